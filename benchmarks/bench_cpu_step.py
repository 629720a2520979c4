"""Steady-state training-step time on CPU and its breakdown, for the embedded default.

Runs ``python -m mgrpo_verl.main_ppo --config-name single_agent`` (tiny Qwen2, echo task, GRPO) for
``--steps`` steps, and, as the reference measured in the same run, stock ``python -m
verl.trainer.main_ppo`` with the same settings (verl's own entry point and config; our plugin is what
lets it run on CPU at all). Reports the median over the steps after ``--warmup`` of verl's timers:

- gen: rollout (agent loop + our HF rollout server);
- old_log_prob: the actor's recomputation of the rollout's log-probs;
- update_actor: the policy update;
- update_weights: weight sync from the actor to the rollout server;
- step: the whole step (reward, advantage, bookkeeping included).

    python benchmarks/bench_cpu_step.py [--steps 8] [--warmup 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIMERS = ("gen", "old_log_prob", "update_actor", "update_weights", "step")


def run(entry: list[str], overrides: list[str], workdir: Path) -> tuple[list[dict], float]:
    metrics = workdir / "metrics.jsonl"
    # verl's file logger writes to $VERL_FILE_LOGGER_PATH; our entry point sets it from mgrpo_verl.metrics_file
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics), "TOKENIZERS_PARALLELISM": "false"}
    if entry[0] == "mgrpo_verl.main_ppo":
        overrides = [*overrides, f"mgrpo_verl.metrics_file={metrics}"]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", *entry, *overrides], cwd=workdir, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    (workdir / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        sys.exit(f"{' '.join(entry)} failed (rc={proc.returncode}); last lines of its log:\n{tail}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r["data"] for r in records if "timing_s/step" in r["data"]], wall


def stock_overrides(resolved: dict) -> list[str]:
    """verl's own entry point with the values our YAML resolved to (so both runs do the same work)."""
    keys = [
        "algorithm.adv_estimator", "algorithm.use_kl_in_reward", "data.train_files", "data.val_files",
        "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
        "data.dataloader_num_workers", "reward.custom_reward_function.path", "reward.custom_reward_function.name",
        "actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path",
        "actor_rollout_ref.model.use_remove_padding", "actor_rollout_ref.actor.strategy",
        "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.ref.strategy",
        "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.agent.num_workers",
        "trainer.device", "trainer.n_gpus_per_node", "trainer.nnodes", "ray_kwargs.ray_init.num_cpus",
    ]
    out = []
    for key in keys:
        value = resolved
        for part in key.split("."):
            value = value[part]
        out.append(f"{key}={json.dumps(value) if isinstance(value, bool) else value}")
    mp = resolved["actor_rollout_ref"]["actor"]["fsdp_config"]["mixed_precision"]
    mp_value = "{" + ",".join(f"{k}:{v}" for k, v in mp.items()) + "}"
    out += [f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={mp_value}",
            f"+actor_rollout_ref.ref.fsdp_config.mixed_precision={mp_value}"]
    attn = resolved["actor_rollout_ref"]["model"]["override_config"]["attn_implementation"]
    out += [f"+actor_rollout_ref.model.override_config.attn_implementation={attn}",
            f"+ray_kwargs.ray_init.num_gpus={resolved['ray_kwargs']['ray_init']['num_gpus']}"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from mgrpo_verl.launcher.resolvers import register_resolvers

    register_resolvers()
    common = [f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
              "trainer.save_freq=-1", "trainer.logger=[console,file]"]
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        resolved = OmegaConf.to_container(compose("single_agent", overrides=common), resolve=True)

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-step-") as tmp:
        for name, entry, overrides in (
            ("mgrpo_verl.main_ppo", ["mgrpo_verl.main_ppo", "--config-name", "single_agent"], common),
            ("verl.trainer.main_ppo", ["verl.trainer.main_ppo"], common + stock_overrides(resolved)),
        ):
            workdir = Path(tmp) / name
            workdir.mkdir()
            print(f"running {name} for {args.steps} steps ...", flush=True)
            steps, wall = run(entry, overrides, workdir)
            steady = steps[args.warmup:]
            if not steady:
                sys.exit(f"{name}: only {len(steps)} steps logged")
            results[name] = {t: statistics.median(s[f"timing_s/{t}"] for s in steady) for t in TIMERS}
            results[name]["wall"] = wall

    ours, ref = results["mgrpo_verl.main_ppo"], results["verl.trainer.main_ppo"]
    print(f"\nsteady-state step time, median of steps {args.warmup + 1}..{args.steps} (seconds)")
    print(f"{'timer':>16} {'mgrpo_verl':>11} {'verl stock':>11} {'ratio':>6}")
    for t in (*TIMERS, "wall"):
        print(f"{t:>16} {ours[t]:>11.3f} {ref[t]:>11.3f} {ours[t] / ref[t]:>5.2f}x")


if __name__ == "__main__":
    main()
