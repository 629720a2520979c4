"""Throughput of our M-GRPO trainer (two models on one GPU) against stock verl GRPO (one model), one run, matched work.

    python benchmarks/bench_gpu_throughput.py run --preset qwen2.5-0.5b          # on the GPU machine (cuda)
    python benchmarks/bench_gpu_throughput.py run --preset qwen2.5-0.5b --stages T2 T3   # some stages (one call each)
    MGRPO_SMOKE_DEVICE=cpu PYTHON=.venv-vllm/bin/python \
      .venv-vllm/bin/python benchmarks/bench_gpu_throughput.py run --preset tiny_h32   # vLLM's CPU build, labelled cpu
    python benchmarks/bench_gpu_throughput.py report --work gpu_smoke_out            # the report again

``run`` builds the model (``--preset``: a real-size random model, mgrpo_verl/models/real_size.py, or a built-in tiny
one) and runs stages of the GPU smoke kit (recipes/gpu_smoke.sh, one harness for all), ours first:

- **T2, ours**: ``python -m mgrpo_verl.main_ppo`` (our M-GRPO trainer) with two models of the same size on the one
  GPU (``multi_agent.placement=shared``, each agent its own vLLM engine that sleeps while the actors update), on
  the agent loop ``mgrpo_twin`` (``mgrpo_verl.experiments.gpu_smoke.twin_loop``): every prompt goes to both models,
  each writes one single-turn row of it.
- **T3, stock at equal tokens**: ``python -m verl.trainer.main_ppo`` (verl's own entry point, GRPO trainer and
  ``single_turn_agent``) with one model and 2n rollouts per prompt, on a config file that ``stock-config`` writes:
  our ``single_agent`` config composed with the same overrides, resolved, our sections removed (so every verl key
  has the value our run has).
- **T1, stock per model**: the same with n rollouts.

What is matched (and checked from the metrics, not assumed): the same prompt rows (the relay task's main-agent
prompts without ``agent_name``, one parquet for all three, tokenised the same way); every row's response is
exactly R generated tokens (``actor_rollout_ref.rollout.ignore_eos``, which verl passes to vLLM's SamplingParams,
and R = ``data.max_response_length``); B prompts per step. So each of our two models generates per step exactly
what T1's one model generates (B x n rows of prompt + R), and T2's step holds exactly T3's tokens (2 B n rows).
The numerator is verl's ``perf/throughput`` on both sides (``compute_throughout_metrics``: the sum over the
step's rows of prompt + response tokens, ``global_token_num``, over the step time and the GPU count), so both
count the same things. The report:

- **per token** (goal >= 0.9): perf/throughput T2 / T3, at equal tokens per step (= T3's step time / T2's);
- **per model step** (bar <= 2.2): step time T2 / T1: two models' step against one model's, same rows per model;

each with a verdict only when its token counts match (``matched``: T2 = T3 tokens, T2 = 2 x T1 tokens, every
response R tokens), per side the median step time, each phase, tokens per step, prompt and response lengths,
perf/throughput, tokens / step time (a check: equal on one GPU), and peak GPU memory per process. Medians over the
measured steps (the first is a warm-up); no validation, no checkpoints. Not measured: the relay task's sequential
delegation (the sub-agent's reply in the main agent's row), which is the task's cost, not the trainer's. Stock runs
our configs' other settings too (the replay-buffer sampler, the reward function). Labels follow the kit: cpu runs
are never GPU figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STOCK, OURS, STOCK_X2 = "T1", "T2", "T3"
#: Run order: what the headline needs first (ours, then stock at equal tokens), then stock per model.
RUN_ORDER = (OURS, STOCK_X2, STOCK)
LABELS = {STOCK: "stock", OURS: "ours", STOCK_X2: "stock_x2"}
THROUGHPUT_BAR = 0.9
STEP_BAR = 2.2
#: Sections of our composed config that stock verl has no schema for.
OUR_SECTIONS = ("mgrpo_verl", "multi_agent")


# ------------------------------------------------------------------------------------------------- stock config


def stock_dataset(out_dir: Path) -> tuple[Path, Path]:
    """The relay task's main-agent prompts for verl's own single-turn loop: the same rows without ``agent_name``."""
    import pandas as pd

    from mgrpo_verl.envs.builtin import task_files

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for src, name in zip(task_files("relay"), ("train.parquet", "val.parquet")):
        frame = pd.read_parquet(src).drop(columns=["agent_name"], errors="ignore")
        frame.to_parquet(out_dir / name)
        paths.append(out_dir / name)
    return paths[0], paths[1]


def stock_config(overrides: list[str], out_dir: Path) -> Path:
    """``single_agent`` composed with ``overrides``, resolved, our sections dropped: ``<out_dir>/stock.yaml``."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import mgrpo_verl
    from mgrpo_verl.launcher.resolvers import register_resolvers

    register_resolvers()
    train, val = stock_dataset(out_dir / "data")
    config_dir = Path(mgrpo_verl.__file__).resolve().parent / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="single_agent", overrides=[
            *overrides, f"data.train_files={train}", f"data.val_files={val}",
            f"mgrpo_verl.metrics_file={out_dir / 'unused.jsonl'}",
        ])
    OmegaConf.resolve(cfg)
    OmegaConf.set_struct(cfg, False)
    for section in (*OUR_SECTIONS, "hydra"):
        cfg.pop(section, None)
    path = out_dir / "stock.yaml"
    path.write_text(OmegaConf.to_yaml(cfg))
    return path


def twin_files(out_dir: Path) -> Path:
    """T2's inputs: stock's prompt rows (:func:`stock_dataset`) and the one-entry agent-loop file that registers
    ``mgrpo_twin`` in T2's agent-loop workers (verl's ``rollout.agent.agent_loop_config_path``)."""
    from mgrpo_verl.experiments.gpu_smoke import TWIN_LOOP, TWIN_TARGET

    stock_dataset(out_dir / "data")
    path = out_dir / "agent_loops.yaml"
    path.write_text(f"- name: {TWIN_LOOP}\n  _target_: {TWIN_TARGET}\n")
    return path


# ------------------------------------------------------------------------------------------------------- report


def _num(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


#: verl's metrics each side reports (medians over the measured steps): tokens per step as perf/throughput counts
#: them, the step time it divides by, and the row lengths that say what was matched.
TOKEN_KEYS = ("perf/total_num_tokens", "perf/time_per_step", "prompt_length/mean", "response_length/mean",
              "response_length/min", "response_length/max")


def step_tokens(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians over the measured steps (the first is the warm-up) of :data:`TOKEN_KEYS`, named by their key."""
    from mgrpo_verl.experiments import gpu_smoke as gs

    steps = [r["data"] for r in records if _num(r["data"].get("timing_s/step")) is not None]
    measured = steps[1:] if len(steps) >= 2 else steps
    return {key: gs._median(_num(d.get(key)) for d in measured) for key in TOKEN_KEYS}


def side(stage: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """One side of the comparison from the kit's stage summary and its metrics records."""
    sm, mem = stage["summary"], stage["gpu_memory"]
    t = step_tokens(records)
    tokens, step_time = t["perf/total_num_tokens"], t["perf/time_per_step"]
    row_tokens = (t["prompt_length/mean"] or 0) + (t["response_length/mean"] or 0)
    return {
        "stage": stage["stage"], "device": stage["device"], "status": stage["status"], "steps": sm["steps"],
        "step_s": sm["step_s"], "phases": {p: sm[p] for p in ("gen", "old_log_prob", "update_actor", "update_weights")},
        "tokens_per_step": tokens, "rows_per_step": tokens / row_tokens if tokens and row_tokens else None,
        "prompt_tokens": t["prompt_length/mean"], "response_tokens": t["response_length/mean"],
        "response_tokens_min_max": [t["response_length/min"], t["response_length/max"]],
        # verl's perf/throughput (tokens / s / GPU); tokens / step time as a check (equal on one GPU)
        "throughput": sm["tokens_per_s"], "tokens_per_step_time": tokens / step_time if tokens and step_time else None,
        "peak_mib_per_process": [(p.get("cmd") or p["name"], p["peak_mib"]) for p in mem["per_process"]],
        "peak_gpu_used_mib": mem["peak_gpu_used_mib"], "torch_peaks_gb": stage["torch_peaks_gb"],
    }


def _usable(sides: dict[str, dict[str, Any] | None], *names: str) -> str | None:
    """Why the sides ``names`` cannot be compared (None: they can)."""
    missing = [n for n in names if sides.get(n) is None]
    if missing:
        return f"{', '.join(missing)} not run"
    bad = [f"{n}: {sides[n]['status']}" for n in names if sides[n]["status"] != "ok"]
    if bad:
        return ", ".join(bad)
    devices = {sides[n]["device"] for n in names}
    return f"different devices ({', '.join(sorted(map(str, devices)))})" if len(devices) > 1 else None


def matched(sides: dict[str, dict[str, Any] | None], response_tokens: int | None) -> dict[str, Any]:
    """What the token counts say (None: a side is missing or has no count): T2's tokens per step equal T3's and
    twice T1's, and every response of every side is ``response_tokens`` long."""
    tok = {n: (s or {}).get("tokens_per_step") for n, s in sides.items()}
    out: dict[str, Any] = {
        "ours_equals_stock_x2":
            None if tok.get(OURS) is None or tok.get(STOCK_X2) is None else tok[OURS] == tok[STOCK_X2],
        "ours_equals_twice_stock":
            None if tok.get(OURS) is None or tok.get(STOCK) is None else tok[OURS] == 2 * tok[STOCK],
    }
    lengths = [v for s in sides.values() if s for v in s["response_tokens_min_max"]]
    out["fixed_length"] = (None if response_tokens is None or not lengths or None in lengths
                           else all(v == response_tokens for v in lengths))
    return out


def compare(sides: dict[str, dict[str, Any] | None], response_tokens: int | None = None) -> dict[str, Any]:
    """throughput ratio = perf/throughput T2 / T3, per token (goal >= 0.9); step ratio = step time T2 / T1, per
    model step (bar <= 2.2). A verdict only where the token counts match (:func:`matched`)."""
    m = matched(sides, response_tokens)
    out: dict[str, Any] = {"matched": m, "throughput_ratio": None, "step_ratio": None, "verdicts": {}, "why": {}}
    ok_length = m["fixed_length"] is not False
    why = _usable(sides, OURS, STOCK_X2)
    if why is None and sides[STOCK_X2]["throughput"] and sides[OURS]["throughput"] is not None:
        out["throughput_ratio"] = sides[OURS]["throughput"] / sides[STOCK_X2]["throughput"]
        if m["ours_equals_stock_x2"] and ok_length:
            out["verdicts"]["throughput"] = "pass" if out["throughput_ratio"] >= THROUGHPUT_BAR else "fail"
        else:
            out["verdicts"]["throughput"] = "unmatched"
            out["why"]["throughput"] = "tokens per step or response lengths differ: no verdict"
    elif why is not None:
        out["why"]["throughput"] = why
    why = _usable(sides, OURS, STOCK)
    if why is None and sides[STOCK]["step_s"] and sides[OURS]["step_s"] is not None:
        out["step_ratio"] = sides[OURS]["step_s"] / sides[STOCK]["step_s"]
        if m["ours_equals_twice_stock"] and ok_length:
            out["verdicts"]["step"] = "pass" if out["step_ratio"] <= STEP_BAR else "fail"
        else:
            out["verdicts"]["step"] = "unmatched"
            out["why"]["step"] = "ours' tokens per step are not twice stock's, or response lengths differ: no verdict"
    elif why is not None:
        out["why"]["step"] = why
    return out


def build_report(work: Path) -> dict[str, Any]:
    """The comparison from the stage folders T1, T2, T3 of ``work`` that exist (at least one)."""
    from mgrpo_verl.experiments import gpu_smoke as gs

    sides: dict[str, dict[str, Any] | None] = {}
    for name in RUN_ORDER:
        d = work / name
        if d.is_dir():
            stage = gs.summarize_stage(d)
            gs.check_labels([stage])
            sides[name] = side(stage, gs.read_metrics(d / "metrics.jsonl"))
        else:
            sides[name] = None
    if not any(sides.values()):
        raise SystemExit(f"bench_gpu_throughput: no stage folder T1, T2 or T3 in {work}: run `run` first")
    env = json.loads((work / "env.json").read_text()) if (work / "env.json").is_file() else {}
    settings = (json.loads((work / "throughput_settings.json").read_text())
                if (work / "throughput_settings.json").is_file() else {})
    devices = {s["device"] for s in sides.values() if s}
    device = devices.pop() if len(devices) == 1 else "mixed"
    return {"device": device, "gpu_results": device == "cuda", "settings": settings,
            "gpus": env.get("gpus"), "versions": env.get("versions"),
            **{LABELS[n]: sides[n] for n in RUN_ORDER}, **compare(sides, settings.get("response_tokens"))}


def _f(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


MATCHED_TEXT = ("Matched: the same prompt rows, B prompts per step, every response exactly R generated tokens "
                "(ignore_eos); each of ours' two models generates T1's rows (n per prompt), and T3 (stock, 2n per "
                "prompt) holds T2's tokens per step. Throughput is verl's perf/throughput on every side (prompt + "
                "response tokens of the step's rows / step time / GPUs).")


def render(rep: dict[str, Any]) -> str:
    head = ("# Throughput, ours (M-GRPO, two models, one GPU) vs stock verl GRPO (one model)"
            if rep["gpu_results"] else f"# Throughput kit, device {rep['device']}: NOT GPU results")
    gpu = ", ".join(g.get("name", "?") for g in rep.get("gpus") or []) or "none"
    lines = [head, "", f"GPU: {gpu}; settings: {json.dumps(rep['settings'])}", "", MATCHED_TEXT, "",
             "| side | stage | device | status | steps | step s | gen s | old_log_prob s | update_actor s "
             "| update_weights s | rows/step | prompt tok | response tok | tokens/step | perf/throughput tok/s/GPU "
             "| peak GPU MiB used |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in RUN_ORDER:
        label = LABELS[name]
        s = rep[label]
        if s is None:
            lines.append(f"| {label} | {name} | – | not run |" + " |" * 12)
            continue
        ph = s["phases"]
        lines.append(f"| {label} | {s['stage']} | {s['device']} | {s['status']} | {s['steps']} | {_f(s['step_s'])} "
                     f"| {_f(ph['gen'])} | {_f(ph['old_log_prob'])} | {_f(ph['update_actor'])} "
                     f"| {_f(ph['update_weights'])} "
                     f"| {_f(s['rows_per_step'], 0)} | {_f(s['prompt_tokens'], 1)} | {_f(s['response_tokens'], 1)} "
                     f"| {_f(s['tokens_per_step'], 0)} | {_f(s['throughput'], 1)} | {_f(s['peak_gpu_used_mib'], 0)} |")
    v, m, why = rep["verdicts"], rep["matched"], rep["why"]
    lines += ["", f"matched: tokens per step ours = stock_x2: {m['ours_equals_stock_x2']}; ours = 2 x stock: "
              f"{m['ours_equals_twice_stock']}; every response R tokens: {m['fixed_length']}", "",
              f"per token, perf/throughput ours/stock_x2 (T2/T3): **{_f(rep['throughput_ratio'])}** (goal >= "
              f"{THROUGHPUT_BAR}: {v.get('throughput', 'n/a')})"
              + (f"; {why['throughput']}" if why.get("throughput") else ""),
              f"per model step, step time ours/stock (T2/T1): **{_f(rep['step_ratio'])}** (bar <= {STEP_BAR}: "
              f"{v.get('step', 'n/a')})" + (f"; {why['step']}" if why.get("step") else "")]
    for name in RUN_ORDER:
        s = rep[LABELS[name]]
        if s and s["peak_mib_per_process"]:
            lines.append(f"{LABELS[name]} GPU processes (peak MiB): " + "; ".join(
                f"{c[:60]}: {mib:.0f}" for c, mib in s["peak_mib_per_process"][:8]))
    return "\n".join(lines) + "\n"


def write_report(work: Path, out: Path) -> dict[str, Any]:
    rep = build_report(work)
    out.mkdir(parents=True, exist_ok=True)
    (out / "throughput.json").write_text(json.dumps(rep, indent=1))
    (out / "throughput.md").write_text(render(rep))
    print(render(rep))
    return rep


# ---------------------------------------------------------------------------------------------------------- run


def model_dirs(preset: str) -> tuple[str, str]:
    """(model dir, tokenizer dir) of a real-size preset or a built-in model (built once, cached)."""
    from mgrpo_verl.models.real_size import PRESETS, build_real_size

    if preset in PRESETS:
        return tuple(build_real_size(preset))
    from mgrpo_verl.envs.builtin import model_paths

    return tuple(model_paths(preset))


def run(args: argparse.Namespace) -> int:
    model, tokenizer = model_dirs(args.preset)
    work = Path(os.environ.get("SMOKE_WORK", "gpu_smoke_out")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    settings = {"preset": args.preset, "prompts": args.prompts, "rollouts": args.rollouts,
                "response_tokens": args.response_tokens, "steps": args.steps, "model": model}
    path = work / "throughput_settings.json"
    if path.is_file() and json.loads(path.read_text()) != settings:  # stages of other settings are not comparable
        for name in RUN_ORDER:
            if (work / name).is_dir():
                shutil.rmtree(work / name)
    path.write_text(json.dumps(settings))
    env = {**os.environ, "SMOKE_MODEL": model, "SMOKE_TOKENIZER": tokenizer, "SMOKE_STEPS": str(args.steps),
           "SMOKE_WORK": str(work), "SMOKE_BATCH": str(args.prompts), "SMOKE_ROLLOUTS": str(args.rollouts),
           "SMOKE_RESPONSE_TOKENS": str(args.response_tokens)}
    rc = 0
    for stage in args.stages:  # one kit call per stage, the report after each: an interrupted call keeps what finished
        rc = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_smoke.sh"), stage], env=env).returncode or rc
        write_report(work, Path(os.environ.get("OUT") or work))
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="stages T2 (ours), T3 and T1 (stock) of the smoke kit, the report after each")
    r.add_argument("--preset", default="qwen2.5-0.5b", help="qwen2.5-0.5b | qwen2.5-1.5b | a built-in model (tiny_h32)")
    r.add_argument("--prompts", type=int, default=16, help="prompts per step (data.train_batch_size)")
    r.add_argument("--rollouts", type=int, default=8, help="rollouts per prompt (actor_rollout_ref.rollout.n)")
    r.add_argument("--response-tokens", type=int, default=256, help="tokens each model generates per rollout")
    r.add_argument("--steps", type=int, default=4, help="training steps per side (the first is not measured)")
    r.add_argument("--stages", nargs="+", default=list(RUN_ORDER), choices=RUN_ORDER,
                   help="stages to run, in this order (default: T2 T3 T1); the report covers every stage folder there")
    t = sub.add_parser("twin-files", help="write T2's prompt rows and agent-loop file into --out-dir")
    t.add_argument("--out-dir", required=True, type=Path)
    s = sub.add_parser("stock-config", help="write <out-dir>/stock.yaml for python -m verl.trainer.main_ppo")
    s.add_argument("--out-dir", required=True, type=Path)
    s.add_argument("overrides", nargs="*")
    p = sub.add_parser("report", help="the comparison from the stage folders T1, T2, T3")
    p.add_argument("--work", default="gpu_smoke_out", type=Path)
    p.add_argument("--out", default=None, type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "stock-config":
        print(stock_config(args.overrides, args.out_dir))
        return 0
    if args.cmd == "twin-files":
        print(twin_files(args.out_dir))
        return 0
    if args.cmd == "report":
        write_report(args.work, args.out or args.work)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
