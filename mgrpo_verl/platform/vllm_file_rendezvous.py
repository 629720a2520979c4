"""Patch ``vllm-file-rendezvous``: a vLLM engine's process group meets through a file, not a TCP store on every
interface.

vLLM 0.24.0 (verl 0.9.1's vLLM on GPUs) gives its workers ``tcp://127.0.0.1:<port>``, and torch's TCPStore server
binds every interface whatever the URL's host (docs/security.md, "Network exposure"): another machine could read
and write the engine's rendezvous keys. vLLM's later releases (0.28, the CPU build we test with) use a file store
for this one-machine rendezvous; this patch does the same in the releases that do not: the multiprocess executor's
``get_distributed_init_method`` returns ``file://<temp dir>/vllm_dist_<random>`` for a loopback address and vLLM's
own URL otherwise. Loaded by vLLM in each of its processes (``vllm.general_plugins``); applied only where the
executor still builds the TCP URL on loopback and the function's source is the recorded one. Guards, test and
removal: ``patches/README.md``.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable

from mgrpo_verl.platform.ray_session import is_loopback

logger = logging.getLogger(__name__)

PATCH_ID = "vllm-file-rendezvous"
TARGET_MODULE = "vllm.v1.executor.multiproc_executor"
#: sha256 of ``inspect.getsource(vllm.utils.network_utils.get_distributed_init_method)``: the same in vLLM 0.24.0
#: (CUDA wheel) and 0.28.0 (CPU build), ``return get_tcp_uri(ip, port)``
RECORDED_SOURCE_SHA256 = "f8dd81e3efb448778af3164bc20cc1d35bf8e92c5e62c1ece4f322757ed8eb94"
#: what the executor's ``_init_executor`` says when it rendezvous over TCP on loopback (vLLM 0.24), and when over a file
TCP_ON_LOOPBACK = "get_loopback_ip(), get_open_port()"
FILE_STORE = "get_file_store_init_method"

_original: dict[str, Callable[[str, int], str]] = {}


def file_init_method() -> str:
    """A fresh file rendezvous in this machine's temporary directory (random name), as vLLM's later releases use."""
    return f"file://{tempfile.gettempdir()}/vllm_dist_{uuid.uuid4().hex}"


def needed(executor_source: str) -> bool:
    """Whether an executor whose ``_init_executor`` reads ``executor_source`` rendezvous over TCP on loopback."""
    return TCP_ON_LOOPBACK in executor_source and FILE_STORE not in executor_source


def is_applied() -> bool:
    return bool(_original)


def apply(strict: bool = False, force: bool = False) -> bool:
    """Rebind the executor module's ``get_distributed_init_method`` (idempotent); returns whether it is in place.
    Quietly not applied where vLLM already uses a file (unless ``force``, for tests); refused (warning, or
    ``RuntimeError`` when ``strict``) when the function's source is not the recorded one."""
    if is_applied():
        return True
    import importlib
    import inspect

    from mgrpo_verl.platform.patching import source_sha256

    module = importlib.import_module(TARGET_MODULE)
    if not force and not needed(inspect.getsource(module.MultiprocExecutor._init_executor)):
        logger.debug("%s: not needed (this vLLM does not rendezvous over TCP on loopback)", PATCH_ID)
        return False
    original = module.get_distributed_init_method
    actual = source_sha256(original)
    if actual != RECORDED_SOURCE_SHA256:
        message = (f"{PATCH_ID}: get_distributed_init_method differs from the recorded one ({actual}); not applied "
                   "(the vLLM engine's rendezvous store listens on every interface: docs/security.md)")
        if strict:
            raise RuntimeError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        logger.warning(message)
        return False

    def get_distributed_init_method(ip: str, port: int) -> str:
        return file_init_method() if is_loopback(ip) else original(ip, port)

    get_distributed_init_method.__mgrpo_patch__ = PATCH_ID  # type: ignore[attr-defined]
    _original["function"] = original
    module.get_distributed_init_method = get_distributed_init_method
    # printed: vLLM's processes do not show our loggers' lines
    print(f"mgrpo_verl: {PATCH_ID} applied (pid {os.getpid()}): the engine's process group meets through a file",
          file=sys.stderr, flush=True)
    return True


def revert() -> None:
    """Undo :func:`apply` (for tests)."""
    if _original:
        import importlib

        importlib.import_module(TARGET_MODULE).get_distributed_init_method = _original.pop("function")


def register() -> None:
    """vLLM's ``vllm.general_plugins`` hook."""
    apply()
