"""The ``multi_agent`` section checked against the rest of the trainer config, and per-agent configs.

The section's schema, defaults and per-field documentation are :mod:`mgrpo_verl.config.schema`, once.
Here: :func:`check_multi_agent` (the section, then every rule that needs the rest of the config, in one
function; :func:`mgrpo_verl.config.plan.build_plan` calls it), :func:`agent_full_config` (the config one model
owner's workers get) and the rule of one model's micro-batches (:func:`check_micro_batches`).

Multi-agent mode does not support some verl features (each refused with its own message): a critic,
``algorithm.use_kl_in_reward``, an active ``algorithm.rollout_correction``, a reward model, distillation,
and more than one node (``trainer.nnodes`` must be 1). LoRA agents have rules of their own
(:func:`mgrpo_verl.config.lora.check_lora`).

Everything here is pure: no Ray, no models; the input config is never modified.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from mgrpo_verl.algorithms.config import MAGRPOConfig
from mgrpo_verl.config import setting
from mgrpo_verl.config.schema import AgentConfig, CooperationConfig, MultiAgentConfig, load_multi_agent, trainer_mode
from mgrpo_verl.config.lora import check_lora

SUPPORTED_ADV_ESTIMATORS = ("grpo", "mgrpo")
"""Top-level ``algorithm.adv_estimator`` values accepted in multi-agent mode (critic-free ones)."""

ENGINES_WITH_MEMORY_FRACTION = ("vllm", "sglang")
"""Rollout engines that reserve ``rollout.gpu_memory_utilization`` of a GPU when they start."""


# ----------------------------------------------------------------------------------------------------
# helpers

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_dictconfig(config: Any) -> DictConfig:
    if isinstance(config, DictConfig):
        return config
    if isinstance(config, Mapping):
        return OmegaConf.create(dict(config))
    raise TypeError(f"expected a DictConfig or a mapping, got {type(config).__name__}")



def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


# ----------------------------------------------------------------------------------------------------
# public API


def multi_agent_enabled(config: Any) -> bool:
    """``multi_agent.enable``; ``False`` when the section or the key is absent or null."""
    config = _as_dictconfig(config)
    enable = OmegaConf.select(config, "multi_agent.enable", default=None, throw_on_missing=False)
    if enable is None:
        return False
    if not isinstance(enable, bool):
        raise ValueError(f"multi_agent.enable must be true or false, got {enable!r}")
    return enable


def agent_full_config(config: DictConfig, spec: AgentConfig) -> DictConfig:
    """The full config that one model owner's workers get.

    A new config (``config`` is not modified; it may be struct-mode or read-only) equal to
    ``config`` except that:

    * ``actor_rollout_ref`` is the top-level one merged with ``spec.actor_rollout_ref``;
    * ``trainer.n_gpus_per_node`` and ``actor_rollout_ref.rollout.n_gpus_per_node`` are
      ``spec.n_gpus_per_node`` and ``trainer.nnodes`` is 1 (the agent's workers form their own pool);
    * ``actor_rollout_ref.rollout.custom`` is the existing ``custom`` dict (if any) plus
      ``mgrpo_agent: <name>``, which tells the rollout side which agent a replica serves.

    Interpolations are kept, not resolved: they resolve in the agent's config, so that e.g.
    ``tokenizer_path: ${actor_rollout_ref.model.path}`` follows the agent's own model path. The
    result is neither struct-mode nor read-only.

    An agent that shares another's model has no workers and no config of its own: ``ValueError``
    (use the owner's spec).
    """
    if not spec.owns_model:
        raise ValueError(
            f"agent {spec.name!r} shares the model of {spec.share_model_with!r} and has no config of its own; "
            f"build the config of {spec.share_model_with!r}"
        )
    config = _as_dictconfig(config)
    plain = OmegaConf.to_container(config, resolve=False)
    full = OmegaConf.create(plain)
    if spec.actor_rollout_ref:
        full = OmegaConf.merge(full, {"actor_rollout_ref": spec.actor_rollout_ref})
    OmegaConf.update(full, "trainer.n_gpus_per_node", spec.n_gpus_per_node, merge=False)
    OmegaConf.update(full, "trainer.nnodes", 1, merge=False)
    OmegaConf.update(full, "actor_rollout_ref.rollout.n_gpus_per_node", spec.n_gpus_per_node, merge=False)
    custom = setting(full, "actor_rollout_ref.rollout.custom")
    if custom is not None and not isinstance(custom, Mapping):
        raise ValueError(f"actor_rollout_ref.rollout.custom must be a mapping or null, got {custom!r}")
    custom = dict(custom or {})
    custom["mgrpo_agent"] = spec.name
    OmegaConf.update(full, "actor_rollout_ref.rollout.custom", custom, merge=False)
    return full


def check_multi_agent(config: DictConfig) -> tuple[MultiAgentConfig, dict[str, DictConfig], str]:
    """The ``multi_agent`` section (:func:`~mgrpo_verl.config.schema.load_multi_agent`) checked together with
    the rest of the trainer config: the one place for the rules across sections. Returns the section (GPU
    shares filled in), every model owner's full config (:func:`agent_full_config`), built once here, and the
    trainer mode that runs the section's role (:func:`~mgrpo_verl.config.schema.trainer_mode`, checked here).
    :func:`mgrpo_verl.config.plan.build_plan` is its caller.

    Raises ``ValueError`` naming the offending key and value. Callers check :func:`multi_agent_enabled`
    first: a disabled or absent section is an error here."""
    config = _as_dictconfig(config)
    if not multi_agent_enabled(config):
        raise ValueError(
            "multi_agent.enable is false (or the multi_agent section is absent): there is no multi-agent "
            "config to parse; check multi_agent_enabled(config) first"
        )
    ma = load_multi_agent(config)
    if not ma.agents:
        raise ValueError(f"multi_agent.agents is empty: at least the main agent {ma.main!r} must be listed")

    # the trainer: our mode, one node, a GPU budget the owners fit in
    # "multi_agent" (the YAML's; main_ppo then sets the role's mode) or the role's own mode, else refused naming the key
    mode = trainer_mode(ma.decoupled.role, setting(config, "trainer.v1.trainer_mode"))
    nnodes = OmegaConf.select(config, "trainer.nnodes", default=1, throw_on_missing=False)
    if nnodes != 1:
        raise ValueError(f"trainer.nnodes must be 1 in multi-agent mode, got {nnodes!r}: placing the agents' "
                         f"workers over several nodes is not supported yet")
    total = setting(config, "trainer.n_gpus_per_node")
    if not _is_int(total) or total < 1:
        raise ValueError(f"trainer.n_gpus_per_node must be a positive int, got {total!r}")
    if ma.placement == "shared":
        for spec in ma.model_owners:
            if spec.n_gpus_per_node not in (None, total):
                raise ValueError(
                    f"multi_agent.agents.{spec.name}.n_gpus_per_node is {spec.n_gpus_per_node!r} but "
                    f"multi_agent.placement is 'shared': every agent's workers use all "
                    f"trainer.n_gpus_per_node={total} GPUs; set it to null (or "
                    f"multi_agent.placement=separate to give agents GPUs of their own)"
                )
        ma = dataclasses.replace(ma, agents={n: dataclasses.replace(a, n_gpus_per_node=total) if a.owns_model else a
                                             for n, a in ma.agents.items()})
    owners = list(ma.local_owners)
    used = sum(s.n_gpus_per_node for s in owners)
    if ma.placement == "separate" and used > total:
        shares = ", ".join(f"{s.name}={s.n_gpus_per_node}" for s in owners)
        raise ValueError(
            f"multi_agent.agents.*.n_gpus_per_node: the agents with their own model need {used} GPUs in all "
            f"({shares}) but trainer.n_gpus_per_node is {total}; give them fewer, or put them on the same GPUs "
            f"with multi_agent.placement=shared"
        )
    if ma.decoupled.role == "sub":
        val_before, test_freq = setting(config, "trainer.val_before_train"), setting(config, "trainer.test_freq")
        if val_before is not False or (_is_int(test_freq) and test_freq > 0):
            raise ValueError(
                f"multi_agent.decoupled.role is 'sub' but validation is on (trainer.val_before_train={val_before!r}, "
                f"trainer.test_freq={test_freq!r}): the sub side samples no prompts of its own, the main side "
                f"validates the whole system; set trainer.val_before_train=false trainer.test_freq=-1 on the sub side"
            )

    # the algorithm against verl's rollout and batch sizes
    if ma.algorithm == "magrpo":
        _check_magrpo_batches(config, ma.magrpo, ma.cooperation)
        n = setting(config, "actor_rollout_ref.rollout.n")
        if n != 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.n is {n!r} but multi_agent.algorithm is magrpo: the cooperative rollout "
                f"expands the whole joint-action tree of a task in one run (its width is multi_agent.magrpo."
                f"num_generations); set actor_rollout_ref.rollout.n=1"
            )
    _check_unsupported(config)
    check_override_keys(config, ma.model_owners)  # every side's agents: one shared config
    fulls = {spec.name: agent_full_config(config, spec) for spec in ma.model_owners}
    if ma.placement == "shared":
        _check_shared_engines(fulls, owners)
    # LoRA agents: verl's keys per agent, which of them share a rollout engine
    check_lora(ma, fulls)
    # MAGRPO: a model trains on B x G first-turn rows (x G per later turn), verl's rollout.n being 1
    _check_agent_overrides(config, fulls, owners,
                           rows_per_prompt=ma.magrpo.num_generations if ma.algorithm == "magrpo" else 1)
    if ma.algorithm != "magrpo":  # MAGRPO's rows per model: _check_magrpo_batches above
        _check_micro_batches(fulls, owners)
    return ma, fulls, mode


# ----------------------------------------------------------------------------------------------------
# parts of check_multi_agent


def _check_magrpo_batches(config: DictConfig, magrpo: MAGRPOConfig, coop: CooperationConfig) -> None:
    """verl splits a model's rows into mini- and micro-batches and asserts they divide evenly. A model gets
    B x G first-turn rows, plus G rows per node expanded at a later turn (their number varies with early
    termination), so every such size must divide B x G (one turn) or G (several turns)."""
    g = magrpo.num_generations
    batch = setting(config, "data.train_batch_size")
    unit = g if coop.num_turns > 1 else (batch * g if _is_int(batch) else None)
    if unit is None:
        return
    for key in ("actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        value = setting(config, key)
        if _is_int(value) and value > 0 and unit % value:
            what = ("multi_agent.magrpo.num_generations" if coop.num_turns > 1
                    else "data.train_batch_size x num_generations")
            raise ValueError(
                f"{key} is {value} but a model's rows come in multiples of {unit} ({what}); verl needs whole "
                f"mini- and micro-batches: set it to a divisor of {unit}"
            )


def _rollout_correction_active(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, Mapping):
        return True
    return (
        value.get("rollout_is") is not None
        or value.get("rollout_rs") is not None
        or bool(value.get("bypass_mode", False))
    )


def _check_unsupported(config: DictConfig) -> None:
    critic = setting(config, "critic.enable")
    if critic is True:
        raise ValueError("critic.enable is true: multi-agent mode has no critic; set critic.enable: null or false")
    estimator = setting(config, "algorithm.adv_estimator")
    if estimator is not None and estimator not in SUPPORTED_ADV_ESTIMATORS:
        raise ValueError(
            f"algorithm.adv_estimator must be one of {list(SUPPORTED_ADV_ESTIMATORS)} in multi-agent mode, got "
            f"{estimator!r}: our trainer computes advantages itself (multi_agent.algorithm), but verl would "
            f"start a critic for gae, which multi-agent mode does not support"
        )
    if setting(config, "algorithm.use_kl_in_reward") is True:
        raise ValueError(
            "algorithm.use_kl_in_reward is true: a KL penalty in the reward is not supported in multi-agent mode; "
            "use actor_rollout_ref.actor.use_kl_loss instead"
        )
    correction = setting(config, "algorithm.rollout_correction")
    if _rollout_correction_active(correction):
        raise ValueError(
            f"algorithm.rollout_correction is set ({correction!r}): rollout correction (importance sampling, "
            f"rejection sampling, bypass mode) is not supported in multi-agent mode; set it to null or leave "
            f"rollout_is, rollout_rs null and bypass_mode false"
        )
    for key in ("reward.reward_model.enable", "reward_model.enable"):
        if setting(config, key) is True:
            raise ValueError(
                f"{key} is true: a reward model is not supported in multi-agent mode; use a reward function"
            )
    if setting(config, "distillation.enabled") is True:
        raise ValueError("distillation.enabled is true: distillation is not supported in multi-agent mode")


def _check_shared_engines(fulls: Mapping[str, DictConfig], owners: list[AgentConfig]) -> None:
    """``placement: shared``: every owner's rollout engine is awake during a rollout, on the same GPUs, so the
    fractions of a GPU that vLLM / SGLang engines reserve must add up to less than 1 (the actors need room too)."""
    fractions = {}
    for spec in owners:
        full = fulls[spec.name]
        if setting(full, "actor_rollout_ref.rollout.name") not in ENGINES_WITH_MEMORY_FRACTION:
            continue
        value = setting(full, "actor_rollout_ref.rollout.gpu_memory_utilization")
        if not _positive(value) or value >= 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.gpu_memory_utilization of agent {spec.name!r} must be a fraction in "
                f"(0, 1), got {value!r}"
            )
        fractions[spec.name] = value
    if sum(fractions.values()) >= 1:
        each = ", ".join(f"{k}={v}" for k, v in fractions.items())
        raise ValueError(
            f"multi_agent.placement is 'shared' but the agents' rollout engines reserve {sum(fractions.values()):g} of "
            f"every GPU together (actor_rollout_ref.rollout.gpu_memory_utilization: {each}); all of them are awake "
            f"during a rollout, so the sum must be < 1 with room left for the actors: lower it per agent "
            f"(multi_agent.agents.<name>.actor_rollout_ref.rollout.gpu_memory_utilization)"
        )


def _check_agent_overrides(config: DictConfig, fulls: Mapping[str, DictConfig], owners: list[AgentConfig],
                           rows_per_prompt: int = 1) -> None:
    top_n = setting(config, "actor_rollout_ref.rollout.n")
    batch = setting(config, "data.train_batch_size")
    batch = batch * rows_per_prompt if _is_int(batch) else batch
    for spec in owners:
        path = f"multi_agent.agents.{spec.name}.actor_rollout_ref"
        full = fulls[spec.name]
        mini = setting(full, "actor_rollout_ref.actor.ppo_mini_batch_size")
        if _is_int(batch) and _is_int(mini) and mini > 0 and batch % mini:
            # a model trains on B*n main rows and/or B*n*D_max aligned sub rows: whole mini-batches of
            # mini*n rows exactly when B is a multiple of mini (no padding rows, no lopsided last update)
            what = f"data.train_batch_size {batch}" if rows_per_prompt == 1 else (
                f"data.train_batch_size x multi_agent.magrpo.num_generations = {batch}")
            raise ValueError(
                f"{what} is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size "
                f"{mini} of agent {spec.name!r} (set in {path} or at the top level): every model's rows must split "
                f"into whole mini-batches"
            )
        if not spec.actor_rollout_ref:
            continue
        n = setting(full, "actor_rollout_ref.rollout.n")
        if n != top_n:
            raise ValueError(
                f"{path}.rollout.n makes actor_rollout_ref.rollout.n {n!r} for agent {spec.name!r} but the top-level "
                f"one is {top_n!r}: every agent must use the same n, because sub-agent rows are grouped with their "
                f"parents' rollouts"
            )


def _check_micro_batches(fulls: Mapping[str, DictConfig], owners: list[AgentConfig]) -> None:
    """verl splits the rows each GPU of a model gets into micro-batches and asserts whole ones, inside a worker at
    step 1 ("data size must be divisible by ... micro_batch_size_per_gpu", verl/workers/engine/utils.py). A model
    gets B x n main rows and B x n x D_max aligned rows per sub-agent it plays (D_max >= 1, varying with
    ``auto``), over its GPUs: every micro-batch of the log-prob passes (all rows at once) must divide
    B x n / GPUs, and the update's must divide one mini-batch, ppo_mini_batch_size x n / GPUs. Passes with a
    dynamic batch size are not split this way."""
    for spec in owners:
        _check_model_micro_batches(
            fulls[spec.name], spec.key_of, f"agent {spec.name!r}'s model",
            setting(fulls[spec.name], "trainer.n_gpus_per_node"),
            f"multi_agent.agents.{spec.name}.n_gpus_per_node, or every GPU with multi_agent.placement=shared",
            "; a sub-agent's model that many times D_max",
        )


def check_micro_batches(config: DictConfig) -> None:
    """The rule of :func:`_check_micro_batches` for a single-model run (``--config-name single_agent``): B x n
    rows over trainer.nnodes x trainer.n_gpus_per_node GPUs. Raises ``ValueError`` naming the keys."""
    nodes, per_node = setting(config, "trainer.nnodes", 1), setting(config, "trainer.n_gpus_per_node")
    world = nodes * per_node if all(_is_int(v) and v > 0 for v in (nodes, per_node)) else None
    _check_model_micro_batches(config, lambda leaf: f"actor_rollout_ref.{leaf}", "the model", world,
                               "trainer.nnodes x trainer.n_gpus_per_node", "")


def _check_model_micro_batches(full: DictConfig, key_of: Callable[[str], str], who: str, world: Any, gpus: str,
                               note: str) -> None:
    """One model's micro-batches (:func:`_check_micro_batches`): ``full`` is its full config, ``key_of`` names
    the key a user sets for an ``actor_rollout_ref.`` leaf, ``world`` its GPUs (``gpus`` says which keys set
    them), ``who`` and ``note`` word the error."""
    arr = "actor_rollout_ref"
    batch, n = setting(full, "data.train_batch_size"), setting(full, f"{arr}.rollout.n")
    mini = setting(full, f"{arr}.actor.ppo_mini_batch_size")
    if not all(_is_int(v) and v > 0 for v in (batch, n, world)):
        return  # refused elsewhere (rollout.n, n_gpus_per_node) or left to verl
    if batch * n % world:
        raise ValueError(
            f"data.train_batch_size x {key_of('rollout.n')} = {batch} x {n} rows are not a multiple of the "
            f"{world} GPUs of {who} ({gpus}): verl splits a model's rows evenly over its GPUs"
        )
    per_gpu = {"log-prob": batch * n // world, "update": mini * n // world if _is_int(mini) and mini > 0 else None}
    passes = [("rollout.log_prob_micro_batch_size_per_gpu", "rollout.log_prob_use_dynamic_bsz", "log-prob"),
              ("actor.ppo_micro_batch_size_per_gpu", "actor.use_dynamic_bsz", "update")]
    if setting(full, f"{arr}.actor.use_kl_loss"):  # verl computes reference log-probs only for a KL loss here
        passes.append(("ref.log_prob_micro_batch_size_per_gpu", "ref.log_prob_use_dynamic_bsz", "log-prob"))
    for leaf, dynamic, kind in passes:
        value, unit = setting(full, f"{arr}.{leaf}"), per_gpu[kind]
        if unit is None or setting(full, f"{arr}.{dynamic}") or not _is_int(value) or value <= 0 or unit % value == 0:
            continue
        rows = (f"data.train_batch_size x rollout.n = {batch} x {n}" if kind == "log-prob" else
                f"one mini-batch, {key_of('actor.ppo_mini_batch_size')} x rollout.n = {mini} x {n}")
        raise ValueError(
            f"{key_of(leaf)} is {value} but {who} gets {unit} rows per GPU in each "
            f"{kind} pass ({rows} rows over {world} GPU(s){note}): verl "
            f"cuts them into micro-batches of {value} and asserts whole ones at step 1; set it to a divisor of {unit}"
        )


def _schema_class(target: Any) -> Optional[type]:
    if not isinstance(target, str) or not target:
        return None
    from hydra.utils import get_class

    try:
        cls = get_class(target)
    except Exception:  # noqa: BLE001 - an unknown _target_ is verl's to report; we only check keys
        return None
    return cls if dataclasses.is_dataclass(cls) else None


def _dataclass_of(annotation: Any) -> Optional[type]:
    """The dataclass in a field's annotation (``X``, ``Optional[X]``), or ``None``."""
    import typing

    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return annotation
    found = [a for a in typing.get_args(annotation) if dataclasses.is_dataclass(a) and isinstance(a, type)]
    return found[0] if len(found) == 1 else None


def _unknown_keys(override: Mapping, cls: Optional[type], schema: Any, path: str) -> list[tuple[str, list[str]]]:
    """Keys of ``override`` that neither the dataclass ``cls`` nor the mapping ``schema`` (the same section of the
    top-level config, whose keys verl accepts) has, each with the keys there are. Sections are typed by their
    ``_target_`` (the override's, else the top-level one), else by the field's annotation; untyped mappings (``Dict``
    fields) are free."""
    import typing

    if cls is not None:
        allowed = [f.name for f in dataclasses.fields(cls)] + ["_target_"]
        allowed += [k for k in (schema.keys() if isinstance(schema, Mapping) else ()) if k not in allowed]
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # noqa: BLE001 - unresolvable annotations: do not descend by annotation
            hints = {}
    else:
        allowed, hints = list(schema.keys()), {}
    bad: list[tuple[str, list[str]]] = []
    for key, value in override.items():
        if key not in allowed:
            bad.append((f"{path}.{key}", allowed))
            continue
        if not isinstance(value, Mapping):
            continue
        child_schema = schema.get(key) if isinstance(schema, Mapping) else None
        target = value.get("_target_") or (child_schema.get("_target_") if isinstance(child_schema, Mapping) else None)
        child_cls = _schema_class(target) or _dataclass_of(hints.get(key))
        if child_cls is not None:
            bad += _unknown_keys(value, child_cls, child_schema, f"{path}.{key}")
    return bad


def check_override_keys(config: DictConfig, owners: Any = ()) -> None:
    """Every key of each owner's ``multi_agent.agents.<name>.actor_rollout_ref`` exists in the top-level
    ``actor_rollout_ref`` or in verl's dataclass of its section (named by the section's ``_target_``), so a typo is
    refused naming the full key, instead of when verl builds its dataclasses in a Ray worker a minute later (Hydra
    already refuses a typo at the top level). Values are not resolved nor type-checked (verl does that)."""
    import difflib

    top = OmegaConf.select(config, "actor_rollout_ref", default=None, throw_on_missing=False)
    if not OmegaConf.is_config(top):
        return
    schema = OmegaConf.to_container(top, resolve=False)
    sources = [(f"multi_agent.agents.{s.name}.actor_rollout_ref", s.actor_rollout_ref)
               for s in owners if s.actor_rollout_ref]
    for path, override in sources:
        bad = _unknown_keys(override, None, schema, path)
        if bad:
            key, allowed = bad[0]
            leaf = key.rsplit(".", 1)[1]
            close = difflib.get_close_matches(leaf, [a for a in allowed if a != "_target_"], n=1)
            value = OmegaConf.select(config, key, default=None, throw_on_missing=False,
                                     throw_on_resolution_failure=False)
            raise ValueError(
                f"{key}={value!r}: unknown key, verl's config has no {leaf!r} there"
                + (f" (did you mean {close[0]!r}?)" if close else f"; its keys are {sorted(allowed)}")
            )
