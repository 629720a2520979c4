"""Decoupled M-GRPO end to end on CPU: the sub side and the main side of the relay task as two
``python -m mgrpo_verl.main_ppo`` processes (each with its own Ray cluster), sharing only a SQLite store.

Setup: B = 4 queries x n = 4 rollouts per step, 2 steps, D_max = 2; the main side validates before
training and after step 2 (its calls reach the sub side, which must keep no row of them).

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

import json
import math
import os
import socket
import subprocess
import sys
from collections import defaultdict

import pytest

from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.store import open_store
from mgrpo_verl.trainer.rows import build_row_table, scalar_advantages

# as tests/trainer/conftest.py: variables that steer the platform or Ray are cleared
_CLEARED = ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "RAY_ADDRESS", "VERL_FILE_LOGGER_PATH")

pytestmark = pytest.mark.slow

STEPS, D_MAX = 2, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(path) -> dict[int, dict]:
    merged: dict[int, dict] = defaultdict(dict)
    for line in path.read_text().splitlines():
        record = json.loads(line)
        merged[record["step"]].update(record["data"])
    return merged


def test_two_processes_train_and_exchange_only_statistics(tmp_path):
    port = _free_port()
    store_url = f"sqlite:///{tmp_path / 'stats.db'}"
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(HOME=str(tmp_path / "home"), MGRPO_VERL_CACHE=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    (tmp_path / "home").mkdir()
    common = [f"multi_agent.decoupled.store={store_url}", f"trainer.total_training_steps={STEPS}",
              "trainer.n_gpus_per_node=1", f"multi_agent.d_max={D_MAX}"]

    def start(side: str, *overrides: str) -> subprocess.Popen:
        out = tmp_path / side
        out.mkdir()
        args = [sys.executable, "-m", "mgrpo_verl.main_ppo", f"multi_agent.decoupled.role={side}",
                f"trainer.default_local_dir={out / 'ckpt'}", f"mgrpo_verl.metrics_file={out / 'metrics.jsonl'}",
                *common, *overrides]
        return subprocess.Popen(args, cwd=out, env=env, stdout=open(out / "log.txt", "w"), stderr=subprocess.STDOUT)

    # the sub side is built first (the model is cached then), the main side waits for its /health
    sub = start("sub", f"multi_agent.decoupled.serve_port={port}", "trainer.val_before_train=false", "trainer.test_freq=-1")
    main = start("main", f"multi_agent.decoupled.sub_urls.sub=http://127.0.0.1:{port}", f"trainer.test_freq={STEPS}")
    try:
        main_rc = main.wait(timeout=1500)
        sub_rc = sub.wait(timeout=300)
    finally:
        for proc in (main, sub):
            if proc.poll() is None:
                proc.kill()
    main_log, sub_log = ((tmp_path / side / "log.txt").read_text() for side in ("main", "sub"))
    assert main_rc == 0, main_log[-4000:]
    assert sub_rc == 0, sub_log[-4000:]
    assert f"served at http://127.0.0.1:{port}" in sub_log
    done = next(line for line in sub_log.splitlines() if "sub side of 'sub' done" in line)
    served, validation = (int(done.split(f"{word} ")[1].split(",")[0]) for word in ("calls served", "validation"))
    assert served > 0 and validation > 0, done  # validation calls were answered, and kept no row (below)

    main_m, sub_m = _metrics(tmp_path / "main" / "metrics.jsonl"), _metrics(tmp_path / "sub" / "metrics.jsonl")
    for step in range(1, STEPS + 1):
        assert main_m[step]["agent/main/update_rows"] == 16
        assert not any(k.startswith("agent/sub/") for k in main_m[step])
        s = sub_m[step]
        assert math.isfinite(s["agent/sub/actor/pg_loss"])
        assert s["decoupled/missing_parent_rows"] == 0 and s["decoupled/unclaimed_rows"] == 0
    assert max(sub_m[step]["agent/sub/actor/grad_norm"] for step in range(1, STEPS + 1)) > 0
    assert "val-core/mgrpo_verl/relay/acc/mean@1" in main_m[STEPS]

    with open_store(store_url) as store:
        records = store.get(_all_ids(tmp_path / "stats.db"))
    mains = [r for r in records.values() if r.parent_traj_id == ""]
    subs = [r for r in records.values() if r.parent_traj_id != ""]
    assert len(mains) == 16 * STEPS
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

    with open_store(store_url) as store:
        assert store.consumed("sub:sub", [r.traj_id for r in subs]) == {r.traj_id for r in subs}


def _all_ids(db_path) -> list[str]:
    """Every traj_id in the SQLite store (the store API reads by id; the test lists them from the file)."""
    import sqlite3

    with sqlite3.connect(db_path) as conn:
        return [row[0] for row in conn.execute("SELECT traj_id FROM stats")]
