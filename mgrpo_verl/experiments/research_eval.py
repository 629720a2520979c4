"""Evaluate trained deep-research systems on benchmarks: the paper-style table plus per-agent statistics.

Two steps, ``run`` then ``report`` (``recipes/research_eval.sh`` does both; ``train`` first trains the
systems to compare, joint M-GRPO and its baselines: ``recipes/research_baselines.sh`` does all three)::

    python -m mgrpo_verl.experiments.research_eval run --out runs/research_eval \\
        --benchmark builtin --benchmark data/gaia_text.parquet \\
        --system joint=runs/research/joint/ckpt/global_step_40 \\
        --system frozen=runs/research/frozen/ckpt/global_step_40 \\
        --system single=runs/research/single/ckpt/global_step_40 \\
        [-- extra Hydra overrides, e.g. the GPU recipe's]
    python -m mgrpo_verl.experiments.research_eval report --runs runs/research_eval --out docs/results

``run`` evaluates each system with the real trainer (``main_ppo research=<preset> trainer.val_only=true``, the
system's checkpoint and variant, every benchmark as ``data.val_files``): verl's validation runs the training
rollout and dumps every query with its statistics; ``report`` rescores the final answers (exact match, F1, an
optional LLM judge) into ``research_eval.md`` / ``.json``. Details: ``docs/research.md``, "Evaluation".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from mgrpo_verl.experiments.baselines import VARIANTS
from mgrpo_verl.experiments.logged_run import run_logged

#: The benchmark spec meaning "the built-in questions' validation split".
BUILTIN = "builtin"

#: What ``run`` writes the per-query dump and the log of one system to, under ``--out``.
GENERATIONS, LOG, DONE = "generations", "log.txt", "done"


@dataclass(frozen=True)
class System:
    """A system to evaluate: ``name`` (the table's row), ``variant`` (a key of ``VARIANTS``) and its
    checkpoint (a ``global_step_N`` folder), ``None`` for the initial models."""

    name: str
    variant: str
    checkpoint: Optional[Path]

    @classmethod
    def parse(cls, spec: str) -> System:
        """``NAME=PATH`` (NAME a variant), ``NAME:VARIANT=PATH``; PATH ``untrained`` for no checkpoint.

        Raises:
            ValueError: a malformed spec, an unknown variant, or a checkpoint that is not a
                ``global_step_N`` folder.
        """
        head, sep, path = spec.partition("=")
        if not sep or not head or not path:
            raise ValueError(f"--system takes NAME=PATH or NAME:VARIANT=PATH, got {spec!r}")
        name, _, variant = head.partition(":")
        variant = variant or name
        if variant not in VARIANTS:
            raise ValueError(f"--system {spec!r}: unknown variant {variant!r}; variants are {sorted(VARIANTS)}")
        if path == "untrained":
            return cls(name, variant, None)
        checkpoint = Path(path)
        if not checkpoint.is_dir() or not checkpoint.name.startswith("global_step_"):
            raise ValueError(f"--system {spec!r}: {path} is not a global_step_N checkpoint folder")
        return cls(name, variant, checkpoint.resolve())


def parse_benchmark(spec: str) -> Optional[Path]:
    """A parquet file in the research layout, or ``None`` for ``builtin`` (the built-in questions).

    Raises:
        ValueError: a missing file.
    """
    if spec == BUILTIN:
        return None
    if not Path(spec).is_file():
        raise ValueError(f"--benchmark {spec!r}: no such file (a converted benchmark parquet, or 'builtin')")
    return Path(spec).resolve()


def eval_command(system: System, val_files: Sequence[str], out: Path, preset: str, extra: Sequence[str]) -> list[str]:
    """The ``main_ppo`` command line evaluating ``system`` on ``val_files``, dumping into ``out``."""
    resume = (
        ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={system.checkpoint}"]
        if system.checkpoint
        else ["trainer.resume_mode=disable"]
    )
    files = ",".join(json.dumps(str(f)) for f in val_files)
    return [
        sys.executable, "-m", "mgrpo_verl.main_ppo", f"research={preset}", "task=relay",
        "trainer.val_only=true", "trainer.val_before_train=true", f"mgrpo_verl.metrics_file={out / 'metrics.jsonl'}",
        f"data.val_files=[{files}]", f"trainer.validation_data_dir={out / GENERATIONS}",
        f"trainer.default_local_dir={out / 'unused_ckpt'}", f"trainer.experiment_name=eval_{system.name}",
        *resume, *VARIANTS[system.variant], *extra,
    ]  # fmt: skip


def run_all(out: Path, systems: Sequence[System], benchmarks: Sequence[Optional[Path]],
            preset: str, extra: Sequence[str]) -> None:
    """Evaluate every system without a finished dump yet, one process after another, printing progress."""
    from mgrpo_verl.envs.builtin import task_files

    val_files = [str(path) if path else str(task_files("research")[1]) for path in benchmarks]
    for i, system in enumerate(systems, 1):
        directory = out / system.name
        if (directory / DONE).is_file():
            print(f"[{i}/{len(systems)}] {system.name}: evaluated already, skipped", flush=True)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        print(f"[{i}/{len(systems)}] {system.name} ({system.variant}, {system.checkpoint or 'untrained'}) ...",
              flush=True)
        seconds = run_logged(eval_command(system, val_files, directory, preset, extra), directory / LOG, system.name)
        (directory / DONE).write_text(f"{seconds:.0f}\n")
        print(f"[{i}/{len(systems)}] {system.name}: {seconds:.0f} s", flush=True)


def train_all(out: Path, variants: Sequence[str], steps: int, preset: str, extra: Sequence[str]) -> dict[str, Path]:
    """Train every variant (``joint``, ``frozen``, ``single``) for ``steps`` steps, one after another, into
    ``out/<variant>`` (skipped when trained already); returns variant -> its last checkpoint."""
    checkpoints = {}
    for i, variant in enumerate(variants, 1):
        directory = out / variant
        checkpoints[variant] = directory / f"global_step_{steps}"
        if (directory / "trained").is_file():
            print(f"[{i}/{len(variants)}] {variant}: trained already, skipped", flush=True)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable, "-m", "mgrpo_verl.main_ppo", f"research={preset}", "task=relay",
            f"trainer.total_training_steps={steps}", f"trainer.save_freq={steps}", f"trainer.test_freq={steps}",
            "trainer.resume_mode=disable", f"trainer.default_local_dir={directory}",
            f"mgrpo_verl.metrics_file={directory / 'metrics.jsonl'}", f"trainer.experiment_name=research_{variant}",
            *VARIANTS[variant], *extra,
        ]  # fmt: skip
        print(f"[{i}/{len(variants)}] {variant}: training {steps} steps ...", flush=True)
        seconds = run_logged(args, directory / LOG, f"{variant} training")
        if not checkpoints[variant].is_dir():
            raise SystemExit(f"{variant} training failed (exit 0): no {checkpoints[variant]}; see {directory / LOG}")
        (directory / "trained").write_text(f"{seconds:.0f}\n")
        print(f"[{i}/{len(variants)}] {variant}: {seconds:.0f} s", flush=True)
    return checkpoints


# ----------------------------------------------------------------------------------------------------
# report


def read_queries(dump_dir: Path) -> list[dict[str, Any]]:
    """One record per query from a validation dump (verl writes ``<step>.jsonl``, one line per row, every
    row of a trajectory carrying its query's statistics; the key ``uid`` is ``<uid>_<session>_<index>``).

    Raises:
        FileNotFoundError: no dump in ``dump_dir``.
        ValueError: a dump line without the statistics of a research rollout.
    """
    from mgrpo_verl.agent_loops.common import QueryStats

    # the dump of the latest step (verl names each by its step: 2.jsonl sorts after 10.jsonl by name)
    files = sorted(dump_dir.glob("*.jsonl"),
                   key=lambda p: (p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0, p.name))
    if not files:
        raise FileNotFoundError(f"no validation dump (*.jsonl) in {dump_dir}")
    queries: dict[str, dict[str, Any]] = {}
    for line in files[-1].read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        try:
            QueryStats.read(record, str(files[-1]))
        except ValueError as err:
            raise ValueError(
                f"a row without the research rollout's statistics ({err}); was it evaluated with the mgrpo_relay "
                "or mgrpo_delegate loop?"
            ) from None
        session = str(record["uid"]).rsplit("_", 1)[0]
        queries[session] = record  # every row of a session carries the same statistics
    return list(queries.values())


def score_query(record: dict[str, Any], judge: Any = None) -> dict[str, Any]:
    """A query's table entry: source, level, ``em`` / ``f1`` of its answer (and ``judge`` with a judge),
    its statistics."""
    from mgrpo_verl.agent_loops.common import QueryStats
    from mgrpo_verl.envs.research import rewards
    from mgrpo_verl.envs.research.dataset import decode_answers

    stats = QueryStats.read(record, f"query {record.get('uid')!r}")
    answers = decode_answers(record["gts"])  # verl's own keys of the dump: gts, input
    prediction = rewards.extract_answer(stats.answer)
    entry = {
        "source": stats.source or "unknown",
        "level": stats.level,
        "em": rewards.exact_match(prediction, answers),
        "f1": rewards.f1(prediction, answers),
        **stats.averaged(),
    }
    if judge is not None:  # the question is the prompt's last "Question:" line (prompts.main_prompt)
        question = str(record.get("input", "")).rpartition("Question:")[2].strip().split("\n")[0]
        entry["judge"] = judge.judge(question, prediction, answers)
    return entry


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(entries: dict[str, list[dict[str, Any]]], metric: str) -> dict[str, Any]:
    """system -> {"accuracy": {source: {level or "all": (mean metric, n)}}, "stats": {key: mean per query}}."""
    from mgrpo_verl.agent_loops.common import QueryStats

    summary: dict[str, Any] = {}
    for system, rows in entries.items():
        accuracy: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
        by_source: dict[str, list[dict]] = defaultdict(list)
        for row in rows:
            by_source[row["source"]].append(row)
        for source, source_rows in sorted(by_source.items()):
            levels = sorted({r["level"] for r in source_rows if r["level"]})
            for level in levels:
                chosen = [r[metric] for r in source_rows if r["level"] == level]
                accuracy[source][level] = (_mean(chosen), len(chosen))
            accuracy[source]["all"] = (_mean([r[metric] for r in source_rows]), len(source_rows))
        keys = sorted({k for r in rows for k in r if QueryStats.is_averaged(k)})
        stats = {k: _mean([r.get(k, 0.0) for r in rows]) for k in keys}
        summary[system] = {"accuracy": dict(accuracy), "stats": stats}
    return summary


def markdown(summary: dict[str, Any], metric: str) -> str:
    """The paper-style table (systems × benchmark levels) and the per-agent statistics table."""
    columns = sorted({(s, lv) for v in summary.values() for s, levels in v["accuracy"].items() for lv in levels},
                     key=lambda c: (c[0], c[1] == "all", c[1]))  # fmt: skip
    header = ["system"] + [f"{s} {'avg' if lv == 'all' else 'L' + lv}" for s, lv in columns]
    lines = [f"Accuracy ({metric}, %) per benchmark and level; n = queries per cell in the last row.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * len(columns)]  # fmt: skip
    counts: dict[tuple[str, str], int] = {}
    for system, values in summary.items():
        cells = []
        for source, level in columns:
            mean, n = values["accuracy"].get(source, {}).get(level, (math.nan, 0))
            cells.append("—" if n == 0 else f"{100 * mean:.1f}")
            counts[(source, level)] = max(counts.get((source, level), 0), n)
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    if counts:
        lines.append("| n | " + " | ".join(str(counts[c]) for c in columns) + " |")
    keys = sorted({k for v in summary.values() for k in v["stats"]}, key=lambda k: (k.startswith("tool/"), k))
    lines += ["", "Per-agent statistics (mean per query): sub-agent calls, failed calls, tool calls by tool "
              "(main agent's and sub-agents'), response tokens generated by each agent.", "",
              "| system | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]  # fmt: skip
    for system, values in summary.items():
        lines.append(f"| {system} | " + " | ".join(f"{values['stats'].get(k, 0.0):.2f}" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def report(runs: Path, out: Path, metric: str = "em", use_judge: bool = False) -> str:
    """Read every evaluated system under ``runs``, write ``research_eval.md`` / ``.json`` into ``out``."""
    judge = None
    if use_judge:
        from mgrpo_verl.envs.research.rewards import LLMJudge, judge_config_from_env

        judge, metric = LLMJudge(judge_config_from_env()), "judge"
    entries = {}
    for directory in sorted(p for p in runs.iterdir() if (p / DONE).is_file()):
        entries[directory.name] = [score_query(q, judge) for q in read_queries(directory / GENERATIONS)]
    if not entries:
        raise SystemExit(f"no evaluated system under {runs} (run the 'run' step first)")
    summary = summarize(entries, metric)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(summary, metric)
    (out / "research_eval.md").write_text(text)
    (out / "research_eval.json").write_text(json.dumps(summary, indent=2, default=list))
    return text


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("train", help="train the systems to compare: joint M-GRPO and the baselines")
    t.add_argument("--out", type=Path, default=Path("runs/research"))
    t.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    t.add_argument("--steps", type=int, default=30)
    t.add_argument("--preset", choices=("cpu", "gpu"), default="cpu")
    t.add_argument("overrides", nargs="*", help="extra Hydra overrides of every training run (after --)")
    r = commands.add_parser("run", help="evaluate each system with the real trainer (val_only)")
    r.add_argument("--out", type=Path, default=Path("runs/research_eval"))
    r.add_argument("--system", action="append", required=True, metavar="NAME[:VARIANT]=CHECKPOINT|untrained")
    r.add_argument("--benchmark", action="append", default=[], metavar="PARQUET|builtin",
                   help="a converted benchmark (mgrpo_verl.envs.research.loaders) or builtin (the default)")
    r.add_argument("--preset", choices=("cpu", "gpu"), default="cpu", help="the training preset: research=<preset>")
    r.add_argument("overrides", nargs="*", help="extra Hydra overrides for every system (after --)")
    p = commands.add_parser("report", help="tabulate the dumps of evaluated systems")
    p.add_argument("--runs", type=Path, default=Path("runs/research_eval"))
    p.add_argument("--out", type=Path, default=Path("runs/research_eval"))
    p.add_argument("--metric", choices=("em", "f1"), default="em")
    p.add_argument("--judge", action="store_true", help="accuracy by an LLM judge (MGRPO_JUDGE_* env vars)")
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            if args.steps < 1:
                raise ValueError("--steps must be >= 1")
            for variant, path in train_all(args.out, args.variants, args.steps, args.preset, args.overrides).items():
                print(f"--system {variant}={path}")
        elif args.command == "run":
            systems = [System.parse(s) for s in args.system]
            benchmarks = [parse_benchmark(b) for b in args.benchmark] or [None]
            run_all(args.out, systems, benchmarks, args.preset, args.overrides)
        else:
            print(report(args.runs, args.out, args.metric, args.judge))
    except ValueError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    main()
