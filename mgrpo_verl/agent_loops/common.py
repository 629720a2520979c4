"""What the agent loops share: the delegation settings they read, one generation call, the handle of an agent
as a loop sees it, the row metadata record, and the rules for scores and per-query statistics.

Public so the loops (:mod:`~mgrpo_verl.agent_loops.delegation`, :mod:`~mgrpo_verl.agent_loops.tool_delegation`,
:mod:`~mgrpo_verl.agent_loops.cooperative`) and the warm-start demonstrations import names, not each other's
privates. Nothing here is registered with verl.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)
from verl.experimental.agent_loop.tool_agent_loop import SPEC_DECODE_EXTRA_KEYS
from verl.utils import hf_tokenizer

from mgrpo_verl.config.schema import AgentConfig, DelegationConfig, load_multi_agent
from mgrpo_verl.envs import relay

logger = logging.getLogger(__name__)

#: tokenizer path -> tokenizer, for sub-agents whose model differs from the main agent's (per process).
TOKENIZERS: dict[str, Any] = {}

#: The sampling-param key both verl's vLLM server and our HF server read as the cap on new tokens.
MAX_TOKENS_KEY = "max_tokens"

@dataclass(frozen=True)
class DelegationSettings:
    """What the delegation loops (relay and tool call) read: the typed ``multi_agent.delegation`` section
    (:class:`~mgrpo_verl.config.schema.DelegationConfig` documents each field), the agents' names and
    the callables the section names, loaded once per process. Without a ``multi_agent`` section (tests,
    tools) the agents are ``main`` and ``sub``."""

    delegation: DelegationConfig = field(default_factory=DelegationConfig)
    main: str = "main"
    sub_agents: tuple[str, ...] = ("sub",)
    scorer: Any = relay.default_scorer
    sub_prompt: Any = None
    """``delegation.sub_prompt`` loaded, or ``None``: each loop's task default."""

    @classmethod
    def from_config(cls, config: DictConfig) -> DelegationSettings:
        """Settings of ``config`` (the whole trainer config), loaded and checked by the schema the trainer
        uses (:func:`~mgrpo_verl.config.schema.load_multi_agent`); raises ``ValueError`` naming a bad field."""
        ma = load_multi_agent(config)
        if not ma.agents:
            ma = dataclasses.replace(ma, agents={ma.main: AgentConfig(), "sub": AgentConfig()})
        section = ma.delegation
        return cls(
            delegation=section,
            main=ma.main,
            sub_agents=ma.sub_agents,
            scorer=relay.load_scorer(section.scorer),
            sub_prompt=relay.load_sub_prompt(section.sub_prompt) if section.sub_prompt else None,
        )

    @property
    def sub_agent(self) -> str:
        """The agent the relay loop calls."""
        return self.delegation.sub_agent or self.sub_agents[0]

    def sub_messages(self, row: dict[str, Any], plan_text: str) -> list[dict[str, Any]]:
        """Chat messages of one sub-agent call of the forced-delegation loop for the dataset ``row`` (the
        loop's ``kwargs``): ``relay.sub_messages(ground truth, plan)`` without a ``sub_prompt``, else
        ``sub_prompt(sub_agent, task)`` with ``task`` = the row's ``extra_info.question`` (when present)
        and the plan on the next line."""
        if self.sub_prompt is None:
            return relay.sub_messages(str(row["reward_model"]["ground_truth"]), plan_text)
        question = str((row.get("extra_info") or {}).get("question") or "").strip()
        task = f"{question}\n{plan_text.strip()}".strip() if question else plan_text.strip()
        return self.sub_prompt(self.sub_agent, task)

    def num_calls(self, plan_ids: list[int]) -> int:
        """``d`` for a plan: ``min_calls + sum(plan_ids) % (max_calls - min_calls + 1)``."""
        low, high = self.delegation.min_calls, self.delegation.max_calls
        return low + sum(plan_ids) % (high - low + 1)


@dataclass(frozen=True)
class Generation:
    """One generation, capped at the requested number of new tokens."""

    token_ids: list[int]
    log_probs: list[float]  # zeros where the backend returned none
    extra_fields: dict[str, Any]
    num_preempted: int | None
    seconds: float


@dataclass(frozen=True)
class AgentHandle:
    """An agent as a loop calls it: its client, tokenizer and length caps (:func:`resolve_agent`)."""

    name: str
    client: Any
    tokenizer: Any
    prompt_length: int
    response_tokens: int



@dataclass(frozen=True)
class RowMeta:
    """``extra_fields["mgrpo"]`` of every row a loop emits (as a plain dict, :meth:`as_dict`: verl carries
    rows as plain data); the trainer's row table (:mod:`mgrpo_verl.trainer.rows`) reads these keys."""

    agent: str
    """The agent that generated the row."""
    traj_id: str
    """``{uid}/{session_id}/main`` for a main row, ``.../{sub}/{j}`` for sub call ``j``."""
    parent_traj_id: str
    """``""`` for a main row, its main row's ``traj_id`` for a sub row."""
    score: float
    """The row's own score (verl's ``reward_score`` is the main score on every row)."""
    calls: int
    """Sub-agent calls of a main row (1 on a sub row)."""
    failed_calls: int = 0
    """Sub-agent calls that raised or timed out (main row)."""
    observation_truncated: bool = False
    """Whether the main row's observation was shortened to fit (relay loop)."""

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "score": float(self.score)}


#: Per-process memo of what a loop object derives from its (immutable) inputs: verl builds one loop object
#: per rollout from the same trainer config, server manager and tokenizer, and reading the settings and
#: resolving the sub-agent from the OmegaConf configs each time cost about 0.2 ms of a rollout's ~3 ms of
#: orchestration CPU time (``benchmarks/bench_orchestration.py``). The configs are not expected to change
#: once loops run (a ``scorer`` is loaded once per config). Keys are object ids; each entry keeps its key
#: objects alive (so an id is never reused while cached) and is checked by identity. Bounded: cleared when
#: it holds MEMO_SIZE entries.
MEMO_SIZE = 32
_SETTINGS: dict[int, tuple[Any, DelegationSettings]] = {}


#: Keys of ``extra_info`` copied into every query's ``reward_extra_info`` as text (the evaluation table's
#: level, and the benchmark's question id), ``""`` when absent.
QUERY_TAGS = ("source", "level", "id")

#: Characters of the main agent's final answer kept in ``reward_extra_info["answer"]``.
ANSWER_CHARS = 500


#: ``reward_extra_info`` key counting the scores of a rollout that could not be computed (scored 0).
REWARD_ERRORS = "reward/errors"


def safe_score(scorer: Any, role: str, text: str, ground_truth: Any) -> tuple[float, int]:
    """``(scorer(role, text, ground_truth), 0)``, or ``(0.0, 1)`` when the scorer raises or returns
    something that is not a finite number: a score depends on model output, and no output may fail the
    step (verl would lose the whole batch). The failure is logged; callers count it in
    :data:`REWARD_ERRORS`."""
    try:
        score = float(scorer(role, text, ground_truth))
        if not math.isfinite(score):
            raise ValueError(f"the score is {score!r}")
        return score, 0
    except Exception as exc:
        logger.warning("the %s score could not be computed, scored 0: %s: %.500s", role, type(exc).__name__, exc)
        return 0.0, 1


def exact_match(answer: str, ground_truth: Any) -> float:
    """1.0 when the main agent's final answer, stripped, is the ground truth (as text, stripped), else 0.0:
    the ``exact`` of every query's ``reward_extra_info`` (validation: ``val-aux/<source>/exact/mean@n``), the
    headline accuracy next to the task's dense score (``acc``). The whole answer is compared: a task whose
    answers carry a format (deep research's ``Answer: ...``) has its own exact match (``research_eval``)."""
    return float(str(answer).strip() == str(ground_truth).strip())


def query_stats(row: dict[str, Any], answer: str, **stats: float) -> dict[str, Any]:
    """A main trajectory's ``reward_extra_info``: ``stats`` (numbers: ``acc``, ``calls``, tokens, ...), the
    main agent's final ``answer`` text (its first :data:`ANSWER_CHARS` characters) and the row's
    :data:`QUERY_TAGS` as text. verl's validation averages the numbers per data source
    (``val-aux/<source>/<key>/mean@n``), skips the text, and dumps both per sample with
    ``trainer.validation_data_dir``: ``mgrpo_verl.experiments.research_eval`` reads that dump (it rescores
    ``answer`` with exact match and F1, and groups by source and level)."""
    extra = row.get("extra_info") or {}
    tags = {key: "" if extra.get(key) is None else str(extra.get(key)) for key in QUERY_TAGS}
    return {**stats, "answer": str(answer)[:ANSWER_CHARS], **tags}


def agent_setting(agent_config: Any, key: str, default: Any) -> Any:
    """``key`` of an agent's full config (a client's ``config``), or ``default`` when it has none."""
    if not isinstance(agent_config, DictConfig):
        return default
    return OmegaConf.select(agent_config, key, default=default)


def tokenizer_path(agent_config: Any) -> str | None:
    """``actor_rollout_ref.model.tokenizer_path``, else ``.path``, of an agent's full config."""
    return agent_setting(agent_config, "actor_rollout_ref.model.tokenizer_path", None) or agent_setting(
        agent_config, "actor_rollout_ref.model.path", None
    )


def settings_of(config: DictConfig) -> DelegationSettings:
    """``DelegationSettings.from_config(config)``, memoised per config object (see :data:`_SETTINGS`)."""
    hit = _SETTINGS.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    settings = DelegationSettings.from_config(config)  # raises for a bad config: nothing is cached then
    if len(_SETTINGS) >= MEMO_SIZE:
        _SETTINGS.clear()
    _SETTINGS[id(config)] = (config, settings)
    return settings


def merge_generation_fields(generations: list[Generation]) -> dict[str, Any]:
    """The main row's server fields: min/max of the global-step bounds, spec-decode counters summed, other
    keys from the last generation."""
    merged: dict[str, Any] = {}
    for gen in generations:
        merged.update(gen.extra_fields)
    for key, pick in (("min_global_steps", min), ("max_global_steps", max)):
        values = [g.extra_fields[key] for g in generations if g.extra_fields.get(key) is not None]
        if values:
            merged[key] = pick(values)
    for key in SPEC_DECODE_EXTRA_KEYS:
        if all(key in g.extra_fields for g in generations):
            merged[key] = sum(int(g.extra_fields[key]) for g in generations)
    return merged


async def generate(
    client: Any, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], max_tokens: int
) -> Generation:
    """One generation of at most ``max_tokens`` new tokens (passed as ``max_tokens``; also enforced here)."""
    params = {**sampling_params, MAX_TOKENS_KEY: max_tokens}  # a copy: vLLM's server pops keys from it
    start = time.perf_counter()
    output = await client.generate(request_id=request_id, prompt_ids=prompt_ids, sampling_params=params)
    seconds = time.perf_counter() - start
    token_ids = list(output.token_ids)[:max_tokens]
    log_probs = [float(x) for x in (output.log_probs or [])[: len(token_ids)]]
    log_probs += [0.0] * (len(token_ids) - len(log_probs))  # zeros where the backend returned none
    return Generation(token_ids, log_probs, dict(output.extra_fields or {}), output.num_preempted, seconds)


def resolve_agent(loop: AgentLoopBase, name: str, response_tokens: int) -> AgentHandle:
    """Where agent ``name``'s generations go, as seen from ``loop``: ``loop.server_manager.for_agent(name)``
    (which raises for an unknown name), or the server manager itself without ``for_agent``. From that
    client's ``config`` (the agent's full config), when it has one: ``actor_rollout_ref.model.tokenizer_path``
    (or ``.path``) picks the tokenizer (the loop's own when equal or absent, loaded once per process),
    ``actor_rollout_ref.rollout.prompt_length`` / ``response_length`` cap its prompts and completions
    (default: the loop's rollout config); completions are also capped at ``response_tokens``."""
    manager = loop.server_manager
    client = manager.for_agent(name) if hasattr(manager, "for_agent") else manager
    agent_config = getattr(client, "config", None)
    path = tokenizer_path(agent_config)
    tokenizer = loop.tokenizer
    if path is not None and path != tokenizer_path(loop.config):
        if path not in TOKENIZERS:
            trust = bool(agent_setting(agent_config, "actor_rollout_ref.model.trust_remote_code", False))
            TOKENIZERS[path] = hf_tokenizer(path, trust_remote_code=trust)
        tokenizer = TOKENIZERS[path]
    rollout = "actor_rollout_ref.rollout"
    prompt_length = int(agent_setting(agent_config, f"{rollout}.prompt_length", loop.rollout_config.prompt_length))
    response_length = int(agent_setting(agent_config, f"{rollout}.response_length", loop.rollout_config.response_length))
    return AgentHandle(name, client, tokenizer, prompt_length, min(response_tokens, response_length))


def preempted(generations: list[Generation]) -> int:
    counts = [g.num_preempted for g in generations if g.num_preempted is not None]
    return sum(counts) if counts else -1


def row_meta(agent: str, traj_id: str, parent_traj_id: str, score: float, calls: int) -> dict[str, Any]:
    """``extra_fields["mgrpo"]`` of a new row, a :class:`RowMeta` as a dict (the main row's ``failed_calls`` /
    ``observation_truncated`` are set once known)."""
    return RowMeta(agent, traj_id, parent_traj_id, score, calls).as_dict()


def output_row(
    prompt_ids: list[int],
    response_ids: list[int],
    response_mask: list[int],
    response_logprobs: list[float],
    *,
    num_turns: int,
    metrics: AgentLoopMetrics,
    extra_fields: dict[str, Any],
    reward_score: float,
) -> AgentLoopOutput:
    """One output; every row sets the same fields, so verl's per-call field set is uniform."""
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=response_mask,
        response_logprobs=response_logprobs,
        reward_score=reward_score,
        num_turns=num_turns,
        metrics=metrics,
        extra_fields=extra_fields,
    )


