"""``benchmarks/bench_step_concurrency.py`` still runs (tiny sizes, no Ray). Its timings are printed, never
asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_step_concurrency_prints_a_ratio_per_model_count():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_step_concurrency.py"), "--backend", "sleep",
         "--agents", "2", "3", "--cost", "0.01", "--repeats", "1", "--queries", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"models\s+sequential\s+concurrent\s+ratio\s+ideal", done.stdout), done.stdout
    rows = re.findall(r"^\s+(\d)\s+\d+\.\d+ s\s+\d+\.\d+ s\s+\d+\.\d+x\s+\d+x$", done.stdout, re.M)
    assert rows == ["2", "3"], done.stdout
