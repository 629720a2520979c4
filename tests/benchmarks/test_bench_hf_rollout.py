"""benchmarks/bench_hf_rollout.py still runs (tiny sizes); timings are printed, never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_hf_rollout_prints_a_ratio(tmp_path):
    env = {**os.environ, "MGRPO_VERL_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    args = ["--num-prompts", "4", "--max-tokens", "8", "--repeats", "1"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_hf_rollout.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"ratio replica / generate = \d+\.\d+", done.stdout), done.stdout
    assert [p for p in tmp_path.rglob("*") if ".cache" in p.parts or p.name.startswith(".")] == []
