"""Resuming into a finished run is refused before Ray (issue 31): with ``trainer.resume_mode=auto`` (or
``resume_path``) and a complete checkpoint at a step >= ``trainer.total_training_steps``, verl's loop would end at
once (``0 steps ... nan -> nan``, exit 0). ``mgrpo_verl.main_ppo.run`` refuses it in the pre-flight
(``preflight.check_finished_run``, with the trainer's own rule ``checkpoints.resume_folder``), naming the keys, the
step and what to do. Composed and run as in ``test_fail_fast.py`` (verl's ``run_ppo`` replaced by a sentinel,
``ray.init`` recorded: never called); the checkpoints are written by hand in the trainer's layout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import ray
from hydra import compose, initialize_config_module

import verl.trainer.main_ppo

from mgrpo_verl import main_ppo
from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.trainer import checkpoints as ckpt

register_resolvers()


class ReachedRay(Exception):
    """verl's run_ppo was called: every check before Ray passed."""


@pytest.fixture
def run(monkeypatch, tmp_path):
    """``run(*overrides)``: compose ``mgrpo_trainer`` (task relay, agents main + sub, checkpoints in
    ``tmp_path/ckpt``) and run it; returns what it raised (``ReachedRay``: every check passed)."""
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", lambda *a, **k: (_ for _ in ()).throw(ReachedRay()))
    inits = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append((a, k)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def call(*overrides: str, name: str = "mgrpo_trainer") -> BaseException:
        task = ["task=relay"] if name == "mgrpo_trainer" else []
        with initialize_config_module("mgrpo_verl.config", version_base=None):
            config = compose(name, overrides=[*task, f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides])
        with pytest.raises(BaseException) as info:
            main_ppo.run(config)
        assert not inits, "the run called ray.init before refusing"
        return info.value

    return call


def save_checkpoint(root: Path, step: int, agents=("main", "sub"), complete: bool = True) -> Path:
    """A step folder as ``MultiAgentTrainer._save_checkpoint`` leaves it (actors, data.pt, agents.json, marker,
    tracker); ``complete=False``: a save cut short (no marker, no data.pt)."""
    folder = Path(ckpt.step_dir(str(root), step))
    for agent in agents:
        (folder / ckpt.actor_subdir(agent)).mkdir(parents=True)
    (folder / ckpt.MANIFEST).write_text(json.dumps({a: {"trainable": True} for a in agents}))
    if complete:
        (folder / ckpt.DATA).write_bytes(b"")
        ckpt.write_marker(str(folder), step, list(agents))
        ckpt.write_atomic(os.path.join(root, ckpt.TRACKER), str(step))
    return folder


@pytest.mark.parametrize("total", [3, 2])
def test_auto_resume_into_a_finished_run_is_refused_before_ray(run, tmp_path, total):
    save_checkpoint(tmp_path / "ckpt", 3)
    err = run(f"trainer.total_training_steps={total}")
    assert isinstance(err, ValueError), repr(err)
    message = str(err)
    for text in ("trainer.resume_mode=auto", f"trainer.default_local_dir={tmp_path / 'ckpt'}", "at step 3",
                 f"trainer.total_training_steps={total}", "train 0 steps", "larger than 3",
                 "another trainer.default_local_dir", "trainer.resume_mode=disable", "global_step_3"):
        assert text in message, (text, message)


def test_resume_path_into_a_finished_run_is_refused(run, tmp_path):
    folder = save_checkpoint(tmp_path / "ckpt", 4)
    err = run("trainer.total_training_steps=4", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}")
    assert isinstance(err, ValueError) and f"trainer.resume_from_path={folder}" in str(err) and "at step 4" in str(err)


@pytest.mark.parametrize("overrides", [
    ("trainer.total_training_steps=4",),  # step 3 of 4: a run to continue
    ("trainer.total_training_steps=3", "trainer.resume_mode=disable"),  # a new run from the base models
])
def test_a_run_with_steps_left_or_no_resume_reaches_ray(run, tmp_path, overrides):
    save_checkpoint(tmp_path / "ckpt", 3)
    assert isinstance(run(*overrides), ReachedRay)


def test_an_empty_checkpoint_folder_reaches_ray(run):
    assert isinstance(run("trainer.total_training_steps=1"), ReachedRay)


def test_only_incomplete_checkpoints_are_refused_before_ray_with_the_trainers_message(run, tmp_path):
    """The trainer would raise this inside Ray (``choose_auto``): now before it."""
    save_checkpoint(tmp_path / "ckpt", 2, complete=False)
    err = run("trainer.total_training_steps=5")
    assert isinstance(err, ValueError) and "no complete checkpoint" in str(err) and "trainer.resume_mode=disable" in str(err)


def test_a_single_model_run_uses_verls_rule(run, tmp_path):
    """``--config-name single_agent`` (verl's trainer): the folder verl's tracker names, verl's layout."""
    root = tmp_path / "ckpt"
    (root / "global_step_5" / "actor").mkdir(parents=True)
    (root / ckpt.TRACKER).write_text("5")
    err = run("trainer.total_training_steps=5", name="single_agent")
    assert isinstance(err, ValueError) and "at step 5" in str(err), repr(err)
    assert isinstance(run("trainer.total_training_steps=6", name="single_agent"), ReachedRay)


def test_validating_a_finished_runs_checkpoint_passes(run, tmp_path):
    """``trainer.val_only``: an evaluation (``experiments/research_eval.py`` resumes each system's last checkpoint with
    the run's own step count) trains nothing, so a finished run is what it should load; refused before the fix with
    the "train 0 steps" error above, which broke ``recipes/research_baselines.sh`` at its first evaluation."""
    folder = save_checkpoint(tmp_path / "ckpt", 4)
    err = run("trainer.total_training_steps=4", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={folder}",
              "trainer.val_only=true")
    assert isinstance(err, ReachedRay), repr(err)
