"""Joint M-GRPO vs its baselines on a relay task: run, tabulate, plot.

``python -m mgrpo_verl.experiments.baselines run --task relay_tools --out DIR --seeds 0 1 2 --steps 12``
trains every variant with every seed (``python -m mgrpo_verl.main_ppo task=<task>`` plus the variant's
overrides, one process after another) and writes each run's verl metrics file to
``DIR/<variant>/seed<k>/metrics.jsonl``. ``report --task relay_tools --runs DIR --out docs/results`` reads
them back and writes ``<task>_baselines.md`` (a Markdown table) and ``<task>_baselines.png`` (held-out
accuracy against step and against training wall time: mean over seeds thick, each seed thin).
``recipes/relay_baselines.sh`` does both.

Variants: ``joint`` (M-GRPO, both agents trained), ``frozen`` (sub-agent not trained),
``shared_reward`` (both trained, the sub-agent on the main agent's score alone: no local term),
``single`` (one model plays both roles, GRPO on the main outcome), ``single_both`` (the same from a checkpoint
warm-started on both roles: on relay_tools the warm start's sub-agent checkpoint, which it fine-tuned on the main
agent's demonstrations and then the sub-agent's; relay_tools only). The
paper's expected shape is joint > frozen > single; the table reports what was measured.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from mgrpo_verl.experiments.logged_run import run_logged
from mgrpo_verl.launcher.step_progress import read_series

#: variant -> its overrides of mgrpo_trainer.yaml, on every task (docs/algorithms.md: each baseline is one switch away)
VARIANTS: dict[str, tuple[str, ...]] = {
    "joint": (),
    "frozen": ("multi_agent.agents.sub.trainable=false",),
    "shared_reward": ("multi_agent.mgrpo.sub_reward_local_weight=0", "multi_agent.mgrpo.sub_reward_main_weight=1"),
    "single": (
        "multi_agent.algorithm=grpo",
        "multi_agent.agents.sub.share_model_with=main",
        "trainer.n_gpus_per_node=1",
    ),
}

#: On relay_tools the single agent gets the sub-agent's tool (read_secret) in its own config: with
#: ``share_model_with`` the sub role takes its model's config, tools included, so without it neither role could
#: read the secret; with it the one model may read the secret itself or delegate to itself (the paper's single
#: agent with every tool).
_RELAY_TOOLS_SINGLE = (
    *VARIANTS["single"],
    "actor_rollout_ref.rollout.multi_turn.tool_config_path=${mgrpo_config_file:tools/relay_sub_tools.yaml}",
)
#: task -> variant -> its whole overrides on that task: a variant of :data:`VARIANTS` run differently there, or
#: one only that task has (``single_both``: it starts from relay_tools' warm start, see the module docstring).
TASK_VARIANTS: dict[str, dict[str, tuple[str, ...]]] = {
    "relay_tools": {
        "single": _RELAY_TOOLS_SINGLE,
        "single_both": (*_RELAY_TOOLS_SINGLE,
                        "actor_rollout_ref.model.path=${multi_agent.agents.sub.actor_rollout_ref.model.path}"),
    },
}


def task_variants(task: str) -> dict[str, tuple[str, ...]]:
    """variant -> its overrides on ``task``: :data:`VARIANTS` with the task's own (:data:`TASK_VARIANTS`)."""
    return {**VARIANTS, **TASK_VARIANTS.get(task, {})}


#: task -> (held-out metric of verl's validation, its label): exact accuracy where the task has it
#: (relay_tools); the relay's dense score on the forced relay, whose random models never answer exactly
VAL_KEYS = {
    "relay_tools": ("val-aux/mgrpo_verl/relay/exact/mean@1", "held-out exact accuracy (greedy)"),
    "relay": ("val-core/mgrpo_verl/relay/acc/mean@1", "held-out accuracy (dense score, greedy)"),
}
#: the main agent's and the sub-agent's training reward, and the step time (for the wall-time axis)
TRAIN_KEY = "agent/main/score/mean"
SUB_KEY = "agent/sub/score/mean"
STEP_TIME_KEY = "timing_s/step"
#: the metric key under which :func:`collect` files the task's held-out metric
VAL = "val"


def run_all(
    out: Path, seeds: list[int], steps: int, test_freq: int, variants: list[str], extra: list[str],
    task: str = "relay_tools",
) -> None:
    """Train every (variant, seed) that has no finished metrics file yet, printing progress."""
    jobs = [(v, s) for s in seeds for v in variants]  # seed by seed: a cut-short sweep still compares variants
    overrides = task_variants(task)
    for i, (variant, seed) in enumerate(jobs, 1):
        run_dir = out / variant / f"seed{seed}"
        metrics = run_dir / "metrics.jsonl"
        if (run_dir / "done").is_file():
            print(f"[{i}/{len(jobs)}] {variant} seed {seed}: done already, skipped", flush=True)
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "mgrpo_verl.main_ppo", f"task={task}",
            f"trainer.total_training_steps={steps}", f"trainer.test_freq={test_freq}", "trainer.save_freq=-1",
            "trainer.resume_mode=disable", f"trainer.default_local_dir={run_dir / 'ckpt'}",
            f"mgrpo_verl.metrics_file={metrics}", f"data.seed={seed}",
            f"trainer.experiment_name={task}_{variant}_seed{seed}", *overrides[variant], *extra,
        ]
        print(f"[{i}/{len(jobs)}] {variant} seed {seed}: training {steps} steps ...", flush=True)
        seconds = run_logged(args, run_dir / "log.txt", f"{variant} seed {seed}")
        (run_dir / "done").write_text(f"{seconds:.0f}\n")
        print(f"[{i}/{len(jobs)}] {variant} seed {seed}: {seconds:.0f} s", flush=True)


def collect(runs: Path, task: str = "relay_tools") -> dict[str, dict[int, dict[str, dict[int, float]]]]:
    """variant -> seed -> metric -> step -> value, for every finished run under ``runs``: the task's held-out
    metric under :data:`VAL`, the training rewards and the step time under their verl keys."""
    out: dict = {}
    for variant in task_variants(task):
        for seed_dir in sorted((runs / variant).glob("seed*")):
            metrics = seed_dir / "metrics.jsonl"
            if (seed_dir / "done").is_file() and metrics.is_file():
                seed = int(seed_dir.name.removeprefix("seed"))
                series = {k: read_series(metrics, k) for k in (TRAIN_KEY, SUB_KEY, STEP_TIME_KEY)}
                out.setdefault(variant, {})[seed] = {VAL: read_series(metrics, VAL_KEYS[task][0]), **series}
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
        val = [s[VAL] for s in seeds.values() if s[VAL]]
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
            "train_seconds": _mean([sum(s[STEP_TIME_KEY].values()) for s in seeds.values()]),
            "steps": max((max(s[TRAIN_KEY]) for s in seeds.values() if s[TRAIN_KEY]), default=0),
        })
    return rows


def markdown_table(rows: list[dict], label: str) -> str:
    lines = [
        f"| variant | seeds | steps | training time (s) | {label}: first val | last val (± std) | best "
        "| main reward (last 25%) | sub reward (last 25%) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['seeds']} | {r['steps']} | {r['train_seconds']:.0f} | {r['val_first']:.3f} "
            f"| {r['val_last']:.3f} ± {r['val_last_std']:.3f} | {r['val_best']:.3f} | {r['train_main']:.3f} "
            f"| {r['train_sub']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def wall_times(seed_series: dict[str, dict[int, float]]) -> dict[int, float]:
    """step -> training seconds up to the end of that step (sum of verl's ``timing_s/step``; step 0: 0)."""
    total, out = 0.0, {0: 0.0}
    for step in sorted(seed_series[STEP_TIME_KEY]):
        total += seed_series[STEP_TIME_KEY][step]
        out[step] = total
    return out


def plot(results: dict, path: Path, label: str, title: str) -> None:
    """Held-out metric against step (left) and against training wall time (right): one colour per variant,
    the mean over seeds thick, each seed thin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, (variant, seeds) in enumerate(results.items()):
        color = f"C{i}"
        runs = [s for s in seeds.values() if s[VAL]]
        times = [wall_times(s) for s in runs]
        for s, t in zip(runs, times):
            steps = sorted(s[VAL])
            by_step.plot(steps, [s[VAL][k] for k in steps], color=color, alpha=0.3, linewidth=1)
            by_time.plot([t.get(k, math.nan) for k in steps], [s[VAL][k] for k in steps], color=color, alpha=0.3,
                         linewidth=1)
        common = sorted(set.intersection(*(set(s[VAL]) for s in runs))) if runs else []
        mean = [_mean([s[VAL][k] for s in runs]) for k in common]
        by_step.plot(common, mean, color=color, linewidth=2.5, marker="o", label=f"{variant} (mean of {len(runs)})")
        mean_time = [_mean([t.get(k, math.nan) for t in times]) for k in common]
        by_time.plot(mean_time, mean, color=color, linewidth=2.5, marker="o")
    by_step.set_xlabel("training step")
    by_time.set_xlabel("training time (s, sum of step times; start-up and validation excluded)")
    by_step.set_ylabel(label)
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    by_step.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(runs: Path, out: Path, task: str = "relay_tools") -> str:
    results = collect(runs, task)
    if not results:
        raise SystemExit(f"no finished run under {runs}")
    label = VAL_KEYS[task][1]
    table = markdown_table(summary_rows(results), label)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{task}_baselines.md").write_text(table)
    plot(results, out / f"{task}_baselines.png", label, f"{task} on CPU: joint M-GRPO vs its baselines")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train every variant and seed")
    r.add_argument("--task", default="relay_tools", choices=list(VAL_KEYS))
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--steps", type=int, default=12)
    r.add_argument("--test-freq", type=int, default=4)
    r.add_argument("--variants", nargs="+", help="default: every variant of the task (see the module's docstring)")
    r.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    p = sub.add_parser("report", help="table and plot from finished runs")
    p.add_argument("--task", default="relay_tools", choices=list(VAL_KEYS))
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        known = task_variants(args.task)
        unknown = sorted(set(args.variants or ()) - set(known))
        if unknown:
            parser.error(f"--variants: {unknown} are not variants of task {args.task!r}; "
                         f"its variants are {list(known)}")
        run_all(args.out, args.seeds, args.steps, args.test_freq, args.variants or list(known), args.overrides,
                args.task)
    else:
        print(report(args.runs, args.out, args.task))


if __name__ == "__main__":
    main()
