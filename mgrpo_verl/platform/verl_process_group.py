"""Patch ``verl-0.9.1-process-group``: verl's global process group on a CPU-only platform, and its store on loopback.

Two changes to ``verl.utils.distributed``, each where verl has no extension point:

- on a CPU platform verl 0.9.1 builds the backend string ``cpu:gloo,{device}:{backend}``, which names ``cpu`` twice
  (``Duplicate device type cpu``); the wrappers use ``cpu:<backend>`` there and verl's string on any other device;
- on every device, a Ray worker group whose ``MASTER_ADDR`` is loopback (a Ray the run starts:
  docs/security.md) gets its store served on that address only (:func:`loopback_store`): torch's ``env://`` store
  binds every interface whatever ``MASTER_ADDR`` says.

Applied on every platform (the store is the same with nccl), guarded by verl's version and the recorded hashes of
the patched sources. The code lives in the package because Ray workers import it (``patches/`` is not shipped).
Symptom, cause, fix, guards, upstream references and removal: ``patches/README.md``.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from mgrpo_verl.platform.patching import VERL_VERSION, VerlPatchError, refuse, source_sha256
from mgrpo_verl.platform.ray_session import is_loopback

__all__ = ["PATCH_ID", "VERL_VERSION", "VerlPatchError", "apply", "backend_string", "is_applied",
           "loopback_store", "revert"]

logger = logging.getLogger(__name__)

PATCH_ID = "verl-0.9.1-process-group"
TARGET_MODULE = "verl.utils.distributed"
#: sha256 of ``inspect.getsource(f)`` of each patched function, recorded from the verl 0.9.1 wheel.
RECORDED_SOURCE_SHA256: dict[str, str] = {
    "initialize_global_process_group": "33a5452c4dde00591e00692a5f967cc7b424a3b7ebd9da7cb23697209ddbd0e1",
    "initialize_global_process_group_ray": "761a94d1a2e058d31a0ac231c89a142abf5daf822e333bac75e84cafcf7507ac",
}

_originals: dict[str, Callable[..., Any]] = {}
_rebound: list[tuple[Any, str, Callable[..., Any]]] = []  # (module, attribute, original) for revert()


def backend_string(device_name: str, comm_backend: str) -> str:
    """The ``init_process_group`` backend string verl means to build, valid when the device is ``cpu``."""
    if device_name == "cpu":
        return f"cpu:{comm_backend}"
    return f"cpu:gloo,{device_name}:{comm_backend}"


def _default_timeout() -> timedelta:
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout


def loopback_store(address: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The process group's store as torch's ``env://`` rendezvous makes it (rank 0 serves a multi-tenant TCPStore,
    the others connect; prefix ``default_pg``), but rank 0's server listens on a socket bound to ``address`` and
    handed to torch (``master_listen_fd``) instead of one torch binds to every interface."""
    import socket

    from torch.distributed import PrefixStore, TCPStore

    listen_fd = None
    if rank == 0:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(max(world_size, 128))
        except OSError:
            sock.close()
            raise
        listen_fd = sock.detach()
    try:
        store = TCPStore(host_name=address, port=port, world_size=world_size, is_master=rank == 0, timeout=timeout,
                         multi_tenant=True, master_listen_fd=listen_fd)
    except Exception:
        if listen_fd is not None:
            os.close(listen_fd)
        raise
    return PrefixStore("default_pg", store)


def upstream_functions() -> dict[str, Callable[..., Any]]:
    """The unpatched functions of the installed verl (the originals if the patch is applied)."""
    import importlib

    module = importlib.import_module(TARGET_MODULE)
    return {name: _originals.get(name) or getattr(module, name) for name in RECORDED_SOURCE_SHA256}


def upstream_drift() -> dict[str, tuple[str, str]]:
    """``{name: (recorded, actual)}`` for each patched function whose source differs from verl 0.9.1."""
    drift = {}
    for name, func in upstream_functions().items():
        actual = source_sha256(func)
        if actual != RECORDED_SOURCE_SHA256[name]:
            drift[name] = (RECORDED_SOURCE_SHA256[name], actual)
    return drift


def is_applied() -> bool:
    return bool(_originals)


def apply(strict: bool = False) -> bool:
    """Install the patch (idempotent). Returns whether it is in place.

    Refuses (warning, or :class:`VerlPatchError` if ``strict``) on any verl other than 0.9.1 or when the
    patched functions' source differs from the recorded one.
    """
    if is_applied():
        return True
    import verl

    version = getattr(verl, "__version__", "unknown")
    if version != VERL_VERSION:
        return refuse(
            f"{PATCH_ID}: written for verl=={VERL_VERSION}, found verl=={version}; not applied. "
            f"Check whether {TARGET_MODULE} still builds 'cpu:gloo,{{device}}:{{backend}}' and update "
            f"mgrpo_verl/platform/verl_process_group.py and patches/README.md.",
            strict,
        )
    drift = upstream_drift()
    if drift:
        return refuse(
            f"{PATCH_ID}: {TARGET_MODULE} differs from verl {VERL_VERSION} in {sorted(drift)}; not applied "
            f"(was the installed verl modified?).",
            strict,
        )

    import importlib

    module = importlib.import_module(TARGET_MODULE)
    original_init = module.initialize_global_process_group
    original_init_ray = module.initialize_global_process_group_ray

    @functools.wraps(original_init)
    def initialize_global_process_group(timeout_second=36000):
        device = module.get_device_name()
        if device != "cpu":
            return original_init(timeout_second)
        # verl 0.9.1's body with the backend string fixed (the function takes no backend argument).
        import torch.distributed

        torch.distributed.init_process_group(
            backend=backend_string(device, module.get_nccl_backend()),
            timeout=timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        local_rank = int(os.environ["LOCAL_RANK"])
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        if torch.distributed.is_initialized():
            module.get_torch_device().set_device(local_rank)
        return local_rank, rank, world_size

    @functools.wraps(original_init_ray)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        device = module.get_device_name()
        if backend is None:
            backend = backend_string(device, module.get_nccl_backend())
        address = os.environ.get("MASTER_ADDR", "")
        if os.environ.get("DIST_INIT_METHOD") or not is_loopback(address):
            return original_init_ray(timeout_second=timeout_second, backend=backend)
        # verl 0.9.1's body with the group's store served on MASTER_ADDR only: torch's env:// store listens on every
        # interface whatever MASTER_ADDR says; a Ray the run starts puts it on 127.0.0.1 on any device (issue 29)
        import torch.distributed

        if torch.distributed.is_initialized():
            return
        rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        timeout = timedelta(seconds=timeout_second) if timeout_second is not None else _default_timeout()
        store = loopback_store(address, int(os.environ["MASTER_PORT"]), rank, world_size, timeout)
        torch.distributed.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                                             timeout=timeout)

    replacements = {
        "initialize_global_process_group": initialize_global_process_group,
        "initialize_global_process_group_ray": initialize_global_process_group_ray,
    }
    for name, func in replacements.items():
        original = getattr(module, name)
        func.__mgrpo_patch__ = PATCH_ID  # type: ignore[attr-defined]
        _originals[name] = original
        # Rebind everywhere verl already holds the original (``from verl.utils.distributed import ...``
        # in modules imported before us); modules imported later pick the patched attribute up.
        for mod in list(sys.modules.values()):
            mod_name = getattr(mod, "__name__", "") or ""
            if (mod_name == "verl" or mod_name.startswith("verl.")) and getattr(mod, name, None) is original:
                setattr(mod, name, func)
                _rebound.append((mod, name, original))
    logger.debug("%s applied", PATCH_ID)
    return True


def revert() -> None:
    """Undo :func:`apply` (for tests), also in verl modules imported after it (they bound the wrapper)."""
    while _rebound:
        mod, name, original = _rebound.pop()
        setattr(mod, name, original)
    for mod in list(sys.modules.values()):
        mod_name = getattr(mod, "__name__", "") or ""
        if mod_name == "verl" or mod_name.startswith("verl."):
            for name, original in _originals.items():
                if getattr(getattr(mod, name, None), "__mgrpo_patch__", None) == PATCH_ID:
                    setattr(mod, name, original)
    _originals.clear()
