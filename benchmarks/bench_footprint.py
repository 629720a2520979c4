"""CPU footprint and start-up of the default run, against stock verl's in the same invocation.

Runs, one after the other, each for ``--steps`` steps:

- ``multi``: ``python -m mgrpo_verl.main_ppo task=relay`` (two tiny random Qwen2 models, M-GRPO, relay
  task; validation before training as by default, checkpoints off);
- ``stock`` (the reference): stock ``python -m verl.trainer.main_ppo`` with the work settings of
  ``single_agent.yaml`` (one tiny model, echo task), passed as ``benchmarks/bench_cpu_step.py`` passes
  them, and everything else verl's defaults (its reward workers, TransferQueue storage units, Ray
  options); our plugin is what lets it run on CPU at all, and it gets the environment our entry point
  gives Ray on CPU (``ray_cpu_env``: private temp dir, thread and prestart settings);
- ``single`` (only with ``--runs``): ``python -m mgrpo_verl.main_ppo --config-name single_agent``.

While a run goes, the proportional set size (PSS, from ``/proc/<pid>/smaps_rollup``: shared pages split
between the processes that map them, so the sum is the real footprint) of the whole process tree (driver,
Ray's GCS and raylet, verl's TaskRunner, workers, rollout servers, TransferQueue, reward workers) is
sampled every ``--interval`` seconds; the breakdown by process kind is kept for the peak sample. The
time from the command to the first step is when the first step's record appears in the run's metrics
file (polled with the samples); the log's lines are time-stamped as they arrive, and the start-up is cut
into phases at the lines below (``--keep DIR`` keeps every log).

The CPU seconds the run's processes used until the first step are summed from the same samples; with
the machine's busy cores over that time they tell how far other jobs stretched the wall-clock figures
(on a shared 2-core machine start-up times vary by 2x between runs; the CPU seconds far less).

Prints, for each run: peak summed PSS, processes (at the peak, and most at once), command -> first step,
its CPU seconds, its phases, the median step time after step 1, and the ratio of ``multi`` to ``stock``
for each figure.

    python benchmarks/bench_footprint.py [--steps 3] [--interval 1] [--runs multi stock] [--keep DIR]
        [-- extra Hydra overrides for the multi-agent run]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import psutil
from bench_cpu_step import stock_overrides
from bench_soak import MB, tree_pss

#: seconds between two breakdowns by process kind (each reads every process's smaps_rollup once more)
KINDS_EVERY = 5.0

#: seconds between two looks at the metrics file for the first step's record
POLL_S = 0.1

#: start-up phases, each ending at the first log line matching its pattern (driver or Ray worker output)
PHASES = (
    ("config resolved, Ray starting", re.compile(r"^ray init kwargs:")),
    ("TaskRunner up", re.compile(r"TaskRunner|'actor_rollout_ref':|\{'actor_rollout_ref'")),
    ("workers, replicas, TransferQueue, reward loop up", re.compile(r"Creating file logger at")),
    ("step-0 validation done", re.compile(r"Initial validation metrics")),
)


def process_kind(proc: psutil.Process) -> str:
    """What a process is: a Ray actor's name (``ray::RewardLoopWorker``), Ray's own daemons, or python."""
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
    if not cmd:
        return proc.name()
    head = cmd[0]
    if head.startswith("ray::"):
        return head.split(".")[0].split(" ")[0]
    for i, part in enumerate(cmd):
        if part.endswith(".py") or part == "-m":
            target = cmd[i + 1] if part == "-m" and i + 1 < len(cmd) else part
            return Path(target).name
    return Path(head).name


def breakdown(root: psutil.Process) -> dict[str, tuple[float, int, int]]:
    """PSS (MiB), process count and thread count of the tree's processes by kind."""
    out: dict[str, list] = defaultdict(lambda: [0.0, 0, 0])
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    for p in procs:
        try:
            pss, threads = p.memory_full_info().pss / MB, p.num_threads()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        kind = process_kind(p)
        out[kind][0] += pss
        out[kind][1] += 1
        out[kind][2] += threads
    return {k: tuple(v) for k, v in out.items()}


def tree_cpu_seconds(root: psutil.Process, seen: dict[int, float]) -> float:
    """CPU seconds (user + system) the tree's processes have used, each process's latest reading kept in
    ``seen`` so that processes that have exited still count (up to their last sample)."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return sum(seen.values())
    for p in procs:
        try:
            times = p.cpu_times()
            seen[p.pid] = times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return sum(seen.values())


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (every process, not only the run's) since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def first_step_record(metrics: Path) -> dict | None:
    if not metrics.is_file():
        return None
    for line in metrics.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if "timing_s/step" in record.get("data", {}):
            return record
    return None


def run_one(name: str, cmd: list[str], env: dict, workdir: Path, metrics: Path, interval: float) -> dict:
    """Run ``cmd`` to the end, sampling its tree's PSS and the metrics file; returns the figures."""
    log_path = workdir / "log.txt"
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    root = psutil.Process(proc.pid)
    stamped: list[tuple[float, str]] = []

    def read_log() -> None:
        with open(log_path, "w") as log:
            for line in proc.stdout:
                t = time.monotonic() - start
                stamped.append((t, line.rstrip("\n")))
                log.write(f"{t:8.2f} {line}")

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    cpu_seen: dict[int, float] = {}
    busy_start, cpu_first_step, busy_first_step = machine_busy_seconds(), None, None
    peak = {"tree": 0.0, "processes": 0, "t": 0.0, "kinds": {}, "kinds_t": None}
    most_processes = 0
    first_step_t = None
    seen_size = -1
    samples = 0
    while proc.poll() is None:
        _, tree, count = tree_pss(root)
        tree_cpu_seconds(root, cpu_seen)
        t = time.monotonic() - start
        samples += count > 0
        most_processes = max(most_processes, count)
        if tree > peak["tree"]:
            peak = {"tree": tree, "processes": count, "t": t, "kinds": peak["kinds"], "kinds_t": peak.get("kinds_t")}
            # the breakdown reads every process again: at most every KINDS_EVERY s, so that sampling stays light
            if peak["kinds_t"] is None or t - peak["kinds_t"] >= KINDS_EVERY:
                kinds = breakdown(root)
                if kinds:
                    peak["kinds"], peak["kinds_t"] = kinds, t
        # until the next sample: watch for the first step's record every POLL_S (a stat when nothing changed)
        next_sample = time.monotonic() + interval
        while time.monotonic() < next_sample and proc.poll() is None:
            if first_step_t is None and metrics.is_file() and metrics.stat().st_size != seen_size:
                seen_size = metrics.stat().st_size
                if first_step_record(metrics) is not None:
                    first_step_t = time.monotonic() - start
                    cpu_first_step = tree_cpu_seconds(root, cpu_seen)
                    busy_first_step = machine_busy_seconds() - busy_start
            time.sleep(POLL_S)
    wall = time.monotonic() - start
    reader.join(timeout=10)
    if proc.returncode != 0:
        tail = "\n".join(line for _, line in stamped[-40:])
        sys.exit(f"{name} failed (rc={proc.returncode}); last lines of its log ({log_path}):\n{tail}")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in records if "timing_s/step" in r["data"]]
    if not steps:
        sys.exit(f"{name}: no step in {metrics}")
    if first_step_t is None:  # finished between two polls
        first_step_t = wall
    if cpu_first_step is None:
        cpu_first_step, busy_first_step = sum(cpu_seen.values()), machine_busy_seconds() - busy_start
    phases, last = [], 0.0
    for label, pattern in PHASES:
        t = next((t for t, line in stamped if pattern.search(line)), None)
        if t is not None and t >= last:
            phases.append((label, t - last))
            last = t
    phases.append(("step 1 (log -> metrics line)", first_step_t - last))
    return {
        "peak_pss_mib": peak["tree"],
        "processes_at_peak": peak["processes"],
        "peak_t": peak["t"],
        "most_processes": most_processes,
        "peak_kinds": peak["kinds"],
        "peak_kinds_t": peak["kinds_t"],
        "first_step_s": first_step_t,
        "step1_s": steps[0]["data"]["timing_s/step"],
        "step_s": statistics.median(r["data"]["timing_s/step"] for r in steps[1:]) if len(steps) > 1 else float("nan"),
        # until the first step: the run's own CPU seconds (processes that exited count up to their last
        # sample), and the
        # machine's busy cores on average (above the run's own share: other jobs competed for the cores)
        "cpu_to_first_step_s": cpu_first_step,
        "run_cores_busy": cpu_first_step / first_step_t,
        "machine_cores_busy": busy_first_step / first_step_t,
        "steps": len(steps),
        "wall_s": wall,
        "samples": samples,
        "phases": phases,
    }


def commands(args: argparse.Namespace, work: Path) -> dict[str, tuple[list[str], dict, Path]]:
    """The command line, extra environment and metrics file of each run."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from mgrpo_verl.launcher.resolvers import register_resolvers

    register_resolvers()
    common = [f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1", "trainer.logger=[console,file]"]
    out = {}
    for name in args.runs:
        metrics = work / name / "metrics.jsonl"
        ckpt = f"trainer.default_local_dir={work / name / 'ckpt'}"
        if name == "multi":
            cmd = ["mgrpo_verl.main_ppo", "task=relay", *common, ckpt, f"mgrpo_verl.metrics_file={metrics}",
                   *args.overrides]
        elif name == "single":
            cmd = ["mgrpo_verl.main_ppo", "--config-name", "single_agent", *common, ckpt,
                   f"mgrpo_verl.metrics_file={metrics}"]
        else:
            with initialize_config_module("mgrpo_verl.config", version_base=None):
                resolved = OmegaConf.to_container(compose("single_agent", overrides=common), resolve=True)
            cmd = ["verl.trainer.main_ppo", *common, ckpt, *stock_overrides(resolved)]
        out[name] = ([sys.executable, "-m", *cmd], {"VERL_FILE_LOGGER_PATH": str(metrics)}, metrics)
    return out


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and b == b and a == a else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between PSS samples")
    parser.add_argument("--runs", nargs="+", default=["multi", "stock"], choices=["multi", "stock", "single"])
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and metrics in this directory")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the multi-agent run")
    args = parser.parse_args()

    from mgrpo_verl.platform.ray_session import private_temp_dir, ray_cpu_env

    results = {}
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            work = args.keep.absolute()
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-footprint-")))
        for name, (cmd, extra_env, metrics) in commands(args, work).items():
            (work / name).mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", **extra_env}
            with private_temp_dir() as ray_tmp:
                if name == "stock":  # what our entry point does for its own runs
                    env.update(ray_cpu_env(ray_tmp))
                print(f"running {name} for {args.steps} steps: {' '.join(cmd[1:4])} ...", file=sys.stderr, flush=True)
                results[name] = run_one(name, cmd, env, work / name, metrics, args.interval)

    print(f"\nfootprint and start-up, {args.steps} steps each, PSS sampled every {args.interval:g} s")
    names = list(results)
    header = "| quantity | " + " | ".join(names) + (" | multi / stock |" if {"multi", "stock"} <= set(names) else " |")
    print(header)
    print("|---|" + "---:|" * (header.count("|") - 2))
    rows = (
        ("peak summed PSS (MiB)", "peak_pss_mib", "{:.0f}"),
        ("processes at the peak", "processes_at_peak", "{:d}"),
        ("most processes at once", "most_processes", "{:d}"),
        ("command -> first step's metrics line (s)", "first_step_s", "{:.1f}"),
        ("run's CPU seconds until the first step", "cpu_to_first_step_s", "{:.0f}"),
        ("  = cores busy with the run, on average", "run_cores_busy", "{:.2f}"),
        ("  cores busy on the whole machine (other jobs included)", "machine_cores_busy", "{:.2f}"),
        ("step 1 (s)", "step1_s", "{:.2f}"),
        ("median step after step 1 (s)", "step_s", "{:.2f}"),
        ("whole run (s)", "wall_s", "{:.1f}"),
    )
    for label, key, fmt in rows:
        cells = [fmt.format(results[n][key]) for n in names]
        extra = f" {ratio(results['multi'][key], results['stock'][key])} |" if {"multi", "stock"} <= set(names) else ""
        print(f"| {label} | " + " | ".join(cells) + " |" + extra)
    others = max(results[n]["machine_cores_busy"] - results[n]["run_cores_busy"] for n in names)
    if others > 0.25:
        print(f"note: other jobs kept up to {others:.2f} of the machine's {psutil.cpu_count()} cores busy during a "
              f"start-up: wall-clock figures are inflated, compare CPU seconds")
    for n in names:
        r = results[n]
        print(f"\n{n}: start-up phases (s): " + "; ".join(f"{label} {s:.1f}" for label, s in r["phases"]))
        kinds = sorted(r["peak_kinds"].items(), key=lambda kv: -kv[1][0])
        print(f"{n}: PSS by process kind near the peak (peak at t={r['peak_t']:.0f} s, breakdown at "
              f"t={r['peak_kinds_t'] or 0:.0f} s, {sum(v[0] for v in r['peak_kinds'].values()):.0f} MiB), "
              f"MiB (processes, threads): " + ", ".join(f"{k} {pss:.0f} ({c}, {th})" for k, (pss, c, th) in kinds))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
