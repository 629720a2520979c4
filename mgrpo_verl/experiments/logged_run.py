"""One experiment step as a child process (a ``python -m mgrpo_verl.main_ppo`` run): every line in a log file, its
progress lines on screen (start-up, each step, the warm start's SFT bars, the summary), so that a run of minutes
inside an experiment command is not a silent one. Shared by the experiment commands, which run their trainings and
evaluations one after another."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional, TextIO

#: lines of a run shown on screen: the entry point's (start-up, steps, summary), the warm start's and its SFT bars
PROGRESS_PREFIXES = ("mgrpo_verl:", "mgrpo_warmstart:", "warm start:")


def run_streamed(args: Sequence[str], log_path: Path, label: str, *, cwd: Optional[Path] = None,
                 env: Optional[Mapping[str, str]] = None, screen: Optional[TextIO] = None) -> int:
    """Run ``args``: the command line, then stdout and stderr, line by line into ``log_path`` (a cut run keeps its
    log); the lines starting with :data:`PROGRESS_PREFIXES` also on ``screen`` (default stdout) as
    ``  [<label>] <line>``. Returns the exit code. ``env`` replaces the environment (default: ours), with
    ``PYTHONUNBUFFERED=1`` added so that the child's lines come as they are written."""
    screen = screen if screen is not None else sys.stdout
    environ = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w", buffering=1) as log:
        log.write(" ".join(args) + "\n")
        proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", cwd=cwd, env=environ)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if line.startswith(PROGRESS_PREFIXES):
                screen.write(f"  [{label}] {line.rstrip()}\n")
                screen.flush()
        return proc.wait()


def run_logged(args: Sequence[str], log_path: Path, what: str) -> float:
    """:func:`run_streamed` labelled ``what``; returns the seconds it took.

    Raises:
        SystemExit: the process exited non-zero: ``"<what> failed (exit N); see <log_path>"``.
    """
    start = time.monotonic()
    rc = run_streamed(args, log_path, what)
    if rc != 0:
        raise SystemExit(f"{what} failed (exit {rc}); see {log_path}")
    return time.monotonic() - start
