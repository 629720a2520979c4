"""The driver's line per training step (mgrpo_verl/launcher/step_progress.py), from a metrics file written by hand
as verl's file logger writes it."""

from __future__ import annotations

import io
import json

from mgrpo_verl.launcher.step_progress import StepWatcher, headline, read_series, watch_steps
from mgrpo_verl.main_ppo import TRAIN_REWARD

EXACT = "val-aux/relay_tools/exact/mean@1"


def record(step, **data):
    return json.dumps({"step": step, "data": data}) + "\n"


def test_headline_takes_the_reward_and_held_out_exact_when_present_and_finite():
    assert headline({"step": 1, "data": {TRAIN_REWARD: 0.25, "x": 1}}, TRAIN_REWARD) == {"reward": 0.25}
    assert headline({"step": 5, "data": {TRAIN_REWARD: 0.5, EXACT: 0.875}}, TRAIN_REWARD) == {"reward": 0.5, "held-out exact": 0.875}
    assert headline({"step": 2, "data": {TRAIN_REWARD: float("nan")}}, TRAIN_REWARD) == {}
    assert headline({"step": 2, "data": "junk"}, TRAIN_REWARD) == {}


def test_read_series_by_step_held_out_exact_by_default_or_any_key(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # step 0: verl's validation before training; step 1 validates nothing; a blank line is skipped
    path.write_text(record(0, **{EXACT: 0.125}) + record(1, **{TRAIN_REWARD: 0.4}) + "\n"
                    + record(5, **{EXACT: 0.5, TRAIN_REWARD: 0.75, "val-core/x/mean@1": 0.3}))
    assert read_series(path) == {0: 0.125, 5: 0.5}
    assert read_series(path, TRAIN_REWARD) == {1: 0.4, 5: 0.75}
    assert read_series(path, "absent") == {}
    assert read_series(tmp_path / "missing.jsonl") == {}


def test_a_line_per_step_with_rate_and_eta(tmp_path):
    path = tmp_path / "metrics.jsonl"
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    out = io.StringIO()
    watcher = StepWatcher(path, 3, TRAIN_REWARD, stream=out, clock=clock)
    path.write_text(record(0, **{EXACT: 0.125}))  # verl's validation before training
    watcher.poll()
    with open(path, "a") as f:
        f.write(record(1, **{TRAIN_REWARD: 0.25}))
    now[0] = 10.0
    watcher.poll()  # t=10: the first step, no rate yet
    with open(path, "a") as f:
        f.write(record(2, **{TRAIN_REWARD: 0.5}) + record(3, **{TRAIN_REWARD: 0.75, EXACT: 1.0}))
    now[0] = 22.0
    watcher.poll()  # t=22: steps 2 and 3 read at once: at step 2, (22 - 10) / 1 = 12 s per step; at 3, 12 / 2 = 6
    lines = out.getvalue().splitlines()
    assert lines[0] == "mgrpo_verl: before training: held-out exact 0.125"
    assert lines[1] == "mgrpo_verl: step 1/3 steps [ 33%]  reward 0.25  elapsed 10s"
    assert lines[2] == "mgrpo_verl: step 2/3 steps [ 66%]  reward 0.5  12.00 s/step  ETA 12s  elapsed 22s"
    assert lines[3] == "mgrpo_verl: step 3/3 steps [100%]  reward 0.75  held-out exact 1.000 (step 3)  6.00 s/step  elapsed 22s"
    assert len(lines) == 4
    with open(path, "a") as f:
        f.write(record(4, **{TRAIN_REWARD: 0.5}))
    watcher.poll()  # no validation at step 4: the last held-out figure keeps its step
    assert "held-out exact 1.000 (step 3)" in out.getvalue().splitlines()[-1]


def test_watch_steps_says_what_starts_and_reads_the_last_step_on_exit_and_nothing_of_an_earlier_run(tmp_path):
    path, out = tmp_path / "metrics.jsonl", io.StringIO()
    path.write_text(record(7, **{TRAIN_REWARD: 0.0}))  # an earlier run's
    with watch_steps(path, 2, TRAIN_REWARD, poll_s=60.0, stream=out):
        path.write_text(record(1, **{TRAIN_REWARD: 0.5}) + record(2, **{TRAIN_REWARD: 1.0}))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("mgrpo_verl: starting Ray") and "(2 steps)" in lines[0]
    assert lines[-1].startswith("mgrpo_verl: step 2/2 steps [100%]  reward 1")
    assert not any("reward 0 " in line or "7/2" in line for line in lines)


def test_a_truncated_file_is_read_again_from_its_start(tmp_path):
    from mgrpo_verl.progress import JsonlFollower

    path = tmp_path / "m.jsonl"
    path.write_text(record(1) + record(2) + record(3))
    follower = JsonlFollower(path)
    assert [r["step"] for r in follower.new_records()] == [1, 2, 3]
    path.write_text(record(1))  # shorter than what was read: truncated and rewritten
    assert [r["step"] for r in follower.new_records()] == [1]
