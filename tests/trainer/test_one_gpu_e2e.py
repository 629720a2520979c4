"""End to end on CPU: two agents, each with its own model, on ONE logical GPU (``multi_agent.placement=shared``).

``python -m mgrpo_verl.main_ppo`` with ``trainer.n_gpus_per_node=1``: the main agent's and the sub-agent's
actor / rollout worker groups share one resource pool (one placement group, one bundle, one logical GPU),
both models train 2 steps, and each rollout server receives its own model's weights after every step.
Where the workers sit is read from the trainer's ``mgrpo placement:`` lines, which each worker answers
from inside (its Ray placement group and GPU ids). The pre-flight memory estimate runs with
``multi_agent.gpu_memory_gb=80`` and prints its summary.

A second test checks a frozen sub-agent on the shared GPU, on a run it shares with test_multi_agent_e2e.py
(conftest.py's ``frozen_sub_on_one_gpu``).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import pytest
from e2e import MGRPO_CONFIG, dense_scorer, synced

pytestmark = pytest.mark.slow

PLACEMENT = re.compile(r"mgrpo placement: agent (\S+) rank (\d+) pool (\S+) placement_group (\S+) bundle (\d+) gpus (\S*)")


@pytest.mark.full  # placement=shared trains end to end in CI through frozen_sub_on_one_gpu (main updates on the shared GPU)
def test_two_agents_train_on_one_gpu(main_ppo, tmp_path):
    run = main_ppo(
        "one_gpu",
        "trainer.n_gpus_per_node=1",
        "multi_agent.placement=shared",
        "multi_agent.gpu_memory_gb=80",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "multi_agent.agents.sub.actor_rollout_ref.model.path=${mgrpo_model:tiny_small}",
        "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}",
        "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true",
        f"multi_agent.delegation.scorer={dense_scorer(tmp_path)}",
        config=MGRPO_CONFIG,
    )
    assert run.returncode == 0, run.log[-6000:]
    assert run.steps() == [1, 2]

    # both worker groups in the one shared pool: the same placement group, bundle 0, the same logical GPU
    placed = defaultdict(list)
    for agent, rank, pool, group, bundle, gpus in PLACEMENT.findall(run.log):
        placed[agent].append((int(rank), pool, group, int(bundle), gpus))
    assert set(placed) == {"main", "sub"}, run.log[-4000:]
    assert placed["main"] == [(0, "agents_shared", placed["main"][0][2], 0, "0")]
    assert placed["sub"] == placed["main"]
    assert placed["main"][0][2] != "none"

    # both models update at every step, one after the other (they share the GPU)
    for step in (1, 2):
        m = run.at(step)
        assert m["mgrpo/concurrent_updates"] == 0.0
        for agent in ("main", "sub"):
            assert m[f"agent/{agent}/update_rows"] > 0
            assert math.isfinite(m[f"agent/{agent}/actor/pg_loss"])
            assert m[f"agent/{agent}/actor/grad_norm"] > 0

    # each agent's server (replica ranks 0 and 1, both on the one GPU) got its own model's new weights
    for replica in (0, 1):
        syncs = synced(run.log, replica)
        assert [step for step, _ in syncs] == [0, 1, 2], syncs
        assert len({fp for _, fp in syncs}) == 3, syncs
    assert set(synced(run.log, 0)).isdisjoint(synced(run.log, 1))

    # the pre-flight estimate ran (tiny models: far below 80 GB)
    assert re.search(r"mgrpo memory estimate: peak [\d.]+ GB of 80 GB per GPU \(the shared GPUs", run.log), run.log[-3000:]


def test_frozen_sub_agent_on_one_gpu(frozen_sub_on_one_gpu):
    """A frozen sub-agent on the shared GPU (conftest.py's ``frozen_sub_on_one_gpu``, also checked by
    test_multi_agent_e2e.py): its engine keeps the initial weights and keeps answering, its actor is moved off the
    GPU after the first sync (verl's offload, called by the trainer), the main model trains."""
    run = frozen_sub_on_one_gpu
    assert run.returncode == 0, run.log[-6000:]
    m = run.at(1)
    assert m["agent/main/update_rows"] > 0 and not any(k.startswith("agent/sub/actor/") for k in m)
    assert m["agent/sub/rows"] > 0  # the frozen model still answers the main agent
    assert [s for s, _ in synced(run.log, 1)] == [0]
    assert [s for s, _ in synced(run.log, 0)] == [0, 1]
    pools = {agent: pool for agent, _, pool, *_ in PLACEMENT.findall(run.log)}
    assert pools == {"main": "agents_shared", "sub": "agents_shared"}
    assert "mgrpo memory estimate skipped: no GPU visible and multi_agent.gpu_memory_gb is null" in run.log
