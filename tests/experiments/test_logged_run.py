"""``logged_run``: an experiment's child process logs every line to its file and shows its progress lines on screen
(the experiment commands ran minutes-long trainings with one line, "training 20 steps ...", before)."""

from __future__ import annotations

import io
import sys

import pytest

from mgrpo_verl.experiments import logged_run

CHILD = r"""
import sys
print("verl noise")
print("mgrpo_verl: step 1/2 steps [ 50%]  reward 0.5")
print("warm start: main SFT 3/10 steps", file=sys.stderr)
print("more noise, then an undecodable byte:", end=" ")
sys.stdout.flush()
sys.stdout.buffer.write(b"\xff\n")
sys.exit(int(sys.argv[1]))
"""


def _child(tmp_path) -> str:
    path = tmp_path / "child.py"
    path.write_text(CHILD)
    return str(path)


def test_every_line_goes_to_the_log_and_the_progress_lines_to_the_screen(tmp_path):
    screen = io.StringIO()
    log = tmp_path / "log.txt"
    rc = logged_run.run_streamed([sys.executable, _child(tmp_path), "3"], log, "joint seed 0", screen=screen)
    assert rc == 3
    assert screen.getvalue() == ("  [joint seed 0] mgrpo_verl: step 1/2 steps [ 50%]  reward 0.5\n"
                                 "  [joint seed 0] warm start: main SFT 3/10 steps\n")
    lines = log.read_text().splitlines()
    assert lines[0] == f"{sys.executable} {tmp_path / 'child.py'} 3" and lines[1:5] == [
        "verl noise", "mgrpo_verl: step 1/2 steps [ 50%]  reward 0.5", "warm start: main SFT 3/10 steps",
        "more noise, then an undecodable byte: \ufffd"]


def test_run_logged_names_the_failed_step_and_its_log(tmp_path):
    with pytest.raises(SystemExit, match=r"seed 1 training failed \(exit 3\); see .*log.txt"):
        logged_run.run_logged([sys.executable, _child(tmp_path), "3"], tmp_path / "log.txt", "seed 1 training")
    assert logged_run.run_logged([sys.executable, _child(tmp_path), "0"], tmp_path / "log.txt", "ok") >= 0
