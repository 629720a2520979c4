"""Two agents as LoRA adapters on one base vs two full models of that base, in the same invocation.

Runs ``python -m mgrpo_verl.main_ppo`` (M-GRPO, relay task, main + sub, validation and checkpoints off) twice,
one after the other, for ``--steps`` steps each:

- ``full`` (the reference): both agents are full models of the same base (each its own FSDP actor with
  optimizer state for every weight, each its own HF rollout engine);
- ``lora``: both agents are adapters on that base (verl's ``model.lora_rank``; each its own FSDP actor, base
  frozen, optimizer state for the adapter only; **one** rollout engine serving both adapters, docs/lora.md).

``--rollout hf`` (default) uses our HF engine; ``--rollout vllm`` verl's vLLM rollout on CPU with vLLM's CPU build
(``+preset=vllm_cpu``; run with ``.venv-vllm/bin/python``, made by ``recipes/vllm_cpu_env.sh``), where the shared
engine is vLLM's multi-LoRA (``mgrpo_verl/vllm_rollout/lora.py``); the tiny base then has heads of 32 (vLLM's CPU
attention serves no smaller).

The base is ``--size tiny`` (the built-in tiny Qwen2: 2 layers, width 64) or ``--size medium`` (a random Qwen2
built here, same tokenizer: 8 layers, width 512, MLP 1536, ~26M parameters), where the weights, rather than
the processes, start to dominate the footprint. The peak summed PSS of the run's process tree and the
median step time after step 1 are measured with ``benchmarks/bench_footprint.py``'s sampler; the ratios
lora / full are printed.

    python benchmarks/bench_lora.py [--size tiny|medium] [--rollout hf|vllm] [--steps 4] [--rank 8]
                                    [--keep DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench_footprint import ratio, run_one

MEDIUM = {"hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1536, "num_attention_heads": 8,
          "num_key_value_heads": 2}


def base_model(size: str, rollout: str):
    from mgrpo_verl.envs.builtin import TINY_H32  # heads of 32 dimensions, for vLLM's CPU attention
    from mgrpo_verl.models.tiny import build_tiny_model

    tiny = TINY_H32 if rollout == "vllm" else None
    return build_tiny_model(seed=0, config_overrides=tiny if size == "tiny" else MEDIUM)


def commands(args: argparse.Namespace, work: Path) -> dict[str, tuple[list[str], Path]]:
    paths = base_model(args.size, args.rollout)
    common = [
        "task=relay", *(["+preset=vllm_cpu"] if args.rollout == "vllm" else []),
        f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.logger=[console,file]",
        f"actor_rollout_ref.model.path={paths.model_dir}",
        f"actor_rollout_ref.model.tokenizer_path={paths.tokenizer_dir}",
        # both agents on the same base
        "multi_agent.agents.sub.actor_rollout_ref.model.path=${actor_rollout_ref.model.path}",
        "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}",
    ]
    lora = [f"actor_rollout_ref.model.lora_rank={args.rank}", f"actor_rollout_ref.model.lora_alpha={2 * args.rank}"]
    out = {}
    for name, extra in (("full", []), ("lora", lora)):
        metrics = work / name / "metrics.jsonl"
        cmd = [sys.executable, "-m", "mgrpo_verl.main_ppo", *common, *extra,
               f"trainer.default_local_dir={work / name / 'ckpt'}", f"mgrpo_verl.metrics_file={metrics}"]
        out[name] = (cmd, metrics)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "medium"], default="tiny")
    parser.add_argument("--rollout", choices=["hf", "vllm"], default="hf",
                        help="rollout engine (vllm: vLLM's CPU build)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8,
                        help="LoRA rank of both agents (alpha = 2 x rank, all linear layers)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between PSS samples")
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and metrics in this directory")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()

    results = {}
    with ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            work = args.keep.absolute()
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-lora-")))
        for name, (cmd, metrics) in commands(args, work).items():
            (work / name).mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
            print(f"running {name} for {args.steps} steps ...", file=sys.stderr, flush=True)
            results[name] = run_one(name, cmd, env, work / name, metrics, args.interval)

    full, lora = results["full"], results["lora"]
    print(f"\ntwo agents on one {args.size} base, {args.rollout} rollout: LoRA adapters (rank {args.rank}) "
          f"vs full models, {args.steps} steps each")
    print("| quantity | full | lora | lora / full |")
    print("|---|---:|---:|---:|")
    for label, key, fmt in (
        ("peak summed PSS (MiB)", "peak_pss_mib", "{:.0f}"),
        ("processes at the peak", "processes_at_peak", "{:d}"),
        ("median step after step 1 (s)", "step_s", "{:.2f}"),
        ("step 1 (s)", "step1_s", "{:.2f}"),
        ("command -> first step (s)", "first_step_s", "{:.1f}"),
    ):
        print(f"| {label} | {fmt.format(full[key])} | {fmt.format(lora[key])} | {ratio(lora[key], full[key])} |")
    for n in ("full", "lora"):
        kinds = sorted(results[n]["peak_kinds"].items(), key=lambda kv: -kv[1][0])
        print(f"{n}: PSS by process kind near the peak, MiB (processes): "
              + ", ".join(f"{k} {pss:.0f} ({c})" for k, (pss, c, _) in kinds))
    if args.out:
        args.out.write_text(json.dumps({"size": args.size, "rollout": args.rollout, "rank": args.rank,
                                        "steps": args.steps, **results}, indent=1))


if __name__ == "__main__":
    main()
