"""What the agent loops share: the delegation settings they read, one generation call, the handle of an agent
as a loop sees it, and the rules for scores, per-query statistics and each row's metadata
(:func:`score_trajectory`, writing the row contract of :mod:`mgrpo_verl.rowmeta`).

Public so the loops (:mod:`~mgrpo_verl.agent_loops.delegation`, :mod:`~mgrpo_verl.agent_loops.tool_delegation`,
:mod:`~mgrpo_verl.agent_loops.cooperative`) and the warm-start demonstrations import names, not each other's
privates. Nothing here is registered with verl.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Optional, TypeVar

from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)
from verl.experimental.agent_loop.tool_agent_loop import SPEC_DECODE_EXTRA_KEYS
from verl.utils import hf_tokenizer

from mgrpo_verl.config import setting
from mgrpo_verl.config.schema import AgentConfig, DelegationConfig, load_multi_agent
from mgrpo_verl.envs import relay
from mgrpo_verl.hf_rollout import ROLLOUT_NAME as HF_ROLLOUT_NAME
from mgrpo_verl.rowmeta import RowMeta, main_traj_id, sub_traj_id

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_C = TypeVar("_C")

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
    scorer_takes_agent: bool = field(init=False, default=False)
    """Whether :attr:`scorer` takes the keyword ``agent`` (:func:`~mgrpo_verl.envs.relay.accepts_agent`), inspected
    once here: :meth:`score` then passes the name of the agent that wrote the text."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "scorer_takes_agent", relay.accepts_agent(self.scorer))

    def score(self, role: str, agent: str, text: str, ground_truth: Any) -> tuple[float, int]:
        """:func:`safe_score` of ``text`` written by ``agent`` in ``role`` (``main`` / ``sub``): the scorer is called
        ``scorer(role, text, ground_truth)``, with ``agent=agent`` too when it takes that keyword."""
        if self.scorer_takes_agent:
            return safe_score(self.scorer, role, text, ground_truth, agent=agent)
        return safe_score(self.scorer, role, text, ground_truth)

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


def trajectory_origin(row: Mapping[str, Any]) -> Optional[str]:
    """``{split}/{index}/{session}`` of the trajectory verl runs for the dataset ``row`` (a loop's ``kwargs``):
    the row's ``extra_info.split`` (``-`` without one), its ``index`` (verl's dataset copies
    ``extra_info.index`` there) and ``session_id`` (its place in its group of ``rollout.n``). The same on every run,
    unlike verl's ``uid`` (a uuid4 per prompt); ``None`` without an ``index`` (a row that did not come through
    verl's dataset)."""
    if row.get("index") is None:
        return None
    split = (row.get("extra_info") or {}).get("split")
    return f"{split if split is not None else '-'}/{row['index']}/{int(row.get('session_id', 0) or 0)}"


class SeedStream:
    """The seeds of one trajectory's sampled requests, in the order the trajectory makes them; a parallel branch
    (one sub-agent call, one agent's completion at a tree node) takes a :meth:`child` of its own.

    Why: vLLM draws a request that names no ``seed`` from one generator in scheduling order, and our HF server
    seeds it by what was asked and in which order it arrived; either way, which trajectory gets which sample
    depends on timing when prompts repeat (relay_tools' main prompt is the same for every task). A seed from the
    trajectory's identity (:func:`trajectory_origin`, the step, the prompt, the call's place in the trajectory)
    makes a run's samples the same on every run of the same seed. A request that names its own ``seed`` keeps it;
    ``SeedStream(None)`` adds none (``multi_agent.trajectory_seeds: false``, or a row without an identity)."""

    def __init__(self, key: Optional[bytes]):
        self.key = key
        self._calls = 0

    def params(self, sampling_params: dict[str, Any]) -> dict[str, Any]:
        """``sampling_params`` with this stream's next seed (a copy), or unchanged."""
        if self.key is None or "seed" in sampling_params:
            return sampling_params
        self._calls += 1
        digest = hashlib.blake2b(self.key + f"|call {self._calls - 1}".encode(), digest_size=8).digest()
        return {**sampling_params, "seed": int.from_bytes(digest, "little") >> 1}  # < 2**63: any engine's int64

    def child(self, label: str) -> SeedStream:
        """The stream of the branch ``label`` (unique within this trajectory, the same on every run)."""
        return SeedStream(None if self.key is None else hashlib.blake2b(self.key + b"|" + label.encode(),
                                                                          digest_size=16).digest())


def trajectory_seeds(loop: AgentLoopBase, row: Mapping[str, Any]) -> SeedStream:
    """The :class:`SeedStream` of the trajectory ``loop`` runs for ``row``: keyed by ``rollout.seed``, the row's
    ``global_steps``, :func:`trajectory_origin` and its ``raw_prompt``; off (no seeds added) when the row has no
    origin or ``multi_agent.trajectory_seeds`` is false (or ``auto`` with a rollout other than our HF one)."""
    origin = trajectory_origin(row)
    if origin is None or not per_config(loop.config, _trajectory_seeds_on):
        return SeedStream(None)
    raw = row.get("raw_prompt")  # a list or a numpy array of messages (no truth value: not `or []`)
    prompt = json.dumps([] if raw is None else list(raw), sort_keys=True, default=str)
    material = f"{setting(loop.rollout_config, 'seed', 0)}|{row.get('global_steps', -1)}|{origin}|{prompt}"
    return SeedStream(hashlib.blake2b(material.encode(), digest_size=16).digest())


def _trajectory_seeds_on(config: DictConfig) -> bool:
    choice = load_multi_agent(config).trajectory_seeds
    if choice == "auto":
        return setting(config, "actor_rollout_ref.rollout.name", None) == HF_ROLLOUT_NAME
    return bool(choice)


@dataclass(frozen=True)
class Generation:
    """One generation, capped at the requested number of new tokens."""

    token_ids: list[int]
    log_probs: list[float]  # zeros where the backend returned none
    extra_fields: dict[str, Any]
    num_preempted: int | None
    seconds: float


#: The completion of a failed generation (one object: a row tells it by identity from an empty one). Here, not in
#: the loop modules that use it: they may be imported while this module is half-initialised (plugin.py's hooks
#: fire inside its import of verl's agent_loop when this module is the first one imported), so they must not use its
#: names at import time.
FAILED_GENERATION = Generation([], [], {}, None, 0.0)


@dataclass(frozen=True)
class AgentHandle:
    """An agent as a loop calls it: its client, tokenizer and length caps (:func:`resolve_agent`)."""

    name: str
    client: Any
    tokenizer: Any
    prompt_length: int
    response_tokens: int



#: Per-process memo of what a loop object derives from its (immutable) inputs: verl builds one loop object
#: per rollout from the same trainer config, server manager and tokenizer, and reading the settings and
#: resolving the sub-agent from the OmegaConf configs each time cost about 0.2 ms of a rollout's ~3 ms of
#: orchestration CPU time (``benchmarks/bench_orchestration.py``). The configs are not expected to change
#: once loops run (a ``scorer`` is loaded once per config). Keys are object ids; each entry keeps its key
#: objects alive (so an id is never reused while cached) and is checked by identity. Bounded: cleared when
#: it holds MEMO_SIZE entries.
MEMO_SIZE = 32
_PER_CONFIG: dict[tuple[Any, int], tuple[Any, Any]] = {}


#: Keys of ``extra_info`` copied into every query's ``reward_extra_info`` as text (the evaluation table's
#: level, and the benchmark's question id), ``""`` when absent.
QUERY_TAGS = ("source", "level", "id")

#: Characters of the main agent's final answer kept in ``reward_extra_info["answer"]``.
ANSWER_CHARS = 500


#: ``reward_extra_info`` key counting the scores of a rollout that could not be computed (scored 0).
REWARD_ERRORS = "reward/errors"


def safe_score(scorer: Any, role: str, text: str, ground_truth: Any, **kwargs: Any) -> tuple[float, int]:
    """``(scorer(role, text, ground_truth, **kwargs), 0)``, or ``(0.0, 1)`` when the scorer raises or returns
    something that is not a finite number: a score depends on model output, and no output may fail the
    step (verl would lose the whole batch). The failure is logged; callers count it in
    :data:`REWARD_ERRORS`. ``kwargs``: ``agent=<name>`` for a scorer that takes it
    (:meth:`DelegationSettings.score`)."""
    try:
        score = float(scorer(role, text, ground_truth, **kwargs))
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


@dataclass(frozen=True)
class QueryStats:
    """A main trajectory's per-query statistics: what every delegation loop writes as its rows'
    ``reward_extra_info`` (:func:`query_stats`) and what the evaluations read back (:meth:`read`:
    ``warmstart.evaluate`` from a loop's row, ``experiments.research_eval`` from verl's validation dump).

    verl needs a plain dict there (its validation averages the numbers per data source,
    ``val-aux/<source>/<key>/mean@n``, skips the text, and dumps every key per sample with
    ``trainer.validation_data_dir``), so this type travels as :meth:`write`'s dict, like
    :class:`~mgrpo_verl.rowmeta.RowMeta`."""

    answer: str
    """The main agent's final answer text, its first :data:`ANSWER_CHARS` characters."""
    acc: float
    """The task scorer's score of the answer: the main score."""
    calls: int
    """Sub-agent calls the main agent started."""
    failed_calls: int
    """Of those, the calls that raised or timed out."""
    exact: Optional[float] = None
    """:func:`exact_match` of the answer."""
    main_tokens: Optional[int] = None
    """Response tokens the main agent generated."""
    sub_tokens: Optional[int] = None
    """Response tokens the sub-agents generated."""
    tools: Mapping[str, float] = field(default_factory=dict)
    """``tool/<name>`` -> calls of that tool (main and sub-agents), and ``tool/parse_errors`` (tool loop)."""
    reward_errors: Optional[float] = None
    """:data:`REWARD_ERRORS`: scores of the rollout that could not be computed (scored 0)."""
    source: str = ""
    level: str = ""
    id: str = ""
    """The dataset row's :data:`QUERY_TAGS` (``extra_info``), ``""`` when absent."""

    #: The numbers an evaluation averages per query (with :attr:`tools`).
    AVERAGED: ClassVar[tuple[str, ...]] = ("calls", "failed_calls", "main_tokens", "sub_tokens")

    def write(self) -> dict[str, Any]:
        """The ``reward_extra_info`` dict (unset optional numbers left out)."""
        out: dict[str, Any] = {"acc": self.acc, "exact": self.exact, "calls": self.calls,
                               "failed_calls": self.failed_calls, "main_tokens": self.main_tokens,
                               "sub_tokens": self.sub_tokens}
        out = {k: v for k, v in out.items() if v is not None}
        out.update(self.tools)
        if self.reward_errors is not None:
            out[REWARD_ERRORS] = self.reward_errors
        return {**out, "answer": self.answer, "source": self.source, "level": self.level, "id": self.id}

    def averaged(self) -> dict[str, float]:
        """:data:`AVERAGED` that are set, and :attr:`tools`, as floats: what an evaluation reports per query."""
        out = {k: float(getattr(self, k)) for k in self.AVERAGED if getattr(self, k) is not None}
        return {**out, **{k: float(v) for k, v in self.tools.items()}}

    @staticmethod
    def is_averaged(key: str) -> bool:
        """Whether ``key`` (of :meth:`averaged`'s dict) is one of the per-query statistics."""
        return key in QueryStats.AVERAGED or key.startswith("tool/")

    @classmethod
    def read(cls, info: Mapping[str, Any], where: str) -> QueryStats:
        """The statistics in ``info``: a row's ``reward_extra_info``, or a line of verl's validation dump (the
        query's ``reward_extra_info`` beside verl's own keys, which are ignored). ``where`` names it in errors.

        Raises:
            ValueError: ``answer``, ``acc``, ``calls`` or ``failed_calls`` missing (not a delegation loop's row),
                or a number that is not one.
        """
        missing = [k for k in ("answer", "acc", "calls", "failed_calls") if info.get(k) is None]
        if missing:
            raise ValueError(f"{where}: no per-query statistics {missing} of a delegation loop (reward_extra_info)")

        def number(key: str) -> Optional[float]:
            return None if info.get(key) is None else float(info[key])

        def count(key: str) -> Optional[int]:  # verl's dump may carry a count as a float
            return None if info.get(key) is None else int(float(info[key]))

        try:
            return cls(
                answer=str(info["answer"]), acc=float(info["acc"]), calls=count("calls"),
                failed_calls=count("failed_calls"), exact=number("exact"),
                main_tokens=count("main_tokens"), sub_tokens=count("sub_tokens"),
                tools={k: float(v) for k, v in info.items() if k.startswith("tool/") and v is not None},
                reward_errors=number(REWARD_ERRORS),
                **{k: "" if info.get(k) is None else str(info[k]) for k in QUERY_TAGS},
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: a per-query statistic is not a number: {err}") from None


def query_stats(row: dict[str, Any], answer: str, *, acc: float, calls: int, failed_calls: int,
                **stats: float) -> dict[str, Any]:
    """A main trajectory's ``reward_extra_info``: :class:`QueryStats` written, with the main agent's final
    ``answer`` text (its first :data:`ANSWER_CHARS` characters) and the row's :data:`QUERY_TAGS` as text.
    ``stats``: ``exact``, ``main_tokens``, ``sub_tokens``, :data:`REWARD_ERRORS` and ``tool/<name>`` counts. verl's
    validation averages the numbers per data source (``val-aux/<source>/<key>/mean@n``), skips the text, and
    dumps both per sample with ``trainer.validation_data_dir``: ``mgrpo_verl.experiments.research_eval`` reads
    that dump (it rescores ``answer`` with exact match and F1, and groups by source and level).

    Raises:
        TypeError: a statistic :class:`QueryStats` has no field for.
    """
    extra = row.get("extra_info") or {}
    tags = {key: "" if extra.get(key) is None else str(extra.get(key)) for key in QUERY_TAGS}
    tools = {k: stats.pop(k) for k in [k for k in stats if k.startswith("tool/")]}
    reward_errors = stats.pop(REWARD_ERRORS, None)
    unknown = sorted(set(stats) - {"exact", "main_tokens", "sub_tokens"})
    if unknown:
        raise TypeError(f"query_stats: no QueryStats field for {unknown}")
    return QueryStats(str(answer)[:ANSWER_CHARS], acc, calls, failed_calls, tools=tools, reward_errors=reward_errors,
                      **stats, **tags).write()


@dataclass(frozen=True)
class SubReport:
    """One sub-agent call of a delegation rollout as the main agent saw it."""

    agent: str
    index: int
    """The call's number (from 0) among the rollout's calls of ``agent``: its ``sub_traj_id``."""
    text: str | None
    """Its report, ``None`` when the call failed or timed out (no row)."""


@dataclass(frozen=True)
class ScoredTrajectory:
    """A delegation rollout's scores and the row contract of each of its rows (:func:`score_trajectory`)."""

    score: float
    """The main agent's answer's score: every row's ``reward_score``."""
    main: RowMeta
    subs: tuple[RowMeta | None, ...]
    """One per :class:`SubReport`, ``None`` where the call failed."""
    reward_extra_info: dict[str, Any]


def score_trajectory(
    settings: DelegationSettings,
    row: dict[str, Any],
    prefix: str,
    answer: str,
    ground_truth: str,
    reports: list[SubReport],
    *,
    calls: int | None = None,
    failed_calls: int | None = None,
    observation_truncated: bool = False,
    session: int | None = None,
    sub_calls: list[str] | None = None,
    **stats: float,
) -> ScoredTrajectory:
    """The epilogue every delegation loop shares: score the main answer and each report with the task's
    scorer (:meth:`DelegationSettings.score`: ``agent=`` the main agent's / the report's agent's name for a scorer
    that takes it; :func:`safe_score`: a failing scorer scores 0, counted in :data:`REWARD_ERRORS`), the query's
    ``reward_extra_info`` (:func:`query_stats`: ``acc``, ``exact``, ``calls``, ``failed_calls``, ``stats``) and
    the :class:`~mgrpo_verl.rowmeta.RowMeta` of the main row and of each answered call. ``calls`` /
    ``failed_calls`` default to the reports' (a decoupled main side's calls have no report here); ``session`` and
    ``sub_calls`` go on the main row (decoupled main side)."""
    score, errors = settings.score("main", settings.main, answer, ground_truth)
    sub_scores = [None if r.text is None else settings.score("sub", r.agent, r.text, ground_truth) for r in reports]
    calls = len(reports) if calls is None else calls
    failed_calls = sum(r.text is None for r in reports) if failed_calls is None else failed_calls
    info = query_stats(
        row, answer, acc=score, exact=exact_match(answer, ground_truth), calls=calls, failed_calls=failed_calls,
        **stats,
        **{REWARD_ERRORS: errors + sum(s[1] for s in sub_scores if s is not None)},
    )
    main_id, origin = main_traj_id(prefix), trajectory_origin(row)
    subs = tuple(None if s is None else RowMeta(r.agent, sub_traj_id(prefix, r.agent, r.index), main_id, s[0],
                                                origin=origin)
                 for r, s in zip(reports, sub_scores, strict=True))
    main = RowMeta(settings.main, main_id, "", score, calls=calls, failed_calls=failed_calls,
                   observation_truncated=observation_truncated, session=session,
                   sub_calls=None if sub_calls is None else tuple(sub_calls), origin=origin)
    return ScoredTrajectory(score, main, subs, info)



def trajectory_rows(
    scored: ScoredTrajectory,
    calls: Sequence[_C],
    sub_row: Callable[[_C, dict[str, Any], dict[str, Any], float], AgentLoopOutput] | None,
    main_row: Callable[[dict[str, Any], dict[str, Any], float], AgentLoopOutput],
) -> list[AgentLoopOutput]:
    """A delegation trajectory's rows, ``[sub rows..., main row]``, as every delegation loop returns them: one
    ``sub_row(call, meta, reward_extra_info, score)`` per answered call of ``calls`` (one per report of
    ``scored``, in call order; a failed call has no row), then ``main_row(meta, reward_extra_info, score)``.
    ``meta`` is the row's :class:`~mgrpo_verl.rowmeta.RowMeta` written (:meth:`~mgrpo_verl.rowmeta.RowMeta.write`),
    ``score`` the main score; each sub row gets its own copy of the query's ``reward_extra_info``. ``sub_row`` is
    ``None`` where the trajectory has no calls here (a decoupled main side: the sub side keeps the sub rows)."""
    if sub_row is None and calls:
        raise ValueError("trajectory_rows: calls without a sub_row to build their rows")
    rows = [sub_row(call, meta.write(), dict(scored.reward_extra_info), scored.score)
            for call, meta in zip(calls, scored.subs, strict=True) if meta is not None]
    rows.append(main_row(scored.main.write(), scored.reward_extra_info, scored.score))
    return rows


def tokenizer_path(agent_config: Any) -> str | None:
    """``actor_rollout_ref.model.tokenizer_path``, else ``.path``, of an agent's full config."""
    return setting(agent_config, "actor_rollout_ref.model.tokenizer_path", None) or setting(
        agent_config, "actor_rollout_ref.model.path", None
    )


def per_config(config: DictConfig, build: Callable[[DictConfig], _T]) -> _T:
    """``build(config)``, memoised per ``build`` and config object (see :data:`_PER_CONFIG`): what a loop
    reads from the trainer config is typed once per loop worker, not once per rollout."""
    key = (build, id(config))
    hit = _PER_CONFIG.get(key)
    if hit is not None and hit[0] is config:
        return hit[1]
    value = build(config)  # raises for a bad config: nothing is cached then
    if len(_PER_CONFIG) >= MEMO_SIZE:
        _PER_CONFIG.clear()
    _PER_CONFIG[key] = (config, value)
    return value


def settings_of(config: DictConfig) -> DelegationSettings:
    """``DelegationSettings.from_config(config)``, memoised per config object (:func:`per_config`)."""
    return per_config(config, DelegationSettings.from_config)


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
            trust = bool(setting(agent_config, "actor_rollout_ref.model.trust_remote_code", False))
            TOKENIZERS[path] = hf_tokenizer(path, trust_remote_code=trust)
        tokenizer = TOKENIZERS[path]
    rollout = "actor_rollout_ref.rollout"
    prompt_length = int(setting(agent_config, f"{rollout}.prompt_length", loop.rollout_config.prompt_length))
    response_length = int(setting(agent_config, f"{rollout}.response_length", loop.rollout_config.response_length))
    return AgentHandle(name, client, tokenizer, prompt_length, min(response_tokens, response_length))


def preempted(generations: list[Generation]) -> int:
    counts = [g.num_preempted for g in generations if g.num_preempted is not None]
    return sum(counts) if counts else -1


class UnscoredRows:
    """What the multi-agent trainer hands verl's agent loops in place of reward workers (it starts none: every
    multi-agent loop scores its rows itself, :func:`output_row`'s ``reward_score``). verl's agent loop calls a
    reward worker only for a trajectory whose last output has no ``reward_score``; this stand-in refuses it with
    the rule, where an empty list would fail in ``random.choice``. Picklable: it travels to every agent-loop
    worker."""

    class _Refuse:
        def remote(self, data: Any) -> None:
            raise ValueError(
                "an agent loop returned a trajectory whose last output has reward_score None: in multi-agent "
                "mode the loop scores its own rows (reward_score and the RowMeta score on every row, "
                "docs/agent_loops.md, 'Rows'); the multi-agent trainer starts no verl reward workers"
            )

    compute_score = _Refuse()


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


