"""verl's FSDP engines registered for device ``cpu``, and the post-import hook that does it lazily."""

from __future__ import annotations

import sys

import pytest

from mgrpo_verl.platform import engines
from mgrpo_verl.platform._import_hooks import when_imported


def test_cpu_engines_are_verls_cuda_classes():
    engines.register_cpu_engines()
    assert engines.register_cpu_engines() == []  # idempotent
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    registry = EngineRegistry._engines
    for model_type, backend in engines.CPU_ENGINE_KEYS:
        assert registry[model_type][backend]["cpu"] is registry[model_type][backend]["cuda"]
    assert registry["language_model"]["fsdp2"]["cpu"] is FSDPEngineWithLMHead
    assert registry["value_model"]["fsdp"]["cpu"] is FSDPEngineWithValueHead


def test_engine_lookup_on_cpu(monkeypatch):
    engines.register_cpu_engines()
    from verl.workers.engine import EngineRegistry

    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cpu")  # verl's own override, independent of this machine
    monkeypatch.setenv("VERL_ENGINE_VENDOR", "cpu")
    cls = EngineRegistry.get_engine_cls("language_model", "fsdp2")
    assert cls.__name__ == "FSDPEngineWithLMHead"


def test_registered_in_a_fresh_process_without_explicit_call(python_runner):
    """The plugin registers them as soon as verl's FSDP module is imported (what a Ray worker does)."""
    out = python_runner(
        """
        import json, sys, verl
        before = "verl.workers.engine.fsdp.transformer_impl" in sys.modules
        from verl.workers.engine import EngineRegistry
        cls = EngineRegistry.get_engine_cls("language_model", "fsdp2")
        vcls = EngineRegistry.get_engine_cls("value_model", "fsdp")
        print(json.dumps({"imported_by_plugin": before, "lm": cls.__name__, "value": vcls.__name__}))
        """,
        env={"MGRPO_VERL_DEVICE": "cpu"},
    )
    assert out == {"imported_by_plugin": False, "lm": "FSDPEngineWithLMHead", "value": "FSDPEngineWithValueHead"}


# -- the post-import hook ---------------------------------------------------------------------------


@pytest.fixture
def scratch_modules(tmp_path, monkeypatch):
    pkg = tmp_path / "mgrpo_hook_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 41\n")
    (pkg / "other.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mgrpo_hook_pkg"
    for name in [n for n in sys.modules if n.startswith("mgrpo_hook_pkg")]:
        del sys.modules[name]


def test_hook_runs_after_import(scratch_modules):
    seen = []
    when_imported(f"{scratch_modules}.target", lambda m: seen.append(m.VALUE + 1))
    assert seen == []
    import importlib

    module = importlib.import_module(f"{scratch_modules}.target")
    assert seen == [42]
    assert module.__loader__.get_source(module.__name__) == "VALUE = 41\n"  # loader still usable
    importlib.import_module(f"{scratch_modules}.other")  # unwatched modules are untouched
    assert seen == [42]
    when_imported(f"{scratch_modules}.target", lambda m: seen.append("now"))  # already imported: runs now
    assert seen == [42, "now"]
