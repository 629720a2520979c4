"""End to end on CPU: ``python -m mgrpo_verl.main_ppo`` (its default config) trains two models.

Two tiny random Qwen2 of different sizes (main: 2 layers, width 64; sub: 1 layer, width 32) on the relay task, each with its own FSDP2 actor, its
own Hugging Face rollout server and its own weight sync. Four runs (each pays ~60-90 s of start-up):

1. joint M-GRPO, 2 steps, validation before training and after step 2, a checkpoint per step;
2. the same command to step 3: resumes from ``global_step_2`` and runs step 3 only;
3. frozen sub-agent, 1 step: the main model updates, the sub model never does;
4. single-agent baseline (``share_model_with: main``, GRPO), 1 step: one model plays both roles.

The relay task's own reward is zero for nearly every answer of a random model; the runs use a dense test
scorer (vowel share) so that step 1 already has non-zero advantages for both agents.
"""

from __future__ import annotations

import json
from pathlib import Path
from functools import partial
import math
import re

import pytest

pytestmark = pytest.mark.slow

CONFIG = "mgrpo_trainer"  # the default, named so that the test does not depend on it staying the default

DENSE_SCORER = """
def score(role, text, ground_truth):
    return sum(c in "aeiouAEIOU" for c in text[:16]) / 16
"""

COMMON = (
    "trainer.test_freq=2",
    # a KL loss against each model's own reference policy (the per-agent reference path)
    "actor_rollout_ref.actor.use_kl_loss=true",
    # the sub-agent is a smaller architecture than the main agent (1 layer, width 32 vs 2 layers, 64)
    "multi_agent.agents.sub.actor_rollout_ref.model.path=${mgrpo_model:tiny_small}",
    # every tiny model shares one tokenizer: the main agent's
    "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}",
    "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true",
)

# B = 4 prompts x n = 4 rollouts per step
MAIN_ROWS = 16


def _synced(log: str, replica: int) -> list[tuple[int, str]]:
    """(global step, fingerprint) of every weight sync the rollout server of ``replica`` logged."""
    pattern = rf"HF rollout replica {replica}: .*global_steps=(\S+), fingerprint=(\w+)"
    return [(int(step), fp) for step, fp in re.findall(pattern, log)]


def test_two_models_train_checkpoint_resume_frozen_and_single(main_ppo, tmp_path):
    scorer = tmp_path / "dense_scorer.py"
    scorer.write_text(DENSE_SCORER)
    common = (*COMMON, f"multi_agent.delegation.scorer={scorer}:score")
    run = partial(main_ppo, config=CONFIG)

    first = run("joint", "trainer.total_training_steps=2", "trainer.save_freq=1", *common)
    assert first.returncode == 0, first.log[-6000:]
    assert first.steps() == [1, 2]
    summary = [line for line in first.log.splitlines() if line.startswith("mgrpo_verl: ")]
    assert summary and "train reward (agent/main/score/mean)" in summary[-1], summary
    assert any(k.startswith("val-core/") for k in first.at(0)) and any(k.startswith("val-core/") for k in first.at(2))
    for step in (1, 2):
        m = first.at(step)
        d_max = m["mgrpo/align/sub/d_max"]
        assert d_max >= 1
        assert m["agent/main/rows"] == MAIN_ROWS
        assert m["agent/main/update_rows"] == MAIN_ROWS
        # the sub-agent trains on exactly D_max rows per main rollout, whatever the calls were
        assert m["agent/sub/update_rows"] == MAIN_ROWS * d_max
        for agent in ("main", "sub"):
            assert math.isfinite(m[f"agent/{agent}/actor/pg_loss"])
            assert m[f"agent/{agent}/actor/grad_norm"] > 0  # the dense scorer gives a learning signal
            assert m[f"agent/{agent}/training/rollout_probs_diff_max"] < 1e-3
            assert m[f"agent/{agent}/advantages/std"] > 0
            assert math.isfinite(m[f"agent/{agent}/actor/kl_loss"])
    assert first.at(1)["agent/sub/calls_per_rollout/max"] <= 3

    # each agent has its own rollout server (replica ranks 0 and 1), and after every step each server
    # received new weights from its own actor
    assert "hf_server_0_0" in first.log and "hf_server_1_0" in first.log
    for replica in (0, 1):
        synced = _synced(first.log, replica)
        assert [step for step, _ in synced] == [0, 1, 2], synced
        assert len({fp for _, fp in synced}) == 3, synced  # the weights changed at every step
    assert set(_synced(first.log, 0)).isdisjoint(_synced(first.log, 1))  # two different models

    ckpt = main_ppo.checkpoints
    for step in (1, 2):
        for agent in ("main", "sub"):
            assert (ckpt / f"global_step_{step}" / "agents" / agent / "actor").is_dir()
    manifest = json.loads((ckpt / "global_step_2" / "agents.json").read_text())
    assert manifest["main"]["trainable"] and manifest["sub"]["trainable"]
    sizes = {a: json.loads((Path(manifest[a]["model"]) / "config.json").read_text()) for a in ("main", "sub")}
    assert (sizes["main"]["num_hidden_layers"], sizes["sub"]["num_hidden_layers"]) == (2, 1)
    assert (sizes["main"]["hidden_size"], sizes["sub"]["hidden_size"]) == (64, 32)

    # resume: continues at step 3 with both models' weights as saved at step 2 (the first sync of the
    # resumed run pushes exactly what the first run's servers held after step 2)
    second = run("resume", "trainer.total_training_steps=3", "trainer.save_freq=1", *common)
    assert second.returncode == 0, second.log[-6000:]
    assert second.steps() == [3]
    for replica in (0, 1):
        assert _synced(second.log, replica)[0][1] == _synced(first.log, replica)[-1][1]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"

    # frozen sub-agent: only the main model is updated and synced
    frozen = run(
        "frozen", "trainer.total_training_steps=1", "trainer.resume_mode=disable",
        "trainer.val_before_train=false", "multi_agent.agents.sub.trainable=false", *common,
    )
    assert frozen.returncode == 0, frozen.log[-6000:]
    m = frozen.at(1)
    assert "agent/main/actor/pg_loss" in m and not any(k.startswith("agent/sub/actor/") for k in m)
    assert "agent/main/actor/kl_loss" in m
    assert m["agent/sub/rows"] > 0  # the frozen model still answers the main agent
    assert [s for s, _ in _synced(frozen.log, 1)] == [0]  # initial weights only
    assert [s for s, _ in _synced(frozen.log, 0)] == [0, 1]

    # single-agent baseline: one model (one server) plays both roles and trains on all rows
    single = run(
        "single", "trainer.total_training_steps=1", "trainer.resume_mode=disable",
        "trainer.val_before_train=false", "trainer.n_gpus_per_node=1", "multi_agent.algorithm=grpo",
        "multi_agent.agents.sub.share_model_with=main", *common,
    )
    assert single.returncode == 0, single.log[-6000:]
    m = single.at(1)
    assert "hf_server_1_0" not in single.log
    assert m["agent/main/update_rows"] == MAIN_ROWS * (1 + m["mgrpo/align/sub/d_max"])
    assert m["agent/sub/rows"] > 0
