"""Helpers for the CPU-platform tests.

verl resolves its platform once per process, so anything that depends on the environment at
``import verl`` runs in a fresh interpreter (:func:`run_python`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

import pytest

# Variables that steer platform selection or Ray; cleared so each subprocess starts from a known state.
_CLEARED = ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "VERL_ENGINE_DEVICE", "VERL_ENGINE_VENDOR", "RAY_ADDRESS")


def run_python(code: str, env: Mapping[str, str] | None = None, timeout: float = 120, cwd: str | None = None):
    """Run ``code`` in a new interpreter; return the JSON object printed on its last stdout line."""
    full_env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    full_env.setdefault("PYTHONWARNINGS", "ignore")
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"subprocess failed (rc={proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
        )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"no output\nstderr:\n{proc.stderr[-6000:]}"
    return json.loads(lines[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def python_runner(tmp_path) -> Any:
    """``run(code, env=None, timeout=120)`` running in a scratch directory."""

    def run(code: str, env: Mapping[str, str] | None = None, timeout: float = 120):
        return run_python(code, env=env, timeout=timeout, cwd=str(tmp_path))

    return run


@pytest.fixture
def port() -> int:
    return free_port()
