"""A CPU platform for verl's platform registry (``verl.plugin.platform``), and the rule that selects it.

verl 0.9.1 ships platforms for NVIDIA, Ascend and ROCm only; with none of them present its detection
falls back to ``nvidia`` and the first process group fails on NCCL. :class:`CpuPlatform` is registered as
``cpu`` and verl then resolves it:

- explicitly, with ``VERL_PLATFORM=cpu`` (verl's own switch) or ``MGRPO_VERL_DEVICE=cpu`` (ours, which
  sets ``VERL_PLATFORM=cpu`` when that is unset);
- automatically, when no other registered platform is available (verl probes registered platforms in
  order and ours is probed after the built-in ones; :meth:`CpuPlatform.is_platform_available` also says
  no whenever another registered platform is available, so it can never shadow an accelerator).

``MGRPO_VERL_DEVICE=accelerator`` turns automatic selection off (verl's stock behaviour).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase

logger = logging.getLogger(__name__)

#: Name under which the platform is registered (``VERL_PLATFORM=cpu``).
PLATFORM_NAME = "cpu"
#: Our switch: ``auto`` (default), ``cpu`` or ``accelerator``.
DEVICE_ENV = "MGRPO_VERL_DEVICE"
_DEVICE_CHOICES = ("auto", "cpu", "accelerator")


def device_choice() -> str:
    """The validated value of ``MGRPO_VERL_DEVICE`` (``auto`` when unset or empty)."""
    value = os.environ.get(DEVICE_ENV, "").strip().lower() or "auto"
    if value not in _DEVICE_CHOICES:
        raise ValueError(f"{DEVICE_ENV}={value!r}: expected one of {', '.join(_DEVICE_CHOICES)}")
    return value


def accelerator_present(use_smi_check: bool = True) -> bool:
    """Whether any registered verl platform other than ours reports itself available.

    Uses the same probe as verl's detection (``is_platform_available(use_smi_check=True)``), so the
    answer matches what ``get_platform()`` will resolve; ``torch.cuda.is_available()`` short-cuts it.
    """
    if torch.cuda.is_available():
        return True
    from verl.plugin.platform import PlatformRegistry

    for name in PlatformRegistry.registered_names():
        cls = PlatformRegistry.get(name)
        if cls is None or issubclass(cls, CpuPlatform):
            continue
        try:
            if cls().is_platform_available(use_smi_check=use_smi_check):
                return True
        except Exception as e:  # a broken probe means "not this platform", as in verl's detection
            logger.debug("platform %s probe failed: %s", name, e)
    return False


def cpu_platform_wanted(use_smi_check: bool = True) -> bool:
    """Whether verl's platform resolution will (or should) pick the CPU platform in this process.

    ``VERL_PLATFORM`` decides when set; otherwise ``MGRPO_VERL_DEVICE``; otherwise (``auto``) CPU is
    chosen exactly when no accelerator platform is available.
    """
    explicit = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if explicit:
        return explicit == PLATFORM_NAME
    choice = device_choice()
    if choice != "auto":
        return choice == "cpu"
    return not accelerator_present(use_smi_check=use_smi_check)


class CpuPlatform(PlatformBase):
    """verl platform backend for plain CPUs: device ``cpu``, collective backend ``gloo``.

    Memory/cache/profiler calls are no-ops. ``current_device()`` returns ``torch.device("cpu")`` because
    verl passes it straight to ``.to(...)`` / ``torch.device(...)`` / FSDP's ``device_id``.

    Ray: verl's resource pools hard-code ``use_gpu=True`` and its resource check only counts ``GPU``/``NPU``
    node resources, so on CPU the workers are scheduled on Ray *logical* GPUs: ``ray_resource_name()`` is
    ``"GPU"`` and Ray must be started with ``num_gpus=N`` (see :mod:`mgrpo_verl.platform.ray_session`).
    Ray then sets ``CUDA_VISIBLE_DEVICES`` in each worker, which a CPU build of torch ignores.
    """

    # -- core device management -------------------------------------------------------------------
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        from mgrpo_verl.platform import cpu_device

        return cpu_device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return cpu_platform_wanted(use_smi_check=use_smi_check)

    def current_device(self) -> torch.device:  # type: ignore[override]  (verl uses it as a device)
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    # -- random number generator ------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    # -- memory management ------------------------------------------------------------------------
    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    # -- device properties ------------------------------------------------------------------------
    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    # -- distributed communication ----------------------------------------------------------------
    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # The variable Ray sets for the logical "GPU" resource this platform schedules on.
        return "CUDA_VISIBLE_DEVICES"

    # -- profiling --------------------------------------------------------------------------------
    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    # -- Ray integration --------------------------------------------------------------------------
    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    # -- IPC / runtime ----------------------------------------------------------------------------
    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
