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
        f"mgrpo_verl: 2 steps (step 1 to 2) in 12 s; train reward 0.020 -> 0.300; "
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
        "mgrpo_verl: 1 steps (step 1 to 1) in 3 s; train reward 0.010 -> 0.010; held-out exact accuracy "
        f"0.100 -> 0.350 (val-aux/relay/exact/mean@1); val-core/relay/acc/mean@1 0.030 -> 0.060; metrics {metrics}"
    )
