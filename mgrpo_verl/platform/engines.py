"""verl's FSDP training engines registered for device ``cpu`` (``EngineRegistry.register``).

verl 0.9.1 registers ``FSDPEngineWithLMHead`` (``language_model``) and ``FSDPEngineWithValueHead``
(``value_model``) for backends ``fsdp``/``fsdp2`` on devices ``cuda`` and ``npu`` only
(``verl/workers/engine/fsdp/transformer_impl.py``). On CPU ``EngineRegistry.get_engine_cls`` then raises
"No engine registered for device='cpu'". We register *the same classes* that verl registered for
``cuda``, read back from the registry, so a renamed or replaced class upstream is followed automatically.

Registration happens right after verl's FSDP module is imported (a post-import hook), so processes that
never build an engine do not pay for importing it. The same hook applies the patch
``verl-0.9.1-fsdp2-pinned-offload`` (:mod:`.verl_cpu_offload_pinning`) to that module.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from mgrpo_verl.platform._import_hooks import when_imported

logger = logging.getLogger(__name__)

#: verl module whose import defines (and registers) the FSDP engines.
FSDP_ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
#: (model_type, backend) pairs mirrored from ``cuda`` to ``cpu``.
CPU_ENGINE_KEYS: tuple[tuple[str, str], ...] = (
    ("language_model", "fsdp"),
    ("language_model", "fsdp2"),
    ("value_model", "fsdp"),
    ("value_model", "fsdp2"),
)


def register_cpu_engines_when_imported() -> None:
    """Register the CPU engines once verl's FSDP engine module is imported (now if it already is)."""
    when_imported(FSDP_ENGINE_MODULE, _register_from_module)


def _register_from_module(module: ModuleType) -> None:
    from mgrpo_verl.platform import verl_cpu_offload_pinning

    register_cpu_engines()
    verl_cpu_offload_pinning.apply(module)


def register_cpu_engines() -> list[tuple[str, str]]:
    """Register for ``cpu`` every class verl registered for ``cuda`` under :data:`CPU_ENGINE_KEYS`.

    Idempotent. Imports verl's FSDP engine module if needed. Returns the keys registered by this call.
    """
    import importlib

    importlib.import_module(FSDP_ENGINE_MODULE)
    from verl.workers.engine.base import EngineRegistry

    registry: dict[str, dict[str, dict[Any, type]]] = EngineRegistry._engines  # read-only use
    added = []
    for model_type, backend in CPU_ENGINE_KEYS:
        by_device = registry.get(model_type, {}).get(backend, {})
        if "cpu" in by_device:
            continue
        engine_cls = by_device.get("cuda")
        if engine_cls is None:
            raise RuntimeError(
                f"verl registers no cuda engine for model_type={model_type!r}, backend={backend!r}; "
                f"the CPU engine mapping (mgrpo_verl.platform.engines) needs updating for this verl version"
            )
        EngineRegistry.register(model_type=model_type, backend=backend, device="cpu")(engine_cls)
        added.append((model_type, backend))
    if added:
        logger.debug("registered verl engines for device cpu: %s", added)
    return added
