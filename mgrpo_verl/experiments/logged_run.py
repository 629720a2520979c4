"""One experiment step as a child process (a ``python -m mgrpo_verl.main_ppo`` run), its output in a log
file: shared by the experiment commands, which run their trainings and evaluations one after another."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def run_logged(args: Sequence[str], log_path: Path, what: str) -> float:
    """Run ``args`` with stdout and stderr in ``log_path`` (unbuffered); returns the seconds it took.

    Raises:
        SystemExit: the process exited non-zero: ``"<what> failed (exit N); see <log_path>"``.
    """
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(list(args), stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode}); see {log_path}")
    return time.monotonic() - start
