"""The benchmark scripts still run (tiny sizes). Timings are printed by the benchmarks, never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_advantage_prints_a_ratio_per_size():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_advantage.py"), "--sizes", "500", "3000", "--repeats", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if re.match(r"\s*\d+\s+\d", line)]
    assert len(rows) == 2, done.stdout
    assert all(re.search(r"\d+\.\d+x", row) for row in rows), done.stdout


def test_bench_orchestration_quick_prints_the_table_and_the_goal(tmp_path):
    env = {**os.environ, "MGRPO_VERL_CACHE": str(tmp_path / "cache")}  # builds its tiny tokenizer there
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_orchestration.py"), "--quick"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"loop\s+rollouts\s+mean d\s+gens\s+wall s\s+ideal s\s+overhead %\s+CPU ms/rollout", done.stdout)
    assert re.search(r"^ours \(relay\)\s+4\s", done.stdout, re.M), done.stdout
    assert re.search(r"^verl single-turn\s+4\s", done.stdout, re.M), done.stdout
    assert re.search(r"CPU per generation ours / verl = \d+\.\d+x", done.stdout), done.stdout
    assert re.search(r"^goal <= 2%: (met|missed)", done.stdout, re.M), done.stdout
