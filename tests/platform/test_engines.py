"""verl's FSDP engines registered for device ``cpu`` (the post-import hook that does it lazily: test_import_hooks.py)."""

from __future__ import annotations


from mgrpo_verl.platform import engines


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
