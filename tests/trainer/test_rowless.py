"""The trainer's count of consecutive steps without rows per trainable agent (mgrpo_verl/trainer/rowless.py), and
what ``MultiAgentTrainer._train_models`` prints and writes with it (issue 31)."""

from __future__ import annotations

import sys
from pathlib import Path

from mgrpo_verl.trainer.rowless import WARN_AFTER, RowlessSteps


def test_warns_from_the_third_step_in_a_row_each_step_and_resets_when_the_agent_trains():
    counter = RowlessSteps(main="main")
    plays = {"sub": ("sub",)}
    seen = [counter.observe(step, ["sub"], ["main"], plays) for step in (1, 2, 3, 4)]
    assert WARN_AFTER == 3 and seen[0] == seen[1] == []
    assert len(seen[2]) == len(seen[3]) == 1
    third, fourth = seen[2][0], seen[3][0]
    assert "trainable agent 'sub' got no rows for 3 steps in a row (step 3)" in third
    assert "for 4 steps in a row (step 4)" in fourth
    for text in ("never called", "no ask_sub call was parsed", "'main' never asked it", "tool/ask_sub", "delegation metrics"):
        assert text in third, text
    # a step where it trains resets the streak: two more steps without rows are quiet again
    assert counter.observe(5, [], ["main", "sub"], plays) == []
    assert counter.observe(6, ["sub"], ["main"], plays) == counter.observe(7, ["sub"], ["main"], plays) == []
    assert counter.observe(8, ["sub"], ["main"], plays) != []


def test_agents_are_counted_apart_and_the_main_agent_gets_another_cause():
    counter = RowlessSteps(main="planner")
    for step in (1, 2):
        assert counter.observe(step, ["alice", "bob"], [], {}) == []
    counter.observe(3, ["bob"], ["alice"], {})  # alice trained: its streak restarts
    warnings = counter.observe(4, ["alice", "bob", "planner"], [], {"planner": ("planner",)})
    assert len(warnings) == 1 and "'bob' got no rows for 4 steps" in warnings[0] and "ask_bob" in warnings[0]
    for step in (5, 6):
        warnings = counter.observe(step, ["planner"], [], {"planner": ("planner",)})
    assert any("'planner' got no rows for 3 steps" in w and "no rollout of its model was sampled" in w for w in warnings)


def test_the_trainer_writes_skipped_every_step_and_prints_the_warning(capsys):
    """The real ``_train_models`` (fakes of TransferQueue and the worker groups, benchmarks/fake_step.py): a
    trainable model without rows gets skipped 1.0, the others 0.0; its third such step prints the warning."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from fake_step import FakeTransferQueue, FakeWorkerGroup, make_trainer, write_step

    counter = None
    for step in (1, 2, 3):  # a fresh store and fakes each step; the trainer's counter carries over
        store = FakeTransferQueue()
        with store.installed():
            groups = {name: FakeWorkerGroup(name, store, scale=1.0) for name in ("main", "sub", "idle")}
            trainer = make_trainer(groups)
            if counter is not None:
                trainer.rowless_steps = counter
            trainer.global_steps = step
            batch, table, updates = write_step(store, ["main", "sub"], seed=step)
            metrics = {}
            trainer._train_models(batch, table, updates, metrics, {})
            counter = trainer.rowless_steps
        assert {k: v for k, v in metrics.items() if k.endswith("/skipped")} == {
            "agent/main/skipped": 0.0, "agent/sub/skipped": 0.0, "agent/idle/skipped": 1.0}
        assert not groups["idle"].calls and groups["sub"].calls
        out = capsys.readouterr().out
        assert ("trainable agent 'idle' got no rows for 3 steps in a row (step 3)" in out) == (step == 3), out
