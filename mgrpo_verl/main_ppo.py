"""``python -m mgrpo_verl.main_ppo [hydra overrides]``: verl's v1 trainer with our config and CPU support.

Unlike ``python -m verl.trainer.main_ppo`` (:func:`run` numbers the stages): our config, resolved and planned
once; every check that can refuse it, then the warm start it names, before Ray starts; on CPU a private,
closed Ray session; a line per step and a summary. The rest is verl's own. The stages and what each does:
``docs/architecture.md``, "From the config to the step".
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.launcher.hooks import absolute_paths
from mgrpo_verl.launcher.preflight import preflight
from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.launcher.step_progress import is_exact_key, watch_steps
from mgrpo_verl.launcher.warm_start import pending_models, run_stage
from mgrpo_verl.platform import uses_cpu

register_resolvers()

#: The metric verl logs for the mean training reward of a step, and the prefix of validation metrics.
TRAIN_REWARD = "critic/score/mean"
VAL_PREFIX = "val-core/"


@contextmanager
def ray_environment(on_cpu: bool, env: dict[str, str], joins_cluster: bool = False) -> Iterator[None]:
    """Environment for the Ray cluster verl starts. A Ray this run starts itself is closed to the network on every
    platform (token authentication with the token in a private temporary directory, loopback only:
    ``ray_session.ray_closed_env``); on CPU also Ray's files there and the CPU sizing. A driver joining a
    ``ray start`` cluster (``joins_cluster``) presents that cluster's settings instead (docs/multinode.md). Ray is
    shut down on exit, whatever happened, before the private temporary directory is removed; a Ray the caller had
    already initialized (verl's ``run_ppo`` then reuses it) is left up."""
    import ray

    ours = not ray.is_initialized()

    from mgrpo_verl.platform.ray_session import private_temp_dir, ray_closed_env, ray_cpu_env, ray_environ

    with ExitStack() as stack:
        if on_cpu:
            tmp = stack.enter_context(private_temp_dir())
            env = {**ray_cpu_env(tmp), "MGRPO_VERL_DEVICE": "cpu", **env}
        elif not joins_cluster:
            env = {**ray_closed_env(stack.enter_context(private_temp_dir())), **env}
        stack.enter_context(ray_environ(env))
        try:
            yield
        finally:
            if ours and ray.is_initialized():
                ray.shutdown()


class DriverTaskRunner:
    """verl's ``TaskRunnerV1`` run in the driver process (``mgrpo_verl.trainer_in_driver``) instead of an actor.

    verl's ``run_ppo`` takes the TaskRunner class as an argument ("for recipe to change TaskRunner") and uses only
    ``cls.remote()`` and ``ray.get(runner.run.remote(config))``: this class answers both, runs the trainer here and
    returns a ready object ref. Everything the actor would have seen of the job's ``runtime_env`` (verl's
    ``env_vars``: ``TRANSFER_QUEUE_ENABLE``, ``TOKENIZERS_PARALLELISM`` ...) is set in this process for the run's
    duration; variables already set win, as for Ray's workers, which inherit them."""

    def __init__(self):
        self.run = SimpleNamespace(remote=self._run)

    @classmethod
    def remote(cls) -> DriverTaskRunner:
        return cls()

    @staticmethod
    def _run(config: DictConfig):
        import ray
        from verl.trainer.main_ppo import TaskRunnerV1

        job_env = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
        added = {key: str(value) for key, value in job_env.items() if key not in os.environ}
        os.environ.update(added)
        try:
            TaskRunnerV1.__ray_actor_class__().run(config)  # the class under verl's @ray.remote
        finally:
            for key in added:
                os.environ.pop(key, None)
        return ray.put(None)


def summarize(metrics_file: Path, seconds: float, reward_key: str = TRAIN_REWARD) -> dict[str, Any]:
    """First and last training reward (``reward_key``), validation score and held-out exact accuracy (when the
    rollout reports one: :func:`~mgrpo_verl.launcher.step_progress.is_exact_key`) from verl's JSON-lines metrics
    file."""
    records = []
    if metrics_file.is_file():
        records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    train = [(r["step"], r["data"][reward_key]) for r in records if reward_key in r["data"]]
    steps = [step for step, _ in train]
    val_key = next((k for r in records for k in r["data"] if k.startswith(VAL_PREFIX) and "/mean@" in k), None)
    val = [(r["step"], r["data"][val_key]) for r in records if val_key and val_key in r["data"]]
    exact_key = next((k for r in records for k in r["data"] if is_exact_key(k)), None)
    exact = [(r["step"], r["data"][exact_key]) for r in records if exact_key and exact_key in r["data"]]
    rowless, trained_steps = rowless_steps(records, reward_key)
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
        "rowless": rowless,
        "trained_steps": trained_steps,
        "metrics_file": str(metrics_file),
    }


def rowless_steps(records: list[dict], reward_key: str = TRAIN_REWARD) -> tuple[dict[str, int], int]:
    """(agent -> training steps in which that trainable agent got no rows, training steps), from the records of
    verl's metrics file. The multi-agent trainer writes ``agent/<name>/skipped`` every step for every trainable
    model: 1.0 when it had no rows (nothing trained), 0.0 when it trained (files from before 0.0 was written lack
    the key on those steps, which reads the same). Training steps: the steps with ``reward_key`` or a ``skipped``
    key (validation records have neither). Agents that trained every step are left out."""
    steps, skipped = set(), {}
    for record in records:
        data, step = record.get("data", {}), record.get("step")
        keys = [k for k in data if k.startswith(_AGENT) and k.endswith(_SKIPPED)]
        if keys or reward_key in data:
            steps.add(step)
        for key in keys:
            if data[key] >= 0.5:
                skipped.setdefault(key[len(_AGENT):-len(_SKIPPED)], set()).add(step)
    return {agent: len(at) for agent, at in sorted(skipped.items())}, len(steps)


_AGENT, _SKIPPED = "agent/", "/skipped"


def rowless_note(s: dict[str, Any]) -> str:
    """``; agent sub got no rows in 15 of 15 steps: it never trained`` for each agent of :func:`rowless_steps`."""
    notes = []
    for agent, count in (s.get("rowless") or {}).items():
        total = s.get("trained_steps", count)
        tail = ": it never trained" if count >= total else ""
        notes.append(f"; agent {agent} got no rows in {count} of {total} steps{tail}")
    return "".join(notes)


def _key_note(reward_key: str) -> str:
    return "" if reward_key == TRAIN_REWARD else f" ({reward_key})"


def summary_line(s: dict[str, Any]) -> str:
    if not Path(s["metrics_file"]).is_file():
        return (f"mgrpo_verl: finished in {s['seconds']:.0f} s; no metrics file at {s['metrics_file']} "
                f"(keep 'file' in trainer.logger for the summary)")
    line = (
        f"mgrpo_verl: {s['steps']} steps (step {s['first_step']} to {s['last_step']}), {s['seconds']:.0f} s with Ray's "
        f"start-up; "
        f"train reward{_key_note(s.get('reward_key', TRAIN_REWARD))} {s['train_reward_first']:.3f} -> "
        f"{s['train_reward_last']:.3f}"
    )
    if s.get("exact_metric"):
        line += f"; held-out exact accuracy {s['exact_first']:.3f} -> {s['exact_last']:.3f} ({s['exact_metric']})"
    if s["val_metric"]:
        line += f"; {s['val_metric']} {s['val_first']:.3f} -> {s['val_last']:.3f}"
    return line + rowless_note(s) + f"; metrics {s['metrics_file']}"


def run(config: DictConfig) -> dict[str, Any]:
    """Resolve, check, warm-start and run one training job; returns the summary."""
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    from mgrpo_verl.platform.ray_session import existing_cluster_address, ray_init_for_existing_cluster

    # 1. resolve: our resolvers name the built-in models and data (written once, seconds); nothing trains here
    OmegaConf.resolve(config)
    # relative hook paths (tool configs, scorer files, ...) made absolute against the launch directory: Ray's
    # processes receive this config, and their working directories differ
    absolute_paths(config)
    # 2. plan: the config read once into typed facts, every multi-agent rule checked
    plan = build_plan(config)
    print(plan.describe(), flush=True)
    # 3. check: everything else that can be refused before any work, in one ordered list
    on_cpu = uses_cpu(config.mgrpo_verl.device)
    preflight(plan, on_cpu, pending_models(plan))
    # 4. warm start: the checkpoints the config starts from, built when not cached yet (minutes on CPU)
    run_stage(plan)
    # 5. train: verl's own trainer in Ray, the trainer mode the role picks
    reward_key = TRAIN_REWARD
    if plan.multi_agent is not None:
        ma = plan.multi_agent
        config.trainer.v1.trainer_mode = plan.trainer_mode
        reward_key = f"agent/{ma.decoupled.train_agent if ma.decoupled.role == 'sub' else ma.main}/score/mean"
    metrics_file = Path(config.mgrpo_verl.metrics_file).absolute()
    metrics_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    env = {"VERL_FILE_LOGGER_PATH": str(metrics_file)}
    ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init)
    joins_cluster = existing_cluster_address(ray_init) is not None
    if joins_cluster:
        # joining a `ray start` cluster (docs/multinode.md): no node resources from the driver, and the
        # driver's environment carried to workers on every node
        with open_dict(config):
            config.ray_kwargs.ray_init = ray_init_for_existing_cluster(
                ray_init, {**env, **({"MGRPO_VERL_DEVICE": "cpu"} if on_cpu else {})})
    total_steps = int(OmegaConf.select(config, "trainer.total_training_steps", default=None) or 0)
    with (ray_environment(on_cpu, env, joins_cluster),
          watch_steps(metrics_file, total_steps, reward_key)):
        run_ppo(config, task_runner_class=DriverTaskRunner if config.mgrpo_verl.trainer_in_driver else TaskRunnerV1)
    summary = summarize(metrics_file, time.monotonic() - start, reward_key)
    print(summary_line(summary), flush=True)
    return summary


@hydra.main(config_path="config", config_name="mgrpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
