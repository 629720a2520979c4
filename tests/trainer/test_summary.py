"""The final summary line of python -m mgrpo_verl.main_ppo, from a hand-written metrics file."""

from __future__ import annotations

import json

from mgrpo_verl.main_ppo import summarize, summary_line


def test_summary_reads_first_and_last_reward_and_validation(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "data": {"val-core/echo/acc/mean@1": 0.1}},  # validation before training
        {"step": 1, "data": {"critic/score/mean": 0.02, "timing_s/step": 1.0}},
        {"step": 2, "data": {"critic/score/mean": 0.30}},
        {"step": 2, "data": {"val-core/echo/acc/mean@1": 0.4}},
    ]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(metrics, 12.4)
    assert (s["steps"], s["first_step"], s["last_step"]) == (2, 1, 2)
    assert (s["train_reward_first"], s["train_reward_last"]) == (0.02, 0.30)
    assert (s["val_metric"], s["val_first"], s["val_last"]) == ("val-core/echo/acc/mean@1", 0.1, 0.4)
    assert summary_line(s) == (
        f"mgrpo_verl: 2 steps (step 1 to 2), 12 s with Ray's start-up; train reward 0.020 -> 0.300; "
        f"val-core/echo/acc/mean@1 0.100 -> 0.400; metrics {metrics}"
    )


def test_summary_without_metrics_file_says_why(tmp_path):
    line = summary_line(summarize(tmp_path / "missing.jsonl", 5.0))
    assert "no metrics file" in line and "trainer.logger" in line


def test_summary_shows_held_out_exact_accuracy_first(tmp_path):
    """A delegation run's validation reports ``exact`` (val-aux/<source>/exact/mean@n) next to the dense score
    (val-core/<source>/acc/mean@n): the summary line leads with the exact accuracy, before and after."""
    metrics = tmp_path / "metrics.jsonl"
    before = {"val-core/relay/acc/mean@1": 0.03, "val-aux/relay/exact/mean@1": 0.1, "val-aux/relay/calls/mean@1": 1.0}
    after = {"val-core/relay/acc/mean@1": 0.06, "val-aux/relay/exact/mean@1": 0.35, "val-aux/relay/calls/mean@1": 1.0}
    rows = [{"step": 0, "data": before}, {"step": 1, "data": {"critic/score/mean": 0.01}}, {"step": 1, "data": after}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(metrics, 3.0)
    assert (s["exact_metric"], s["exact_first"], s["exact_last"]) == ("val-aux/relay/exact/mean@1", 0.1, 0.35)
    assert summary_line(s) == (
        "mgrpo_verl: 1 steps (step 1 to 1), 3 s with Ray's start-up; train reward 0.010 -> 0.010; held-out exact accuracy "
        f"0.100 -> 0.350 (val-aux/relay/exact/mean@1); val-core/relay/acc/mean@1 0.030 -> 0.060; metrics {metrics}"
    )


def _train_record(step: int, **skipped: float) -> dict:
    """A multi-agent training step's record: the main agent's reward and ``agent/<name>/skipped`` per trainable agent."""
    return {"step": step, "data": {"agent/main/score/mean": 0.5, **{f"agent/{a}/skipped": v for a, v in skipped.items()}}}


def test_summary_names_a_trainable_agent_that_never_got_rows(tmp_path):
    """Issue 31: a sub-agent the main agent never asked got no rows in any step: the summary line says so."""
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "data": {"val-core/relay/acc/mean@1": 0.1}}]  # validation: no skipped key, not a step
    rows += [_train_record(step, main=0.0, sub=1.0) for step in range(1, 16)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(metrics, 30.0, "agent/main/score/mean")
    assert (s["rowless"], s["trained_steps"]) == ({"sub": 15}, 15)
    assert summary_line(s) == (
        "mgrpo_verl: 15 steps (step 1 to 15), 30 s with Ray's start-up; train reward (agent/main/score/mean) 0.500 -> 0.500; "
        f"val-core/relay/acc/mean@1 0.100 -> 0.100; agent sub got no rows in 15 of 15 steps: it never trained; "
        f"metrics {metrics}"
    )


def test_summary_counts_the_steps_each_agent_got_no_rows(tmp_path):
    """Two sub-agents: alice skipped in steps 2 and 4 of 4, bob in every step, main never; a step where an agent
    trained has skipped 0.0 (or, in files written before 0.0 was, no key: read the same)."""
    metrics = tmp_path / "metrics.jsonl"
    rows = [_train_record(1, main=0.0, alice=0.0, bob=1.0), _train_record(2, main=0.0, alice=1.0, bob=1.0),
            {"step": 3, "data": {"agent/main/score/mean": 0.5, "agent/bob/skipped": 1.0}},  # old file: no 0.0 keys
            _train_record(4, main=0.0, alice=1.0, bob=1.0)]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(metrics, 8.0, "agent/main/score/mean")
    assert (s["rowless"], s["trained_steps"]) == ({"alice": 2, "bob": 4}, 4)
    assert summary_line(s).endswith(
        f"; agent alice got no rows in 2 of 4 steps; agent bob got no rows in 4 of 4 steps: it never trained; metrics {metrics}"
    )


def test_summary_of_agents_that_always_trained_names_none(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(_train_record(step, main=0.0, sub=0.0)) + "\n" for step in (1, 2)))
    s = summarize(metrics, 2.0, "agent/main/score/mean")
    assert (s["rowless"], s["trained_steps"]) == ({}, 2)
    assert "no rows" not in summary_line(s)
