"""The ``multi_agent:`` section of the trainer config: parsing, validation and per-agent configs.

Our Hydra config is verl's ``ppo_trainer`` config plus top-level keys of our own. verl's typed
sections reject unknown keys, so the multi-agent settings live in a section of their own::

    multi_agent:
      enable: false
      main: main
      algorithm: mgrpo
      mgrpo: {sub_reward_local_weight: 0.5, sub_reward_main_weight: 0.5, norm_adv_by_std: true,
              epsilon: 1.0e-6, norm_scope: group}
      d_max: auto
      delegation: {sub_agent: null, min_calls: 0, max_calls: 3, plan_tokens: 8, answer_tokens: 8,
                   sub_response_tokens: 16, timeout_s: 120, scorer: null, sub_max_turns: 2,
                   sub_prompt: null}
      decoupled: {role: null, train_agent: null, store: null, sub_urls: {}, serve_host: 127.0.0.1,
                  serve_port: 8470, wait_timeout_s: 60, poll_s: 0.05, max_policy_lag: null,
                  missing_policy: skip, idle_timeout_s: 900, connect_timeout_s: 900}
      placement: separate
      gpu_memory_gb: null
      agents:
        main: {trainable: true, n_gpus_per_node: null, share_model_with: null, actor_rollout_ref: {}}
        sub:  {trainable: true, n_gpus_per_node: null, share_model_with: null, actor_rollout_ref: {}}

What every key means, and why it exists:

``enable`` (default ``false``)
    ``true`` runs our per-agent trainer (one model, one set of actor/ref/rollout workers per agent)
    instead of verl's single-model trainer. ``trainer.v1.trainer_mode`` must then be ``"mgrpo"``, so
    that verl's own trainer modes are never started on a multi-agent config by mistake.
``main`` (default ``"main"``)
    Name of the main agent (the planner). Its rows are the roots of the hierarchy: they have
    ``parent_traj_id == ""``. It must be one of ``agents``; it always comes first in
    :attr:`MultiAgentConfig.agents` (its model is placed first, its replicas get offset 0).
``algorithm`` (default ``"mgrpo"``)
    ``mgrpo``: hierarchical M-GRPO advantages (sub-agents credited with their own score and their
    parent's). ``grpo``: single-agent GRPO baseline, advantages from the main agent's score only.
``mgrpo`` (default: :class:`~mgrpo_verl.algorithms.config.MGRPOConfig`'s defaults)
    Options of the M-GRPO estimator, parsed by :meth:`MGRPOConfig.from_any` (documented there).
    Parsed (and so validated) with ``algorithm: grpo`` too, so that switching algorithms never
    uncovers a typo late.
``d_max`` (default ``"auto"``)
    D, the number of sub-agent calls per main trajectory that take part in the alignment: a
    positive int, or ``"auto"`` (a quantile of the batch's call counts); see
    :func:`mgrpo_verl.algorithms.alignment.resolve_d_max`.
``delegation``
    How the main agent delegates to a sub-agent in the built-in environments. See
    :class:`DelegationConfig`.
``decoupled`` (default: ``role: null``, the synchronous mode)
    Decoupled M-GRPO: this process is the ``main`` or the ``sub`` side, the other side runs elsewhere
    and they exchange only statistics (docs/decoupled.md). See :class:`DecoupledSettings`; on a side,
    only that side's models count against ``trainer.n_gpus_per_node``.
``placement`` (default ``"separate"``)
    Where the model owners' workers go. ``separate``: each model owner gets a resource pool of its own,
    ``agents.<name>.n_gpus_per_node`` GPUs out of ``trainer.n_gpus_per_node`` (the shares add up to at
    most that). ``shared``: one resource pool of all ``trainer.n_gpus_per_node`` GPUs, and every model
    owner's actor / reference / rollout worker group spans all of them (verl colocates worker groups of
    one pool on the same GPUs, each taking a fraction of a GPU), so two agents fit on one GPU. Each
    agent's rollout engine then takes its own ``rollout.gpu_memory_utilization`` of every GPU (set it
    per agent in ``agents.<name>.actor_rollout_ref``): all engines are awake during a rollout (the main
    agent calls the sub-agent mid-rollout), so their fractions must add up to less than 1 (checked for
    vLLM / SGLang). The trainer sleeps every trainable agent's engines before any update, updates the
    models one after the other, and moves a frozen agent's actor to CPU once its engine has the weights;
    ``mgrpo_verl.trainer.memory`` estimates whether the phases fit. With ``shared``, an agent's
    ``n_gpus_per_node`` must be null or equal to ``trainer.n_gpus_per_node``.
``gpu_memory_gb`` (default ``null``)
    Memory of one GPU in GB (10^9 bytes) for the pre-flight memory estimate
    (:func:`mgrpo_verl.trainer.memory.preflight`): a number > 0, or null to read it from ``nvidia-smi``
    when a GPU is visible (the estimate is skipped, with a log line, when none is).
``concurrent_updates`` (default ``"auto"``)
    ``auto``: models on resource pools of their own (``placement: separate``) run their old-log-prob /
    reference / actor update at the same time, one driver thread each; models that share a pool update
    one after the other. ``false``: always one after the other. Read by the trainer's update step.
``agents`` (required, non-empty)
    The agents, a mapping keyed by name. Names must match ``[A-Za-z0-9_-]+`` because they become
    metric prefixes (``<agent>/actor/...``) and folder names (checkpoints per agent). Each entry:

    ``trainable`` (default ``true``)
        Whether this agent's model is updated. A frozen agent still generates (and gets a reference
        / log-prob pass only if needed), so a fixed sub-agent can serve a trained main agent.
    ``n_gpus_per_node`` (default ``null``: 1 with ``placement: separate``, all GPUs with ``shared``)
        This agent's share of ``trainer.n_gpus_per_node`` (GPUs, or logical GPUs on CPU) for its own
        actor + ref + rollout workers (a colocated hybrid engine per agent). Model owners' shares
        must add up to at most ``trainer.n_gpus_per_node`` (``placement: separate``). Ignored (taken as
        0) for an agent that shares another's model: it has no workers of its own.
    ``share_model_with`` (default ``null``)
        Another agent's name: this agent has no model of its own; its calls go to that agent's
        model and its rows train that model (the single-agent baseline, where one model plays every
        role). The other agent must own its model (no chains) and cannot be the agent itself; the
        main agent cannot share. ``trainable`` must equal the owner's (the same weights cannot be
        both frozen and trained), and ``actor_rollout_ref`` must be empty (the model's settings are
        the owner's).
    ``node_resource`` (default ``null``)
        A custom Ray resource (declared by ``ray start --resources='{"<name>": 1}'`` on one node) that
        this agent's pool must land on: its bundles ask for it, so every worker of the agent runs on
        that node (docs/multinode.md). Null: Ray chooses. Only for an agent with its own model and
        ``placement: separate``.
    ``actor_rollout_ref`` (default ``{}``)
        Overrides merged onto the top-level ``actor_rollout_ref`` for this agent (model path, lr,
        ``rollout.response_length``, ...). Keys verl's typed configs do not have are rejected here,
        naming the full key (:func:`check_override_keys`). ``rollout.n`` cannot differ from the top-level one, because
        sub-agent rows are grouped with their parents' rollouts.

Multi-agent mode does not support some verl features (each rejected with its own message):
a critic (``critic.enable: true`` or ``algorithm.adv_estimator`` other than ``grpo`` / ``mgrpo``:
the top-level estimator is not used by our trainer, but ``gae`` would need a critic),
``algorithm.use_kl_in_reward``, an active ``algorithm.rollout_correction`` (``rollout_is`` or
``rollout_rs`` set, or ``bypass_mode: true``; verl's default section with both null is inert and
accepted), a reward model (``reward.reward_model.enable``, or the legacy ``reward_model.enable``),
LoRA (``model.lora_rank > 0`` or ``model.lora.rank > 0``, top-level or in any agent's override),
distillation (``distillation.enabled``), and more than one node (``trainer.nnodes`` must be 1:
per-agent placement over several nodes is not supported yet).

Everything here is pure: no Ray, no models; the input config is never modified.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from mgrpo_verl.algorithms.config import MAGRPOConfig, MGRPOConfig

logger = logging.getLogger(__name__)

ALGORITHMS = ("mgrpo", "grpo", "magrpo")
"""Values of ``multi_agent.algorithm``."""

TRAINER_MODE = "mgrpo"
"""The ``trainer.v1.trainer_mode`` that multi-agent mode requires."""

SUPPORTED_ADV_ESTIMATORS = ("grpo", "mgrpo")
"""Top-level ``algorithm.adv_estimator`` values accepted in multi-agent mode (critic-free ones)."""

AGENT_NAME_RE = re.compile(r"[A-Za-z0-9_\-]+")
"""Agent names become metric prefixes and folder names."""

AGENT_KEYS = ("trainable", "n_gpus_per_node", "share_model_with", "node_resource", "actor_rollout_ref")
"""Keys of one entry of ``multi_agent.agents``."""

PLACEMENTS = ("separate", "shared")
"""Values of ``multi_agent.placement``."""

SECTION_KEYS = ("enable", "main", "algorithm", "mgrpo", "d_max", "delegation", "agents", "decoupled", "magrpo",
                "cooperation", "placement", "gpu_memory_gb", "concurrent_updates")
"""Keys of the ``multi_agent`` section (``concurrent_updates`` is read by the trainer's update step)."""

ENGINES_WITH_MEMORY_FRACTION = ("vllm", "sglang")
"""Rollout engines that reserve ``rollout.gpu_memory_utilization`` of a GPU when they start."""


@dataclass(frozen=True)
class AgentSpec:
    """One entry of ``multi_agent.agents`` (see the module docstring for each field's meaning)."""

    name: str
    """The agent's name (its key in ``multi_agent.agents``)."""

    trainable: bool
    """Whether the agent's model is updated (for a sharing agent: equal to its owner's)."""

    n_gpus_per_node: int
    """GPUs (logical on CPU) of this agent's workers; 0 for an agent that shares another's model."""

    share_model_with: Optional[str]
    """The agent whose model plays this one, or ``None`` when it owns its model."""

    actor_rollout_ref: dict
    """Overrides of ``actor_rollout_ref`` for this agent, a plain container. Interpolations are kept
    unresolved, so that they resolve in the agent's own config (see :func:`agent_full_config`).
    Treat as read-only."""

    node_resource: Optional[str] = None
    """Custom Ray resource of the node this agent's pool must land on, or ``None`` (Ray chooses)."""

    @property
    def owns_model(self) -> bool:
        """Whether the agent has a model (and workers) of its own."""
        return self.share_model_with is None


@dataclass(frozen=True)
class DelegationConfig:
    """``multi_agent.delegation``: how the main agent delegates to a sub-agent in our environments."""

    sub_agent: Optional[str] = None
    """The agent the main agent calls. ``null`` in the config means the first non-main agent;
    after parsing it is always a name (of a non-main agent)."""

    min_calls: int = 0
    """Fewest sub-agent calls per main trajectory the environment asks for (>= 0). 0 lets the main
    agent answer alone, which the hierarchy must handle (a main row without children)."""

    max_calls: int = 3
    """Most sub-agent calls per main trajectory (>= 1, >= min_calls): bounds rollout time and the
    number of sub rows per main row."""

    plan_tokens: int = 8
    """Response tokens of the main agent's planning turn (>= 1); small, for fast toy runs."""

    answer_tokens: int = 8
    """Response tokens of the main agent's final answer turn (>= 1)."""

    sub_response_tokens: int = 16
    """Response tokens of one sub-agent call (>= 1)."""

    timeout_s: float = 120.0
    """Seconds one sub-agent call may take before it counts as failed (> 0), so that a stuck
    replica cannot hang the whole rollout."""

    scorer: Optional[str] = None
    """How rows are scored: ``null`` for the task's own scorer, or ``"module:function"`` /
    ``"file.py:function"`` called as ``f(role, text, ground_truth) -> float`` with role ``main`` or
    ``sub`` (``mgrpo_verl.envs.relay.load_scorer``): a task variant without writing a new loop."""

    sub_max_turns: int = 2
    """Delegation by tool call (agent loop ``mgrpo_delegate``): assistant turns of one sub-agent call
    (>= 1), i.e. its own multi-turn tool loop (``multi_turn.max_assistant_turns`` of the sub-agent);
    its last turn's text is the report the main agent sees. The main agent's turn limits stay verl's
    own ``actor_rollout_ref.rollout.multi_turn.max_assistant_turns`` / ``max_user_turns``."""

    sub_prompt: Optional[str] = None
    """How a sub-agent call is prompted: ``null`` for the task's own prompt (relay / relay_tools), or
    ``"module:function"`` / ``"file.py:function"`` called as ``f(agent, task) -> chat messages``
    (``mgrpo_verl.envs.relay.load_sub_prompt``). ``task`` is the main agent's ``task`` argument (delegation
    by tool call), or the row's ``extra_info.question`` and the main agent's plan (forced delegation,
    ``mgrpo_relay``), e.g. the research task's ``mgrpo_verl.envs.research.prompts:sub_messages``."""


DELEGATION_KEYS = tuple(f.name for f in dataclasses.fields(DelegationConfig))
"""Keys of ``multi_agent.delegation``."""

@dataclass(frozen=True)
class CooperationConfig:
    """``multi_agent.cooperation``: MAGRPO's cooperative rollout (agent loop ``magrpo_coop``). The tree's
    width G and the joint mode are ``multi_agent.magrpo.num_generations`` / ``joint_mode``."""

    num_turns: int = 1
    """Turns of the joint-action tree (>= 1). Each turn after the first shows every agent the previous
    turn's completions and the task's feedback (test results, a critique): the external transition."""

    termination_threshold: Optional[float] = None
    """A node whose joint reward reaches this is not expanded further (early termination); null: never."""

    response_tokens: int = 64
    """New tokens of one agent's completion (>= 1), also capped by its rollout ``response_length``."""

    timeout_s: float = 120.0
    """Seconds one generation may take; a failed or timed-out one is the empty completion, counted."""


COOPERATION_KEYS = tuple(f.name for f in dataclasses.fields(CooperationConfig))
"""Keys of ``multi_agent.cooperation``."""


def parse_cooperation(section: Any) -> tuple[MAGRPOConfig, CooperationConfig]:
    """``multi_agent.magrpo`` and ``multi_agent.cooperation`` of a ``multi_agent`` section, validated (the
    cooperative loop reads them in its own process). ``num_generations`` is required (G > 0)."""
    section = section or {}
    try:
        magrpo = MAGRPOConfig.from_any(section.get("magrpo") or None)
    except (TypeError, ValueError) as err:
        raise ValueError(f"multi_agent.magrpo: {err}") from None
    if magrpo.num_generations is None:
        raise ValueError(
            "multi_agent.magrpo.num_generations must be set (G, the completions per agent at a node) for the "
            "cooperative rollout"
        )
    raw = section.get("cooperation") or {}
    path = "multi_agent.cooperation"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: expected a mapping, got {raw!r}")
    _check_keys(raw, COOPERATION_KEYS, path)
    defaults = CooperationConfig()
    values = {k: (getattr(defaults, k) if raw.get(k) is None else raw[k]) for k in COOPERATION_KEYS}
    values["termination_threshold"] = raw.get("termination_threshold")
    for key in ("num_turns", "response_tokens"):
        if not _is_int(values[key]) or values[key] < 1:
            raise ValueError(f"{path}.{key} must be an int >= 1, got {values[key]!r}")
    threshold = values["termination_threshold"]
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not math.isfinite(threshold)):
        raise ValueError(f"{path}.termination_threshold must be null or a finite number, got {threshold!r}")
    if not _positive(values["timeout_s"]) or not math.isfinite(values["timeout_s"]):
        raise ValueError(f"{path}.timeout_s must be a finite number > 0, got {values['timeout_s']!r}")
    return magrpo, CooperationConfig(**values)


DECOUPLED_ROLES = ("main", "sub")
"""Values of ``multi_agent.decoupled.role`` besides ``null`` (one process trains every agent)."""


@dataclass(frozen=True)
class DecoupledSettings:
    """``multi_agent.decoupled``: decoupled M-GRPO, one trainer process per side (docs/decoupled.md).

    Both sides run ``python -m mgrpo_verl.main_ppo`` with the same ``multi_agent`` section and a
    different ``role``. The sub side trains one model and serves it to the main side over HTTP; the
    main side trains the main agent's model and publishes one record per main trajectory (ids, uid,
    score, format flag, step, version, the sub calls it used) to the store. No tensors cross.
    """

    role: Optional[str] = None
    """``null``: one process trains every agent (the synchronous mode). ``main``: this process trains
    the main agent's model and calls remote sub-agents. ``sub``: this process trains ``train_agent``'s
    model and serves it."""

    train_agent: Optional[str] = None
    """``role: sub``: the model owner this process trains and serves (null: the owner of
    ``delegation.sub_agent``)."""

    store: Optional[str] = None
    """URL of the statistics store both sides open (``sqlite:///abs/path.db`` on a filesystem both see,
    or ``redis://host:port/db``); required with a role."""

    sub_urls: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """``role: main``: sub-agent name -> base URL of the sub side serving it
    (``http://host:port``); every sub-agent needs one."""

    serve_host: str = "127.0.0.1"
    """``role: sub``: address the delegation service listens on (``0.0.0.0`` for other machines)."""

    serve_port: int = 8470
    """``role: sub``: its TCP port."""

    wait_timeout_s: float = 60.0
    """``role: sub``: how long a sub row may wait for its parent's main score before
    ``missing_policy`` applies to it (bounded, so a dead main side stalls nothing for long)."""

    poll_s: float = 0.05
    """``role: sub``: interval of the store polls (the hand-off latency's floor)."""

    max_policy_lag: Optional[int] = None
    """``role: sub``: a parent made by main weights more than this many versions older than the newest
    parent of the step counts as missing (null: any)."""

    missing_policy: str = "skip"
    """``role: sub``: rows whose parent is missing or stale: ``skip`` (left out of the update, counted in
    ``decoupled/missing_parent_rows`` / ``stale_parent_rows``) or ``error`` (raise)."""

    idle_timeout_s: float = 900.0
    """``role: sub``: a step that receives no delegation call for this long raises (the main side is
    down or points elsewhere) instead of waiting for ever."""

    connect_timeout_s: float = 900.0
    """``role: main``: how long the main side waits at start for every sub side to answer ``/health``
    (the sides may start in any order)."""


DECOUPLED_KEYS = tuple(f.name for f in dataclasses.fields(DecoupledSettings))
"""Keys of ``multi_agent.decoupled``."""


@dataclass(frozen=True)
class MultiAgentConfig:
    """The parsed, validated ``multi_agent`` section (see the module docstring)."""

    main: str
    """Name of the main agent."""

    algorithm: str
    """``"mgrpo"`` or ``"grpo"``."""

    mgrpo: MGRPOConfig
    """M-GRPO estimator options."""

    d_max: Union[int, str]
    """A positive int or ``"auto"``."""

    delegation: DelegationConfig
    """Delegation settings, with ``sub_agent`` resolved to a name."""

    agents: tuple[AgentSpec, ...]
    """Every agent: the main agent first, then the others in config order."""

    decoupled: DecoupledSettings = dataclasses.field(default_factory=DecoupledSettings)
    """Decoupled M-GRPO settings (``role`` null: the synchronous mode)."""

    magrpo: MAGRPOConfig = dataclasses.field(default_factory=MAGRPOConfig)
    """MAGRPO estimator options (``algorithm: magrpo``; defaults otherwise)."""

    cooperation: CooperationConfig = dataclasses.field(default_factory=CooperationConfig)
    """The cooperative rollout's settings (``algorithm: magrpo``; defaults otherwise)."""

    placement: str = "separate"
    """``"separate"`` (a resource pool per model owner) or ``"shared"`` (one pool, every model owner on all
    ``trainer.n_gpus_per_node`` GPUs)."""

    gpu_memory_gb: Optional[float] = None
    """Memory of one GPU in GB for the pre-flight estimate; ``None``: ask ``nvidia-smi``."""

    @property
    def local_owners(self) -> tuple[AgentSpec, ...]:
        """Model owners this process builds workers for: all of them in the synchronous mode, the main
        agent's model on the main side, ``decoupled.train_agent`` on the sub side."""
        role = self.decoupled.role
        if role is None:
            return self.model_owners
        keep = self.owner_of(self.main) if role == "main" else self.decoupled.train_agent
        return tuple(a for a in self.model_owners if a.name == keep)

    def agent(self, name: str) -> AgentSpec:
        """The agent called ``name``; ``ValueError`` naming the known agents if there is none."""
        for spec in self.agents:
            if spec.name == name:
                return spec
        raise ValueError(f"unknown agent {name!r}; known agents are {[a.name for a in self.agents]}")

    @property
    def model_owners(self) -> tuple[AgentSpec, ...]:
        """Agents with a model of their own, main first (the order of model placement)."""
        return tuple(a for a in self.agents if a.owns_model)

    @property
    def sub_agents(self) -> tuple[str, ...]:
        """Every agent name except the main agent's, in order."""
        return tuple(a.name for a in self.agents if a.name != self.main)

    def owner_of(self, name: str) -> str:
        """The agent whose model plays ``name``: itself, or the agent it shares a model with."""
        spec = self.agent(name)
        return spec.name if spec.share_model_with is None else spec.share_model_with

    @property
    def trainable_owners(self) -> tuple[AgentSpec, ...]:
        """Model owners whose model is updated."""
        return tuple(a for a in self.model_owners if a.trainable)

    def replica_offsets(self, replicas_per_agent: Mapping[str, int]) -> dict[str, int]:
        """Index of each model owner's first rollout replica when all replicas are numbered together.

        Offsets accumulate over :attr:`model_owners` in order: the first gets 0, each next one the
        previous offset plus the previous count. ``replicas_per_agent`` must give a count (int >= 0)
        for every model owner and nothing else.
        """
        owners = [a.name for a in self.model_owners]
        extra = sorted(str(k) for k in replicas_per_agent if k not in owners)
        if extra:
            raise ValueError(f"replica_offsets: {extra} are not model owners; model owners are {owners}")
        offsets: dict[str, int] = {}
        offset = 0
        for name in owners:
            if name not in replicas_per_agent:
                raise ValueError(f"replica_offsets: no replica count for model owner {name!r}; model owners are {owners}")
            count = replicas_per_agent[name]
            if not _is_int(count) or count < 0:
                raise ValueError(f"replica_offsets: replica count of {name!r} must be an int >= 0, got {count!r}")
            offsets[name] = offset
            offset += int(count)
        return offsets


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


def _select(config: DictConfig, key: str) -> Any:
    """The value at ``key``, ``None`` when absent or ``???``; containers come back as plain ones."""
    value = OmegaConf.select(config, key, default=None, throw_on_missing=False)
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _child(node: DictConfig, key: Any, path: str, resolve: bool = True) -> Any:
    """``node[key]`` as a plain value (containers converted), with a ``path`` in errors."""
    try:
        value = node[key]
    except MissingMandatoryValue:
        raise ValueError(f"{path}: missing mandatory value (???)") from None
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=resolve)
    return value


def _check_keys(node: Any, allowed: tuple[str, ...], path: str) -> None:
    if not isinstance(node, (Mapping, DictConfig)):
        raise ValueError(f"{path}: expected a mapping, got {node!r}")
    unknown = [k for k in node.keys() if k not in allowed]
    if unknown:
        paths = ", ".join(f"{path}.{k}" for k in unknown)
        raise ValueError(f"{paths}: unknown key(s); the keys of {path} are {list(allowed)}")


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


def agent_full_config(config: DictConfig, spec: AgentSpec) -> DictConfig:
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
    custom = _select(full, "actor_rollout_ref.rollout.custom")
    if custom is not None and not isinstance(custom, Mapping):
        raise ValueError(f"actor_rollout_ref.rollout.custom must be a mapping or null, got {custom!r}")
    custom = dict(custom or {})
    custom["mgrpo_agent"] = spec.name
    OmegaConf.update(full, "actor_rollout_ref.rollout.custom", custom, merge=False)
    return full


def parse_multi_agent(config: DictConfig) -> MultiAgentConfig:
    """Parse ``config.multi_agent`` and validate it together with the rest of the config.

    Raises ``ValueError`` naming the offending key path and value (see the module docstring for
    the rules). Callers check :func:`multi_agent_enabled` first: a disabled or absent section is an
    error here.
    """
    config = _as_dictconfig(config)
    if not multi_agent_enabled(config):
        raise ValueError(
            "multi_agent.enable is false (or the multi_agent section is absent): there is no multi-agent "
            "config to parse; check multi_agent_enabled(config) first"
        )
    section = OmegaConf.select(config, "multi_agent")
    _check_keys(section, SECTION_KEYS, "multi_agent")

    def get(key: str, default: Any, resolve: bool = True) -> Any:
        if key not in section:
            return default
        value = _child(section, key, f"multi_agent.{key}", resolve=resolve)
        return default if value is None else value

    _check_trainer(config)
    placement = get("placement", "separate")
    if placement not in PLACEMENTS:
        raise ValueError(f"multi_agent.placement must be one of {list(PLACEMENTS)}, got {placement!r}")
    gpu_memory_gb = get("gpu_memory_gb", None)
    if gpu_memory_gb is not None and (not _positive(gpu_memory_gb) or not math.isfinite(gpu_memory_gb)):
        raise ValueError(
            f"multi_agent.gpu_memory_gb must be null (read the GPU's memory from nvidia-smi) or a number of GB > 0, "
            f"got {gpu_memory_gb!r}"
        )
    concurrent = get("concurrent_updates", "auto")
    if concurrent not in ("auto", False):
        raise ValueError(f"multi_agent.concurrent_updates must be 'auto' or false, got {concurrent!r}")

    # agents
    main = get("main", "main")
    if not isinstance(main, str) or not main:
        raise ValueError(f"multi_agent.main must be a non-empty agent name, got {main!r}")
    agents_node = section["agents"] if "agents" in section else None
    if agents_node is None or (OmegaConf.is_config(agents_node) and len(agents_node) == 0):
        raise ValueError(f"multi_agent.agents is empty: at least the main agent {main!r} must be listed")
    if not isinstance(agents_node, DictConfig):
        raise ValueError(f"multi_agent.agents must be a mapping of agent name to settings, got {agents_node!r}")
    names = list(agents_node.keys())
    for name in names:
        if not isinstance(name, str) or not AGENT_NAME_RE.fullmatch(name):
            raise ValueError(
                f"multi_agent.agents: agent name {name!r} is invalid; names must be non-empty strings matching "
                f"[A-Za-z0-9_-]+ (they become metric prefixes and folder names)"
            )
    if main not in names:
        raise ValueError(f"multi_agent.main: the main agent {main!r} is not among multi_agent.agents {names}")

    raw = {name: _read_agent(agents_node, name) for name in names}
    total = OmegaConf.select(config, "trainer.n_gpus_per_node", default=None, throw_on_missing=False)
    specs = _build_specs(raw, main, names, shared_gpus=total if placement == "shared" else None)
    ordered = (specs[main],) + tuple(specs[n] for n in names if n != main)
    owners = [s for s in ordered if s.owns_model]

    delegation = parse_delegation(get("delegation", {}), main, [s.name for s in ordered])
    probe = MultiAgentConfig(main, "mgrpo", MGRPOConfig(), 1, delegation, ordered)
    decoupled = parse_decoupled(get("decoupled", {}), probe)
    if decoupled.role is not None:
        probe = dataclasses.replace(probe, decoupled=decoupled)
        owners = list(probe.local_owners)
    if decoupled.role == "sub":
        val_before = _select(config, "trainer.val_before_train")
        test_freq = _select(config, "trainer.test_freq")
        if val_before is not False or (_is_int(test_freq) and test_freq > 0):
            raise ValueError(
                f"multi_agent.decoupled.role is 'sub' but validation is on (trainer.val_before_train={val_before!r}, "
                f"trainer.test_freq={test_freq!r}): the sub side samples no prompts of its own, the main side "
                f"validates the whole system; set trainer.val_before_train=false trainer.test_freq=-1 on the sub side"
            )

    used = sum(s.n_gpus_per_node for s in owners)
    if placement == "separate" and used > total:
        shares = ", ".join(f"{s.name}={s.n_gpus_per_node}" for s in owners)
        raise ValueError(
            f"multi_agent.agents.*.n_gpus_per_node: the agents with their own model need {used} GPUs in all "
            f"({shares}) but trainer.n_gpus_per_node is {total}; give them fewer, or put them on the same GPUs "
            f"with multi_agent.placement=shared"
        )
    if decoupled.role is not None and not owners[0].trainable:
        raise ValueError(
            f"multi_agent.decoupled.role is {decoupled.role!r} but the model it would train ({owners[0].name!r}) has "
            f"trainable: false; a frozen model needs no trainer process of its own"
        )
    if not any(s.trainable for s in owners):
        raise ValueError(
            "multi_agent.agents.*.trainable: no agent with its own model is trainable, so nothing would be "
            "trained; set trainable: true on at least one"
        )

    # algorithm, estimator, d_max
    algorithm = get("algorithm", "mgrpo")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"multi_agent.algorithm must be one of {list(ALGORITHMS)}, got {algorithm!r}")
    try:
        mgrpo = MGRPOConfig.from_any(get("mgrpo", None))
    except (TypeError, ValueError) as err:
        raise ValueError(f"multi_agent.mgrpo: {err}") from None
    if decoupled.role is not None and algorithm != "mgrpo":
        raise ValueError(
            f"multi_agent.algorithm is {algorithm!r} but decoupled mode (multi_agent.decoupled.role) computes M-GRPO "
            f"advantages only: the grpo baseline gives sub rows their parent's advantage, which needs one process"
        )
    magrpo, cooperation = MAGRPOConfig(), CooperationConfig()
    if algorithm == "magrpo":
        magrpo, cooperation = parse_cooperation(section)
        _check_magrpo_batches(config, magrpo, cooperation)
        n = _select(config, "actor_rollout_ref.rollout.n")
        if n != 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.n is {n!r} but multi_agent.algorithm is magrpo: the cooperative rollout "
                f"expands the whole joint-action tree of a task in one run (its width is multi_agent.magrpo."
                f"num_generations); set actor_rollout_ref.rollout.n=1"
            )
    d_max = get("d_max", "auto")
    if isinstance(d_max, str):
        if d_max != "auto":
            raise ValueError(f"multi_agent.d_max must be a positive int or 'auto', got {d_max!r}")
    elif not _is_int(d_max) or d_max < 1:
        raise ValueError(f"multi_agent.d_max must be a positive int (>= 1) or 'auto', got {d_max!r}")

    _check_unsupported(config)
    if placement == "shared":
        _check_shared_engines(config, owners)
    # MAGRPO: a model trains on B x G first-turn rows (x G per later turn), verl's rollout.n being 1
    check_override_keys(config, [s for s in ordered if s.owns_model])  # every side's agents: one shared config
    _check_agent_overrides(config, owners, rows_per_prompt=magrpo.num_generations if algorithm == "magrpo" else 1)

    return MultiAgentConfig(
        main=main,
        algorithm=algorithm,
        mgrpo=mgrpo,
        d_max=d_max,
        delegation=delegation,
        agents=ordered,
        decoupled=decoupled,
        magrpo=magrpo,
        cooperation=cooperation,
        placement=placement,
        gpu_memory_gb=None if gpu_memory_gb is None else float(gpu_memory_gb),
    )


# ----------------------------------------------------------------------------------------------------
# parts of parse_multi_agent


def _check_trainer(config: DictConfig) -> None:
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=None, throw_on_missing=False)
    if mode != TRAINER_MODE:
        raise ValueError(
            f"trainer.v1.trainer_mode must be {TRAINER_MODE!r} when multi_agent.enable is true "
            f"(our per-agent trainer), got {mode!r}"
        )
    nnodes = OmegaConf.select(config, "trainer.nnodes", default=1, throw_on_missing=False)
    if nnodes != 1:
        raise ValueError(
            f"trainer.nnodes must be 1 in multi-agent mode, got {nnodes!r}: placing the agents' workers "
            f"over several nodes is not supported yet"
        )
    total = OmegaConf.select(config, "trainer.n_gpus_per_node", default=None, throw_on_missing=False)
    if not _is_int(total) or total < 1:
        raise ValueError(f"trainer.n_gpus_per_node must be a positive int, got {total!r}")


def _read_agent(agents_node: DictConfig, name: str) -> dict:
    path = f"multi_agent.agents.{name}"
    node = agents_node[name]
    if node is None:
        return {}
    if not isinstance(node, DictConfig):
        raise ValueError(f"{path}: expected a mapping of agent settings, got {node!r}")
    _check_keys(node, AGENT_KEYS, path)
    # overrides stay unresolved: their interpolations resolve in the agent's own config
    return {k: _child(node, k, f"{path}.{k}", resolve=(k != "actor_rollout_ref")) for k in node.keys()}


def _build_specs(raw: dict[str, dict], main: str, names: list[str], shared_gpus: Optional[int] = None) -> dict[str, AgentSpec]:
    """``shared_gpus``: ``trainer.n_gpus_per_node`` with ``placement: shared`` (every owner spans all GPUs),
    ``None`` with ``separate``."""
    # first pass: ownership (share_model_with must name an owner)
    share: dict[str, Optional[str]] = {}
    for name in names:
        target = raw[name].get("share_model_with")
        path = f"multi_agent.agents.{name}.share_model_with"
        if target is None:
            share[name] = None
            continue
        if not isinstance(target, str) or target not in names:
            raise ValueError(f"{path}: {target!r} is not an agent; agents are {names}")
        if target == name:
            raise ValueError(f"{path}: an agent cannot share a model with itself ({target!r}); use null")
        if name == main:
            raise ValueError(
                f"{path}: the main agent {main!r} must own its model and cannot share one (got {target!r}); "
                f"let the other agents share the main agent's model instead"
            )
        if raw[target].get("share_model_with") is not None:
            raise ValueError(
                f"{path}: {target!r} itself shares the model of {raw[target]['share_model_with']!r}; "
                f"name the agent that owns the model (no chains)"
            )
        share[name] = target

    # trainable of every agent, then resources and overrides
    trainable: dict[str, bool] = {}
    for name in names:
        value = raw[name].get("trainable")
        value = True if value is None else value
        if not isinstance(value, bool):
            raise ValueError(f"multi_agent.agents.{name}.trainable must be true or false, got {value!r}")
        trainable[name] = value

    specs: dict[str, AgentSpec] = {}
    for name in names:
        path = f"multi_agent.agents.{name}"
        overrides = raw[name].get("actor_rollout_ref")
        overrides = {} if overrides is None else overrides
        if not isinstance(overrides, Mapping):
            raise ValueError(f"{path}.actor_rollout_ref must be a mapping of overrides, got {overrides!r}")
        owner = share[name]
        if owner is not None:
            if overrides:
                # one switch (share_model_with) turns a config into the single-agent baseline, whatever the
                # agent's own model settings were; they cannot apply, so they are dropped, loudly
                logger.warning(
                    "%s.actor_rollout_ref is ignored: %r plays the model of %r, whose settings apply (%r)",
                    path, name, owner, overrides,
                )
                overrides = {}
            if trainable[name] != trainable[owner]:
                raise ValueError(
                    f"{path}.trainable is {trainable[name]!r} but the agent owning its model, {owner!r}, has "
                    f"trainable {trainable[owner]!r}: both play the same weights, which cannot be frozen and "
                    f"trained at once; make them equal"
                )
            gpus = 0  # no workers of its own: the value, if any, is ignored (documented)
        elif shared_gpus is not None:
            gpus = raw[name].get("n_gpus_per_node")
            if gpus is not None and gpus != shared_gpus:
                raise ValueError(
                    f"{path}.n_gpus_per_node is {gpus!r} but multi_agent.placement is 'shared': every agent's workers "
                    f"use all trainer.n_gpus_per_node={shared_gpus} GPUs; set it to null (or "
                    f"multi_agent.placement=separate to give agents GPUs of their own)"
                )
            gpus = shared_gpus
        else:
            gpus = raw[name].get("n_gpus_per_node")
            gpus = 1 if gpus is None else gpus
            if not _is_int(gpus) or gpus < 1:
                raise ValueError(f"{path}.n_gpus_per_node must be a positive int for an agent with its own model, got {gpus!r}")
        node_resource = raw[name].get("node_resource")
        if node_resource is not None:
            if not isinstance(node_resource, str) or not node_resource:
                raise ValueError(f"{path}.node_resource must be null or the name of a custom Ray resource, got {node_resource!r}")
            if owner is not None or shared_gpus is not None:
                why = f"it plays {owner!r}'s model" if owner is not None else "multi_agent.placement is 'shared' (one pool)"
                raise ValueError(f"{path}.node_resource={node_resource!r} cannot apply: {why}; set it to null")
        specs[name] = AgentSpec(
            name=name,
            trainable=trainable[name],
            n_gpus_per_node=gpus,
            share_model_with=owner,
            node_resource=node_resource,
            actor_rollout_ref=dict(overrides),
        )
    return specs


def parse_delegation(raw: Any, main: str, agent_names: list[str]) -> DelegationConfig:
    """Validate ``multi_agent.delegation`` alone (the agent loops read it in their own processes)."""
    path = "multi_agent.delegation"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: expected a mapping, got {raw!r}")
    _check_keys(raw, DELEGATION_KEYS, path)
    defaults = DelegationConfig()
    values = {k: (getattr(defaults, k) if raw.get(k) is None else raw[k]) for k in DELEGATION_KEYS}

    if not _is_int(values["min_calls"]) or values["min_calls"] < 0:
        raise ValueError(f"{path}.min_calls must be an int >= 0, got {values['min_calls']!r}")
    if not _is_int(values["max_calls"]) or values["max_calls"] < 1:
        raise ValueError(f"{path}.max_calls must be an int >= 1, got {values['max_calls']!r}")
    if values["min_calls"] > values["max_calls"]:
        raise ValueError(
            f"{path}.min_calls ({values['min_calls']!r}) must be <= {path}.max_calls ({values['max_calls']!r})"
        )
    for key in ("plan_tokens", "answer_tokens", "sub_response_tokens", "sub_max_turns"):
        if not _is_int(values[key]) or values[key] < 1:
            raise ValueError(f"{path}.{key} must be an int >= 1, got {values[key]!r}")
    timeout = values["timeout_s"]
    if not _positive(timeout) or not math.isfinite(timeout):
        raise ValueError(f"{path}.timeout_s must be a finite number > 0, got {timeout!r}")

    others = [n for n in agent_names if n != main]
    sub_agent = raw.get("sub_agent")
    if sub_agent is None:
        if not others:
            raise ValueError(
                f"{path}.sub_agent is null and there is no agent besides the main agent {main!r} to delegate to; "
                f"add one to multi_agent.agents"
            )
        sub_agent = others[0]
    elif sub_agent == main or sub_agent not in others:
        raise ValueError(f"{path}.sub_agent must name an agent other than the main agent {main!r}; got {sub_agent!r}, "
                         f"sub-agents are {others}")
    scorer = values["scorer"]
    if scorer is not None and (not isinstance(scorer, str) or ":" not in scorer):
        raise ValueError(f"{path}.scorer must be null or 'module:function' / 'file.py:function', got {scorer!r}")
    sub_prompt = values["sub_prompt"]
    if sub_prompt is not None and (not isinstance(sub_prompt, str) or ":" not in sub_prompt):
        raise ValueError(
            f"{path}.sub_prompt must be null or 'module:function' / 'file.py:function', got {sub_prompt!r}"
        )
    values["sub_agent"] = sub_agent
    values["timeout_s"] = float(timeout)
    return DelegationConfig(**values)


def parse_decoupled(raw: Any, ma: MultiAgentConfig) -> DecoupledSettings:
    """Validate ``multi_agent.decoupled`` against the agents of ``ma`` (its own ``decoupled`` unused)."""
    path = "multi_agent.decoupled"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: expected a mapping, got {raw!r}")
    _check_keys(raw, DECOUPLED_KEYS, path)
    defaults = DecoupledSettings()
    values = {k: (getattr(defaults, k) if raw.get(k) is None else raw[k]) for k in DECOUPLED_KEYS}
    role = values["role"]
    if role is not None and role not in DECOUPLED_ROLES:
        raise ValueError(f"{path}.role must be null, 'main' or 'sub', got {role!r}")
    for key in ("wait_timeout_s", "poll_s", "idle_timeout_s", "connect_timeout_s"):
        value = values[key]
        if not _positive(value) or not math.isfinite(value):
            raise ValueError(f"{path}.{key} must be a finite number > 0, got {value!r}")
        values[key] = float(value)
    lag = values["max_policy_lag"]
    if lag is not None and (not _is_int(lag) or lag < 0):
        raise ValueError(f"{path}.max_policy_lag must be null or an int >= 0, got {lag!r}")
    if values["missing_policy"] not in ("skip", "error"):
        hint = (
            " ('zero' keeps an orphan row in the batch with advantage 0, which needs its query's main records to "
            "place it among the aligned rows; the sub-side trainer does not support it, mgrpo_verl.store."
            "sub_advantages does)" if values["missing_policy"] == "zero" else ""
        )
        raise ValueError(f"{path}.missing_policy must be 'skip' or 'error', got {values['missing_policy']!r}{hint}")
    port = values["serve_port"]
    if not _is_int(port) or not 1 <= port <= 65535:
        raise ValueError(f"{path}.serve_port must be a TCP port (1-65535), got {port!r}")
    if not isinstance(values["serve_host"], str) or not values["serve_host"]:
        raise ValueError(f"{path}.serve_host must be a non-empty host name or address, got {values['serve_host']!r}")
    urls = values["sub_urls"]
    if not isinstance(urls, Mapping):
        raise ValueError(f"{path}.sub_urls must map sub-agent names to URLs, got {urls!r}")
    urls = {str(k): v for k, v in urls.items() if v is not None}  # null: not set (the YAML lists the default agent)
    for name, url in urls.items():
        if name not in ma.sub_agents:
            raise ValueError(f"{path}.sub_urls: {name!r} is not a sub-agent; sub-agents are {list(ma.sub_agents)}")
        if not isinstance(url, str) or not re.fullmatch(r"https?://[^/\s]+/?", url):
            raise ValueError(f"{path}.sub_urls.{name} must be a base URL such as http://host:8470, got {url!r}")
    values["sub_urls"] = {k: v.rstrip("/") for k, v in urls.items()}
    if role is None:
        return DecoupledSettings(**values)

    store = values["store"]
    if not isinstance(store, str) or not re.match(r"(sqlite|redis|rediss)://", store):
        raise ValueError(
            f"{path}.store must be the store's URL (sqlite:///abs/path.db or redis://host:port/db) when role is "
            f"{role!r}, got {store!r}"
        )
    if role == "main":
        remote = [a for a in ma.sub_agents if ma.owner_of(a) != ma.owner_of(ma.main)]
        missing = [a for a in remote if a not in values["sub_urls"]]
        if missing:
            raise ValueError(
                f"{path}.sub_urls has no URL for sub-agent(s) {missing}: on the main side every sub-agent with a "
                f"model of its own is served by a sub side (set {path}.sub_urls.<agent>=http://host:port)"
            )
        if not remote:
            raise ValueError(f"{path}.role is 'main' but every agent plays the main agent's model: nothing to decouple")
    else:
        train = values["train_agent"]
        if train is None:
            train = ma.owner_of(ma.delegation.sub_agent)
        owners = [a.name for a in ma.model_owners]
        if train not in owners or train == ma.owner_of(ma.main):
            raise ValueError(
                f"{path}.train_agent must name a sub-agent with a model of its own, got {train!r}; candidates are "
                f"{[o for o in owners if o != ma.owner_of(ma.main)]}"
            )
        values["train_agent"] = train
    return DecoupledSettings(**values)


def _check_magrpo_batches(config: DictConfig, magrpo: MAGRPOConfig, coop: CooperationConfig) -> None:
    """verl splits a model's rows into mini- and micro-batches and asserts they divide evenly. A model gets
    B x G first-turn rows, plus G rows per node expanded at a later turn (their number varies with early
    termination), so every such size must divide B x G (one turn) or G (several turns)."""
    g = magrpo.num_generations
    batch = _select(config, "data.train_batch_size")
    unit = g if coop.num_turns > 1 else (batch * g if _is_int(batch) else None)
    if unit is None:
        return
    for key in ("actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        value = _select(config, key)
        if _is_int(value) and value > 0 and unit % value:
            what = "multi_agent.magrpo.num_generations" if coop.num_turns > 1 else "data.train_batch_size x num_generations"
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


def _lora_path(config: DictConfig) -> Optional[tuple[str, Any]]:
    """The LoRA key of ``config.actor_rollout_ref.model`` that enables LoRA, if any, and its value."""
    for key in ("lora_rank", "lora.rank"):
        value = OmegaConf.select(config, f"actor_rollout_ref.model.{key}", default=None, throw_on_missing=False)
        if _positive(value):
            return f"actor_rollout_ref.model.{key}", value
    return None


def _check_unsupported(config: DictConfig) -> None:
    critic = _select(config, "critic.enable")
    if critic is True:
        raise ValueError("critic.enable is true: multi-agent mode has no critic; set critic.enable: null or false")
    estimator = _select(config, "algorithm.adv_estimator")
    if estimator is not None and estimator not in SUPPORTED_ADV_ESTIMATORS:
        raise ValueError(
            f"algorithm.adv_estimator must be one of {list(SUPPORTED_ADV_ESTIMATORS)} in multi-agent mode, got "
            f"{estimator!r}: our trainer computes advantages itself (multi_agent.algorithm), but verl would "
            f"start a critic for gae, which multi-agent mode does not support"
        )
    if _select(config, "algorithm.use_kl_in_reward") is True:
        raise ValueError(
            "algorithm.use_kl_in_reward is true: a KL penalty in the reward is not supported in multi-agent mode; "
            "use actor_rollout_ref.actor.use_kl_loss instead"
        )
    correction = _select(config, "algorithm.rollout_correction")
    if _rollout_correction_active(correction):
        raise ValueError(
            f"algorithm.rollout_correction is set ({correction!r}): rollout correction (importance sampling, "
            f"rejection sampling, bypass mode) is not supported in multi-agent mode; set it to null or leave "
            f"rollout_is, rollout_rs null and bypass_mode false"
        )
    for key in ("reward.reward_model.enable", "reward_model.enable"):
        if _select(config, key) is True:
            raise ValueError(
                f"{key} is true: a reward model is not supported in multi-agent mode; use a reward function"
            )
    lora = _lora_path(config)
    if lora is not None:
        raise ValueError(f"{lora[0]} is {lora[1]!r}: LoRA is not supported in multi-agent mode; set it to 0")
    if _select(config, "distillation.enabled") is True:
        raise ValueError("distillation.enabled is true: distillation is not supported in multi-agent mode")


def _check_shared_engines(config: DictConfig, owners: list[AgentSpec]) -> None:
    """``placement: shared``: every owner's rollout engine is awake during a rollout, on the same GPUs, so the
    fractions of a GPU that vLLM / SGLang engines reserve must add up to less than 1 (the actors need room too)."""
    fractions = {}
    for spec in owners:
        full = agent_full_config(config, spec) if spec.actor_rollout_ref else config
        if _select(full, "actor_rollout_ref.rollout.name") not in ENGINES_WITH_MEMORY_FRACTION:
            continue
        value = _select(full, "actor_rollout_ref.rollout.gpu_memory_utilization")
        if not _positive(value) or value >= 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.gpu_memory_utilization of agent {spec.name!r} must be a fraction in (0, 1), "
                f"got {value!r}"
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


def _check_agent_overrides(config: DictConfig, owners: list[AgentSpec], rows_per_prompt: int = 1) -> None:
    top_n = _select(config, "actor_rollout_ref.rollout.n")
    batch = _select(config, "data.train_batch_size")
    batch = batch * rows_per_prompt if _is_int(batch) else batch
    for spec in owners:
        path = f"multi_agent.agents.{spec.name}.actor_rollout_ref"
        full = agent_full_config(config, spec) if spec.actor_rollout_ref else config
        mini = _select(full, "actor_rollout_ref.actor.ppo_mini_batch_size")
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
        lora = _lora_path(full)
        if lora is not None:
            raise ValueError(
                f"{path}.{lora[0].removeprefix('actor_rollout_ref.')} makes {lora[0]} {lora[1]!r} for agent "
                f"{spec.name!r}: LoRA is not supported in multi-agent mode"
            )
        n = _select(full, "actor_rollout_ref.rollout.n")
        if n != top_n:
            raise ValueError(
                f"{path}.rollout.n makes actor_rollout_ref.rollout.n {n!r} for agent {spec.name!r} but the top-level "
                f"one is {top_n!r}: every agent must use the same n, because sub-agent rows are grouped with their "
                f"parents' rollouts"
            )


# ----------------------------------------------------------------------------------------------------
# fail-fast checks of the rest of the run's config, called before Ray starts (mgrpo_verl.main_ppo.run)

GROUP_RELATIVE_ESTIMATORS = ("grpo", "grpo_vectorized", "mgrpo")
"""Top-level ``algorithm.adv_estimator`` values whose baseline is the mean score of a prompt's n responses."""


def check_rollout_n(config: DictConfig) -> None:
    """``actor_rollout_ref.rollout.n`` is an int >= 1 (verl takes 0 or a negative n and fails minutes later in
    the replay buffer). n = 1 with a group-relative estimator is allowed with a warning, not refused: verl's
    GRPO (and our M-GRPO) give a group of one mean 0 and std 1, so the advantage is the raw score (no
    baseline); MAGRPO requires n = 1, and M-GRPO's sub-agent groups can still have several members."""
    n = _select(config, "actor_rollout_ref.rollout.n")
    if not _is_int(n) or n < 1:
        raise ValueError(f"actor_rollout_ref.rollout.n must be an int >= 1 (responses per prompt), got {n!r}")
    if n > 1:
        return
    if multi_agent_enabled(config):
        algorithm = _select(config, "multi_agent.algorithm") or "mgrpo"
        relative = algorithm in ("mgrpo", "grpo")
        what = f"multi_agent.algorithm={algorithm}"
    else:
        estimator = _select(config, "algorithm.adv_estimator")
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


def _check_model_location(key: str, value: Any, required: bool) -> None:
    """A model / tokenizer location verl can open: an existing local path, an ``hdfs://`` path or a hub id. verl
    finds a bad one only when its workers load the model; we never contact the hub here."""
    if value is None and not required:
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


def check_model_paths(config: DictConfig, ma: Optional[MultiAgentConfig] = None) -> None:
    """``actor_rollout_ref.model.path`` / ``tokenizer_path`` at the top level and, for every model owner of ``ma``,
    the ones its ``multi_agent.agents.<name>.actor_rollout_ref`` overrides set. Reads resolved values (call it
    after ``OmegaConf.resolve``, which builds the built-in models)."""
    for leaf, required in (("path", True), ("tokenizer_path", False)):
        key = f"actor_rollout_ref.model.{leaf}"
        _check_model_location(key, _select(config, key), required)
    for spec in (ma.model_owners if ma is not None else ()):
        model = spec.actor_rollout_ref.get("model")
        if not isinstance(model, Mapping):
            continue
        for leaf in ("path", "tokenizer_path"):
            if leaf in model:
                key = f"multi_agent.agents.{spec.name}.actor_rollout_ref.model.{leaf}"
                _check_model_location(key, _select(config, key), leaf == "path")


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
    sources = [(f"multi_agent.agents.{s.name}.actor_rollout_ref", s.actor_rollout_ref) for s in owners if s.actor_rollout_ref]
    for path, override in sources:
        bad = _unknown_keys(override, None, schema, path)
        if bad:
            key, allowed = bad[0]
            leaf = key.rsplit(".", 1)[1]
            close = difflib.get_close_matches(leaf, [a for a in allowed if a != "_target_"], n=1)
            value = OmegaConf.select(config, key, default=None, throw_on_missing=False, throw_on_resolution_failure=False)
            raise ValueError(
                f"{key}={value!r}: unknown key, verl's config has no {leaf!r} there"
                + (f" (did you mean {close[0]!r}?)" if close else f"; its keys are {sorted(allowed)}")
            )
