"""Joint M-GRPO on the three-model example against its baselines: ``python compare.py run --seeds 0 1 2``, then
``python compare.py report --out ../../docs/results``.

Variants (each one switch of specialists.yaml, passed to ./run.sh):

* ``joint``: all three models trained by M-GRPO, each specialist on its own digit;
* ``frozen_alice`` / ``frozen_bob``: that specialist is not trained (it keeps its warm start);
* ``single``: one model (main's warm start) plays all three roles, with both tools, trained by GRPO on the final
  answer (``share_model_with``; the paper's single-agent baseline). It starts from a copy of the warm start's main
  checkpoint, outside the warm start's folder: its model offers other tools than the warm start was built for, which
  the warm start refuses (``StaleTools``), and a shared role cannot be fine-tuned on its own.

Every run starts from the same warm start (``data_seed`` 0, built once and cached); the seed is RL's
(``data.seed``: the order of the prompts). Runs go one after another (2 cores); a finished run is skipped, so a cut
sweep resumes. ``report`` prints and writes a Markdown table: held-out exact accuracy at each validation, mean ± std
over seeds, and every seed's last value.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mgrpo_verl.launcher.step_progress import read_series

HERE = Path(__file__).resolve().parent
EXACT = "val-aux/specialists/exact/mean@1"
VARIANTS = {
    "joint": [],
    "frozen_alice": ["multi_agent.agents.alice.trainable=false"],
    "frozen_bob": ["multi_agent.agents.bob.trainable=false"],
    "single": ["multi_agent.algorithm=grpo", "multi_agent.agents.alice.share_model_with=main",
               "multi_agent.agents.bob.share_model_with=main", "trainer.n_gpus_per_node=1",
               f"actor_rollout_ref.rollout.multi_turn.tool_config_path={HERE / 'tools_single.yaml'}",
               # the main prompt with four tool schemas is 711 tokens: at specialists.yaml's 576 verl cut its head
               "data.max_prompt_length=768"],
}


def single_base(out: Path, extra: list[str]) -> list[str]:
    """The single variant's model: a copy of the warm start's main checkpoint (the warm start of specialists.yaml
    with the ``mgrpo_verl.warmstart.*`` overrides in ``extra``, built by an earlier variant's run), and no warm start
    of its own."""
    import shutil

    from omegaconf import OmegaConf

    from mgrpo_verl.launcher.warm_start import checkpoint_dir

    copy = out / "single_base"
    if not copy.is_dir():
        given = OmegaConf.from_dotlist([o for o in extra if o.startswith("mgrpo_verl.warmstart.")])
        settings = OmegaConf.merge(OmegaConf.load(HERE / "specialists.yaml"), given).mgrpo_verl.warmstart
        settings.demos = str(HERE / settings.demos)  # relative to the launch directory, which run.sh makes HERE
        main = Path(checkpoint_dir("main", settings))
        if not main.is_dir():
            sys.exit(f"single: the warm start is not built yet ({main}): run another variant first")
        shutil.copytree(main, copy)
    return ["mgrpo_verl.warmstart.demos=null", f"actor_rollout_ref.model.path={copy}",
            *(f"multi_agent.agents.{a}.actor_rollout_ref.model.path={copy}" for a in ("alice", "bob"))]


def run(out: Path, seeds: list[int], variants: list[str], steps: int, extra: list[str]) -> None:
    jobs = [(v, s) for s in seeds for v in variants]
    for i, (variant, seed) in enumerate(jobs, 1):
        folder = out / variant / f"seed{seed}"
        if (folder / "done").is_file():
            print(f"[{i}/{len(jobs)}] {variant} seed {seed}: done already", flush=True)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        args = [str(HERE / "run.sh"), f"data.seed={seed}", f"trainer.total_training_steps={steps}",
                "trainer.resume_mode=disable", f"trainer.default_local_dir={folder / 'ckpt'}",
                f"mgrpo_verl.metrics_file={folder / 'metrics.jsonl'}",
                f"trainer.experiment_name=specialists_{variant}_seed{seed}", *VARIANTS[variant],
                *(single_base(out, extra) if variant == "single" else ()), *extra]
        print(f"[{i}/{len(jobs)}] {variant} seed {seed}: {steps} steps, log {folder / 'log.txt'}", flush=True)
        start = time.monotonic()
        with open(folder / "log.txt", "w") as log:
            # run.sh runs $PYTHON (default: the `python` on PATH): this interpreter, so that a venv's python need not be
            # activated first
            env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
            code = subprocess.call(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        seconds = time.monotonic() - start
        if code != 0:
            sys.exit(f"{variant} seed {seed} failed (exit {code}): see {folder / 'log.txt'}")
        (folder / "done").write_text(f"{seconds:.0f}\n")
        print(f"[{i}/{len(jobs)}] {variant} seed {seed}: {seconds:.0f} s; {summary_line(folder / 'log.txt')}",
              flush=True)


def summary_line(log: Path) -> str:
    lines = [line for line in log.read_text().splitlines() if line.startswith("mgrpo_verl: ") and " steps (" in line]
    return lines[-1] if lines else "(no summary line)"


def report(runs: Path, out: Path | None) -> str:
    rows, header_steps = [], None
    for variant in VARIANTS:
        seeds = {int(d.name.removeprefix("seed")): read_series(d / "metrics.jsonl", EXACT)
                 for d in sorted((runs / variant).glob("seed*")) if (d / "done").is_file()}
        if not seeds:
            continue
        steps = sorted(set.intersection(*(set(s) for s in seeds.values())))
        header_steps = header_steps or steps
        cells = []
        for step in header_steps:
            values = [s[step] for s in seeds.values() if step in s]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f}" if values else "–")
        last = ", ".join(f"{s[max(s)]:.3f}" for s in seeds.values())
        seconds = [float((runs / variant / f"seed{k}" / "done").read_text()) for k in seeds]
        rows.append(f"| {variant} | {len(seeds)} | " + " | ".join(cells)
                    + f" | {last} | {statistics.mean(seconds):.0f} |")
    if not rows:
        raise SystemExit(f"no finished run under {runs}")
    head = ("| variant | seeds | " + " | ".join(f"step {s}" for s in header_steps)
            + " | last, per seed | seconds per run |")
    table = "\n".join([head, "|" + "---|" * (len(header_steps) + 4), *rows]) + "\n"
    if out is not None:
        write_table(out / "specialists_baselines.md", table)
    return table


BEGIN, END = "<!-- compare.py report: begin -->", "<!-- compare.py report: end -->"


def write_table(page: Path, table: str) -> None:
    """Put ``table`` between :data:`BEGIN` and :data:`END` in ``page``, keeping what is written around them (the
    notes on the runs); a page without them gets a heading line and the table."""
    block = f"{BEGIN}\n{table}{END}\n"
    text = page.read_text() if page.is_file() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1].removeprefix("\n")
    else:
        text = ("Held-out exact accuracy (greedy, 32 held-out codes; mean ± std over seeds), written by "
                "examples/specialists/compare.py report.\n\n" + block + ("\n" + text if text else ""))
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=HERE / "outputs" / "compare")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    r.add_argument("--steps", type=int, default=15)
    r.add_argument("overrides", nargs="*", help="extra Hydra overrides of every run")
    p = sub.add_parser("report")
    p.add_argument("--runs", type=Path, default=HERE / "outputs" / "compare")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the table into specialists_baselines.md here (its notes are kept)")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, args.seeds, args.variants, args.steps, args.overrides)
    else:
        print(report(args.runs, args.out))


if __name__ == "__main__":
    main()
