"""The live progress line (mgrpo_verl/progress.py) and the SFT metrics follower that feeds it, by hand."""

from __future__ import annotations

import io
import json

from mgrpo_verl.progress import JsonlFollower, Progress, format_seconds
from mgrpo_verl.warmstart.sft import logged_steps


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_format_seconds():
    assert [format_seconds(s) for s in (0, 42.4, 65, 3600 + 120)] == ["0s", "42s", "1m05s", "1h02m"]


def test_rate_and_eta_count_from_the_first_update_not_the_start():
    clock, out = Clock(), io.StringIO()
    bar = Progress("sft", 100, stream=out, every_s=0.0, clock=clock, live=False)
    clock.t = 130.0  # 30 s of start-up before the first step is logged: not a step
    bar.update(10, loss=2.5)
    clock.t = 150.0  # 20 s for steps 10 -> 30: 1 s per step, 70 steps left: ETA 70 s
    bar.update(30, loss=0.5)
    last = out.getvalue().splitlines()[-1]
    assert last == "sft 30/100 steps [ 30%]  loss 0.5  1.00 s/step  ETA 1m10s  elapsed 50s"


def test_off_a_terminal_it_prints_at_most_every_every_s_and_always_the_last_line():
    clock, out = Clock(), io.StringIO()
    bar = Progress("sft", 4, stream=out, every_s=10.0, clock=clock, live=False)
    for step in range(1, 5):
        clock.t += 3.0
        bar.update(step, loss=None)  # a None figure (verl's validation line) keeps the last one
    bar.close()
    bar.close()  # once
    lines = out.getvalue().splitlines()
    # printed at the first update (t=103), none within 10 s after it, then the final line
    assert [line.split("  ")[0] for line in lines] == ["sft 1/4 steps [ 25%]", "sft 4/4 steps [100%]"]
    assert "\r" not in out.getvalue()


def test_on_a_terminal_one_line_is_rewritten():
    out = io.StringIO()
    bar = Progress("sft", 2, stream=out, clock=Clock(), live=True)
    bar.update(1)
    bar.update(2)
    bar.close()
    assert out.getvalue().count("\r") == 3 and out.getvalue().count("\n") == 1


def test_follower_reads_complete_new_lines_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follower = JsonlFollower(path)
    assert follower.new_records() == []  # verl has not created the file yet
    with open(path, "wb") as f:
        f.write(json.dumps({"step": 1, "data": {"train/loss": 7.0}}).encode() + b"\n")
        f.write(b'{"step": 2, "data": {"train/lo')  # being written
    assert logged_steps(follower.new_records()) == [(1, 7.0)]
    with open(path, "ab") as f:
        f.write(b'ss": 6.5}}\n{"step": 2, "data": {"val/loss": 6.0}}\nnot json\n')
    assert logged_steps(follower.new_records()) == [(2, 6.5), (2, None)]  # "not json" skipped
    assert follower.new_records() == []


def test_close_does_not_repeat_the_line_just_printed():
    clock, out = Clock(), io.StringIO()
    bar = Progress("sft", 2, stream=out, every_s=0.0, clock=clock, live=False)
    bar.update(1, loss=1.0)
    bar.update(2, loss=0.5)  # printed: every_s is 0
    bar.close()
    assert [line.split("  ")[0] for line in out.getvalue().splitlines()] == ["sft 1/2 steps [ 50%]", "sft 2/2 steps [100%]"]
