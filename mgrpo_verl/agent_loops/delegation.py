"""Hierarchical rollout of the relay task: a main agent that delegates to a sub-agent.

``RelayDelegationLoop`` (verl agent loop ``mgrpo_relay``): the main agent plans, the sub-agent is called ``d``
times concurrently on its own model (``d`` follows from the plan's token ids), and the main agent answers from
the reports. ``RelaySubCallLoop`` (``mgrpo_relay_sub``) is one such call, served by a decoupled sub side. Rows:
``[sub rows in call order..., main row]`` in the row contract of :mod:`mgrpo_verl.rowmeta`. The steps, why the
main row is last, each row's fields and the errors: ``docs/agent_loops.md``, "The relay loop".
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.utils import normalize_token_ids

from mgrpo_verl.envs import relay
from mgrpo_verl.agent_loops import common  # the module, not its names (see cooperative.py)
from mgrpo_verl.rowmeta import ROW_META, RowMeta, main_traj_id, sub_traj_id
from mgrpo_verl.agent_loops.remote_sub import (
    RemoteSubAgent,
    SubCallReply,
    SubCallRequest,
    call_or_error,
)

logger = logging.getLogger(__name__)


#: The agent loop a sub side runs for one relay call (:class:`RelaySubCallLoop`).
SUB_CALL_LOOP_NAME = "mgrpo_relay_sub"

#: Appended to an observation shortened to fit the main agent's response budget.
TRUNCATED = "...(truncated)"


#: Per-process memo of the resolved sub-agent per (server manager, trainer config, tokenizer) objects, for
#: the reason and rules of :data:`mgrpo_verl.agent_loops.common.MEMO_SIZE`.
_SUB_AGENTS: dict[tuple[int, int, int], tuple[tuple[Any, Any, Any], common.AgentHandle]] = {}


@dataclass
class _MainTurns:
    """The main agent's growing multi-turn sequence: ``runtime`` = prompt ⊕ response so far, with one mask
    and log-prob entry per response token."""

    messages: list[dict[str, Any]]
    request_id: str  # one per trajectory: both main generations go to the same server (prefix cache)
    response_length: int
    seeds: common.SeedStream = field(default_factory=lambda: common.SeedStream(None))
    runtime: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    generations: list[common.Generation] = field(default_factory=list)
    calls_seconds: float = 0.0
    observation_truncated: bool = False

    @property
    def room(self) -> int:
        """New tokens the response can still take."""
        return max(0, self.response_length - len(self.mask))

    def main_row(self, mgrpo: dict[str, Any], reward_extra_info: dict[str, Any], score: float) -> AgentLoopOutput:
        """The main row, cut to ``response_length`` (ids, mask and log-probs together)."""
        start = len(self.runtime) - len(self.mask)  # where the response begins (CT merges may edit the prefix)
        n = min(len(self.mask), self.response_length)
        return common.output_row(
            self.runtime[:start],
            self.runtime[start : start + n],
            self.mask[:n],
            self.logprobs[:n],
            num_turns=2 + len(self.generations),  # user prompt, plan, observation (+ answer when there was room)
            metrics=AgentLoopMetrics(
                generate_sequences=sum(g.seconds for g in self.generations),
                tool_calls=self.calls_seconds,
                num_preempted=common.preempted(self.generations),
            ),
            extra_fields={**common.merge_generation_fields(self.generations), ROW_META: mgrpo,
                          "reward_extra_info": reward_extra_info},
            reward_score=score,
        )


def sub_row(
    prompt_ids: list[int], call: common.Generation, mgrpo: dict[str, Any], reward_extra_info: dict[str, Any],
    score: float,
) -> AgentLoopOutput:
    """The row of one sub-agent call: every response token generated (mask 1); user prompt + answer turns."""
    return common.output_row(
        prompt_ids,
        call.token_ids,
        [1] * len(call.token_ids),
        call.log_probs,
        num_turns=2,
        metrics=AgentLoopMetrics(generate_sequences=call.seconds, num_preempted=common.preempted([call])),
        extra_fields={**call.extra_fields, ROW_META: mgrpo, "reward_extra_info": dict(reward_extra_info)},
        reward_score=score,
    )


@register(relay.AGENT_LOOP_NAME)
class RelayDelegationLoop(AgentLoopBase):
    """The relay task's hierarchical rollout (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = common.settings_of(self.config)
        #: main agent's response budget (``actor_rollout_ref.rollout.response_length``)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        """Rows ``[sub rows..., main row]`` of one main trajectory; ``kwargs`` is the dataset row (verl passes
        ``raw_prompt``, ``reward_model``, ``uid``, ``session_id``, ...; without ``uid`` a fresh id is used)."""
        sub = self._resolve_sub_agent()  # before any generation: an unknown sub-agent is a config error
        digit = str(kwargs["reward_model"]["ground_truth"])
        prefix = f"{kwargs.get('uid', uuid4().hex)}/{kwargs.get('session_id', 0)}"
        turns = _MainTurns(list(kwargs["raw_prompt"]), uuid4().hex, self.response_length,
                           seeds=common.trajectory_seeds(self, kwargs))
        turns.runtime = await self.ct_build_initial_tokens(turns.messages)

        plan_text = await self._main_turn(turns, sampling_params, self.settings.delegation.plan_tokens)
        d = self.settings.num_calls(turns.generations[0].token_ids)
        if isinstance(sub.client, RemoteSubAgent):
            return await self._run_remote(turns, sub, kwargs, prefix, digit, plan_text, d, sampling_params)
        sub_prompt = self._sub_prompt(sub, self.settings.sub_messages(kwargs, plan_text))
        start = time.perf_counter()
        calls = await asyncio.gather(*(
            self._call_sub(sub, sub_prompt, turns.seeds.child(f"{sub.name}/{j}").params(sampling_params))
            for j in range(d)
        ))
        turns.calls_seconds = time.perf_counter() - start
        texts = [
            call if isinstance(call, str) else sub.tokenizer.decode(call.token_ids, skip_special_tokens=True).strip()
            for call in calls
        ]
        await self._observe(turns, plan_text, "Helper said: " + " | ".join(texts) if d else "Helper was not asked.")
        answer_text = (await self._main_turn(turns, sampling_params, self.settings.delegation.answer_tokens)
                       if turns.room else "")

        answered = [call for call in calls if not isinstance(call, str)]
        scored = common.score_trajectory(
            self.settings, kwargs, prefix, answer_text, digit,
            [common.SubReport(sub.name, j, None if isinstance(call, str) else text)
             for j, (call, text) in enumerate(zip(calls, texts))],
            observation_truncated=turns.observation_truncated,
            main_tokens=sum(len(g.token_ids) for g in turns.generations),
            sub_tokens=sum(len(call.token_ids) for call in answered),
        )
        return common.trajectory_rows(
            scored, calls, lambda call, meta, info, score: sub_row(sub_prompt, call, meta, info, score), turns.main_row
        )

    async def _run_remote(
        self, turns: _MainTurns, sub: common.AgentHandle, kwargs: dict[str, Any], prefix: str, digit: str,
        plan_text: str, d: int, sampling_params: dict[str, Any],
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
                traj_id=sub_traj_id(prefix, sub.name, j),
                parent_traj_id=main_traj_id(prefix),
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
            *(asyncio.wait_for(call_or_error(sub.client, r), timeout=self.settings.delegation.timeout_s)
              for r in requests),
            return_exceptions=True,
        )
        turns.calls_seconds = time.perf_counter() - start
        replies = [
            r if isinstance(r, (SubCallReply, str))
            else f"<error: timed out after {self.settings.delegation.timeout_s:g}s>"
            if isinstance(r, asyncio.TimeoutError)
            else f"<error: {type(r).__name__}: {r}>"
            for r in replies
        ]
        texts = [r if isinstance(r, str) else r.text for r in replies]
        await self._observe(turns, plan_text, "Helper said: " + " | ".join(texts) if d else "Helper was not asked.")
        answer_text = (await self._main_turn(turns, sampling_params, self.settings.delegation.answer_tokens)
                       if turns.room else "")
        used = [r.traj_id for r in replies if isinstance(r, SubCallReply)]
        scored = common.score_trajectory(
            self.settings, kwargs, prefix, answer_text, digit, [],  # the sub side keeps and scores the sub rows
            calls=d, failed_calls=d - len(used), observation_truncated=turns.observation_truncated, session=session,
            sub_calls=used, main_tokens=sum(len(g.token_ids) for g in turns.generations),
            sub_tokens=sum(r.response_tokens for r in replies if isinstance(r, SubCallReply)),
        )
        return common.trajectory_rows(scored, [], None, turns.main_row)  # the sub side keeps the sub rows

    async def _main_turn(self, turns: _MainTurns, sampling_params: dict[str, Any], max_tokens: int) -> str:
        """One main-agent generation (at most ``max_tokens`` and the room left), appended; returns its text."""
        gen = await common.generate(
            self.server_manager, turns.request_id, turns.runtime, turns.seeds.params(sampling_params),
            min(max_tokens, turns.room),
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
        self, sub: common.AgentHandle, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> common.Generation | str:
        """One sub-agent call; a failure or timeout is returned as the ``"<error: ...>"`` text the main sees."""
        try:
            return await asyncio.wait_for(
                common.generate(sub.client, uuid4().hex, prompt_ids, sampling_params, sub.response_tokens),
                timeout=self.settings.delegation.timeout_s,
            )
        except asyncio.TimeoutError:
            logger.warning("sub-agent %r call timed out after %gs", sub.name, self.settings.delegation.timeout_s)
            return f"<error: timed out after {self.settings.delegation.timeout_s:g}s>"
        except Exception as exc:
            logger.warning("sub-agent %r call failed: %r", sub.name, exc)
            return f"<error: {type(exc).__name__}: {exc}>"

    def _resolve_sub_agent(self) -> common.AgentHandle:
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
        if len(_SUB_AGENTS) >= common.MEMO_SIZE:
            _SUB_AGENTS.clear()
        _SUB_AGENTS[key] = ((self.server_manager, self.config, self.tokenizer), sub)
        return sub

    def _build_sub_agent(self) -> common.AgentHandle:
        """:meth:`_resolve_sub_agent` without the memo."""
        return common.resolve_agent(self, self.settings.sub_agent, self.settings.delegation.sub_response_tokens)

    def _sub_prompt(self, sub: common.AgentHandle, messages: list[dict[str, Any]]) -> list[int]:
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
    """One relay sub-agent call, run by a sub side in decoupled mode (:mod:`mgrpo_verl.agent_loops.sub_service`).

    The same call as :meth:`RelayDelegationLoop._call_sub` in the synchronous mode: the prompt is the chat
    ``raw_prompt`` in this model's chat template, left-truncated to its ``prompt_length``; at most
    ``multi_agent.delegation.sub_response_tokens`` new tokens (and its ``response_length``); the score is
    the task scorer's ``sub`` score against ``reward_model.ground_truth`` (with ``agent=<the call's agent>`` for a
    scorer that takes it). ``mgrpo_call`` names the row
    (``traj_id``, ``parent_traj_id``, ``agent``). Returns one sub row.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = common.settings_of(self.config)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        call = kwargs["mgrpo_call"]
        ground_truth = kwargs["reward_model"]["ground_truth"]
        tokenized = self.tokenizer.apply_chat_template(
            list(kwargs["raw_prompt"]), add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs
        )
        prompt_ids = normalize_token_ids(tokenized)[-int(self.rollout_config.prompt_length) :]
        max_tokens = min(self.settings.delegation.sub_response_tokens, int(self.rollout_config.response_length))
        gen = await common.generate(self.server_manager, uuid4().hex, prompt_ids, sampling_params, max_tokens)
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True).strip()
        score, errors = self.settings.score("sub", str(call["agent"]), text, str(ground_truth))
        meta = RowMeta(str(call["agent"]), str(call["traj_id"]), str(call["parent_traj_id"]), score)
        return [sub_row(prompt_ids, gen, meta.write(), {"acc": score, "calls": 1, common.REWARD_ERRORS: errors}, score)]
