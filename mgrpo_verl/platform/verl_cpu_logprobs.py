"""Patch ``verl-0.9.1-cpu-logprobs``: verl's log-probabilities on CPU without one autograd node per token.

Without flash-attn (every CPU machine), verl 0.9.1's ``logprobs_from_logits`` falls back to
``logprobs_from_logits_v2``, which for fp32 logits calls ``torch.logsumexp`` once per row of its input to bound
peak memory. verl's FSDP engine hands it the logits flattened to ``(tokens, vocab)`` when remove-padding is off
(the CPU setting), so a row is a token: a warm-start SFT step of 16 x 448 tokens made ~7,000 ``logsumexp`` calls
and as many autograd nodes, and it was most of the step. Here the fp32/fp64 branch does the same arithmetic in
chunks of rows that hold at most :data:`CHUNK_ELEMENTS` logits (the memory bound verl wanted: ~1,000 rows of a
tiny model's 1k vocabulary, 21 of a 49k one); every other dtype goes to verl's function. The values are verl's to
the last bit on the tested shapes and within float rounding (2e-6 on values of ~15) in general
(``tests/platform/test_verl_logprobs_patch.py``). Applied only on the CPU platform,
when ``verl.utils.torch_functional`` is imported; guarded by verl's version and both functions' source hashes.
Symptom, cause, measurements and upstream: ``patches/README.md``.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

import torch

from mgrpo_verl.platform.patching import VERL_VERSION, installed_verl_version, refuse, source_sha256

logger = logging.getLogger(__name__)

PATCH_ID = "verl-0.9.1-cpu-logprobs"
TARGET_MODULE = "verl.utils.torch_functional"
#: sha256 of ``inspect.getsource`` of each function in the verl 0.9.1 wheel: the one replaced, and the dispatcher
#: whose fallback branch reaches it through the module's globals (what makes replacing the attribute enough)
RECORDED_SOURCE_SHA256 = {
    "logprobs_from_logits_v2": "1074be97faf338ae07d3c2351db0752714541a17e0616a785ee65b6fc14ea262",
    "logprobs_from_logits": "dffd21fe40eb806b45d740d0753a7f969889366c80e32e354988cc20f1e9d726",
}
#: logits per chunk (4 MiB of fp32): what one ``logsumexp`` call's temporaries hold at most. Measured
#: (benchmarks/bench_cpu_logprobs.py, 2 cores): 2^18-2^20 were the fastest for 2048 x 49,152 logits (0.75 s forward +
#: backward, verl's row loop 1.0 s, 2^24 1.0 s); for 7,168 x 1,030 every size from 2^16 to 2^24 was ~10x verl's.
CHUNK_ELEMENTS = 1 << 20

_original: dict[str, object] = {}


def chunked_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[labels]`` for fp32/fp64 ``logits`` of shape ``(..., vocab)`` and ``labels`` of shape
    ``(...)``; the ``logsumexp`` runs over chunks of at most :data:`CHUNK_ELEMENTS` logits (rows of the flattened
    leading dimensions) instead of verl's one call per row of the first dimension. Other dtypes: verl's own."""
    if logits.dtype not in (torch.float32, torch.float64):
        return _original["logprobs_from_logits_v2"](logits, labels)
    picked = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    flat = logits.reshape(-1, logits.shape[-1])
    rows = max(1, CHUNK_ELEMENTS // max(1, flat.shape[-1]))
    normaliser = torch.cat([torch.logsumexp(chunk, dim=-1) for chunk in flat.split(rows)])
    return picked - normaliser.view(picked.shape)


def upstream_drift(module: ModuleType | None = None) -> dict[str, tuple[str, str]]:
    """``{function: (recorded, actual)}`` for every guarded function whose source differs from verl 0.9.1."""
    module = module or importlib.import_module(TARGET_MODULE)
    fn_of = {name: _original.get(name, getattr(module, name)) for name in RECORDED_SOURCE_SHA256}
    actual = {name: source_sha256(fn) for name, fn in fn_of.items()}
    return {name: (RECORDED_SOURCE_SHA256[name], actual[name]) for name in actual
            if actual[name] != RECORDED_SOURCE_SHA256[name]}


def is_applied() -> bool:
    return bool(_original)


def apply(module: ModuleType | None = None, strict: bool = False) -> bool:
    """Install the patch into ``verl.utils.torch_functional`` (idempotent). Returns whether it is in place."""
    if is_applied():
        return True
    version = installed_verl_version()
    if version != VERL_VERSION:
        return refuse(f"{PATCH_ID}: written for verl=={VERL_VERSION}, found verl=={version}; not applied", strict)
    module = module or importlib.import_module(TARGET_MODULE)
    drift = upstream_drift(module)
    if drift:
        return refuse(f"{PATCH_ID}: {TARGET_MODULE}.{', '.join(sorted(drift))} differs from verl {VERL_VERSION}; "
                      f"not applied", strict)
    _original["logprobs_from_logits_v2"] = module.logprobs_from_logits_v2
    module.logprobs_from_logits_v2 = chunked_logprobs
    logger.debug("%s applied", PATCH_ID)
    return True


def apply_when_imported() -> None:
    """:func:`apply` once verl's ``torch_functional`` is imported (now if it already is)."""
    from mgrpo_verl.platform._import_hooks import when_imported

    when_imported(TARGET_MODULE, apply)


def revert() -> None:
    """Undo :func:`apply` (for tests)."""
    if _original:
        importlib.import_module(TARGET_MODULE).logprobs_from_logits_v2 = _original.pop("logprobs_from_logits_v2")
