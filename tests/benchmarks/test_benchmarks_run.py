"""The benchmark scripts still run (tiny sizes). Timings are printed by the benchmarks, never asserted."""

from __future__ import annotations

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
