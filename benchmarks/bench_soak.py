"""Soak: the default multi-agent job for many steps, with memory and step time sampled as it runs.

Runs ``python -m mgrpo_verl.main_ppo task=relay`` (two tiny models, M-GRPO, relay task) for ``--steps``
steps with validation and checkpoints off, and samples every ``--interval`` seconds the proportional set
size (PSS: shared pages split between the processes that map them, so the sum is the real footprint) of
the driver and of all its descendants (Ray's GCS and raylet, verl's TaskRunner, workers, rollout servers,
TransferQueue). Each sample is tagged with the last step the metrics file shows.

Reports, over the steps after ``--warmup``: the least-squares growth of the summed PSS (driver, and whole
tree) per 100 steps, and the step time of the last tenth of the run against the first tenth after the
warm-up (the reference measured in the same run: a ratio of 1.00 means no slow-down).

    python benchmarks/bench_soak.py [--steps 200] [--warmup 10] [--interval 2] [--out soak.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

MB = 2**20


def tree_pss(root: psutil.Process) -> tuple[float, float, int]:
    """(driver PSS, whole-tree PSS, process count) in MiB; processes that vanish mid-read are skipped."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0, 0
    total, driver, count = 0.0, 0.0, 0
    for p in procs:
        try:
            pss = p.memory_full_info().pss / MB
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total += pss
        count += 1
        if p.pid == root.pid:
            driver = pss
    return driver, total, count


def last_step(metrics: Path) -> int:
    if not metrics.is_file():
        return 0
    step = 0
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if "timing_s/step" in record.get("data", {}):
            step = max(step, int(record["step"]))
    return step


def slope_per_100(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x, times 100 (growth per 100 steps)."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return float("nan")
    return 100 * sum((x - mx) * (y - my) for x, y in points) / sxx


def summarize(samples: list[dict], step_times: dict[int, float], warmup: int) -> dict:
    """Growth per 100 steps of the last sample of each step after ``warmup``; step-time ratio last / first
    tenth after the warm-up."""
    final = max((s["step"] for s in samples), default=0)
    by_step: dict[int, dict] = {}
    for s in samples:
        # the last sample of each step; the final step's samples are the shutdown (processes exiting)
        if warmup < s["step"] < final:
            by_step[s["step"]] = s
    steps = sorted(by_step)
    timed = sorted(k for k in step_times if k > warmup)
    tenth = max(1, len(timed) // 10)
    first = statistics.median(step_times[k] for k in timed[:tenth]) if timed else float("nan")
    last = statistics.median(step_times[k] for k in timed[-tenth:]) if timed else float("nan")
    return {
        "steps_sampled": len(steps),
        "driver_pss_mib_first": by_step[steps[0]]["driver"] if steps else float("nan"),
        "driver_pss_mib_last": by_step[steps[-1]]["driver"] if steps else float("nan"),
        "tree_pss_mib_first": by_step[steps[0]]["tree"] if steps else float("nan"),
        "tree_pss_mib_last": by_step[steps[-1]]["tree"] if steps else float("nan"),
        "tree_pss_peak_mib": max((s["tree"] for s in samples), default=float("nan")),
        "driver_growth_mib_per_100_steps": slope_per_100([(k, by_step[k]["driver"]) for k in steps]),
        "tree_growth_mib_per_100_steps": slope_per_100([(k, by_step[k]["tree"]) for k in steps]),
        "step_s_first_tenth": first,
        "step_s_last_tenth": last,
        "step_time_ratio_last_vs_first": last / first if first == first and first > 0 else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=None, help="write samples and summary as JSON")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for main_ppo")
    parser.add_argument("--report", type=Path, default=None, help="only summarise the JSON of an earlier --out")
    args = parser.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        times = {int(k): v for k, v in saved["step_times"].items()}
        print_summary(summarize(saved["samples"], times, args.warmup), len(saved["samples"]), args, wall=None)
        return
    if args.steps <= args.warmup + 1:
        sys.exit(f"--steps ({args.steps}) must exceed --warmup + 1 ({args.warmup + 1})")

    with tempfile.TemporaryDirectory(prefix="mgrpo_soak_") as tmp:
        work = Path(tmp)
        metrics = work / "metrics.jsonl"
        cmd = [sys.executable, "-m", "mgrpo_verl.main_ppo", "task=relay", f"trainer.total_training_steps={args.steps}",
               "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
               f"trainer.default_local_dir={work / 'ckpt'}", f"mgrpo_verl.metrics_file={metrics}", *args.overrides]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
        log = open(work / "log.txt", "w")
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        samples: list[dict] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                driver, tree, count = tree_pss(root)
                step = last_step(metrics)
                if count:
                    samples.append({"t": time.monotonic() - start, "step": step, "driver": driver, "tree": tree,
                                    "processes": count})
                    print(f"\rt={samples[-1]['t']:6.0f}s step {step:4d}/{args.steps}  tree PSS {tree:8.0f} MiB "
                          f"({count} processes)  driver {driver:6.0f} MiB", end="", file=sys.stderr, flush=True)
                done.wait(args.interval)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        rc = proc.wait()
        done.set()
        thread.join()
        log.close()
        print(file=sys.stderr)
        wall = time.monotonic() - start
        if rc != 0:
            tail = "\n".join((work / "log.txt").read_text().splitlines()[-40:])
            sys.exit(f"main_ppo failed (rc={rc}); last lines of its log:\n{tail}")
        step_times = {}
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if "timing_s/step" in record["data"]:
                step_times[int(record["step"])] = record["data"]["timing_s/step"]

    summary = summarize(samples, step_times, args.warmup)
    print_summary(summary, len(samples), args, wall)
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "samples": samples, "step_times": step_times}, indent=1))


def print_summary(summary: dict, n_samples: int, args: argparse.Namespace, wall: float | None) -> None:
    took = f" in {wall:.0f} s" if wall is not None else ""
    print(f"soak: default multi-agent job, {args.steps} steps{took}, {n_samples} samples "
          f"every {args.interval:g} s; after a {args.warmup}-step warm-up:")
    print("| quantity | first | last | growth per 100 steps |")
    print("|---|---:|---:|---:|")
    print(f"| driver PSS (MiB) | {summary['driver_pss_mib_first']:.0f} | {summary['driver_pss_mib_last']:.0f} | "
          f"{summary['driver_growth_mib_per_100_steps']:+.1f} |")
    print(f"| whole tree PSS (MiB) | {summary['tree_pss_mib_first']:.0f} | {summary['tree_pss_mib_last']:.0f} | "
          f"{summary['tree_growth_mib_per_100_steps']:+.1f} |")
    print(f"| step time (s, median of a tenth) | {summary['step_s_first_tenth']:.2f} | "
          f"{summary['step_s_last_tenth']:.2f} | ratio last/first {summary['step_time_ratio_last_vs_first']:.2f} |")
    print(f"peak whole-tree PSS {summary['tree_pss_peak_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
