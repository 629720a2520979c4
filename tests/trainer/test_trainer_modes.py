"""``multi_agent.decoupled.role`` -> ``trainer.v1.trainer_mode`` -> the trainer class verl's registry starts.

Users set only the role; ``mgrpo_verl.main_ppo.run`` sets the mode (``TRAINER_MODES``) before Ray starts, and
verl's ``get_trainer_cls`` then picks ``MultiAgentTrainer``, ``DecoupledMainTrainer`` or ``DecoupledSubTrainer``.
A trainer mode that contradicts the role is refused before Ray; a trainer class started on a role it does not
run refuses in its ``__init__``. No Ray, no model: ``run_ppo`` and ``ray.init`` are replaced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from hydra import compose, initialize_config_module

import verl.trainer.main_ppo
from verl.trainer.ppo.v1 import get_trainer_cls

from mgrpo_verl import main_ppo
from mgrpo_verl.config.schema import TRAINER_MODES, trainer_mode
from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.trainer.decoupled import DecoupledMainTrainer, DecoupledSubTrainer
from mgrpo_verl.trainer.per_agent import MultiAgentTrainer

register_resolvers()

CLASSES = {None: MultiAgentTrainer, "main": DecoupledMainTrainer, "sub": DecoupledSubTrainer}


def _side(role: str | None, tmp_path: Path) -> list[str]:
    """The overrides of a run of ``role`` (what recipes/decoupled_relay.sh gives each side)."""
    store = f"multi_agent.decoupled.store=sqlite:///{tmp_path}/stats.db"
    if role == "main":
        return ["multi_agent.decoupled.role=main", store, "multi_agent.decoupled.sub_urls.sub=http://127.0.0.1:8470",
                "trainer.n_gpus_per_node=1"]
    if role == "sub":
        return ["multi_agent.decoupled.role=sub", store, "trainer.val_before_train=false", "trainer.test_freq=-1",
                "trainer.n_gpus_per_node=1"]
    return []


def _compose(*overrides: str, tmp_path: Path):
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        return compose("mgrpo_trainer", overrides=["task=relay", f"trainer.default_local_dir={tmp_path}/ckpt", *overrides])


class ReachedRay(Exception):
    """verl's run_ppo was called, with this trainer mode."""

    def __init__(self, mode: str):
        super().__init__(mode)
        self.mode = mode


@pytest.fixture
def run(monkeypatch, tmp_path):
    """``run(*overrides)``: compose ``mgrpo_trainer`` and run ``main_ppo.run``; returns what it raised (a
    :class:`ReachedRay` with the trainer mode verl would have started, or the refusal)."""

    def reached(config, **kwargs):
        raise ReachedRay(config.trainer.v1.trainer_mode)

    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", reached)
    inits = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append((a, k)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def call(*overrides: str) -> BaseException:
        with pytest.raises(BaseException) as info:
            main_ppo.run(_compose(*overrides, tmp_path=tmp_path))
        assert not inits, "ray.init was called"
        return info.value

    return call


@pytest.mark.parametrize("role", [None, "main", "sub"])
def test_role_picks_the_registered_class(role):
    mode = trainer_mode(role, "multi_agent")
    assert mode == TRAINER_MODES[role]
    assert trainer_mode(role, mode) == mode  # the role's own mode, set explicitly, is kept
    cls = get_trainer_cls(mode)
    assert cls is CLASSES[role] and cls.ROLE == role
    assert "__new__" not in vars(MultiAgentTrainer)


@pytest.mark.parametrize("first", ["verl.trainer.ppo.v1", "mgrpo_verl.trainer.per_agent", "mgrpo_verl.agent_loops.sub_service"])
def test_the_plugin_registers_every_mode_in_a_fresh_process(first):
    """As in a Ray worker: ``import verl`` (our ``verl.plugins`` entry point), then a first module: verl's v1
    trainer package (verl's task runner imports it to look the mode up), or one of ours that imports that
    package half-way through its own import (a worker unpickling one of per_agent's functions, the sub-agent
    service's actor). That import succeeds and the three modes are registered."""
    code = (f"import json, verl, {first}\n"
            "from verl.trainer.ppo.v1 import get_trainer_cls\n"
            f"print(json.dumps({{m: get_trainer_cls(m).__name__ for m in {list(TRAINER_MODES.values())!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    names = json.loads(out.stdout.strip().splitlines()[-1])
    assert names == {TRAINER_MODES[role]: cls.__name__ for role, cls in CLASSES.items()}


@pytest.mark.parametrize("role", [None, "main", "sub"])
def test_a_mode_that_contradicts_the_role_is_refused(role):
    """Accepted: "multi_agent" (the YAML's: the role picks) and the role's own mode; any other is refused."""
    for other in [m for m in TRAINER_MODES.values() if m not in ("multi_agent", TRAINER_MODES[role])] + ["sync"]:
        with pytest.raises(ValueError, match=rf"trainer.v1.trainer_mode='{other}' contradicts multi_agent.decoupled.role"):
            trainer_mode(role, other)


@pytest.mark.parametrize("role", [None, "main", "sub"])
def test_main_ppo_sets_the_role_s_mode_before_ray(run, tmp_path, role):
    err = run(*_side(role, tmp_path))
    assert isinstance(err, ReachedRay), err
    assert err.mode == TRAINER_MODES[role]
    assert get_trainer_cls(err.mode) is CLASSES[role]


@pytest.mark.parametrize("role, mode", [("main", "mgrpo_decoupled_sub"), (None, "mgrpo_decoupled_main"), ("sub", "sync")])
def test_main_ppo_refuses_a_contradicting_mode_before_ray(run, tmp_path, role, mode):
    err = run(*_side(role, tmp_path), f"trainer.v1.trainer_mode={mode}")
    assert isinstance(err, ValueError), err
    assert "trainer.v1.trainer_mode" in str(err) and mode in str(err), err


@pytest.mark.parametrize("cls, role", [(DecoupledSubTrainer, "main"), (DecoupledMainTrainer, None), (MultiAgentTrainer, "sub")])
def test_a_trainer_class_refuses_a_role_it_does_not_run(tmp_path, cls, role):
    """Reached only by bypassing main_ppo (e.g. verl's own entry point with our YAML): the class verl's
    registry picked must run the configured role."""
    config = _compose(*_side(role, tmp_path), tmp_path=tmp_path)
    with pytest.raises(ValueError, match=rf"runs multi_agent.decoupled.role={cls.ROLE!r}, but the role is {role!r}"):
        cls(config)


def test_the_old_name_of_the_mode_is_refused_with_its_new_name():
    """``mgrpo`` was the synchronous mode's name until it was renamed (it runs MAGRPO too)."""
    with pytest.raises(ValueError, match="trainer.v1.trainer_mode=mgrpo was renamed multi_agent"):
        trainer_mode(None, "mgrpo")
