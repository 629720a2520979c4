"""Timing helpers shared by the benchmark scripts (imported as ``timing``: each script runs as
``python benchmarks/<script>.py``, so this folder is on ``sys.path``)."""

from __future__ import annotations

import time


def best_times(repeats: int, fns: dict) -> dict:
    """Best wall time of each function, the functions interleaved in every round so that load from
    other processes affects them alike."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def fmt_s(seconds: float) -> str:
    """Seconds with 4 decimals below 0.1 s, 3 above."""
    return f"{seconds:.4f} s" if seconds < 0.1 else f"{seconds:.3f} s"
