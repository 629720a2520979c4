"""Hierarchical rollout of the relay task: a main agent that delegates to a sub-agent.

``RelayDelegationLoop`` (verl agent loop ``mgrpo_relay``, chosen per row by the dataset column
``agent_name``, see :mod:`mgrpo_verl.envs.relay`) runs one main trajectory:

1. the main agent writes a plan (at most ``plan_tokens`` tokens) from its prompt;
2. it decides how many times the sub-agent is called:
   ``d = min_calls + sum(plan token ids) % (max_calls - min_calls + 1)``, a function of the main agent's
   own output, so ``d`` varies between rollouts (and is 0 sometimes when ``min_calls`` is 0);
3. the ``d`` calls run concurrently on the sub-agent's own model: ``server_manager.for_agent(sub)``
   (a :class:`~mgrpo_verl.rollout.multi_client.MultiAgentLLMClient`), or ``server_manager`` itself when
   it has no ``for_agent`` (single-agent baseline: one model plays every role). Each call sees the
   secret digit and the plan (prompt in the sub-agent's own tokenizer) and yields one sub row;
4. the main agent sees the observation ``"Helper said: a1 | a2 | ..."`` (``"Helper was not asked."``
   when ``d = 0``), appended as a user turn with response mask 0 and log-prob 0, and writes its final
   answer (at most ``answer_tokens`` tokens);
5. the main row is plan ⊕ observation ⊕ answer, one multi-turn response within the main
   ``response_length``: an observation too long to leave ``answer_tokens`` of room is shortened (text
   prefix + ``"...(truncated)"``), and whatever still overflows is cut (ids, mask and log-probs together).

Rows returned: ``[sub rows in call order..., main row]``. The main row is **last** because verl treats
``outputs[-1]`` as the trajectory's final output: ``AgentLoopWorkerTQ._agent_loop_postprocess`` computes
the reward for it only and then overwrites every earlier output's ``reward_score`` and
``reward_extra_info`` with the final one's, and validation keeps the last row of each session.

That overwrite is why every row carries its **own** score in ``extra_fields["mgrpo"]["score"]`` (the
M-GRPO trainer reads it from there), while ``reward_score`` (verl's ``rm_scores``) is the main score on
every row: the loop sets it itself, so verl runs no reward loop of its own and every row has the same
set of fields, as ``list_of_dict_to_tensordict`` requires (it takes the keys from the first row).

Row metadata, ``extra_fields`` of every row:

* ``"mgrpo"``: ``{"agent", "traj_id", "parent_traj_id", "score", "calls", "failed_calls",
  "observation_truncated"}`` with ``traj_id = "{uid}/{session_id}/main"`` for the main row and
  ``"{uid}/{session_id}/{sub}/{j}"`` for call ``j``; ``parent_traj_id`` is ``""`` for the main row and
  the main's ``traj_id`` for sub rows; ``calls`` is ``d`` on the main row and 1 on sub rows;
  ``failed_calls`` counts sub calls that raised or timed out (main row; 0 on sub rows);
  ``observation_truncated`` is True when the observation was shortened to fit (False on sub rows);
* what the server put in each generation's ``TokenOutput.extra_fields`` (``min_global_steps``,
  ``max_global_steps``, ``global_steps``, ...): verl turns the first two into the row's staleness tags.
  The main row has two generations: min of the mins, max of the maxes, speculative-decoding counters
  summed, any other key from the last generation;
* ``"reward_extra_info"``: :func:`query_stats`: ``{"acc": main score, "calls": d, "failed_calls",
  "main_tokens", "sub_tokens" (response tokens generated), "reward/errors", "answer", "source", "level", "id"}``.

Errors: a sub-agent generation that raises or exceeds ``timeout_s`` becomes ``"<error: ...>"`` in the
observation, yields no sub row and is counted in ``failed_calls``; a score that raises or is not a finite
number is 0, logged and counted in ``reward_extra_info["reward/errors"]`` (:func:`safe_score`: model output
never fails the step); configuration errors (bad
``multi_agent.delegation`` values, an unknown sub-agent name) raise.

``AgentLoopWorkerTQ`` (verl's v1 trainer) accepts a list of outputs; verl's legacy ``AgentLoopWorker``
accepts one output only, so this loop needs the v1 trainer. The module must be imported in each
agent-loop worker process for ``@register`` to take effect.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from omegaconf import DictConfig, OmegaConf

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import SPEC_DECODE_EXTRA_KEYS
from verl.utils import hf_tokenizer, normalize_token_ids

from mgrpo_verl.config.schema import AgentConfig, DelegationConfig, load_multi_agent
from mgrpo_verl.envs import relay
from mgrpo_verl.rollout.remote_sub import RemoteSubAgent, SubCallReply, SubCallRequest, call_or_error

logger = logging.getLogger(__name__)


#: tokenizer path -> tokenizer, for sub-agents whose model differs from the main agent's (per process).
_TOKENIZERS: dict[str, Any] = {}

#: The sampling-param key both verl's vLLM server and our HF server read as the cap on new tokens.
MAX_TOKENS_KEY = "max_tokens"

#: The agent loop a sub side runs for one relay call (:class:`RelaySubCallLoop`).
SUB_CALL_LOOP_NAME = "mgrpo_relay_sub"

#: Appended to an observation shortened to fit the main agent's response budget.
TRUNCATED = "...(truncated)"


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
class _Generation:
    """One generation, capped at the requested number of new tokens."""

    token_ids: list[int]
    log_probs: list[float]  # zeros where the backend returned none
    extra_fields: dict[str, Any]
    num_preempted: int | None
    seconds: float


@dataclass(frozen=True)
class _SubAgent:
    """Where and how the sub-agent's calls run."""

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
#: objects alive (so an id is never reused while cached) and is checked by identity. Bounded: cleared when full.
_SETTINGS: dict[int, tuple[Any, DelegationSettings]] = {}
_SUB_AGENTS: dict[tuple[int, int, int], tuple[tuple[Any, Any, Any], _SubAgent]] = {}
_MEMO_SIZE = 32


@dataclass
class _MainTurns:
    """The main agent's growing multi-turn sequence: ``runtime`` = prompt ⊕ response so far, with one mask
    and log-prob entry per response token."""

    messages: list[dict[str, Any]]
    request_id: str  # one per trajectory: both main generations go to the same server (prefix cache)
    response_length: int
    runtime: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    generations: list[_Generation] = field(default_factory=list)
    calls_seconds: float = 0.0
    observation_truncated: bool = False

    @property
    def room(self) -> int:
        """New tokens the response can still take."""
        return max(0, self.response_length - len(self.mask))

    def row(self, extra_fields: dict[str, Any], score: float) -> AgentLoopOutput:
        """The main row, cut to ``response_length`` (ids, mask and log-probs together)."""
        start = len(self.runtime) - len(self.mask)  # where the response begins (CT merges may edit the prefix)
        n = min(len(self.mask), self.response_length)
        return _row(
            self.runtime[:start],
            self.runtime[start : start + n],
            self.mask[:n],
            self.logprobs[:n],
            num_turns=2 + len(self.generations),  # user prompt, plan, observation (+ answer when there was room)
            metrics=AgentLoopMetrics(
                generate_sequences=sum(g.seconds for g in self.generations),
                tool_calls=self.calls_seconds,
                num_preempted=_preempted(self.generations),
            ),
            extra_fields={**_merge_generation_fields(self.generations), **extra_fields},
            reward_score=score,
        )


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


def _agent_setting(agent_config: Any, key: str, default: Any) -> Any:
    """``key`` of an agent's full config (a client's ``config``), or ``default`` when it has none."""
    if not isinstance(agent_config, DictConfig):
        return default
    return OmegaConf.select(agent_config, key, default=default)


def _tokenizer_path(agent_config: Any) -> str | None:
    """``actor_rollout_ref.model.tokenizer_path``, else ``.path``, of an agent's full config."""
    return _agent_setting(agent_config, "actor_rollout_ref.model.tokenizer_path", None) or _agent_setting(
        agent_config, "actor_rollout_ref.model.path", None
    )


def _settings_of(config: DictConfig) -> DelegationSettings:
    """``DelegationSettings.from_config(config)``, memoised per config object (see :data:`_SETTINGS`)."""
    hit = _SETTINGS.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    settings = DelegationSettings.from_config(config)  # raises for a bad config: nothing is cached then
    if len(_SETTINGS) >= _MEMO_SIZE:
        _SETTINGS.clear()
    _SETTINGS[id(config)] = (config, settings)
    return settings


def _merge_generation_fields(generations: list[_Generation]) -> dict[str, Any]:
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


async def _generate(
    client: Any, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], max_tokens: int
) -> _Generation:
    """One generation of at most ``max_tokens`` new tokens (passed as ``max_tokens``; also enforced here)."""
    params = {**sampling_params, MAX_TOKENS_KEY: max_tokens}  # a copy: vLLM's server pops keys from it
    start = time.perf_counter()
    output = await client.generate(request_id=request_id, prompt_ids=prompt_ids, sampling_params=params)
    seconds = time.perf_counter() - start
    token_ids = list(output.token_ids)[:max_tokens]
    log_probs = [float(x) for x in (output.log_probs or [])[: len(token_ids)]]
    log_probs += [0.0] * (len(token_ids) - len(log_probs))  # zeros where the backend returned none
    return _Generation(token_ids, log_probs, dict(output.extra_fields or {}), output.num_preempted, seconds)


def resolve_agent(loop: AgentLoopBase, name: str, response_tokens: int) -> _SubAgent:
    """Where agent ``name``'s generations go, as seen from ``loop``: ``loop.server_manager.for_agent(name)``
    (which raises for an unknown name), or the server manager itself without ``for_agent``. From that
    client's ``config`` (the agent's full config), when it has one: ``actor_rollout_ref.model.tokenizer_path``
    (or ``.path``) picks the tokenizer (the loop's own when equal or absent, loaded once per process),
    ``actor_rollout_ref.rollout.prompt_length`` / ``response_length`` cap its prompts and completions
    (default: the loop's rollout config); completions are also capped at ``response_tokens``."""
    manager = loop.server_manager
    client = manager.for_agent(name) if hasattr(manager, "for_agent") else manager
    agent_config = getattr(client, "config", None)
    path = _tokenizer_path(agent_config)
    tokenizer = loop.tokenizer
    if path is not None and path != _tokenizer_path(loop.config):
        if path not in _TOKENIZERS:
            trust = bool(_agent_setting(agent_config, "actor_rollout_ref.model.trust_remote_code", False))
            _TOKENIZERS[path] = hf_tokenizer(path, trust_remote_code=trust)
        tokenizer = _TOKENIZERS[path]
    rollout = "actor_rollout_ref.rollout"
    prompt_length = int(_agent_setting(agent_config, f"{rollout}.prompt_length", loop.rollout_config.prompt_length))
    response_length = int(_agent_setting(agent_config, f"{rollout}.response_length", loop.rollout_config.response_length))
    return _SubAgent(name, client, tokenizer, prompt_length, min(response_tokens, response_length))


def _preempted(generations: list[_Generation]) -> int:
    counts = [g.num_preempted for g in generations if g.num_preempted is not None]
    return sum(counts) if counts else -1


def _mgrpo(agent: str, traj_id: str, parent_traj_id: str, score: float, calls: int) -> dict[str, Any]:
    """``extra_fields["mgrpo"]`` of a row (``failed_calls`` / ``observation_truncated`` set for the main row)."""
    return {
        "agent": agent,
        "traj_id": traj_id,
        "parent_traj_id": parent_traj_id,
        "score": float(score),
        "calls": calls,
        "failed_calls": 0,
        "observation_truncated": False,
    }


def _row(
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


def _sub_row(
    prompt_ids: list[int], call: _Generation, mgrpo: dict[str, Any], reward_extra_info: dict[str, Any], score: float
) -> AgentLoopOutput:
    """The row of one sub-agent call: every response token generated (mask 1); user prompt + answer turns."""
    return _row(
        prompt_ids,
        call.token_ids,
        [1] * len(call.token_ids),
        call.log_probs,
        num_turns=2,
        metrics=AgentLoopMetrics(generate_sequences=call.seconds, num_preempted=_preempted([call])),
        extra_fields={**call.extra_fields, "mgrpo": mgrpo, "reward_extra_info": dict(reward_extra_info)},
        reward_score=score,
    )


@register(relay.AGENT_LOOP_NAME)
class RelayDelegationLoop(AgentLoopBase):
    """The relay task's hierarchical rollout (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = _settings_of(self.config)
        #: main agent's response budget (``actor_rollout_ref.rollout.response_length``)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        """Rows ``[sub rows..., main row]`` of one main trajectory; ``kwargs`` is the dataset row (verl passes
        ``raw_prompt``, ``reward_model``, ``uid``, ``session_id``, ...; without ``uid`` a fresh id is used)."""
        sub = self._resolve_sub_agent()  # before any generation: an unknown sub-agent is a config error
        digit = str(kwargs["reward_model"]["ground_truth"])
        prefix = f"{kwargs.get('uid', uuid4().hex)}/{kwargs.get('session_id', 0)}"
        turns = _MainTurns(list(kwargs["raw_prompt"]), uuid4().hex, self.response_length)
        turns.runtime = await self.ct_build_initial_tokens(turns.messages)

        plan_text = await self._main_turn(turns, sampling_params, self.settings.delegation.plan_tokens)
        d = self.settings.num_calls(turns.generations[0].token_ids)
        if isinstance(sub.client, RemoteSubAgent):
            return await self._run_remote(turns, sub, kwargs, prefix, digit, plan_text, d, sampling_params)
        sub_prompt = self._sub_prompt(sub, self.settings.sub_messages(kwargs, plan_text))
        start = time.perf_counter()
        calls = await asyncio.gather(*(self._call_sub(sub, sub_prompt, sampling_params) for _ in range(d)))
        turns.calls_seconds = time.perf_counter() - start
        texts = [
            call if isinstance(call, str) else sub.tokenizer.decode(call.token_ids, skip_special_tokens=True).strip()
            for call in calls
        ]
        await self._observe(turns, plan_text, "Helper said: " + " | ".join(texts) if d else "Helper was not asked.")
        answer_text = await self._main_turn(turns, sampling_params, self.settings.delegation.answer_tokens) if turns.room else ""

        score, errors = safe_score(self.settings.scorer, "main", answer_text, digit)
        answered = [call for call in calls if not isinstance(call, str)]
        sub_scores = [
            safe_score(self.settings.scorer, "sub", text, digit) if not isinstance(call, str) else (0.0, 0)
            for call, text in zip(calls, texts, strict=True)
        ]
        reward_extra_info = query_stats(
            kwargs,
            answer_text,
            acc=score,
            calls=d,
            failed_calls=d - len(answered),
            main_tokens=sum(len(g.token_ids) for g in turns.generations),
            sub_tokens=sum(len(call.token_ids) for call in answered),
            **{REWARD_ERRORS: errors + sum(e for _, e in sub_scores)},
        )
        rows = [
            _sub_row(
                sub_prompt,
                call,
                _mgrpo(sub.name, f"{prefix}/{sub.name}/{j}", f"{prefix}/main", sub_score, 1),
                reward_extra_info,
                score,
            )
            for j, (call, (sub_score, _)) in enumerate(zip(calls, sub_scores, strict=True))
            if not isinstance(call, str)
        ]
        main = _mgrpo(self.settings.main, f"{prefix}/main", "", score, d)
        main.update(failed_calls=len(calls) - len(rows), observation_truncated=turns.observation_truncated)
        rows.append(turns.row({"mgrpo": main, "reward_extra_info": reward_extra_info}, score))
        return rows

    async def _run_remote(
        self, turns: _MainTurns, sub: _SubAgent, kwargs: dict[str, Any], prefix: str, digit: str, plan_text: str,
        d: int, sampling_params: dict[str, Any],
    ) -> list[AgentLoopOutput]:
        """Decoupled mode: the ``d`` calls go to the sub side serving ``sub`` (:class:`RemoteSubAgent`),
        which keeps the sub rows; this process returns the main row only. Its metadata adds ``session``
        and ``sub_calls`` (the ``traj_id`` of every call whose answer the main agent saw), which the main
        side publishes so that the sub side trains on exactly those calls."""
        session = int(kwargs.get("session_id", 0))
        requests = [
            SubCallRequest(
                agent=sub.name,
                agent_loop=SUB_CALL_LOOP_NAME,
                traj_id=f"{prefix}/{sub.name}/{j}",
                parent_traj_id=f"{prefix}/main",
                uid=prefix.rsplit("/", 1)[0],
                session=session,
                messages=self.settings.sub_messages(kwargs, plan_text),
                ground_truth=digit,
                main_step=int(kwargs.get("global_steps", 0) or 0),
            )
            for j in range(d)
        ]
        start = time.perf_counter()
        replies = await asyncio.gather(
            *(asyncio.wait_for(call_or_error(sub.client, r), timeout=self.settings.delegation.timeout_s) for r in requests),
            return_exceptions=True,
        )
        turns.calls_seconds = time.perf_counter() - start
        replies = [
            r if isinstance(r, (SubCallReply, str))
            else f"<error: timed out after {self.settings.delegation.timeout_s:g}s>" if isinstance(r, asyncio.TimeoutError)
            else f"<error: {type(r).__name__}: {r}>"
            for r in replies
        ]
        texts = [r if isinstance(r, str) else r.text for r in replies]
        await self._observe(turns, plan_text, "Helper said: " + " | ".join(texts) if d else "Helper was not asked.")
        answer_text = await self._main_turn(turns, sampling_params, self.settings.delegation.answer_tokens) if turns.room else ""
        score, errors = safe_score(self.settings.scorer, "main", answer_text, digit)
        used = [r.traj_id for r in replies if isinstance(r, SubCallReply)]
        main = _mgrpo(self.settings.main, f"{prefix}/main", "", score, d)
        main.update(
            failed_calls=d - len(used),
            observation_truncated=turns.observation_truncated,
            session=session,
            sub_calls=used,
        )
        stats = query_stats(
            kwargs,
            answer_text,
            acc=score,
            calls=d,
            failed_calls=d - len(used),
            main_tokens=sum(len(g.token_ids) for g in turns.generations),
            sub_tokens=sum(r.response_tokens for r in replies if isinstance(r, SubCallReply)),
            **{REWARD_ERRORS: errors},
        )
        return [turns.row({"mgrpo": main, "reward_extra_info": stats}, score)]

    async def _main_turn(self, turns: _MainTurns, sampling_params: dict[str, Any], max_tokens: int) -> str:
        """One main-agent generation (at most ``max_tokens`` and the room left), appended; returns its text."""
        gen = await _generate(
            self.server_manager, turns.request_id, turns.runtime, sampling_params, min(max_tokens, turns.room)
        )
        merged, turns.mask, turns.logprobs = await self.ct_merge_assistant_token(
            turns.runtime, gen.token_ids, turns.mask, turns.logprobs, assistant_logprobs=gen.log_probs
        )
        turns.runtime = merged.token_ids
        turns.generations.append(gen)
        return self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)

    async def _observe(self, turns: _MainTurns, plan_text: str, observation: str) -> None:
        """Append the observation as a user turn (mask 0, log-prob 0), with the next generation prompt.

        It keeps ``answer_tokens`` of room for the answer: an observation that does not fit is replaced by
        its longest text prefix that does, marked ``TRUNCATED`` (``observation_truncated`` notes it). When not
        even the bare marker fits, the row is cut to ``response_length`` at the end (ids, mask and
        log-probs together) and the answer gets what room is left, possibly none.
        """
        history = turns.messages + [{"role": "assistant", "content": plan_text}]
        budget = turns.response_length - self.settings.delegation.answer_tokens
        merged = await self._merge_observation(turns, history, observation)
        if len(merged[1]) > budget:
            turns.observation_truncated = True
            low, high = 0, len(observation)  # longest prefix length known to fit / not yet excluded
            merged = await self._merge_observation(turns, history, TRUNCATED)
            while low < high:
                mid = (low + high + 1) // 2
                candidate = await self._merge_observation(turns, history, observation[:mid] + TRUNCATED)
                if len(candidate[1]) <= budget:
                    low, merged = mid, candidate
                else:
                    high = mid - 1
        turns.runtime, turns.mask, turns.logprobs = merged

    async def _merge_observation(
        self, turns: _MainTurns, history: list[dict[str, Any]], observation: str
    ) -> tuple[list[int], list[int], list[float]]:
        """(tokens, mask, log-probs) of ``turns`` with ``observation`` appended; ``turns`` is not changed."""
        merged, mask, logprobs = await self.ct_merge_context_msg(
            history, history + [{"role": "user", "content": observation}], turns.runtime, turns.mask, turns.logprobs
        )
        return merged.token_ids, mask, logprobs

    async def _call_sub(
        self, sub: _SubAgent, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> _Generation | str:
        """One sub-agent call; a failure or timeout is returned as the ``"<error: ...>"`` text the main sees."""
        try:
            return await asyncio.wait_for(
                _generate(sub.client, uuid4().hex, prompt_ids, sampling_params, sub.response_tokens),
                timeout=self.settings.delegation.timeout_s,
            )
        except asyncio.TimeoutError:
            logger.warning("sub-agent %r call timed out after %gs", sub.name, self.settings.delegation.timeout_s)
            return f"<error: timed out after {self.settings.delegation.timeout_s:g}s>"
        except Exception as exc:
            logger.warning("sub-agent %r call failed: %r", sub.name, exc)
            return f"<error: {type(exc).__name__}: {exc}>"

    def _resolve_sub_agent(self) -> _SubAgent:
        """The sub-agent's client, tokenizer and limits.

        The client is ``server_manager.for_agent(sub_agent)`` (which raises for an unknown name), or the
        server manager itself without ``for_agent``. From the client's ``config`` (the agent's full
        config), when it has one: ``actor_rollout_ref.model.tokenizer_path`` (or ``.path``) picks the
        tokenizer (the main agent's when equal or absent), ``actor_rollout_ref.rollout.prompt_length`` /
        ``response_length`` cap the sub prompt and answer (default: the main agent's rollout config).
        Memoised per (server manager, trainer config, tokenizer) objects, see :data:`_SUB_AGENTS`.
        """
        key = (id(self.server_manager), id(self.config), id(self.tokenizer))
        hit = _SUB_AGENTS.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], (self.server_manager, self.config, self.tokenizer))):
            return hit[1]
        sub = self._build_sub_agent()  # raises for an unknown sub-agent: nothing is cached then
        if len(_SUB_AGENTS) >= _MEMO_SIZE:
            _SUB_AGENTS.clear()
        _SUB_AGENTS[key] = ((self.server_manager, self.config, self.tokenizer), sub)
        return sub

    def _build_sub_agent(self) -> _SubAgent:
        """:meth:`_resolve_sub_agent` without the memo."""
        return resolve_agent(self, self.settings.sub_agent, self.settings.delegation.sub_response_tokens)

    def _sub_prompt(self, sub: _SubAgent, messages: list[dict[str, Any]]) -> list[int]:
        """Prompt token ids of a sub-agent call (its own tokenizer), left-truncated to its prompt length."""
        tokenized = sub.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=True,
            tokenize=True,
            **self.apply_chat_template_kwargs,
        )
        return normalize_token_ids(tokenized)[-sub.prompt_length :]


@register(SUB_CALL_LOOP_NAME)
class RelaySubCallLoop(AgentLoopBase):
    """One relay sub-agent call, run by a sub side in decoupled mode (:mod:`mgrpo_verl.rollout.sub_service`).

    The same call as :meth:`RelayDelegationLoop._call_sub` in the synchronous mode: the prompt is the chat
    ``raw_prompt`` in this model's chat template, left-truncated to its ``prompt_length``; at most
    ``multi_agent.delegation.sub_response_tokens`` new tokens (and its ``response_length``); the score is
    the task scorer's ``sub`` score against ``reward_model.ground_truth``. ``mgrpo_call`` names the row
    (``traj_id``, ``parent_traj_id``, ``agent``). Returns one sub row.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = _settings_of(self.config)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        call = kwargs["mgrpo_call"]
        ground_truth = kwargs["reward_model"]["ground_truth"]
        tokenized = self.tokenizer.apply_chat_template(
            list(kwargs["raw_prompt"]), add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs
        )
        prompt_ids = normalize_token_ids(tokenized)[-int(self.rollout_config.prompt_length) :]
        max_tokens = min(self.settings.delegation.sub_response_tokens, int(self.rollout_config.response_length))
        gen = await _generate(self.server_manager, uuid4().hex, prompt_ids, sampling_params, max_tokens)
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True).strip()
        score, errors = safe_score(self.settings.scorer, "sub", text, str(ground_truth))
        meta = _mgrpo(str(call["agent"]), str(call["traj_id"]), str(call["parent_traj_id"]), score, 1)
        return [_sub_row(prompt_ids, gen, meta, {"acc": score, "calls": 1, REWARD_ERRORS: errors}, score)]
