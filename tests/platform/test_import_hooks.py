"""The post-import hook fails loudly: a failing callback fails the watched import with its own error, and
the module stays refused (never a silent half-registration that shows up later as an unknown name)."""

from __future__ import annotations

import importlib
import logging
import sys

import pytest

from mgrpo_verl.platform import _import_hooks
from mgrpo_verl.platform._import_hooks import PostImportHookError, when_imported


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    pkg = tmp_path / "mgrpo_hook_fail_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 41\n")
    (pkg / "other.py").write_text("VALUE = 1\n")
    (pkg / "broken.py").write_text("raise ValueError('broken registration module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mgrpo_hook_fail_pkg"
    for name in [n for n in sys.modules if n.startswith("mgrpo_hook_fail_pkg")]:
        del sys.modules[name]
    for name in [n for n in _import_hooks._failed if n.startswith("mgrpo_hook_fail_pkg")]:
        del _import_hooks._failed[name]
    for name in [n for n in _import_hooks._pending if n.startswith("mgrpo_hook_fail_pkg")]:
        del _import_hooks._pending[name]


class Boom(RuntimeError):
    pass


def test_failing_callback_fails_the_import_with_its_own_error(scratch, caplog):
    seen = []

    def boom(module):
        raise Boom("registration failed")

    when_imported(f"{scratch}.target", lambda m: seen.append("first"))
    when_imported(f"{scratch}.target", boom)
    when_imported(f"{scratch}.target", lambda m: seen.append("after"))
    with caplog.at_level(logging.ERROR, logger=_import_hooks.__name__):
        with pytest.raises(Boom, match="registration failed") as info:
            importlib.import_module(f"{scratch}.target")
    assert seen == ["first"]  # callbacks after the failing one do not run
    assert any("post-import hook" in note and f"{scratch}.target" in note for note in info.value.__notes__)
    assert [r.levelno for r in caplog.records] == [logging.ERROR] and "registration failed" in caplog.text
    assert f"{scratch}.target" not in sys.modules


def test_module_stays_refused_after_a_failed_callback(scratch):
    def boom(module):
        raise Boom("registration failed")

    when_imported(f"{scratch}.target", boom)
    with pytest.raises(Boom):
        importlib.import_module(f"{scratch}.target")
    # a second import does not silently succeed without the registration: it names the first error
    with pytest.raises(PostImportHookError, match=r"Boom: registration failed") as info:
        importlib.import_module(f"{scratch}.target")
    assert isinstance(info.value.__cause__, Boom)
    with pytest.raises(ImportError):  # plain `import` / `from ... import` too
        exec(f"from {scratch}.target import VALUE")


def test_error_of_a_module_imported_by_the_callback_surfaces(scratch):
    """What the plugin's hooks do: the callback imports our registration module; its error comes through."""
    when_imported(f"{scratch}.target", lambda m: importlib.import_module(f"{scratch}.broken"))
    with pytest.raises(ValueError, match="broken registration module"):
        importlib.import_module(f"{scratch}.target")


def test_callback_on_an_imported_module_raises_at_once(scratch):
    importlib.import_module(f"{scratch}.target")
    with pytest.raises(Boom):
        when_imported(f"{scratch}.target", lambda m: (_ for _ in ()).throw(Boom("now")))


def test_broken_trainer_registration_is_not_an_unknown_trainer(python_runner):
    """End to end through the plugin: if mgrpo_verl.trainer.per_agent cannot be imported when verl's v1
    trainer package loads, asking verl for the ``mgrpo`` trainer raises that import error (first and
    second time), not verl's "unknown trainer" KeyError."""
    out = python_runner(
        """
        import json, sys
        sys.modules["mgrpo_verl.trainer.per_agent"] = None  # makes `import mgrpo_verl.trainer.per_agent` fail
        import verl  # the plugin registers its hooks
        errors = []
        for attempt in range(2):
            try:
                from verl.trainer.ppo.v1 import get_trainer_cls
                get_trainer_cls("multi_agent")
                errors.append(None)
            except BaseException as e:
                cause = e.__cause__
                errors.append([type(e).__name__, str(e), type(cause).__name__ if cause else None,
                               str(cause) if cause else None])
        print(json.dumps(errors))
        """
    )
    first, second = out
    # Python raises ModuleNotFoundError for a None entry in sys.modules: the import error itself
    assert first[0] == "ModuleNotFoundError" and "mgrpo_verl.trainer.per_agent" in first[1]
    assert second[0] == "PostImportHookError" and "verl.trainer.ppo.v1" in second[1]
    assert second[2:] == first[:2]


def test_hook_runs_after_import(scratch):
    seen = []
    when_imported(f"{scratch}.target", lambda m: seen.append(m.VALUE + 1))
    assert seen == []
    import importlib

    module = importlib.import_module(f"{scratch}.target")
    assert seen == [42]
    assert module.__loader__.get_source(module.__name__) == "VALUE = 41\n"  # loader still usable
    importlib.import_module(f"{scratch}.other")  # unwatched modules are untouched
    assert seen == [42]
    when_imported(f"{scratch}.target", lambda m: seen.append("now"))  # already imported: runs now
    assert seen == [42, "now"]
