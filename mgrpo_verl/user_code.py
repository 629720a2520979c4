"""Import a user's function named ``"file.py:function"`` or ``"module:function"`` by a config key.

One loader for every hook a user names in YAML (the delegation scorer and sub-agent prompt, the warm start's
demonstrations), so that they resolve files, register modules and word their errors alike. A ``file.py`` module is
executed afresh on every load (an edited file is seen) and registered in ``sys.modules`` under a name derived from its
absolute path: dataclasses and pickling look a class's module up there.
A relative file is resolved against the current directory (``main_ppo`` makes it absolute against the launch
directory before Ray starts, ``mgrpo_verl.launcher.hooks``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any


def load_function(spec: str, key: str) -> Callable[..., Any]:
    """The callable ``spec`` names; ``key`` is the config key it came from (``multi_agent.delegation.scorer``).

    Raises:
        ValueError: naming ``key=spec``, then the file or module and the function: a malformed spec, no such file,
            a file or module that raises on import, or a name that is not callable.
    """
    target, _, name = str(spec).rpartition(":")
    where = f"{key}={spec}"
    if not target or not name:
        raise ValueError(f"{key} must be 'module:function' or 'file.py:function', got {spec!r}")
    if target.endswith(".py"):
        path = os.path.abspath(os.path.expanduser(target))
        if not os.path.isfile(path):
            raise ValueError(f"{where}: no such file {path} (a relative path is resolved against the launch directory)")
        module_name = f"mgrpo_user_{hashlib.sha256(path.encode()).hexdigest()[:16]}"
        try:
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
        except Exception as err:  # the file itself raises (a syntax error, a failing import)
            sys.modules.pop(module_name, None)
            raise ValueError(f"{where}: loading {path} failed: {type(err).__name__}: {err}") from err
        source = path
    else:
        try:
            module = importlib.import_module(target)
        except Exception as err:
            raise ValueError(f"{where}: importing module {target!r} failed: {type(err).__name__}: {err}") from err
        source = f"module {target}"
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"{where}: {source} has no function {name!r}")
    return fn

