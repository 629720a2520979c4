"""Throughput of our M-GRPO (two models on one GPU) against stock verl GRPO (one model), one run, same work per model.

    python benchmarks/bench_gpu_throughput.py run --preset qwen2.5-0.5b          # on the GPU machine (cuda)
    MGRPO_SMOKE_DEVICE=cpu PYTHON=.venv-vllm/bin/python \
      .venv-vllm/bin/python benchmarks/bench_gpu_throughput.py run --preset tiny_h32   # vLLM's CPU build, labelled cpu
    python benchmarks/bench_gpu_throughput.py report --work gpu_smoke_out            # the report again

``run`` builds the model (``--preset``: a real-size random model, mgrpo_verl/models/real_size.py, or a built-in tiny
one) and runs two stages of the GPU smoke kit (recipes/gpu_smoke.sh, one harness for both):

- **T1, stock**: ``python -m verl.trainer.main_ppo`` (verl's own entry point and GRPO trainer) with one model, on a
  config file that ``stock-config`` writes: our ``single_agent`` config composed with the same overrides, resolved,
  our sections removed (so every verl key has the value our run has), and the relay task's main-agent prompts
  without their ``agent_name`` (verl's single-turn loop).
- **T2, ours**: ``python -m mgrpo_verl.main_ppo task=relay`` with two models of the same size on the one GPU
  (``multi_agent.placement=shared``, each agent its own vLLM engine that sleeps while the actors update).

Same work per model: B prompts x n rollouts in both; every generation is forced to its full length with verl's
``actor_rollout_ref.rollout.ignore_eos`` (verl passes it to vLLM's SamplingParams). Stock generates R tokens per
rollout; in ours the main agent generates R/2 (plan) + R/2 (answer) and the sub-agent R, so each model generates
R tokens for each of its B x n rows, and our step holds about twice stock's tokens (plus the sub-agent's reply
that the main agent's row carries as an observation). verl's ``perf/throughput`` divides a step's tokens (prompt
+ response, all rows) by its time and the GPU count; the report gives it per side, its ratio ours / stock (goal
>= 0.9), and the step-time ratio T2 / T1 (bar <= 2.2: two models' work in at most 2.2 times one model's time),
with each phase, the tokens per step and peak GPU memory per process. Medians over the measured steps (the first
is a warm-up); no validation, no checkpoints. Labels follow the kit: cpu runs are never GPU figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STOCK, OURS = "T1", "T2"
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


# ------------------------------------------------------------------------------------------------------- report


def _num(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def step_tokens(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians over the measured steps of verl's ``perf/total_num_tokens`` and ``perf/time_per_step``."""
    from mgrpo_verl.experiments import gpu_smoke as gs

    steps = [r["data"] for r in records if _num(r["data"].get("timing_s/step")) is not None]
    measured = steps[1:] if len(steps) >= 2 else steps
    return {key.split("/")[1]: gs._median(_num(d.get(key)) for d in measured)
            for key in ("perf/total_num_tokens", "perf/time_per_step")}


def side(stage: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """One side of the comparison from the kit's stage summary and its metrics records."""
    sm, mem = stage["summary"], stage["gpu_memory"]
    tokens = step_tokens(records)
    own = (tokens["total_num_tokens"] / tokens["time_per_step"]
           if tokens["total_num_tokens"] and tokens["time_per_step"] else None)
    return {
        "stage": stage["stage"], "device": stage["device"], "status": stage["status"], "steps": sm["steps"],
        "step_s": sm["step_s"], "phases": {p: sm[p] for p in ("gen", "old_log_prob", "update_actor", "update_weights")},
        "tokens_per_step": tokens["total_num_tokens"],
        # verl's perf/throughput (tokens / s / GPU); tokens / step time as a check (equal on one GPU)
        "throughput": sm["tokens_per_s"], "tokens_per_step_time": own,
        "peak_mib_per_process": [(p.get("cmd") or p["name"], p["peak_mib"]) for p in mem["per_process"]],
        "peak_gpu_used_mib": mem["peak_gpu_used_mib"], "torch_peaks_gb": stage["torch_peaks_gb"],
    }


def compare(stock: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """ratio = ours' perf/throughput / stock's (goal >= 0.9); step ratio = ours' step time / stock's (bar <= 2.2)."""
    out: dict[str, Any] = {"throughput_ratio": None, "step_ratio": None, "verdicts": {}}
    if stock["status"] != "ok" or ours["status"] != "ok":
        out["why"] = f"{STOCK}: {stock['status']}, {OURS}: {ours['status']}"
        return out
    if stock["device"] != ours["device"]:
        out["why"] = f"different devices ({stock['device']} vs {ours['device']})"
        return out
    if stock["throughput"] and ours["throughput"] is not None:
        out["throughput_ratio"] = ours["throughput"] / stock["throughput"]
        out["verdicts"]["throughput"] = "pass" if out["throughput_ratio"] >= THROUGHPUT_BAR else "fail"
    if stock["step_s"] and ours["step_s"] is not None:
        out["step_ratio"] = ours["step_s"] / stock["step_s"]
        out["verdicts"]["step"] = "pass" if out["step_ratio"] <= STEP_BAR else "fail"
    return out


def build_report(work: Path) -> dict[str, Any]:
    from mgrpo_verl.experiments import gpu_smoke as gs

    sides = {}
    for name in (STOCK, OURS):
        d = work / name
        if not d.is_dir():
            raise SystemExit(f"bench_gpu_throughput: no stage folder {d}: run `run` first")
        stage = gs.summarize_stage(d)
        gs.check_labels([stage])
        sides[name] = side(stage, gs.read_metrics(d / "metrics.jsonl"))
    env = json.loads((work / "env.json").read_text()) if (work / "env.json").is_file() else {}
    settings = json.loads((work / "throughput_settings.json").read_text()) if (work / "throughput_settings.json").is_file() else {}
    device = sides[STOCK]["device"] if sides[STOCK]["device"] == sides[OURS]["device"] else "mixed"
    return {"device": device, "gpu_results": device == "cuda", "settings": settings,
            "gpus": env.get("gpus"), "versions": env.get("versions"), "stock": sides[STOCK], "ours": sides[OURS],
            **compare(sides[STOCK], sides[OURS])}


def _f(v: Any, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def render(rep: dict[str, Any]) -> str:
    head = ("# Throughput, ours (M-GRPO, two models, one GPU) vs stock verl GRPO (one model)"
            if rep["gpu_results"] else f"# Throughput kit, device {rep['device']}: NOT GPU results")
    gpu = ", ".join(g.get("name", "?") for g in rep.get("gpus") or []) or "none"
    lines = [head, "", f"GPU: {gpu}; settings: {json.dumps(rep['settings'])}", "",
             "| side | stage | device | status | steps | step s | gen s | old_log_prob s | update_actor s "
             "| update_weights s | tokens/step | perf/throughput tok/s/GPU | peak GPU MiB used |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label in ("stock", "ours"):
        s = rep[label]
        ph = s["phases"]
        lines.append(f"| {label} | {s['stage']} | {s['device']} | {s['status']} | {s['steps']} | {_f(s['step_s'])} "
                     f"| {_f(ph['gen'])} | {_f(ph['old_log_prob'])} | {_f(ph['update_actor'])} | {_f(ph['update_weights'])} "
                     f"| {_f(s['tokens_per_step'], 0)} | {_f(s['throughput'], 1)} | {_f(s['peak_gpu_used_mib'], 0)} |")
    v = rep["verdicts"]
    lines += ["", f"throughput ours/stock: **{_f(rep['throughput_ratio'])}** (goal >= {THROUGHPUT_BAR}: "
              f"{v.get('throughput', 'n/a')}); step time ours/stock: **{_f(rep['step_ratio'])}** (bar <= {STEP_BAR}: "
              f"{v.get('step', 'n/a')})" + (f"; {rep['why']}" if rep.get("why") else "")]
    for label in ("stock", "ours"):
        procs = rep[label]["peak_mib_per_process"]
        if procs:
            lines.append(f"{label} GPU processes (peak MiB): " + "; ".join(f"{c[:60]}: {m:.0f}" for c, m in procs[:8]))
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
    r = args.response_tokens
    if r % 2:
        raise SystemExit(f"--response-tokens must be even (the main agent's plan and answer get half each), got {r}")
    work = Path(os.environ.get("SMOKE_WORK", "gpu_smoke_out")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    settings = {"preset": args.preset, "prompts": args.prompts, "rollouts": args.rollouts, "response_tokens": r,
                "steps": args.steps, "model": model}
    (work / "throughput_settings.json").write_text(json.dumps(settings))
    env = {**os.environ, "SMOKE_MODEL": model, "SMOKE_TOKENIZER": tokenizer, "SMOKE_STEPS": str(args.steps),
           "SMOKE_WORK": str(work), "SMOKE_BATCH": str(args.prompts), "SMOKE_ROLLOUTS": str(args.rollouts),
           "SMOKE_RESPONSE_TOKENS": str(r)}
    rc = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_smoke.sh"), STOCK, OURS], env=env).returncode
    write_report(work, Path(os.environ.get("OUT") or work))
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="stages T1 (stock) and T2 (ours) of the smoke kit, then the report")
    r.add_argument("--preset", default="qwen2.5-0.5b", help="qwen2.5-0.5b | qwen2.5-1.5b | a built-in model (tiny_h32)")
    r.add_argument("--prompts", type=int, default=16, help="prompts per step (data.train_batch_size)")
    r.add_argument("--rollouts", type=int, default=8, help="rollouts per prompt (actor_rollout_ref.rollout.n)")
    r.add_argument("--response-tokens", type=int, default=256, help="tokens each model generates per rollout")
    r.add_argument("--steps", type=int, default=4, help="training steps per side (the first is not measured)")
    s = sub.add_parser("stock-config", help="write <out-dir>/stock.yaml for python -m verl.trainer.main_ppo")
    s.add_argument("--out-dir", required=True, type=Path)
    s.add_argument("overrides", nargs="*")
    p = sub.add_parser("report", help="the comparison from the stage folders T1 and T2")
    p.add_argument("--work", default="gpu_smoke_out", type=Path)
    p.add_argument("--out", default=None, type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "stock-config":
        print(stock_config(args.overrides, args.out_dir))
        return 0
    if args.cmd == "report":
        write_report(args.work, args.out or args.work)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
