"""End to end on CPU: ``python -m mgrpo_verl.main_ppo`` (its default config) trains two models.

Two tiny random Qwen2 of different sizes (main: 2 layers, width 64; sub: 1 layer, width 32) on the relay task, each
with its own FSDP2 actor, its own Hugging Face rollout server and its own weight sync. Five runs (each pays ~60-90 s
of start-up), two of them shared with other test files (session fixtures of conftest.py):

1. joint M-GRPO, 2 steps, validation before training and after step 2, a checkpoint per step (``two_agent_job``:
   run on a simulated two-node cluster, one agent per node; test_multinode_e2e.py checks the placement);
2. the same command to step 3, on this machine's own Ray: resumes from ``global_step_2`` and runs step 3 only
   (marked full: test_lora_e2e.py resumes two agents' checkpoints in CI);
3. frozen sub-agent, 1 step: the main model updates, the sub model never does (``frozen_sub_on_one_gpu``: the two
   models share one logical GPU; test_one_gpu_e2e.py checks that side);
4. single-agent baseline (``share_model_with: main``, GRPO), 1 step: one model plays both roles.
5. run 1's command again on this machine's own Ray: it must train identically (trajectory seeds, trajectory order).

The relay task's own reward is zero for nearly every answer of a random model; the runs use a dense test
scorer (vowel share) so that step 1 already has non-zero advantages for both agents.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from e2e import MAIN_ROWS, MGRPO_CONFIG, TWO_MODELS, dense_scorer, synced

pytestmark = pytest.mark.slow


def test_two_models_train_and_checkpoint(two_agent_job):
    first = two_agent_job.run
    assert first.returncode == 0, first.log[-6000:]
    assert first.steps() == [1, 2]
    summary = [line for line in first.log.splitlines() if line.startswith("mgrpo_verl: ")]
    assert summary and "train reward (agent/main/score/mean)" in summary[-1], summary
    assert [line.split()[2] for line in summary if line.startswith("mgrpo_verl: step ")] == ["1/2", "2/2"], summary
    # the config is parsed into a plan twice: by the driver's checks, then by the trainer, here in the driver too
    # (mgrpo_verl.trainer_in_driver, the CPU default): no TaskRunner actor
    plans = [line for line in first.log.splitlines() if "mgrpo plan: trainer mode multi_agent" in line]
    assert len(plans) == 2 and all(p.startswith("mgrpo plan: ") for p in plans), plans
    assert "(TaskRunnerV1 pid=" not in first.log
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
        syncs = synced(first.log, replica)
        assert [step for step, _ in syncs] == [0, 1, 2], syncs
        assert len({fp for _, fp in syncs}) == 3, syncs  # the weights changed at every step
    assert set(synced(first.log, 0)).isdisjoint(synced(first.log, 1))  # two different models

    main_ppo = two_agent_job.main_ppo
    ckpt = main_ppo.checkpoints
    for step in (1, 2):
        for agent in ("main", "sub"):
            assert (ckpt / f"global_step_{step}" / "agents" / agent / "actor").is_dir()
    manifest = json.loads((ckpt / "global_step_2" / "agents.json").read_text())
    assert manifest["main"]["trainable"] and manifest["sub"]["trainable"]
    sizes = {a: json.loads((Path(manifest[a]["model"]) / "config.json").read_text()) for a in ("main", "sub")}
    assert (sizes["main"]["num_hidden_layers"], sizes["sub"]["num_hidden_layers"]) == (2, 1)
    assert (sizes["main"]["hidden_size"], sizes["sub"]["hidden_size"]) == (64, 32)


def test_the_same_command_trains_identically_on_another_layout(two_agent_job):
    """Reproducibility (multi_agent.trajectory_seeds, auto: on with the HF rollout; rows in trajectory order): the
    command of ``two_agent_job`` again, on this machine's own Ray instead of the two-node cluster (other processes,
    other timing, other arrival order at the servers), trains the same: every logged metric but time, memory and the
    servers' log-prob rounding equal at every step (``reproduce.first_difference``), and both servers hold weights of
    the same fingerprint after every sync. Before trajectory seeds two runs of one command differed from step 1."""
    from e2e import reaped

    from mgrpo_verl.experiments.reproduce import first_difference

    first, main_ppo = two_agent_job.run, two_agent_job.main_ppo
    assert first.returncode == 0, first.log[-6000:]
    proc = main_ppo.start(
        "again", "trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.test_freq=2", *TWO_MODELS,
        f"multi_agent.delegation.scorer={two_agent_job.scorer}", config=MGRPO_CONFIG,
        checkpoints=main_ppo.root / "ckpt_again",
    )
    with reaped(proc):
        again = proc.result(900)
    assert again.returncode == 0, again.log[-6000:]
    assert again.steps() == first.steps() == [1, 2]
    assert first_difference(main_ppo.root / "joint" / "metrics.jsonl", main_ppo.root / "again" / "metrics.jsonl") is None
    for replica in (0, 1):
        assert synced(again.log, replica) == synced(first.log, replica)
        assert len({fp for _, fp in synced(again.log, replica)}) == 3  # the weights changed at each step


@pytest.mark.full  # resuming two agents' checkpoints runs end to end in CI in test_lora_e2e.py (adapters, same trainer code)
def test_two_models_resume_from_their_checkpoints(two_agent_job):
    """Resume (this machine's own Ray, no cluster to join): continues at step 3 with both models' weights as saved
    at step 2 (the first sync of the resumed run pushes exactly what the first run's servers held after step 2)."""
    first, main_ppo = two_agent_job.run, two_agent_job.main_ppo
    assert first.returncode == 0, first.log[-6000:]
    ckpt = main_ppo.checkpoints
    second = main_ppo(
        "resume", "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.test_freq=2", *TWO_MODELS,
        f"multi_agent.delegation.scorer={two_agent_job.scorer}", config=MGRPO_CONFIG,
    )
    assert second.returncode == 0, second.log[-6000:]
    assert "Connecting to existing Ray cluster" not in second.log
    assert second.steps() == [3]
    for replica in (0, 1):
        assert synced(second.log, replica)[0][1] == synced(first.log, replica)[-1][1]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"


def test_frozen_sub_agent(frozen_sub_on_one_gpu):
    """Frozen sub-agent: only the main model is updated and synced."""
    frozen = frozen_sub_on_one_gpu
    assert frozen.returncode == 0, frozen.log[-6000:]
    # mgrpo_verl.trainer_in_driver=false: verl's layout, the trainer's plan printed by its TaskRunner actor
    plans = [line for line in frozen.log.splitlines() if "mgrpo plan: trainer mode multi_agent" in line]
    assert len(plans) == 2 and plans[0].startswith("mgrpo plan: ") and "(TaskRunnerV1 pid=" in plans[1], plans
    m = frozen.at(1)
    assert "agent/main/actor/pg_loss" in m and not any(k.startswith("agent/sub/actor/") for k in m)
    assert "agent/main/actor/kl_loss" in m
    assert m["agent/sub/rows"] > 0  # the frozen model still answers the main agent
    assert [s for s, _ in synced(frozen.log, 1)] == [0]  # initial weights only
    assert [s for s, _ in synced(frozen.log, 0)] == [0, 1]


@pytest.mark.full  # one model in both roles: the same trainer path as two_agent_job, one model fewer
def test_single_agent_baseline(main_ppo, tmp_path):
    """One model (one server) plays both roles and trains on all rows."""
    single = main_ppo(
        "single", "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=2",
        "trainer.n_gpus_per_node=1", "multi_agent.algorithm=grpo", "multi_agent.agents.sub.share_model_with=main",
        *TWO_MODELS, f"multi_agent.delegation.scorer={dense_scorer(tmp_path)}", config=MGRPO_CONFIG,
    )
    assert single.returncode == 0, single.log[-6000:]
    m = single.at(1)
    assert "hf_server_1_0" not in single.log
    assert m["agent/main/update_rows"] == MAIN_ROWS * (1 + m["mgrpo/align/sub/d_max"])
    assert m["agent/sub/rows"] > 0
