"""``benchmarks/bench_soak.py``'s arithmetic on hand-made samples (the soak itself is a long benchmark run,
not a test)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_soak", ROOT / "benchmarks" / "bench_soak.py")
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


def test_growth_and_step_time_ratio():
    # warm-up 2: steps 1-2 ignored. Steps 3..12: tree PSS 1000 + 2 * step MiB (the last sample of a step
    # counts: the first sample of each step says 0), driver flat at 300 -> growth 200 MiB / 100 steps, 0
    samples = []
    for step in range(1, 13):
        samples.append({"step": step, "driver": 300.0, "tree": 0.0})
        samples.append({"step": step, "driver": 300.0, "tree": 1000.0 + 2 * step})
    # the final step (13) is the shutdown: its samples (processes exiting) are left out
    samples.append({"step": 13, "driver": 450.0, "tree": 450.0})
    # step times after the warm-up: steps 3..12 (10 steps), a tenth = 1 step: first 1.0 s (step 3), last 1.5 s
    times = {1: 9.0, 2: 9.0, **{k: 1.0 for k in range(3, 12)}, 12: 1.5}
    out = soak.summarize(samples, times, warmup=2)
    assert out["steps_sampled"] == 10
    assert out["tree_growth_mib_per_100_steps"] == pytest.approx(200.0)
    assert out["driver_growth_mib_per_100_steps"] == pytest.approx(0.0)
    assert (out["tree_pss_mib_first"], out["tree_pss_mib_last"]) == (1006.0, 1024.0)
    assert out["step_time_ratio_last_vs_first"] == pytest.approx(1.5)
    assert out["tree_pss_peak_mib"] == 1024.0


def test_slope_needs_two_distinct_steps():
    assert math.isnan(soak.slope_per_100([(5, 1.0)]))
    assert math.isnan(soak.slope_per_100([(5, 1.0), (5, 2.0)]))
    # (1, 1), (3, 5): slope 2 per step -> 200 per 100 steps
    assert soak.slope_per_100([(1, 1.0), (3, 5.0)]) == pytest.approx(200.0)


def test_tree_pss_counts_this_process():
    driver, tree, count = soak.tree_pss(psutil.Process())
    assert count >= 1 and driver > 0 and tree >= driver
