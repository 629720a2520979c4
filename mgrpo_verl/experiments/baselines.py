"""Joint M-GRPO vs frozen sub-agent vs single-agent GRPO on the relay task: run, tabulate, plot.

``python -m mgrpo_verl.experiments.baselines run --out DIR --seeds 0 1 --steps 30`` trains every variant
with every seed (``python -m mgrpo_verl.main_ppo`` (``mgrpo_trainer.yaml``) plus the variant's
overrides, one process after another) and writes each run's verl metrics file to
``DIR/<variant>/seed<k>/metrics.jsonl``. ``report --runs DIR --out docs/results`` reads them back and
writes a Markdown table and a plot of held-out accuracy against step (mean over seeds, each seed thin).
``recipes/relay_baselines.sh`` does both.

The paper's expected shape is joint > frozen > single; the table reports what was measured.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from mgrpo_verl.experiments.logged_run import run_logged

#: variant -> its overrides of mgrpo_trainer.yaml (docs/algorithms.md: each baseline is one switch away)
VARIANTS: dict[str, tuple[str, ...]] = {
    "joint": (),
    "frozen": ("multi_agent.agents.sub.trainable=false",),
    "single": (
        "multi_agent.algorithm=grpo",
        "multi_agent.agents.sub.share_model_with=main",
        "trainer.n_gpus_per_node=1",
    ),
}

#: held-out accuracy (verl's validation metric of the relay task) and the main agent's training reward
VAL_KEY = "val-core/mgrpo_verl/relay/acc/mean@1"
TRAIN_KEY = "agent/main/score/mean"
SUB_KEY = "agent/sub/score/mean"


def run_all(out: Path, seeds: list[int], steps: int, test_freq: int, variants: list[str], extra: list[str]) -> None:
    """Train every (variant, seed) that has no finished metrics file yet, printing progress."""
    jobs = [(v, s) for s in seeds for v in variants]  # seed by seed: a cut-short sweep still compares variants
    for i, (variant, seed) in enumerate(jobs, 1):
        run_dir = out / variant / f"seed{seed}"
        metrics = run_dir / "metrics.jsonl"
        if (run_dir / "done").is_file():
            print(f"[{i}/{len(jobs)}] {variant} seed {seed}: done already, skipped", flush=True)
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "mgrpo_verl.main_ppo", "task=relay",
            f"trainer.total_training_steps={steps}", f"trainer.test_freq={test_freq}", "trainer.save_freq=-1",
            "trainer.resume_mode=disable", f"trainer.default_local_dir={run_dir / 'ckpt'}",
            f"mgrpo_verl.metrics_file={metrics}", f"data.seed={seed}",
            f"trainer.experiment_name=relay_{variant}_seed{seed}", *VARIANTS[variant], *extra,
        ]
        print(f"[{i}/{len(jobs)}] {variant} seed {seed}: training {steps} steps ...", flush=True)
        seconds = run_logged(args, run_dir / "log.txt", f"{variant} seed {seed}")
        (run_dir / "done").write_text(f"{seconds:.0f}\n")
        print(f"[{i}/{len(jobs)}] {variant} seed {seed}: {seconds:.0f} s", flush=True)


def read_series(metrics_file: Path, key: str) -> dict[int, float]:
    """step -> value of ``key`` in one verl JSON-lines metrics file."""
    series = {}
    for line in metrics_file.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if key in record["data"]:
                series[int(record["step"])] = float(record["data"][key])
    return series


def collect(runs: Path) -> dict[str, dict[int, dict[str, dict[int, float]]]]:
    """variant -> seed -> metric key -> step -> value, for every finished run under ``runs``."""
    out: dict = {}
    for variant in VARIANTS:
        for seed_dir in sorted((runs / variant).glob("seed*")):
            metrics = seed_dir / "metrics.jsonl"
            if (seed_dir / "done").is_file() and metrics.is_file():
                seed = int(seed_dir.name.removeprefix("seed"))
                out.setdefault(variant, {})[seed] = {k: read_series(metrics, k) for k in (VAL_KEY, TRAIN_KEY, SUB_KEY)}
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def summary_rows(results: dict) -> list[dict]:
    """One row per variant: held-out accuracy at the first and last validation (mean ± std over seeds),
    its best value, and the main / sub training reward averaged over the last quarter of the steps."""
    rows = []
    for variant, seeds in results.items():
        val = [s[VAL_KEY] for s in seeds.values() if s[VAL_KEY]]
        first = [v[min(v)] for v in val]
        last = [v[max(v)] for v in val]
        best = [max(v.values()) for v in val]

        def tail(key: str) -> list[float]:
            out = []
            for s in seeds.values():
                steps = sorted(s[key])
                if steps:
                    keep = steps[-max(1, len(steps) // 4):]
                    out.append(_mean([s[key][k] for k in keep]))
            return out

        rows.append({
            "variant": variant, "seeds": len(seeds),
            "val_first": _mean(first), "val_last": _mean(last), "val_last_std": _std(last), "val_best": _mean(best),
            "train_main": _mean(tail(TRAIN_KEY)), "train_sub": _mean(tail(SUB_KEY)),
            "steps": max((max(s[TRAIN_KEY]) for s in seeds.values() if s[TRAIN_KEY]), default=0),
        })
    return rows


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| variant | seeds | steps | held-out acc, first val | held-out acc, last val (± std) | best "
        "| main reward (last 25%) | sub reward (last 25%) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['seeds']} | {r['steps']} | {r['val_first']:.3f} | {r['val_last']:.3f} ± {r['val_last_std']:.3f} "
            f"| {r['val_best']:.3f} | {r['train_main']:.3f} | {r['train_sub']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Held-out accuracy against step: one colour per variant, the mean over seeds thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (variant, seeds) in enumerate(results.items()):
        color = f"C{i}"
        curves = [s[VAL_KEY] for s in seeds.values() if s[VAL_KEY]]
        for c in curves:
            ax.plot(sorted(c), [c[k] for k in sorted(c)], color=color, alpha=0.3, linewidth=1)
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        ax.plot(steps, [_mean([c[k] for c in curves]) for k in steps], color=color, linewidth=2.5, marker="o",
                label=f"{variant} (mean of {len(curves)})")
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out accuracy (relay, greedy)")
    ax.set_title("Relay task on CPU: joint M-GRPO vs frozen sub-agent vs single agent")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(runs: Path, out: Path) -> str:
    results = collect(runs)
    if not results:
        raise SystemExit(f"no finished run under {runs}")
    table = markdown_table(summary_rows(results))
    out.mkdir(parents=True, exist_ok=True)
    (out / "relay_baselines.md").write_text(table)
    plot(results, out / "relay_baselines.png")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train every variant and seed")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    r.add_argument("--steps", type=int, default=30)
    r.add_argument("--test-freq", type=int, default=5)
    r.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    r.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    p = sub.add_parser("report", help="table and plot from finished runs")
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        run_all(args.out, args.seeds, args.steps, args.test_freq, args.variants, args.overrides)
    else:
        print(report(args.runs, args.out))


if __name__ == "__main__":
    main()
