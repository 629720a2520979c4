"""Patch ``verl-0.9.1-fsdp2-pinned-offload``: let verl build FSDP2 reference (forward-only) engines on CPU.

verl 0.9.1's ``FSDPEngine._build_fsdp_module`` offloads every forward-only engine (the reference policy) with
``CPUOffloadPolicy(pin_memory=True)``, and pinning needs an accelerator; in that one module the name is
replaced by a subclass that never pins. Applied only when the CPU platform is active, right after verl's FSDP
engine module is imported; guarded by verl's version and the method's recorded source hash. Symptom, cause,
fix, tests and upstream: ``patches/README.md``.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType

from torch.distributed.fsdp import CPUOffloadPolicy

from mgrpo_verl.platform.patching import VERL_VERSION, installed_verl_version, refuse, source_sha256

logger = logging.getLogger(__name__)

PATCH_ID = "verl-0.9.1-fsdp2-pinned-offload"
TARGET_MODULE = "verl.workers.engine.fsdp.transformer_impl"
TARGET_METHOD = "FSDPEngine._build_fsdp_module"
#: sha256 of ``inspect.getsource(FSDPEngine._build_fsdp_module)`` in the verl 0.9.1 wheel.
RECORDED_SOURCE_SHA256 = "35b7b539858443e45894da2d9675fb5a1d7b2bbb7c7c8b35605b0746d3179213"

_original: dict[str, type] = {}


@dataclass
class UnpinnedCPUOffloadPolicy(CPUOffloadPolicy):
    """torch's ``CPUOffloadPolicy`` that never pins memory (there is no accelerator to pin it for)."""

    def __post_init__(self) -> None:
        self.pin_memory = False


def _target_method(module: ModuleType):
    cls_name, method = TARGET_METHOD.split(".")
    return getattr(getattr(module, cls_name), method)


def upstream_drift(module: ModuleType | None = None) -> tuple[str, str] | None:
    """``(recorded, actual)`` hash if the patched method differs from verl 0.9.1, else None."""
    module = module or importlib.import_module(TARGET_MODULE)
    actual = source_sha256(_target_method(module))
    return None if actual == RECORDED_SOURCE_SHA256 else (RECORDED_SOURCE_SHA256, actual)


def is_applied() -> bool:
    return bool(_original)


def apply(module: ModuleType | None = None, strict: bool = False) -> bool:
    """Install the patch into verl's FSDP engine module (idempotent). Returns whether it is in place."""
    if is_applied():
        return True
    version = installed_verl_version()
    if version != VERL_VERSION:
        return refuse(f"{PATCH_ID}: written for verl=={VERL_VERSION}, found verl=={version}; not applied", strict)
    module = module or importlib.import_module(TARGET_MODULE)
    if upstream_drift(module) is not None:
        return refuse(f"{PATCH_ID}: {TARGET_MODULE}.{TARGET_METHOD} differs from verl {VERL_VERSION}; not applied",
                      strict)
    _original["CPUOffloadPolicy"] = module.CPUOffloadPolicy
    module.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    logger.debug("%s applied", PATCH_ID)
    return True


def revert() -> None:
    """Undo :func:`apply` (for tests)."""
    if _original:
        importlib.import_module(TARGET_MODULE).CPUOffloadPolicy = _original.pop("CPUOffloadPolicy")
