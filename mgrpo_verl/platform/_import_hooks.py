"""Run a callback right after a module finishes importing (a minimal post-import hook).

Used to register things with verl as soon as verl defines their registries, without importing verl's
heavy modules in every process that merely imports ``verl``: the CPU FSDP engines
(:mod:`mgrpo_verl.platform.engines`), our agent loops and the ``multi_agent`` trainer (:mod:`mgrpo_verl.plugin`).

A failing callback fails the import of the watched module with the callback's own exception (logged at
ERROR too: verl imports some of these modules inside Ray workers). The module then stays refused: every
later import of it raises :class:`ImportError` chained to that original exception, so a half-registered
process can never go on to a misleading error later (an "unknown trainer", an unregistered agent loop).
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

_Callback = Callable[[ModuleType], None]
_pending: dict[str, list[_Callback]] = {}
#: watched module -> (callback, the exception it raised): the module is refused from then on
_failed: dict[str, tuple[_Callback, BaseException]] = {}
_lock = threading.RLock()


class PostImportHookError(ImportError):
    """A watched module is refused because one of its post-import callbacks failed earlier."""


def when_imported(module_name: str, callback: _Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported (now, if it already is).

    An exception of ``callback`` propagates: out of this call when the module is already imported, else
    out of the ``import`` statement that loads the module (see the module docstring)."""
    with _lock:
        module = sys.modules.get(module_name)
        if module is not None and not _is_initializing(module):
            run_now = True
        else:
            run_now = False
            _pending.setdefault(module_name, []).append(callback)
            if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _PostImportFinder())
    if run_now:
        callback(module)


def _is_initializing(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _refusal(fullname: str) -> PostImportHookError:
    callback, error = _failed[fullname]
    return PostImportHookError(
        f"{fullname} is refused: its post-import hook {callback!r} failed when it was first imported "
        f"({type(error).__name__}: {error})",
        name=fullname,
    )


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders and wraps the loader of a watched module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        with _lock:
            if fullname in _failed:
                callback, error = _failed[fullname]
                raise _refusal(fullname) from error
            if fullname not in _pending:
                return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _CallbackLoader(spec.loader, fullname)
                return spec
        return None


class _CallbackLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callbacks registered for the module."""

    def __init__(self, loader: Any, fullname: str) -> None:
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._fullname, [])
        for callback in callbacks:
            try:
                callback(module)
            except Exception as error:
                # importlib drops the half-registered module from sys.modules; _failed keeps it refused
                with _lock:
                    _failed[self._fullname] = (callback, error)
                logger.error("post-import hook %r for %s failed; the import fails with its error",
                             callback, self._fullname, exc_info=True)
                error.add_note(f"(raised by the post-import hook {callback!r} of {self._fullname}, "
                               f"mgrpo_verl.platform._import_hooks)")
                raise

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)
