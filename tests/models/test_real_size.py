"""mgrpo_verl/models/real_size.py: the presets have Qwen2.5's shapes (parameter counts derived by hand) with
SmolLM2's vocabulary, and the builder writes a deterministic bfloat16 checkpoint."""

from __future__ import annotations

import pytest
import torch

from mgrpo_verl.models import real_size as rs


class _Tok:
    """The three fields of a tokenizer the config reads, for a given vocabulary size."""

    def __init__(self, n: int):
        self.n, self.bos_token_id, self.eos_token_id, self.pad_token_id = n, 1, 2, 2

    def __len__(self):
        return self.n


def qwen2_params(vocab: int, hidden: int, inter: int, layers: int, heads: int, kv_heads: int) -> int:
    """Parameters of a Qwen2 with tied embeddings: embedding vocab x hidden; per layer q (hidden x hidden + bias),
    k and v (hidden x kv_dim + bias each, kv_dim = kv_heads x head_dim), o (hidden x hidden, no bias), gate/up/down
    (3 x hidden x inter), two RMSNorms (2 x hidden); a final RMSNorm."""
    kv_dim = kv_heads * hidden // heads
    layer = hidden * hidden + hidden + 2 * (hidden * kv_dim + kv_dim) + hidden * hidden + 3 * hidden * inter + 2 * hidden
    return vocab * hidden + layers * layer + hidden


def test_hand_formula_matches_the_published_qwen_sizes():
    # Qwen2.5-0.5B with its own vocabulary (151,936): 494,032,768 parameters (its model card: 0.49 B);
    # 1.5B: 1,543,714,304 (1.54 B)
    assert qwen2_params(151936, 896, 4864, 24, 14, 2) == 494_032_768
    assert qwen2_params(151936, 1536, 8960, 28, 12, 2) == 1_543_714_304


@pytest.mark.parametrize("preset, expected", [
    # 0.5B, SmolLM2's 49,152 tokens: embedding 49,152 x 896 = 44,040,192; a layer 803,712 (q) + 2 x 114,816 (k, v)
    # + 802,816 (o) + 13,074,432 (MLP) + 1,792 (norms) = 14,912,384, x 24 = 357,897,216; + 896 = 401,938,304
    ("qwen2.5-0.5b", 401_938_304),
    # 1.5B: 49,152 x 1,536 = 75,497,472; a layer 2,360,832 + 2 x 393,472 + 2,359,296 + 41,287,680 + 3,072
    # = 46,797,824, x 28 = 1,310,339,072; + 1,536 = 1,385,838,080
    ("qwen2.5-1.5b", 1_385_838_080),
])
def test_preset_parameter_count(preset, expected):
    from transformers import Qwen2ForCausalLM

    config = rs.preset_config(preset, _Tok(49152))
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == expected
    shape = rs.PRESETS[preset]
    assert expected == qwen2_params(49152, shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"],
                                    shape["num_attention_heads"], shape["num_key_value_heads"])
    assert config.tie_word_embeddings and config.vocab_size == 49152 and config.rope_parameters["rope_theta"] == 1e6


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="unknown model preset 'qwen2.5-7b'"):
        rs.build_real_size("qwen2.5-7b", tokenizer_dir="/nonexistent")


def test_tokenizer_from_the_cache_without_the_wheel(tmp_path, monkeypatch):
    from mgrpo_verl.models import smollm2

    monkeypatch.setenv("MGRPO_VERL_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "smollm2_available", lambda: False)
    with pytest.raises(FileNotFoundError, match="found 0"):
        rs.smollm2_tokenizer_dir()
    (tmp_path / "tokenizers" / "smollm2-135m-instruct-abc").mkdir(parents=True)
    (tmp_path / "tokenizers" / "smollm2-135m-instruct-abc.lock").write_text("")
    assert rs.smollm2_tokenizer_dir() == str(tmp_path / "tokenizers" / "smollm2-135m-instruct-abc")


@pytest.mark.slow
def test_builder_writes_a_deterministic_bf16_checkpoint(tmp_path, monkeypatch):
    """The 0.5B preset built for real (with the tiny tokenizer, to keep the test offline and small: 1,030 tokens)."""
    from safetensors import safe_open

    from mgrpo_verl.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(tmp_path))
    model_dir, tok_dir = rs.build_real_size("qwen2.5-0.5b", seed=0, tokenizer_dir=tokenizer)
    assert tok_dir == tokenizer
    with safe_open(f"{model_dir}/model.safetensors", "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    # tied: no lm_head tensor; 1,030 x 896 = 922,880, + 357,897,216 (layers) + 896 (final norm) = 358,820,992
    assert sum(t.numel() for t in tensors.values()) == qwen2_params(1030, 896, 4864, 24, 14, 2) == 358_820_992
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    # same seed, same weights: a second build in another cache equals the first
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(tmp_path / "again"))
    again, _ = rs.build_real_size("qwen2.5-0.5b", seed=0, tokenizer_dir=tokenizer)
    with safe_open(f"{again}/model.safetensors", "pt") as f:
        key = "model.layers.3.mlp.up_proj.weight"
        assert torch.equal(f.get_tensor(key), tensors[key])
