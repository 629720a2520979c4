"""Run a callback right after a module finishes importing (a minimal post-import hook).

Used to register verl's FSDP engine classes for device ``cpu`` as soon as verl defines them, without
importing verl's engine stack (~1 s, torch FSDP, transformers) in every process that merely imports
``verl`` (TaskRunner, TransferQueue, reward workers, ...).
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
_lock = threading.RLock()


def when_imported(module_name: str, callback: _Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported (now, if it already is)."""
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


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders and wraps the loader of a watched module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        with _lock:
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
            except Exception:  # never break the import of the watched module itself
                logger.exception("post-import hook %r for %s failed", callback, self._fullname)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)
