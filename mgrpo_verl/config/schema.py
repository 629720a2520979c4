"""The ``multi_agent:`` section: one typed schema, each field documented once, here.

Dataclasses in verl's :class:`~verl.base_config.BaseConfig` style, built from the YAML with verl's own
:func:`~verl.utils.config.omega_conf_to_dataclass` (:func:`load_multi_agent`): OmegaConf checks types and
refuses unknown keys, each class's ``__post_init__`` checks its own values and the rules *within* the
section (agent names, ``share_model_with``, the delegation target, the decoupled roles and URLs).
Rules that need the rest of the trainer config (GPU budget, ``rollout.n``, mini-batches, verl features
we do not support) are one function, :func:`mgrpo_verl.config.rules.check_multi_agent`.

Differs from verl's own sections: the section lives under our own key (verl's typed sections refuse
unknown keys), and a ``null`` value anywhere in it means "the default" (a YAML lists every key so that
the command line can override it; ``null`` lets a preset reset one). The agent loops, the trainers and the
store read these same objects; the YAML restates every default (tested equal,
tests/trainer/test_config_files.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from verl.base_config import BaseConfig
from verl.utils.config import omega_conf_to_dataclass

from mgrpo_verl.algorithms.config import MAGRPOConfig, MGRPOConfig

ALGORITHMS = ("mgrpo", "grpo", "magrpo")
PLACEMENTS = ("separate", "shared")
DECOUPLED_ROLES = ("main", "sub")
MISSING_POLICIES = ("skip", "error")
AGENT_NAME_RE = re.compile(r"[A-Za-z0-9_\-]+")

_A = "multi_agent.agents"

TRAINER_MODES: dict[Optional[str], str] = {
    None: "multi_agent",  # one process trains every agent (M-GRPO or MAGRPO): MultiAgentTrainer (trainer/per_agent.py)
    "main": "mgrpo_decoupled_main",  # DecoupledMainTrainer (trainer/decoupled.py)
    "sub": "mgrpo_decoupled_sub",  # DecoupledSubTrainer (trainer/decoupled.py)
}
"""``multi_agent.decoupled.role`` -> the ``trainer.v1.trainer_mode`` (verl's trainer registry) that runs it."""


def trainer_mode(role: Optional[str], configured: str) -> str:
    """The trainer mode of a multi-agent run whose ``multi_agent.decoupled.role`` is ``role`` and whose
    ``trainer.v1.trainer_mode`` is ``configured``: ``TRAINER_MODES[role]``. Users set only the role, so
    ``configured`` is ``"multi_agent"`` (the YAML's) or already that mode; any other value contradicts the role
    (or is one of verl's single-model modes) and raises ``ValueError``."""
    if role not in TRAINER_MODES:
        raise ValueError(f"multi_agent.decoupled.role must be null, 'main' or 'sub', got {role!r}")
    if configured == "mgrpo":
        raise ValueError("trainer.v1.trainer_mode=mgrpo was renamed multi_agent (it runs MAGRPO as well as M-GRPO): "
                         "set trainer.v1.trainer_mode=multi_agent, or leave it at the YAML's value")
    expected = TRAINER_MODES[role]
    if configured not in (TRAINER_MODES[None], expected):
        raise ValueError(
            f"trainer.v1.trainer_mode={configured!r} contradicts multi_agent.decoupled.role={role!r}, which runs "
            f"the trainer mode {expected!r}: set only the role and leave trainer.v1.trainer_mode at "
            f"{TRAINER_MODES[None]!r} (the role picks the mode)"
        )
    return expected



logger = logging.getLogger(__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_at_least(path: str, value: Any, low: int) -> None:
    if not _is_int(value) or value < low:
        raise ValueError(f"{path} must be an int >= {low}, got {value!r}")


def _positive_finite(path: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{path} must be a finite number > 0, got {value!r}")


def _callable_ref(path: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or ":" not in value):
        raise ValueError(f"{path} must be null or 'module:function' / 'file.py:function', got {value!r}")


def _set(obj: Any, name: str, value: Any) -> None:
    """Normalise a field in ``__post_init__`` (BaseConfig freezes fields once set)."""
    object.__setattr__(obj, name, value)


@dataclass
class AgentConfig(BaseConfig):
    """One entry of ``multi_agent.agents``, keyed by the agent's name. Names match ``[A-Za-z0-9_-]+``: they
    become metric prefixes (``<agent>/actor/...``) and checkpoint folder names."""

    trainable: bool = True
    """Whether this agent's model is updated. A frozen agent still generates, so a fixed sub-agent can
    serve a trained main agent (the frozen baseline)."""

    n_gpus_per_node: Optional[int] = None
    """This agent's share of ``trainer.n_gpus_per_node`` (logical GPUs on CPU) for its own actor + ref +
    rollout workers. Null: 1 with ``placement: separate``, all GPUs with ``shared``; 0 (ignored) for an
    agent that shares another's model. The owners' shares add up to at most ``trainer.n_gpus_per_node``."""

    share_model_with: Optional[str] = None
    """Another agent whose model plays this one (the single-agent baseline: one model, every role). That
    agent owns its model (no chains); the main agent cannot share; ``trainable`` must equal the owner's;
    this agent's ``actor_rollout_ref`` is ignored, with a warning."""

    node_resource: Optional[str] = None
    """A custom Ray resource (``ray start --resources='{"<name>": 1}'`` on one node) this agent's pool must
    land on (docs/multinode.md); only for an owner of a model with ``placement: separate``. Null: Ray
    chooses."""

    actor_rollout_ref: Dict[str, Any] = field(default_factory=dict)
    """Overrides merged onto the top-level ``actor_rollout_ref`` for this agent only (model path, lr,
    ``rollout.response_length``, ...), kept unresolved so that interpolations resolve in the agent's own
    config. Keys verl's configs lack are refused naming the full key; ``rollout.n`` cannot differ from the
    top-level one (sub-agent rows are grouped with their parents' rollouts)."""

    name: str = ""
    """Set from the entry's key by :class:`MultiAgentConfig`; leave it out of the YAML."""

    @property
    def owns_model(self) -> bool:
        """Whether the agent has a model (and workers) of its own."""
        return self.share_model_with is None

    def key_of(self, leaf: str) -> str:
        """The key that sets ``actor_rollout_ref.<leaf>`` for this agent: its override
        ``multi_agent.agents.<name>.actor_rollout_ref.<leaf>`` when it has one, else the top-level key. Errors
        name it."""
        node: Any = self.actor_rollout_ref
        for part in leaf.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        where = f"{_A}.{self.name}.actor_rollout_ref" if node is not None else "actor_rollout_ref"
        return f"{where}.{leaf}"


@dataclass
class DelegationConfig(BaseConfig):
    """``multi_agent.delegation``: how the main agent delegates to a sub-agent in the built-in tasks, by the
    forced relay loop (``mgrpo_relay``) or by a tool call (``mgrpo_delegate``, ``ask_<sub>(task)``)."""

    sub_agent: Optional[str] = None
    """The agent the relay loop calls. Null: the first agent that is not the main one (after loading it is
    always a sub-agent's name)."""

    min_calls: int = 0
    """Fewest sub-agent calls per main trajectory in the relay loop (>= 0); 0 lets the main agent answer
    alone (a main row without children)."""

    max_calls: int = 3
    """Most sub-agent calls per main trajectory (>= 1, >= min_calls): bounds rollout time and the sub rows
    per main row. The tool loop refuses further calls with an error the main agent sees."""

    plan_tokens: int = 8
    """New tokens of the main agent's planning turn in the relay loop (>= 1)."""

    answer_tokens: int = 8
    """New tokens of the main agent's answer (>= 1); the tool loop keeps this much room after tool
    responses."""

    sub_response_tokens: int = 8
    """New tokens of one sub-agent generation (>= 1), also capped by the sub-agent's ``response_length``. A
    tool call takes 20-30 tokens of the tiny tokenizer: raise it for the ``relay_tools`` task."""

    timeout_s: float = 120.0
    """Seconds one sub-agent call may take before it counts as failed (> 0): a stuck replica cannot hang
    the rollout."""

    scorer: Optional[str] = None
    """How rows are scored: null for the task's own scorer, or ``"module:function"`` /
    ``"file.py:function"`` called as ``f(role, text, ground_truth) -> float`` with role ``main`` or ``sub``
    (``mgrpo_verl.envs.relay.load_scorer``). A scorer with a parameter named ``agent`` is also passed
    ``agent=<name>``: the sub-agent that wrote a report, the main agent for the final answer, so each
    sub-agent can be scored as itself (``relay.accepts_agent``). A relative file is resolved against the launch
    directory."""

    sub_max_turns: int = 2
    """Tool loop: assistant turns of one sub-agent call (>= 1), its own tool loop; its last turn's text is
    the report. The main agent's turn limits are verl's ``rollout.multi_turn.max_assistant_turns``."""

    sub_prompt: Optional[str] = None
    """How a sub-agent call is prompted: null for the task's own prompt, or ``"module:function"`` /
    ``"file.py:function"`` called as ``f(agent, task) -> chat messages`` (``relay.load_sub_prompt``);
    ``task`` is the tool call's argument, or (relay loop) the row's ``extra_info.question`` and the plan."""

    def __post_init__(self) -> None:
        p = "multi_agent.delegation"
        _int_at_least(f"{p}.min_calls", self.min_calls, 0)
        _int_at_least(f"{p}.max_calls", self.max_calls, 1)
        if self.min_calls > self.max_calls:
            raise ValueError(f"{p}.min_calls ({self.min_calls!r}) must be <= {p}.max_calls ({self.max_calls!r})")
        for key in ("plan_tokens", "answer_tokens", "sub_response_tokens", "sub_max_turns"):
            _int_at_least(f"{p}.{key}", getattr(self, key), 1)
        _positive_finite(f"{p}.timeout_s", self.timeout_s)
        _set(self, "timeout_s", float(self.timeout_s))
        _callable_ref(f"{p}.scorer", self.scorer)
        _callable_ref(f"{p}.sub_prompt", self.sub_prompt)


@dataclass
class CooperationConfig(BaseConfig):
    """``multi_agent.cooperation``: MAGRPO's cooperative rollout (agent loop ``magrpo_coop``). The tree's
    width G and the joint mode are ``multi_agent.magrpo.num_generations`` / ``joint_mode``."""

    num_turns: int = 1
    """Turns of the joint-action tree (>= 1). Each turn after the first shows every agent the previous
    turn's completions and the task's feedback (test results, a critique): the external transition."""

    termination_threshold: Optional[float] = None
    """A node whose joint reward reaches this is not expanded further (early termination); null: never."""

    response_tokens: int = 64
    """New tokens of one agent's completion (>= 1), also capped by its rollout ``response_length``."""

    timeout_s: Optional[float] = None
    """Seconds one generation may take (> 0), null: no limit, as verl's own agent loops. A failed or timed-out
    generation is the empty completion, counted (``reward_extra_info["generation/errors"]``). The time includes the
    request's wait in its server's queue, and validation sends every held-out task at once (the writing task: 32
    articles x 2 agents x G = 256 requests): with SmolLM2 on 2 CPU cores a 120 s limit failed 241 of them
    (2026-12-07), so a limit must leave room for the largest batch."""

    def __post_init__(self) -> None:
        p = "multi_agent.cooperation"
        _int_at_least(f"{p}.num_turns", self.num_turns, 1)
        _int_at_least(f"{p}.response_tokens", self.response_tokens, 1)
        if self.termination_threshold is not None and not math.isfinite(self.termination_threshold):
            raise ValueError(f"{p}.termination_threshold must be null or a finite number, "
                             f"got {self.termination_threshold!r}")
        if self.timeout_s is not None:
            _positive_finite(f"{p}.timeout_s", self.timeout_s)
            _set(self, "timeout_s", float(self.timeout_s))


@dataclass
class DecoupledConfig(BaseConfig):
    """``multi_agent.decoupled``: decoupled M-GRPO, one trainer process per side (docs/decoupled.md). Both
    sides run ``python -m mgrpo_verl.main_ppo`` with the same section and their own ``role``; they exchange
    delegation calls (HTTP, text only) and one record per main trajectory (the store), never tensors."""

    role: Optional[str] = None
    """Null: one process trains every agent (the synchronous mode). ``main``: this process trains the main
    agent's model and calls remote sub-agents. ``sub``: it trains ``train_agent``'s model and serves it."""

    train_agent: Optional[str] = None
    """Sub side: the model owner it trains and serves (null: the owner of ``delegation.sub_agent``)."""

    store: Optional[str] = None
    """URL of the statistics store both sides open: ``sqlite:///abs/path.db`` on a disk both see, or
    ``redis://host:port/db``; required with a role."""

    sub_urls: Dict[str, Optional[str]] = field(default_factory=dict)
    """Main side: sub-agent name -> base URL of the sub side serving it (``http://host:port``); every
    sub-agent with a model of its own needs one. Null values are unset."""

    serve_host: str = "127.0.0.1"
    """Sub side: the address its delegation service listens on (``0.0.0.0`` for other machines)."""

    serve_port: int = 8470
    """Sub side: its TCP port."""

    secret_file: Optional[str] = None
    """File holding the secret both sides share (at least 16 characters; the sub side's service refuses callers
    without it); null: the environment variable ``MGRPO_DECOUPLED_SECRET``. One of the two is required with a role."""

    wait_timeout_s: float = 60.0
    """Sub side: how long a sub row may wait for its parent's main score before ``missing_policy``
    applies to it (bounded, so a dead main side stalls nothing for long)."""

    poll_s: float = 0.05
    """Sub side: interval of the store polls (the hand-off latency's floor)."""

    max_policy_lag: Optional[int] = None
    """Sub side: a parent made by main weights more than this many versions older than the newest parent
    of the step counts as missing (null: any)."""

    missing_policy: str = "skip"
    """Sub side: rows whose parent is missing or stale are ``skip`` ped (left out of the update, counted in
    ``decoupled/missing_parent_rows`` / ``stale_parent_rows``) or raise (``error``)."""

    idle_timeout_s: float = 900.0
    """Sub side: a step that receives no delegation call for this long raises (the main side is down or
    points elsewhere) instead of waiting for ever."""

    connect_timeout_s: float = 900.0
    """Main side: how long it waits at start for every sub side to answer ``/health`` (the sides may start
    in any order)."""

    def __post_init__(self) -> None:
        p = "multi_agent.decoupled"
        if self.role is not None and self.role not in DECOUPLED_ROLES:
            raise ValueError(f"{p}.role must be null, 'main' or 'sub', got {self.role!r}")
        for key in ("wait_timeout_s", "poll_s", "idle_timeout_s", "connect_timeout_s"):
            _positive_finite(f"{p}.{key}", getattr(self, key))
            _set(self, key, float(getattr(self, key)))
        if self.max_policy_lag is not None and (not _is_int(self.max_policy_lag) or self.max_policy_lag < 0):
            raise ValueError(f"{p}.max_policy_lag must be null or an int >= 0, got {self.max_policy_lag!r}")
        if self.missing_policy not in MISSING_POLICIES:
            raise ValueError(f"{p}.missing_policy must be 'skip' or 'error', got {self.missing_policy!r}")
        if not _is_int(self.serve_port) or not 1 <= self.serve_port <= 65535:
            raise ValueError(f"{p}.serve_port must be a TCP port (1-65535), got {self.serve_port!r}")
        if not self.serve_host:
            raise ValueError(f"{p}.serve_host must be a non-empty host name or address, got {self.serve_host!r}")
        urls = {str(k): v for k, v in self.sub_urls.items() if v is not None}
        for name, url in urls.items():
            if not re.fullmatch(r"https?://[^/\s]+/?", url):
                raise ValueError(f"{p}.sub_urls.{name} must be a base URL such as http://host:8470, got {url!r}")
        _set(self, "sub_urls", {k: v.rstrip("/") for k, v in urls.items()})
        if self.role is not None and (not isinstance(self.store, str)
                                      or not re.match(r"(sqlite|redis|rediss)://", self.store)):
            raise ValueError(
                f"{p}.store must be the store's URL (sqlite:///abs/path.db or redis://host:port/db) when role is "
                f"{self.role!r}, got {self.store!r}"
            )


@dataclass
class MultiAgentConfig(BaseConfig):
    """The ``multi_agent`` section: several agents, each its own model, trained by one trainer."""

    enable: bool = False
    """True runs our per-agent trainer (``trainer.v1.trainer_mode: multi_agent``) instead of verl's single-model
    trainer."""

    main: str = "main"
    """The main agent (planner): its rows are the roots of the hierarchy (``parent_traj_id == ""``); it is
    placed first and its replicas get offset 0."""

    algorithm: str = "mgrpo"
    """``mgrpo``: hierarchical M-GRPO advantages (sub-agents credited with their own score and their
    parent's); ``grpo``: single-agent GRPO on the main outcome, every row of a rollout gets its rollout's
    advantage; ``magrpo``: cooperative MAGRPO (``magrpo`` and ``cooperation`` below)."""

    mgrpo: MGRPOConfig = field(default_factory=MGRPOConfig)
    """M-GRPO estimator options (:class:`~mgrpo_verl.algorithms.config.MGRPOConfig` documents each);
    checked with every algorithm, so that switching algorithms never uncovers a typo late."""

    d_max: Any = "auto"
    """D, the sub-agent rows per main rollout after alignment: an int >= 1, or ``auto`` (90th percentile
    of the calls per rollout in the batch, at least 1). Fewer calls are duplicated, more are dropped and
    counted (:func:`mgrpo_verl.algorithms.alignment.resolve_d_max`)."""

    delegation: DelegationConfig = field(default_factory=DelegationConfig)
    """How the main agent delegates in the built-in tasks."""

    decoupled: DecoupledConfig = field(default_factory=DecoupledConfig)
    """Decoupled M-GRPO (null ``role``: the synchronous mode)."""

    magrpo: MAGRPOConfig = field(default_factory=MAGRPOConfig)
    """MAGRPO estimator options (``algorithm: magrpo``, which requires ``num_generations``)."""

    cooperation: CooperationConfig = field(default_factory=CooperationConfig)
    """The cooperative rollout (``algorithm: magrpo``)."""

    placement: str = "separate"
    """Where the model owners' workers go. ``separate``: a resource pool per owner, ``n_gpus_per_node`` GPUs
    each. ``shared``: one pool of all ``trainer.n_gpus_per_node`` GPUs spanned by every owner's actor /
    ref / rollout workers (two agents on one GPU); every rollout engine is awake during a rollout, so the
    agents' ``rollout.gpu_memory_utilization`` must add up to < 1; the trainer sleeps the engines before
    updates and updates one model at a time (docs/multi_agent.md)."""

    gpu_memory_gb: Optional[float] = None
    """GB of one GPU for the pre-flight memory estimate (:mod:`mgrpo_verl.trainer.memory`), which refuses a
    layout that cannot fit; null: read it from ``nvidia-smi``, skipped (a log line) without a GPU."""

    concurrent_updates: Any = "auto"
    """``auto``: models on pools of their own run their old-log-prob / reference / update at the same time,
    one driver thread each; models sharing a pool update in turn. ``false``: always in turn."""

    trajectory_seeds: Any = "auto"
    """``true``: every sampled request of our agent loops carries a seed derived from its trajectory: the dataset
    row (``extra_info.split``, ``index``, prompt), its place in its group (``session_id``), the step,
    ``rollout.seed`` and the call's place in the trajectory (``agent_loops.common.SeedStream``); a run's samples
    are then the same on every run of the same seeds, whatever order rollouts finish in. ``false``: the rollout
    server's own seeding (vLLM: one generator in scheduling order). ``auto``: true with our HF rollout
    (``rollout.name: hf``, where it costs nothing), false with vLLM / SGLang, whose GPU samplers handle seeded
    requests one by one (vLLM 0.24 also leaves FlashInfer's sampler for them)."""

    agents: Dict[str, AgentConfig] = field(default_factory=dict)
    """The agents, keyed by name; after loading the main agent comes first, then the others in order."""

    def __post_init__(self) -> None:
        if not self.main:
            raise ValueError(f"multi_agent.main must be a non-empty agent name, got {self.main!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"multi_agent.algorithm must be one of {list(ALGORITHMS)}, got {self.algorithm!r}")
        if self.d_max != "auto" and (not _is_int(self.d_max) or self.d_max < 1):
            raise ValueError(f"multi_agent.d_max must be a positive int (>= 1) or 'auto', got {self.d_max!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"multi_agent.placement must be one of {list(PLACEMENTS)}, got {self.placement!r}")
        if self.gpu_memory_gb is not None:
            if not math.isfinite(self.gpu_memory_gb) or self.gpu_memory_gb <= 0:
                raise ValueError(f"multi_agent.gpu_memory_gb must be null (read the GPU's memory from nvidia-smi) or "
                                 f"a number of GB > 0, got {self.gpu_memory_gb!r}")
        if not (self.trajectory_seeds == "auto" or isinstance(self.trajectory_seeds, bool)):
            raise ValueError(
                f"multi_agent.trajectory_seeds must be 'auto', true or false, got {self.trajectory_seeds!r}")
        if self.concurrent_updates not in ("auto", False):
            raise ValueError(f"multi_agent.concurrent_updates must be 'auto' or false, got {self.concurrent_updates!r}")
        if self.algorithm == "magrpo":
            self.tree_width()
        if not self.agents:
            return  # a section read by a loop without agents (tests, tools); the trainer requires them
        self._check_agents()
        self._resolve_delegation()
        self._resolve_decoupled()

    # ------------------------------------------------------------------ rules within the section

    def _check_agents(self) -> None:
        names = list(self.agents)
        for name in names:
            if not isinstance(name, str) or not AGENT_NAME_RE.fullmatch(name):
                raise ValueError(f"{_A}: agent name {name!r} is invalid; names must be non-empty strings matching "
                                 f"[A-Za-z0-9_-]+ (they become metric prefixes and folder names)")
        if self.main not in names:
            raise ValueError(f"multi_agent.main: the main agent {self.main!r} is not among {_A} {names}")
        for name, spec in self.agents.items():
            path = f"{_A}.{name}"
            if spec.name not in ("", name):
                raise ValueError(f"{path}.name is set by the entry's key; leave it out (got {spec.name!r})")
            target = spec.share_model_with
            if target is not None:
                where = f"{path}.share_model_with"
                if target not in names:
                    raise ValueError(f"{where}: {target!r} is not an agent; agents are {names}")
                if target == name:
                    raise ValueError(f"{where}: an agent cannot share a model with itself ({target!r}); use null")
                if name == self.main:
                    raise ValueError(f"{where}: the main agent {self.main!r} must own its model and cannot share one "
                                     f"(got {target!r}); let the other agents share the main agent's model instead")
                if self.agents[target].share_model_with is not None:
                    raise ValueError(f"{where}: {target!r} itself shares the model of "
                                     f"{self.agents[target].share_model_with!r}; name the agent that owns the model "
                                     f"(no chains)")
                if spec.actor_rollout_ref:
                    # one switch (share_model_with) turns a config into the single-agent baseline, whatever the
                    # agent's own model settings were; they cannot apply, so they are dropped, loudly
                    logger.warning("%s.actor_rollout_ref is ignored: %r plays the model of %r, whose settings "
                                   "apply (%r)", path, name, target, spec.actor_rollout_ref)
                    self.agents[name] = spec = dataclasses.replace(spec, actor_rollout_ref={})
                if spec.trainable != self.agents[target].trainable:
                    raise ValueError(f"{path}.trainable is {spec.trainable!r} but the agent owning its model, "
                                     f"{target!r}, has "
                                     f"trainable {self.agents[target].trainable!r}: both play the same weights, which "
                                     f"cannot be frozen and trained at once; make them equal")
            elif spec.n_gpus_per_node is not None and spec.n_gpus_per_node < 1:
                raise ValueError(f"{path}.n_gpus_per_node must be a positive int for an agent with its own model, "
                                 f"got {spec.n_gpus_per_node!r}")
            if spec.node_resource is not None:
                if not spec.node_resource:
                    raise ValueError(f"{path}.node_resource must be null or the name of a custom Ray resource, "
                                     f"got {spec.node_resource!r}")
                if target is not None or self.placement == "shared":
                    why = (f"it plays {target!r}'s model" if target is not None
                           else "multi_agent.placement is 'shared' (one pool)")
                    raise ValueError(f"{path}.node_resource={spec.node_resource!r} cannot apply: {why}; set it to null")
        if not any(s.trainable for s in self.agents.values() if s.owns_model):
            raise ValueError(f"{_A}.*.trainable: no agent with its own model is trainable, so nothing would be "
                             f"trained; set trainable: true on at least one")
        ordered = [self.main] + [n for n in names if n != self.main]
        _set(self, "agents", {n: dataclasses.replace(self.agents[n], name=n, n_gpus_per_node=self._gpus(self.agents[n]))
                              for n in ordered})

    def _gpus(self, spec: AgentConfig) -> Optional[int]:
        if not spec.owns_model:
            return 0  # no workers of its own: the value, if any, is ignored (documented)
        if self.placement == "separate" and spec.n_gpus_per_node is None:
            return 1
        return spec.n_gpus_per_node  # shared: filled with trainer.n_gpus_per_node by the trainer-config rules

    def _resolve_delegation(self) -> None:
        p = "multi_agent.delegation.sub_agent"
        others = list(self.sub_agents)
        target = self.delegation.sub_agent
        if target is None:
            if not others:
                raise ValueError(f"{p} is null and there is no agent besides the main agent {self.main!r} to "
                                 f"delegate to; add one to {_A}")
            _set(self, "delegation", dataclasses.replace(self.delegation, sub_agent=others[0]))
        elif target not in others:
            raise ValueError(f"{p} must name an agent other than the main agent {self.main!r}; got {target!r}, "
                             f"sub-agents are {others}")

    def _resolve_decoupled(self) -> None:
        p, d = "multi_agent.decoupled", self.decoupled
        for name in d.sub_urls:
            if name not in self.sub_agents:
                raise ValueError(f"{p}.sub_urls: {name!r} is not a sub-agent; sub-agents are {list(self.sub_agents)}")
        if d.role is None:
            return
        if self.algorithm != "mgrpo":
            raise ValueError(f"multi_agent.algorithm is {self.algorithm!r} but decoupled mode ({p}.role) computes "
                             f"M-GRPO advantages only: the grpo baseline gives sub rows their parent's advantage, "
                             f"which needs one process")
        main_owner = self.owner_of(self.main)
        if d.role == "main":
            remote = [a for a in self.sub_agents if self.owner_of(a) != main_owner]
            missing = [a for a in remote if a not in d.sub_urls]
            if not remote:
                raise ValueError(f"{p}.role is 'main' but every agent plays the main agent's model: "
                                 "nothing to decouple")
            if missing:
                raise ValueError(f"{p}.sub_urls has no URL for sub-agent(s) {missing}: on the main side every "
                                 f"sub-agent with a model of its own is served by a sub side "
                                 f"(set {p}.sub_urls.<agent>=http://host:port)")
        else:
            train = d.train_agent if d.train_agent is not None else self.owner_of(self.delegation.sub_agent)
            owners = [a.name for a in self.model_owners]
            if train not in owners or train == main_owner:
                raise ValueError(f"{p}.train_agent must name a sub-agent with a model of its own, got {train!r}; "
                                 f"candidates are {[o for o in owners if o != main_owner]}")
            _set(self, "decoupled", dataclasses.replace(d, train_agent=train))
        if not self.local_owners[0].trainable:
            raise ValueError(f"{p}.role is {d.role!r} but the model it would train ({self.local_owners[0].name!r}) has "
                             f"trainable: false; a frozen model needs no trainer process of its own")

    # ------------------------------------------------------------------ views

    def tree_width(self) -> int:
        """G, ``magrpo.num_generations``, which the cooperative rollout requires."""
        if self.magrpo.num_generations is None:
            raise ValueError("multi_agent.magrpo.num_generations must be set (G, the completions per agent at a node) "
                             "for the cooperative rollout")
        return self.magrpo.num_generations

    def agent(self, name: str) -> AgentConfig:
        """The agent called ``name``; ``ValueError`` naming the known agents if there is none."""
        if name not in self.agents:
            raise ValueError(f"unknown agent {name!r}; known agents are {list(self.agents)}")
        return self.agents[name]

    def owner_of(self, name: str) -> str:
        """The agent whose model plays ``name``: itself, or the agent it shares a model with."""
        spec = self.agent(name)
        return spec.name if spec.share_model_with is None else spec.share_model_with

    @property
    def sub_agents(self) -> tuple[str, ...]:
        """Every agent name except the main agent's, in order."""
        return tuple(n for n in self.agents if n != self.main)

    @property
    def model_owners(self) -> tuple[AgentConfig, ...]:
        """Agents with a model of their own, main first (the order of model placement)."""
        return tuple(a for a in self.agents.values() if a.owns_model)

    @property
    def trainable_owners(self) -> tuple[AgentConfig, ...]:
        """Model owners whose model is updated."""
        return tuple(a for a in self.model_owners if a.trainable)

    @property
    def local_owners(self) -> tuple[AgentConfig, ...]:
        """Model owners this process builds workers for: all of them in the synchronous mode, the main
        agent's model on the main side, ``decoupled.train_agent`` on the sub side."""
        role = self.decoupled.role
        if role is None:
            return self.model_owners
        keep = self.owner_of(self.main) if role == "main" else self.decoupled.train_agent
        return tuple(a for a in self.model_owners if a.name == keep)

    def replica_offsets(self, replicas_per_agent: Mapping[str, int]) -> dict[str, int]:
        """Index of each model owner's first rollout replica when all replicas are numbered together:
        offsets accumulate over :attr:`model_owners` in order. ``replicas_per_agent`` gives a count (int
        >= 0) for every model owner and nothing else."""
        owners = [a.name for a in self.model_owners]
        extra = sorted(str(k) for k in replicas_per_agent if k not in owners)
        if extra:
            raise ValueError(f"replica_offsets: {extra} are not model owners; model owners are {owners}")
        offsets: dict[str, int] = {}
        offset = 0
        for name in owners:
            if name not in replicas_per_agent:
                raise ValueError(f"replica_offsets: no replica count for model owner {name!r}; "
                                 f"model owners are {owners}")
            count = replicas_per_agent[name]
            if not _is_int(count) or count < 0:
                raise ValueError(f"replica_offsets: replica count of {name!r} must be an int >= 0, got {count!r}")
            offsets[name] = offset
            offset += int(count)
        return offsets


# ----------------------------------------------------------------------------------------------------
# loading

#: the sections nested in ``multi_agent`` (free mappings such as ``sub_urls`` or an agent's
#: ``actor_rollout_ref`` keep their nulls: there a null is data)
_SECTIONS = {"mgrpo": MGRPOConfig, "magrpo": MAGRPOConfig, "delegation": DelegationConfig,
             "decoupled": DecoupledConfig, "cooperation": CooperationConfig}


def _drop_nulls(value: Any, cls: type) -> Any:
    """``value`` (a plain mapping for the dataclass ``cls``) without null entries, recursively through
    nested sections and the agents: a null means the field's default."""
    if not isinstance(value, Mapping):
        return value
    out = {}
    for key, item in value.items():
        if item is None:
            continue
        if cls is MultiAgentConfig and key in _SECTIONS:
            item = _drop_nulls(item, _SECTIONS[key])
        elif cls is MultiAgentConfig and key == "agents" and isinstance(item, Mapping):
            item = {k: ({} if v is None else _drop_nulls(v, AgentConfig)) for k, v in item.items()}
        out[key] = item
    return out


_PREFIXES = {"MGRPOConfig": "multi_agent.mgrpo", "MAGRPOConfig": "multi_agent.magrpo"}


def _omegaconf_error(err: OmegaConfBaseException, section: Mapping) -> ValueError:
    key = f"multi_agent.{err.full_key}" if getattr(err, "full_key", None) else "multi_agent"
    message = str(getattr(err, "msg", err)).splitlines()[0]
    if "not in" in message:  # an unknown key: name the known ones
        parent = key.rsplit(".", 1)[0]
        return ValueError(f"{key}: unknown key; the keys of {parent} are {_known_keys(parent)}")
    value = OmegaConf.select(OmegaConf.create(dict(section)), str(err.full_key), default=None) if err.full_key else None
    return ValueError(f"{key}: {message}, got {value!r}")


def _known_keys(path: str) -> list[str]:
    parts = path.split(".")[1:]
    cls: Any = MultiAgentConfig
    if parts[:1] == ["agents"] and len(parts) > 1:
        cls = AgentConfig
    elif parts:
        cls = _SECTIONS.get(parts[0], MultiAgentConfig)
    return [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_") and f.name != "name"]


def section_container(config: Any) -> dict:
    """``multi_agent`` of a trainer config (a DictConfig or mapping) as a plain dict: resolved, except each
    agent's ``actor_rollout_ref`` (its interpolations resolve in the agent's own config)."""
    if isinstance(config, Mapping) and not isinstance(config, DictConfig):
        config = OmegaConf.create(dict(config))
    node = OmegaConf.select(config, "multi_agent", default=None, throw_on_missing=False)
    if node is None:
        return {}
    if not isinstance(node, DictConfig):
        raise ValueError(f"multi_agent must be a mapping, got {node!r}")
    out = {}
    for key in node.keys():
        try:
            if key == "agents" and isinstance(node.get(key), DictConfig):
                agents = {}
                for name in node[key].keys():
                    entry = node[key][name]
                    if isinstance(entry, DictConfig):
                        agents[name] = {k: OmegaConf.to_container(entry[k], resolve=k != "actor_rollout_ref")
                                        if OmegaConf.is_config(entry[k]) else entry[k] for k in entry.keys()}
                    else:
                        agents[name] = entry
                out[key] = agents
            else:
                value = node[key]
                out[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except MissingMandatoryValue:
            raise ValueError(f"multi_agent.{key}: missing mandatory value (???)") from None
    return out


def load_multi_agent(config: Any) -> MultiAgentConfig:
    """The typed ``multi_agent`` section of a trainer config, with the rules within the section checked.

    Raises ``ValueError`` naming the key and the value. Each agent's ``actor_rollout_ref`` stays as written
    (unresolved); the rest is resolved."""
    section = _drop_nulls(section_container(config), MultiAgentConfig)
    agents = section.get("agents", {})
    if not isinstance(agents, Mapping):
        raise ValueError(f"{_A} must be a mapping of agent name to settings, got {agents!r}")
    overrides = {}
    for name, entry in agents.items():
        if not isinstance(entry, Mapping):
            raise ValueError(f"{_A}.{name}: expected a mapping of agent settings, got {entry!r}")
        raw = entry.get("actor_rollout_ref", {})
        if not isinstance(raw, Mapping):
            raise ValueError(f"{_A}.{name}.actor_rollout_ref must be a mapping of overrides, got {raw!r}")
        overrides[name] = dict(raw)
    # overrides are attached after conversion: OmegaConf would resolve their interpolations out of context
    bare = {**section,
            "agents": {n: {k: v for k, v in e.items() if k != "actor_rollout_ref"} for n, e in agents.items()}}
    try:
        ma = omega_conf_to_dataclass(OmegaConf.create(bare), MultiAgentConfig)
    except OmegaConfBaseException as err:
        raise _omegaconf_error(err, bare) from None
    except ValueError as err:
        raise _with_prefix(err) from None
    if not overrides:
        return ma
    return dataclasses.replace(
        ma, agents={n: dataclasses.replace(a, actor_rollout_ref=overrides.get(n, {})) for n, a in ma.agents.items()}
    )


def _with_prefix(err: ValueError) -> ValueError:
    message = str(err)
    for cls, path in _PREFIXES.items():
        if message.startswith(f"{cls}:"):
            return ValueError(path + message[len(cls):])
    return err
