"""The ``torch.<device>``-style namespace that verl gets from ``get_torch_device()`` on the CPU platform.

verl calls accelerator-module functions all over (``get_torch_device().empty_cache()``,
``.mem_get_info()``, ``.max_memory_allocated()``, ``.get_rng_state()``, ``.set_device(i)`` ...). ``torch.cpu``
has only some of them, so this module supplies the rest: memory and cache calls are no-ops that report
zero device memory (the CPU has no separate device memory), RNG calls go to torch's global CPU generator,
and anything not defined here falls through to ``torch.cpu`` (``Stream``, ``current_stream``,
``stream``, ``Event``, ``synchronize``, ...).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import torch


def __getattr__(name: str) -> Any:  # PEP 562: fall back to torch.cpu for everything else
    try:
        return getattr(torch.cpu, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} (CPU stand-in for torch.cuda) has no attribute {name!r}") from None


# -- device management -------------------------------------------------------------------------------


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device: Any = None) -> None:
    """No-op: there is one CPU device (verl calls this with the local rank)."""


def synchronize(device: Any = None) -> None:
    """No-op: CPU kernels run synchronously."""


def get_device_name(device: Any = None) -> str:
    return "cpu"


def get_device_capability(device: Any = None) -> tuple[None, None]:
    return None, None


def get_device_properties(device: Any = None) -> SimpleNamespace:
    return SimpleNamespace(
        name="cpu", total_memory=_total_memory(), major=None, minor=None, multi_processor_count=os.cpu_count() or 1
    )


# -- random number generator -------------------------------------------------------------------------


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def get_rng_state(device: Any = None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    torch.set_rng_state(new_state)


# -- memory: no separate device memory on CPU ---------------------------------------------------------


def empty_cache() -> None:
    """No-op."""


def ipc_collect() -> None:
    """No-op."""


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """No-op."""


def reset_peak_memory_stats(device: Any = None) -> None:
    """No-op."""


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """No-op."""


def reset_max_memory_allocated(device: Any = None) -> None:
    """No-op."""


def memory_allocated(device: Any = None) -> int:
    return 0


def memory_reserved(device: Any = None) -> int:
    return 0


def max_memory_allocated(device: Any = None) -> int:
    return 0


def max_memory_reserved(device: Any = None) -> int:
    return 0


def memory_stats(device: Any = None) -> dict[str, Any]:
    return {}


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` host memory in bytes (what verl's memory checks should see on CPU)."""
    return _available_memory(), _total_memory()


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
