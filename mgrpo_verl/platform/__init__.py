"""Run verl's real trainer on CPU through verl's own extension points (design: docs/cpu.md).

:func:`register_cpu_platform` (on ``import verl`` in every process, through our plugin) registers
:class:`CpuPlatform` in verl's ``PlatformRegistry`` and, only when the CPU platform is the one this process
uses, verl's FSDP engines for ``cpu`` and the CPU patches; on an accelerator verl resolves its own platform as
without us. :func:`ray_cpu_session` starts and stops a private local Ray. The steps in order: ``docs/cpu.md``.
"""

from __future__ import annotations

import logging
import os
import sys

# Whether verl was imported before this package: if not, the import of .cpu below imports it, and verl
# then loads our plugin while this package is half-initialised (see _finish_plugin_registration).
_VERL_IMPORTED_BEFORE = "verl" in sys.modules

from mgrpo_verl.platform.cpu import (  # noqa: E402  (after the check above)
    DEVICE_ENV,
    PLATFORM_NAME,
    CpuPlatform,
    accelerator_present,
    cpu_platform_wanted,
    device_choice,
)
from mgrpo_verl.platform.ray_session import RayCpuSession, ray_cpu_env, ray_cpu_session  # noqa: E402

logger = logging.getLogger(__name__)

__all__ = [
    "DEVICE_ENV",
    "PLATFORM_NAME",
    "CpuPlatform",
    "RayCpuSession",
    "accelerator_present",
    "cpu_platform_active",
    "cpu_platform_wanted",
    "DEVICE_MODES",
    "device_choice",
    "ray_cpu_env",
    "ray_cpu_session",
    "register_cpu_platform",
    "uses_cpu",
]


def register_cpu_platform() -> bool:
    """Register the CPU platform with verl and, if it is this process's platform, its engines and patches.

    Idempotent. Returns whether the CPU platform is (to be) used in this process. Raises ``ValueError``
    for an invalid ``MGRPO_VERL_DEVICE`` or one that contradicts ``VERL_PLATFORM``.
    """
    from verl.plugin.platform import PlatformRegistry

    if PlatformRegistry.get(PLATFORM_NAME) is not CpuPlatform:
        PlatformRegistry.register(platform=PLATFORM_NAME)(CpuPlatform)

    choice = device_choice()
    explicit = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if choice == "cpu":
        if explicit and explicit != PLATFORM_NAME:
            raise ValueError(f"{DEVICE_ENV}=cpu contradicts VERL_PLATFORM={explicit!r}; unset one of them")
        os.environ["VERL_PLATFORM"] = PLATFORM_NAME

    resolved = _resolved_platform()
    if resolved is not None:
        # verl resolved its platform before we were registered (e.g. plugin re-run by ensure_registered).
        use_cpu = isinstance(resolved, CpuPlatform)
        if not use_cpu and cpu_platform_wanted():
            logger.warning(
                "verl already resolved platform %r before the CPU platform was registered; "
                "the CPU engines and patches are not installed",
                resolved.device_name,
            )
    else:
        use_cpu = cpu_platform_wanted()

    from mgrpo_verl.platform import verl_process_group

    # on every platform: its wrappers fix the backend string on CPU only, and serve a worker group's store on a
    # loopback MASTER_ADDR on any device (docs/security.md, "Network exposure")
    verl_process_group.apply()
    if use_cpu:
        from mgrpo_verl.platform import engines, verl_cpu_logprobs

        engines.register_cpu_engines_when_imported()
        verl_cpu_logprobs.apply_when_imported()
    return use_cpu


def cpu_platform_active() -> bool:
    """Whether verl's resolved platform (``verl.plugin.platform.get_platform()``) is the CPU platform."""
    from verl.plugin.platform import get_platform

    return isinstance(get_platform(), CpuPlatform)


#: values of ``mgrpo_verl.device``: the CPU platform, verl's accelerator, or whichever verl resolves here
DEVICE_MODES = ("auto", "cpu", "accelerator")


def uses_cpu(mode: str) -> bool:
    """Whether a run with ``mgrpo_verl.device=mode`` trains on the CPU platform."""
    if mode not in DEVICE_MODES:
        raise ValueError(f"mgrpo_verl.device must be one of {DEVICE_MODES}, got {mode!r}")
    if mode != "auto":
        return mode == "cpu"
    return cpu_platform_active()


def _resolved_platform():
    """verl's platform singleton if already resolved, else None (reads a private module attribute)."""
    from verl.plugin.platform import platform_manager

    return getattr(platform_manager, "_current_platform", None)


#: our entry point in group ``verl.plugins`` (pyproject.toml)
PLUGIN_ENTRY_POINT = "mgrpo_verl"


def _plugin_allowed(policy: str) -> bool:
    """Whether verl's ``VERL_USE_EXTERNAL_PLUGINS`` policy (``auto``, ``none`` or a list of entry-point
    names; verl/__init__.py) loads our entry point."""
    policy = policy.strip().lower()
    return policy == "auto" or PLUGIN_ENTRY_POINT in {name.strip() for name in policy.split(",")}


def _finish_plugin_registration() -> None:
    """Register our plugin when importing this package first is what imported verl.

    In that order verl's ``import`` runs our entry point (``mgrpo_verl.plugin``) from inside the
    ``from verl.plugin.platform import ...`` of :mod:`.cpu`; the plugin's ``from mgrpo_verl.platform import
    register_cpu_platform`` then fails on this half-initialised package, verl swallows the error (debug
    log only), and the process resolves verl's platform without ours (``nvidia`` on a machine without
    an accelerator). Seen with ``import mgrpo_verl.platform.ray_session`` as a script's first import.
    Now that this package is complete, our entry point is loaded again, as verl loads it (unless verl's
    policy excludes it); through the entry point, not an import of the plugin module, which imports this
    package.
    """
    if _VERL_IMPORTED_BEFORE or "mgrpo_verl.plugin" in sys.modules:
        return
    if _plugin_allowed(os.getenv("VERL_USE_EXTERNAL_PLUGINS", "auto")):
        from importlib.metadata import entry_points

        for entry_point in entry_points(group="verl.plugins", name=PLUGIN_ENTRY_POINT):
            entry_point.load()  # registers on import


_finish_plugin_registration()
