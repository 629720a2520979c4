"""MAGRPO-trained agents vs the no-training baselines, over training steps: run, tabulate, plot.

``python -m mgrpo_verl.experiments.magrpo_comparison run --out DIR --seeds 0 1 2 --steps 40`` does, on the
task's validation items (``--problems`` items, ``--samples`` joint samples each, sampled at temperature 1):

1. the four baselines with the models the training starts from (single, parallel, sequential, discussion:
   :mod:`mgrpo_verl.experiments.coop_baselines`), once: ``DIR/untrained`` (for the writing task its warm start,
   built first when not cached: :func:`initial_models`);
2. per seed, MAGRPO training (``python -m mgrpo_verl.main_ppo --config-name magrpo_trainer`` with
   ``coop_task``, the seed, and a Hugging Face export of every agent every ``--eval-every`` steps), then the
   trained agents under the parallel protocol (MAGRPO's own: every agent writes its part at once) at each
   saved step, and under all four protocols at the last one: ``DIR/seed<k>/step<n>``.

``report --runs DIR --out docs/results`` writes ``magrpo_<task>.md`` (mean ± std over seeds of the joint
reward and its parts, per protocol, untrained vs trained) and ``magrpo_<task>.png`` (held-out joint
reward against step, with the untrained baselines as horizontal lines). ``recipes/magrpo_comparison.sh``
does both.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

from mgrpo_verl.experiments import coop_baselines
from mgrpo_verl.experiments.logged_run import run_logged
from mgrpo_verl.models.tiny import cached_name

#: ``coop_task`` group of magrpo_trainer.yaml for each task of coop_baselines
COOP_TASK = {"coop_writing": "writing", "coop_code": "code"}

#: What ``run`` records of the models it starts from (agent -> model and tokenizer folders) and of its overrides,
#: in ``DIR``: the report names the models in its table and plot.
MODELS_FILE = "models.json"

#: What each agent's checkpoint exports, so that the evaluation can load it (verl's ``save_contents``).
SAVE_CONTENTS = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"


def _baselines(task: str, out: Path, problems: int, samples: int, max_tokens: int, protocols: list[str],
               models: dict[str, dict[str, str]]) -> None:  # fmt: skip
    """One coop_baselines evaluation into ``out`` of ``models`` (agent -> its ``model`` and ``tokenizer``
    folders), skipped when its records exist."""
    if (out / f"{task}_records.jsonl").is_file():
        return
    argv = ["--task", task, "--problems", str(problems), "--samples", str(samples), "--max-tokens", str(max_tokens),
            "--out", str(out), "--protocols", *protocols]  # fmt: skip
    for agent, paths in models.items():
        argv += ["--model", f"{agent}={paths['model']}", "--tokenizer", f"{agent}={paths['tokenizer']}"]
    coop_baselines.main(argv)


def _agent_exports(step_dir: Path) -> dict[str, dict[str, str]]:
    """agent -> its Hugging Face export in a ``global_step_N`` folder (verl writes the tokenizer beside it)."""
    exports = {p.parent.parent.name: {"model": str(p), "tokenizer": str(p)}
               for p in sorted(step_dir.glob("agents/*/actor/huggingface"))}  # fmt: skip
    if not exports:
        raise SystemExit(f"{step_dir} has no Hugging Face export (agents/*/actor/huggingface)")
    return exports


def initial_models(task: str, extra: list[str]) -> dict[str, dict[str, str]]:
    """Each agent's model and tokenizer folders as the training runs start them (``mgrpo_verl.model`` /
    ``sub_model``, or the warm start's checkpoints, built now when not cached, as ``main_ppo`` would before Ray,
    same cache), so that "before RL" evaluates the very models the runs train."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from mgrpo_verl.config.plan import build_plan
    from mgrpo_verl.launcher import warm_start
    from mgrpo_verl.launcher.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        config = compose(config_name="magrpo_trainer", overrides=[f"coop_task={COOP_TASK[task]}", *extra])
    OmegaConf.resolve(config)
    plan = build_plan(config)
    warm_start.run_stage(plan)
    models = {}
    for agent in plan.multi_agent.agents:
        model = plan.agent_configs[plan.multi_agent.owner_of(agent)].actor_rollout_ref.model
        models[agent] = {"model": str(model.path), "tokenizer": str(model.get("tokenizer_path") or model.path)}
    return models


def run_all(out: Path, task: str, seeds: list[int], steps: int, eval_every: int, problems: int, samples: int,
            max_tokens: int, extra: list[str]) -> None:  # fmt: skip
    """Every step of the module docstring that has not finished yet, printing progress."""
    models = initial_models(task, extra)
    out.mkdir(parents=True, exist_ok=True)
    (out / MODELS_FILE).write_text(json.dumps({"models": models, "overrides": extra}, indent=1) + "\n")
    print("baselines before RL (" + ", ".join(f"{a}: {m['model']}" for a, m in models.items()) + ") ...", flush=True)
    _baselines(task, out / "untrained", problems, samples, max_tokens, list(coop_baselines.PROTOCOLS), models)
    for seed in seeds:
        run_dir = out / f"seed{seed}"
        ckpt = run_dir / "ckpt"
        if not (run_dir / "trained").is_file():
            run_dir.mkdir(parents=True, exist_ok=True)
            args = [
                sys.executable, "-m", "mgrpo_verl.main_ppo", "--config-name", "magrpo_trainer",
                f"coop_task={COOP_TASK[task]}", f"trainer.total_training_steps={steps}",
                f"trainer.save_freq={eval_every}", "trainer.test_freq=-1", "trainer.val_before_train=false",
                "trainer.resume_mode=disable", f"trainer.default_local_dir={ckpt}", SAVE_CONTENTS,
                f"mgrpo_verl.metrics_file={run_dir / 'metrics.jsonl'}", f"data.seed={seed}",
                f"trainer.experiment_name=magrpo_{task}_seed{seed}", *extra,
            ]  # fmt: skip
            print(f"seed {seed}: training {steps} steps ...", flush=True)
            seconds = run_logged(args, run_dir / "log.txt", f"seed {seed} training")
            (run_dir / "trained").write_text(f"{seconds:.0f}\n")
            print(f"seed {seed}: trained in {seconds:.0f} s", flush=True)
        saved = sorted(ckpt.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
        for step_dir in saved:
            step = int(step_dir.name.rsplit("_", 1)[1])
            protocols = list(coop_baselines.PROTOCOLS) if step_dir == saved[-1] else ["parallel"]
            print(f"seed {seed}: evaluating step {step} ({', '.join(protocols)}) ...", flush=True)
            _baselines(task, run_dir / f"step{step}", problems, samples, max_tokens, protocols,
                       _agent_exports(step_dir))


# ----------------------------------------------------------------------------------------------------
# report


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def collect(runs: Path, task: str) -> dict[str, Any]:
    """``{"untrained": {protocol: summary}, "seeds": {seed: {step: {protocol: summary}}}}`` (summaries of
    :func:`coop_baselines.summarize`), plus the training reward curves."""
    from mgrpo_verl.envs.coop_tasks import TASK_SOURCES, task_for

    info_keys = task_for(TASK_SOURCES[task]).info_keys
    untrained = runs / "untrained" / f"{task}_records.jsonl"
    if not untrained.is_file():
        raise SystemExit(f"no untrained baselines under {runs} (run the 'run' step first)")
    result: dict[str, Any] = {"untrained": coop_baselines.summarize(_records(untrained), info_keys), "seeds": {},
                              "train": {}, "models": _models_label(runs / MODELS_FILE)}
    for run_dir in sorted(runs.glob("seed*")):
        seed = int(run_dir.name[4:])
        steps = {}
        for step_dir in run_dir.glob("step*"):
            records = step_dir / f"{task}_records.jsonl"
            if records.is_file():
                steps[int(step_dir.name[4:])] = coop_baselines.summarize(_records(records), info_keys)
        if steps:
            result["seeds"][seed] = dict(sorted(steps.items()))
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file():
            curve = {}
            for line in metrics.read_text().splitlines():
                record = json.loads(line) if line.strip() else {}
                rewards = [v for k, v in record.get("data", {}).items()
                           if k.startswith("agent/") and k.endswith("/score/mean")]
                if rewards:
                    curve[int(record["step"])] = float(rewards[0])  # the joint reward: the same for every agent
            result["train"][seed] = curve
    return result


def _models_label(path: Path) -> str:
    """The models a run started from, by name (``cached_name``: ``smollm2-135m-instruct``, ``tiny-qwen2``), in agent
    order without repeats, and the run's extra overrides when it had any; "models not recorded" for runs made before
    ``run`` wrote :data:`MODELS_FILE`."""
    if not path.is_file():
        return "models not recorded"
    record = json.loads(path.read_text())
    label = " / ".join(dict.fromkeys(cached_name(m["model"]) for m in record["models"].values()))
    overrides = record.get("overrides") or []
    return label + (f" (overrides: {' '.join(f'`{o}`' for o in overrides)})" if overrides else "")


def markdown(result: dict[str, Any], task: str) -> str:
    """Per protocol: the untrained agents' metrics vs the trained agents' at each seed's last step."""
    seeds = result["seeds"]
    last = {seed: steps[max(steps)] for seed, steps in seeds.items() if steps}
    keys = sorted({k for row in result["untrained"].values() for k in row if k != "samples"},
                  key=lambda k: (k != "reward", k))
    steps = sorted({max(s) for s in seeds.values() if s})
    lines = [f"### {task}: no training vs MAGRPO ({len(last)} seeds, step {'/'.join(map(str, steps)) or '-'})", "",
             f"Models: {result['models']}.", "",
             "Mean over validation items × samples (temperature 1); trained: mean ± std over seeds.", "",
             "| protocol | agents | " + " | ".join(keys) + " |", "|---|---|" + "---:|" * len(keys)]  # fmt: skip
    for protocol in coop_baselines.PROTOCOLS:
        if protocol in result["untrained"]:
            row = result["untrained"][protocol]
            lines.append(f"| {protocol} | before RL | "
                         + " | ".join(f"{row.get(k, math.nan):.3f}" for k in keys) + " |")
        trained = [s[protocol] for s in last.values() if protocol in s]
        if trained:
            cells = []
            for k in keys:
                mean, std = _mean_std([t[k] for t in trained if k in t])
                cells.append(f"{mean:.3f} ± {std:.3f}")
            lines.append(f"| {protocol} | MAGRPO | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], task: str, path: Path) -> None:
    """Held-out joint reward (parallel protocol) against step per seed and their mean; the untrained
    baselines as horizontal lines; the training reward thin and dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    curves = {seed: {0: result["untrained"]["parallel"]["reward"],
                     **{k: v["parallel"]["reward"] for k, v in steps.items()}}
              for seed, steps in result["seeds"].items() if "parallel" in result["untrained"]}  # fmt: skip
    for curve in curves.values():
        ax.plot(sorted(curve), [curve[k] for k in sorted(curve)], color="C0", alpha=0.3, linewidth=1)
    if curves:
        common = sorted(set.intersection(*(set(c) for c in curves.values())))
        ax.plot(common, [sum(c[k] for c in curves.values()) / len(curves) for k in common], color="C0", linewidth=2.5,
                marker="o", label=f"MAGRPO, held-out, parallel (mean of {len(curves)} seeds)")  # fmt: skip
    for seed, curve in result["train"].items():
        ax.plot(sorted(curve), [curve[k] for k in sorted(curve)], color="C0", alpha=0.25, linewidth=0.8, linestyle="--",
                label="MAGRPO, training reward" if seed == min(result["train"]) else None)  # fmt: skip
    for i, (protocol, row) in enumerate(result["untrained"].items(), 1):
        ax.axhline(row["reward"], color=f"C{i}", linestyle=":", linewidth=1.5, label=f"before RL, {protocol}")
    ax.set_xlabel("training step")
    ax.set_ylabel("joint reward")
    # the label names every override: wrapped to the figure's width, without the table's Markdown backticks
    title = f"MAGRPO on {task} (CPU; {result['models']}) vs the same agents before RL".replace("`", "")
    ax.set_title(textwrap.fill(title, 110), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(runs: Path, out: Path, task: str) -> str:
    result = collect(runs, task)
    table = markdown(result, task)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"magrpo_{task}.md").write_text(table)
    plot(result, task, out / f"magrpo_{task}.png")
    return table


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="baselines, MAGRPO training per seed, evaluation of the saved steps")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--task", choices=sorted(COOP_TASK), default="coop_writing")
    r.add_argument("--seeds", type=int, nargs="+", default=[0])
    r.add_argument("--steps", type=int, default=40)
    r.add_argument("--eval-every", type=int, default=10)
    r.add_argument("--problems", type=int, default=32)
    r.add_argument("--samples", type=int, default=4)
    r.add_argument("--max-tokens", type=int, default=48, help="as multi_agent.cooperation.response_tokens")
    r.add_argument("overrides", nargs="*", help="extra Hydra overrides of the training runs (after --)")
    p = commands.add_parser("report", help="table and plot of finished runs")
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--out", type=Path, default=Path("docs/results"))
    p.add_argument("--task", choices=sorted(COOP_TASK), default="coop_writing")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.steps < 1 or args.eval_every < 1:
            parser.error("--steps and --eval-every must be >= 1")
        run_all(args.out, args.task, args.seeds, args.steps, args.eval_every, args.problems, args.samples,
                args.max_tokens, args.overrides)  # fmt: skip
    else:
        print(report(args.runs, args.out, args.task))


if __name__ == "__main__":
    main()
