"""benchmarks/bench_store.py still runs (tiny sizes). Timings are printed, never asserted."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_store_prints_the_table_and_the_goal():
    backends = ["sqlite"] + (["redis"] if shutil.which("redis-server") else [])
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_store.py"), "--trajectories", "100", "--steps", "1",
         "--step-seconds", "0.2", "--backends", *backends],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"backend\s+put rec/s\s+replay rec/s\s+get rec/s\s+main_scores rec/s\s+hand-off median ms\s+p95 ms\s+vs queue", out), out
    assert re.search(r"^mp\.Queue \(reference\)\s+-\s+-\s+-\s+-\s+\d+\.\d+\s+\d+\.\d+\s+1\.0x$", out, re.M), out
    assert re.search(r"^sqlite \(synchronous=full\)(\s+[\d,]+){4}\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\dx$", out, re.M), out
    if "redis" in backends:
        assert re.search(r"^redis \(AOF everysec\)(\s+[\d,]+){4}\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\dx$", out, re.M), out
    assert re.search(r"^goal median hand-off < 100 ms at 100 trajectories/step: (met|missed) \(sqlite \d+\.\d ms", out, re.M), out
