"""Models that run offline on CPU: a tiny random Qwen2 (+ local BPE tokenizer) and SmolLM2-135M."""

from mgrpo_verl.models.smollm2 import SMOLLM2_INSTALL_HINT, build_smollm2, smollm2_available
from mgrpo_verl.models.tiny import (
    BUILDER_VERSION,
    TinyModelPaths,
    build_tiny_model,
    build_tiny_tokenizer,
    cache_root,
    tiny_qwen2_config,
)

__all__ = [
    "BUILDER_VERSION",
    "SMOLLM2_INSTALL_HINT",
    "TinyModelPaths",
    "build_smollm2",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "cache_root",
    "smollm2_available",
    "tiny_qwen2_config",
]
