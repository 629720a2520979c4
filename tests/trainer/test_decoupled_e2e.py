"""Decoupled M-GRPO end to end on CPU: the sub side and the main side of the relay task as two
``python -m mgrpo_verl.main_ppo`` processes (each with its own Ray cluster, here a simulated single-node one per
side), sharing only a SQLite store: conftest.py's ``decoupled_on_two_machines``, whose placement
test_multinode_e2e.py checks.

Setup: B = 4 queries x n = 4 rollouts per step, 2 steps, D_max = 2; the main side validates before
training and after step 2 (its calls reach the sub side, which must keep no row of them).

Both sides score with the dense scorer of e2e.py (the relay reward is 0 for nearly every answer of a random
tiny model: every group tied and the sub side's gradient was 0, which the suite saw under load).

Checked:
- both processes exit 0; the sub side served the main side's calls, validation calls included;
- the main side trains 16 main rows per step and no sub rows; the sub side trains D_max rows per main
  rollout of every query that called it (16 x D_max = 32 when all 4 queries did), with finite losses and
  a non-zero gradient;
- the store holds one record per main trajectory (32) and one per trained sub row; the sub rows trained
  at step k are exactly the calls the main records of step k list (nothing lost, nothing extra:
  0 missing, 0 unclaimed);
- the advantage each sub row was trained with equals the synchronous M-GRPO advantage recomputed from the
  store alone (``scalar_advantages`` over the step's main and sub records, as one synchronous batch);
- every trained row is marked consumed, once.
"""

from __future__ import annotations

import math

import pytest
from e2e import DECOUPLED_D_MAX as D_MAX
from e2e import DECOUPLED_STEPS as STEPS
from e2e import MAIN_ROWS, by_step, store_records

from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.store import open_store
from mgrpo_verl.trainer.rows import build_row_table, scalar_advantages

pytestmark = pytest.mark.slow


def test_two_processes_train_and_exchange_only_statistics(decoupled_on_two_machines):
    d = decoupled_on_two_machines
    assert d.main.returncode == 0, d.main.log[-4000:]
    assert d.sub.returncode == 0, d.sub.log[-4000:]
    assert f"served at http://127.0.0.1:{d.port}" in d.sub.log
    done = next(line for line in d.sub.log.splitlines() if "sub side of 'sub' done" in line)
    served, validation = (int(done.split(f"{word} ")[1].split(",")[0]) for word in ("calls served", "validation"))
    assert served > 0 and validation > 0, done  # validation calls were answered, and kept no row (below)

    main_m, sub_m = by_step(d.main.metrics), by_step(d.sub.metrics)
    for step in range(1, STEPS + 1):
        assert main_m[step]["agent/main/update_rows"] == MAIN_ROWS
        assert not any(k.startswith("agent/sub/") for k in main_m[step])
        s = sub_m[step]
        assert math.isfinite(s["agent/sub/actor/pg_loss"])
        assert s["decoupled/missing_parent_rows"] == 0 and s["decoupled/unclaimed_rows"] == 0
    assert max(sub_m[step]["agent/sub/actor/grad_norm"] for step in range(1, STEPS + 1)) > 0
    assert "val-core/mgrpo_verl/relay/acc/mean@1" in main_m[STEPS]

    records = store_records(d.store_db)
    mains = [r for r in records.values() if r.parent_traj_id == ""]
    subs = [r for r in records.values() if r.parent_traj_id != ""]
    assert len(mains) == MAIN_ROWS * STEPS
    for step in range(1, STEPS + 1):
        listed = {t for m in mains if m.step == step for t in m.extra["sub_calls"]}
        trained = {r.traj_id for r in subs if r.step == step}
        assert trained == listed, f"step {step}"
        assert sub_m[step]["decoupled/ready_rows"] == len(listed)
        # D_max aligned slots per main rollout of every query that called the sub-agent at least once: a query
        # whose 4 rollouts made no call (min_calls is 0) never reaches the sub side, so its zero-mask padding
        # rows are absent (the one stated difference from the synchronous mode, docs/decoupled.md)
        reached = {m.uid for m in mains if m.step == step and m.extra["sub_calls"]}
        assert sub_m[step]["agent/sub/update_rows"] == D_MAX * sum(m.step == step and m.uid in reached for m in mains)

        # the synchronous computation on the step's records, as one batch
        step_rows = [m for m in mains if m.step == step] + [r for r in subs if r.step == step]
        table = build_row_table(
            [f"{r.uid}_{i}_0" for i, r in enumerate(step_rows)], [r.uid for r in step_rows],
            [{"mgrpo": {"agent": r.agent, "traj_id": r.traj_id, "parent_traj_id": r.parent_traj_id, "score": r.score}}
             for r in step_rows],
        )
        expected = scalar_advantages(table, "mgrpo", MGRPOConfig(sub_reward_local_weight=0.5, sub_reward_main_weight=0.5))
        for i, r in enumerate(step_rows):
            if r.parent_traj_id:
                assert r.extra["advantage"] == pytest.approx(expected[i], abs=1e-9), r.traj_id

    with open_store(f"sqlite:///{d.store_db}") as store:
        assert store.consumed("sub:sub", [r.traj_id for r in subs]) == {r.traj_id for r in subs}
