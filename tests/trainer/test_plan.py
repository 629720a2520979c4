"""The run's plan (``mgrpo_verl/config/plan.py``): built once in the driver, pure, and what every later stage takes.

``main_ppo.run`` is called with verl's ``run_ppo`` replaced by a sentinel (no Ray): it must type the
``multi_agent`` section exactly once and build each model owner's full config exactly once, whatever the checks
and the memory estimate read after it."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import verl.trainer.main_ppo

from mgrpo_verl import main_ppo
from mgrpo_verl.config import plan as plan_module
from mgrpo_verl.config import rules
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.launcher.resolvers import register_resolvers

register_resolvers()


class ReachedRay(Exception):
    """verl's run_ppo was called."""


def _compose(*overrides: str, tmp_path: Path):
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        return compose("mgrpo_trainer", overrides=["task=relay", f"trainer.default_local_dir={tmp_path}", *overrides])


def _counting(monkeypatch, module, name: str) -> list:
    calls: list = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("overrides, owners", [
    ((), 2),
    (("multi_agent.agents.sub.share_model_with=main", "multi_agent.algorithm=grpo", "trainer.n_gpus_per_node=1"), 1),
    (("multi_agent.gpu_memory_gb=80",), 2),  # the memory estimate runs too, on the plan's configs
])
def test_the_driver_parses_the_config_once(monkeypatch, tmp_path, overrides, owners):
    loads = _counting(monkeypatch, rules, "load_multi_agent")
    fulls = _counting(monkeypatch, rules, "agent_full_config")
    plans = _counting(monkeypatch, plan_module, "check_multi_agent")
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", lambda *a, **k: (_ for _ in ()).throw(ReachedRay()))
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    with pytest.raises(ReachedRay):
        main_ppo.run(_compose(*overrides, tmp_path=tmp_path))
    assert (len(loads), len(plans), len(fulls)) == (1, 1, owners)


@pytest.mark.parametrize("role", [None, "main"])
def test_the_plan_applies_the_role_s_mode_rule_once(monkeypatch, tmp_path, role):
    modes = _counting(monkeypatch, rules, "trainer_mode")
    overrides = [] if role is None else ["multi_agent.decoupled.role=main", f"multi_agent.decoupled.store=sqlite:///{tmp_path}/s.db",
                                         "multi_agent.decoupled.sub_urls.sub=http://127.0.0.1:8470", "trainer.n_gpus_per_node=1"]
    config = _compose(*overrides, tmp_path=tmp_path)
    OmegaConf.resolve(config)
    plan = build_plan(config)
    assert len(modes) == 1 and plan.trainer_mode == {None: "multi_agent", "main": "mgrpo_decoupled_main"}[role]


def test_the_plan_is_pure_and_describes_the_run(tmp_path):
    config = _compose("multi_agent.agents.sub.trainable=false", tmp_path=tmp_path)
    OmegaConf.resolve(config)
    before = OmegaConf.to_yaml(config)
    plan = build_plan(config)
    assert OmegaConf.to_yaml(config) == before
    assert list(plan.agent_configs) == ["main", "sub"] and plan.local_configs.keys() == plan.agent_configs.keys()
    # each owner's config is the whole config with its own model and GPU share
    assert plan.agent_configs["sub"].actor_rollout_ref.model.path == config.multi_agent.agents.sub.actor_rollout_ref.model.path
    assert plan.agent_configs["main"].actor_rollout_ref.model.path == config.actor_rollout_ref.model.path
    assert plan.agent_configs["sub"].trainer.n_gpus_per_node == 1
    assert plan.trainer_mode == "multi_agent"
    line = plan.describe()
    assert line.startswith("mgrpo plan: trainer mode multi_agent, algorithm mgrpo, placement separate, models main (main: ")
    assert "sub (sub, frozen: " in line


def test_source_key_names_the_override_that_set_a_value(tmp_path):
    config = _compose("+multi_agent.agents.sub.actor_rollout_ref.rollout.name=hf", tmp_path=tmp_path)
    OmegaConf.resolve(config)
    plan = build_plan(config)
    leaf = "actor_rollout_ref.rollout.name"
    assert plan.source_key("sub", leaf) == f"multi_agent.agents.sub.{leaf}"
    assert plan.source_key("main", leaf) == leaf and plan.source_key(None, leaf) == leaf
