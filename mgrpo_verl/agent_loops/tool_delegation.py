"""Delegation by tool call: agent loop ``mgrpo_delegate`` (specification: ``docs/agent_loops.md``).

The main agent runs verl's multi-turn tool loop with one extra tool per sub-agent, ``ask_<sub>(task: str)``;
each call runs the sub-agent's own verl tool loop on its own model, tokenizer and tools, and the sub-agent's
final text is the tool response. What differs from verl's ``ToolAgentLoop`` (subclassed; sub-agents compose
it): every call of a turn is answered (calls beyond ``max_parallel_calls``, malformed calls from the
``hermes_strict`` parser, unknown tools and bad arguments get an ``<error: ...>`` observation, counted, where
verl drops them), tool responses that do not fit are replaced, and the rollout returns rows ``[sub rows...,
main row]`` with M-GRPO's metadata (the contract of :mod:`mgrpo_verl.agent_loops.delegation`).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

from omegaconf import OmegaConf

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    register,
)
from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.tools.tool_registry import load_all_tools
from verl.utils import hf_tokenizer
from verl.utils.import_utils import resolve_config_path
from verl.workers.rollout.replica import TokenOutput

from mgrpo_verl.agent_loops.tool_parser import CALL_BLOCK, FORMAT, MAX_CALL_CHARS, ToolCall
from mgrpo_verl.agent_loops.tool_parser import error_text as _error
from mgrpo_verl.envs import relay
# the module, not its names: importing it first triggers this module's registration mid-way (plugin.py)
from mgrpo_verl.agent_loops import common, delegation
from mgrpo_verl.config import setting
from mgrpo_verl.rowmeta import ROW_META

logger = logging.getLogger(__name__)

#: ``@register`` name of :class:`ToolDelegationLoop` (the ``agent_name`` of dataset rows).
AGENT_LOOP_NAME = relay.TOOLS_AGENT_LOOP_NAME

#: ``multi_turn.format`` values already warned about (see ``ToolDelegationLoop.__init__``).
_WARNED_FORMATS: set[str] = set()

#: What the main agent sees when a sub-agent's report is empty.
NO_ANSWER = "(no answer)"

#: (tool_config_path, function_tool_path) -> loaded tools, for sub-agents (per process, like verl's worker).
_TOOLS: dict[tuple[Optional[str], Optional[str]], list[Any]] = {}

#: model path -> ``model_type`` of its ``config.json`` (``None`` when unreadable), for sub-agents' builders.
_MODEL_TYPES: dict[str, Optional[str]] = {}

class _SubToolLoop(ToolAgentLoop):
    """verl's ``ToolAgentLoop`` for sub-agent calls; it counts the tools it runs (by name) in the rollout's
    :attr:`_Rollout.tool_uses`, for the evaluation's per-agent statistics, and answers a call the
    ``hermes_strict`` parser could not read with its error (verl would look up a tool named "")."""

    async def _call_tool(self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: Any):
        error = getattr(tool_call, "error", None)
        if error:
            return ToolResponse(text=error), 0.0, {}
        state = _ROLLOUT.get()
        if state is not None:
            state.tool_uses[tool_call.name] += 1
        return await super()._call_tool(tool_call, tools_kwargs, agent_data)


def _decode_arguments(tool_call: FunctionCall) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """``(arguments, None)`` when the call's ``arguments`` are a JSON object, else ``(None, error text)``. Never
    raises on model output: a string over :data:`~mgrpo_verl.agent_loops.tool_parser.MAX_CALL_CHARS` is refused
    before decoding; JSON nested too deeply (``RecursionError``) or an int over Python's digit limit
    (``ValueError``) is an error like any invalid JSON."""
    name, text = tool_call.name, tool_call.arguments
    if not isinstance(text, str) or len(text) > MAX_CALL_CHARS:
        size = f"{len(text)} characters" if isinstance(text, str) else type(text).__name__
        limit = f"a JSON object of at most {MAX_CALL_CHARS} characters"
        return None, _error(f"arguments of {name} must be {limit}, got {size}")
    try:
        arguments = json.loads(text)
    except (ValueError, RecursionError, MemoryError) as exc:  # JSONDecodeError is a ValueError
        return None, _error(f"arguments of {name} are not valid JSON: {type(exc).__name__}: {str(exc)[:200]}")
    if not isinstance(arguments, dict):
        return None, _error(f"arguments of {name} must be a JSON object, got {text[:200]}")
    return arguments, None


def _strip_calls(text: str) -> str:
    """``text`` without tool-call blocks (closed or not), stripped."""
    return CALL_BLOCK.sub("", text).strip()


def _fit(values: Optional[list[float]], n: int) -> list[float]:
    """``values`` cut or zero-padded to ``n`` entries."""
    values = [float(x) for x in (values or [])[:n]]
    return values + [0.0] * (n - len(values))


# ----------------------------------------------------------------------------------------------------
# generations: one route per loop, one recorder per rollout / sub-agent call (found through a context var)


class _Recorder:
    """Generates on ``client`` for one trajectory: seeds each request from ``seeds``, caps new tokens at ``cap``
    and the room left in ``response_length`` (counted from the first prompt it sees), cuts over-long outputs,
    fills missing log-probs with zeros and keeps every generation (for the row's server fields and final text)."""

    def __init__(self, client: Any, response_length: int, cap: Optional[int] = None,
                 seeds: Optional[common.SeedStream] = None):
        self.client = client
        self.seeds = seeds or common.SeedStream(None)
        self.response_length = response_length
        self.cap = cap
        self.generations: list[common.Generation] = []
        self._prompt_length: Optional[int] = None

    async def generate(
        self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        if self._prompt_length is None:
            self._prompt_length = len(prompt_ids)
        room = self.response_length - (len(prompt_ids) - self._prompt_length)
        max_tokens = max(1, min(room, self.cap) if self.cap else room)
        # a copy: vLLM's server pops keys from it
        params = {**self.seeds.params(sampling_params), common.MAX_TOKENS_KEY: max_tokens}
        start = time.perf_counter()
        output = await self.client.generate(
            request_id=request_id, prompt_ids=prompt_ids, sampling_params=params, **kwargs
        )
        seconds = time.perf_counter() - start
        token_ids = list(output.token_ids)[:max_tokens]
        log_probs = _fit(output.log_probs, len(token_ids))
        self.generations.append(
            common.Generation(token_ids, log_probs, dict(output.extra_fields or {}), output.num_preempted, seconds)
        )
        return output.model_copy(update={"token_ids": token_ids, "log_probs": log_probs})

    def final_text(self, tokenizer: Any) -> str:
        """The last generation's text without tool calls ("" when there was none)."""
        if not self.generations:
            return ""
        return _strip_calls(tokenizer.decode(self.generations[-1].token_ids, skip_special_tokens=True))


#: The recorder of the trajectory generating in the current task: the main rollout's, or a sub call's.
_RECORDER: contextvars.ContextVar[Optional[_Recorder]] = contextvars.ContextVar("mgrpo_tool_recorder", default=None)


class _Route:
    """A loop's ``server_manager``: the current trajectory's recorder, or ``client`` outside a rollout."""

    def __init__(self, client: Any):
        self.client = client

    async def generate(self, **kwargs: Any) -> TokenOutput:
        recorder = _RECORDER.get()
        return await (recorder or self.client).generate(**kwargs)


# ----------------------------------------------------------------------------------------------------
# settings, sub-agents, per-rollout state


@dataclass(frozen=True)
class DelegationTool:
    """``ask_<agent>(task)``: a tool entry of the main agent (schema only; the loop runs it)."""

    agent: str
    name: str
    tool_schema: OpenAIFunctionToolSchema

    @classmethod
    def for_agent(cls, agent: str) -> DelegationTool:
        name = relay.delegation_tool_name(agent)
        schema = OpenAIFunctionToolSchema.model_validate(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"Delegate a task to the sub-agent {agent}; returns its report.",
                    "parameters": {
                        "type": "object",
                        "properties": {"task": {"type": "string", "description": f"What {agent} should do."}},
                        "required": ["task"],
                    },
                },
            }
        )
        return cls(agent, name, schema)


@dataclass(frozen=True)
class _SubAgent:
    """Where and how one sub-agent's calls run (resolved once per rollout)."""

    name: str
    client: Any
    tokenizer: Any
    response_length: int
    response_tokens: int
    loop: ToolAgentLoop


@dataclass
class _SubCall:
    """One started delegation call: ``order`` over all calls of the rollout, ``index`` among ``agent``'s."""

    order: int
    agent: str
    index: int
    output: Optional[AgentLoopOutput] = None
    generations: list[common.Generation] = field(default_factory=list)
    report: str = ""


@dataclass
class _Rollout:
    """Per-rollout state shared by the main loop's hooks (through :data:`_ROLLOUT`)."""

    sampling_params: dict[str, Any]
    tools_kwargs: dict[str, Any]
    subs: dict[str, _SubAgent]
    main: _Recorder
    calls: list[_SubCall] = field(default_factory=list)
    failed_calls: int = 0
    observation_truncated: bool = False
    #: tool name -> calls run, of the main agent's own tools and of the sub-agents' tools (delegation excluded)
    tool_uses: Counter = field(default_factory=Counter)
    #: tool calls of the main agent that could not be parsed (``tool/parse_errors``)
    parse_errors: int = 0

    def fail(self, text: str) -> tuple[ToolResponse, float, dict]:
        """An error observation, counted in ``failed_calls``."""
        self.failed_calls += 1
        return ToolResponse(text=text), 0.0, {}


_ROLLOUT: contextvars.ContextVar[Optional[_Rollout]] = contextvars.ContextVar("mgrpo_tool_rollout", default=None)


def _tools_for(agent_config: Any) -> list[Any]:
    """The tools of an agent's full config (``multi_turn.tool_config_path`` / ``function_tool_path``), loaded
    once per process; none without a config."""
    key = tuple(
        setting(agent_config, f"actor_rollout_ref.rollout.multi_turn.{name}", None)
        for name in ("tool_config_path", "function_tool_path")
    )
    if key not in _TOOLS:
        tool_path, function_path = key
        _TOOLS[key] = load_all_tools(
            tool_config_path=resolve_config_path(tool_path) if tool_path else None,
            function_tool_path=resolve_config_path(function_path) if function_path else None,
        )
    return _TOOLS[key]



def _model_type(path: Optional[str]) -> Optional[str]:
    """``model_type`` of a local model's ``config.json`` (``None`` when absent: verl's default builder)."""
    if not path:
        return None
    if path not in _MODEL_TYPES:
        try:
            _MODEL_TYPES[path] = json.loads((Path(path) / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            _MODEL_TYPES[path] = None
    return _MODEL_TYPES[path]


# ----------------------------------------------------------------------------------------------------
# the loop



def _output_row(
    output: AgentLoopOutput, generations: list, mgrpo: dict[str, Any], reward_extra_info: dict[str, Any], score: float
) -> AgentLoopOutput:
    """The row of one finished verl tool loop (main or sub): its tokens, our metadata and the main score."""
    return common.output_row(
        list(output.prompt_ids),
        list(output.response_ids),
        list(output.response_mask),
        _fit(output.response_logprobs, len(output.response_ids)),
        num_turns=output.num_turns,
        metrics=output.metrics,
        extra_fields={**common.merge_generation_fields(generations), ROW_META: mgrpo,
                      "reward_extra_info": reward_extra_info},
        reward_score=score,
    )


@register(AGENT_LOOP_NAME)
class ToolDelegationLoop(ToolAgentLoop):
    """The main agent's tool loop with ``ask_<sub>`` tools (see ``docs/agent_loops.md``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._hf_model_type = kwargs.get("hf_model_type")
        super().__init__(*args, **kwargs)
        self.settings = common.settings_of(self.config)
        self._manager = self.server_manager
        self.server_manager = _Route(self._manager)
        for agent in self.settings.sub_agents:
            tool = DelegationTool.for_agent(agent)
            if tool.name in self.tools:
                raise ValueError(
                    f"the main agent's own tools already have a tool named {tool.name!r}, the delegation tool of "
                    f"sub-agent {agent!r}; rename that tool"
                )
            self.tools[tool.name] = tool
            self.tool_schemas.append(tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True))
        parser = self.rollout_config.multi_turn.format
        if parser != FORMAT and parser not in _WARNED_FORMATS:
            _WARNED_FORMATS.add(parser)
            logger.warning(
                "%s: multi_turn.format is %r, not %r: tool calls its parser cannot read are dropped (verl's parsers), "
                "not answered nor counted in tool/parse_errors", AGENT_LOOP_NAME, parser, FORMAT,
            )
        # every call of a turn is answered; those beyond verl's per-turn cap get an error (see _handle_generating_state)
        self.turn_call_limit = self.max_parallel_calls
        self.max_parallel_calls = sys.maxsize

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        """Rows ``[sub rows..., main row]`` of one main trajectory; ``kwargs`` is the dataset row (verl passes
        ``raw_prompt``, ``reward_model``, ``tools_kwargs``, ``uid``, ``session_id``, ...)."""
        subs = {name: self._resolve_sub_agent(name) for name in self.settings.sub_agents}  # config errors first
        ground_truth = str(kwargs["reward_model"]["ground_truth"])
        prefix = f"{kwargs.get('uid', uuid4().hex)}/{kwargs.get('session_id', 0)}"
        state = _Rollout(
            sampling_params=dict(sampling_params),
            tools_kwargs=dict(kwargs.get("tools_kwargs") or {}),
            subs=subs,
            main=_Recorder(self._manager, self.response_length, seeds=common.trajectory_seeds(self, kwargs)),
        )
        rollout_token, recorder_token = _ROLLOUT.set(state), _RECORDER.set(state.main)
        try:
            output = await super().run(sampling_params, **kwargs)
        finally:
            _RECORDER.reset(recorder_token)
            _ROLLOUT.reset(rollout_token)
        return self._rows(state, output, prefix, ground_truth, kwargs)

    # -- hooks of ToolAgentLoop

    async def _handle_generating_state(
        self, agent_data: Any, sampling_params: dict[str, Any], ignore_termination: bool = False
    ) -> AgentState:
        """verl's step; then the calls its parser could not read are counted (``tool/parse_errors``), and every
        call beyond ``multi_turn.max_parallel_calls`` in this turn is marked to be answered with an error
        instead of being run."""
        next_state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        if next_state == AgentState.PROCESSING_TOOLS:
            state = _ROLLOUT.get()
            if state is not None:
                state.parse_errors += sum(bool(getattr(call, "error", None)) for call in agent_data.tool_calls)
            limit = sys.maxsize if self.turn_call_limit is None else self.turn_call_limit
            agent_data.tool_calls = [
                ToolCall(
                    name=call.name,
                    arguments=call.arguments,
                    tool_call_id=call.tool_call_id,
                    error=getattr(call, "error", None)
                    or (_error(f"too many tool calls in one turn: at most {limit} are run") if i >= limit else None),
                )
                for i, call in enumerate(agent_data.tool_calls)
            ]
        return next_state

    async def _call_tool(
        self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: Any
    ) -> tuple[ToolResponse, float, dict]:
        state = _ROLLOUT.get()
        if state is None:  # not inside run(): plain verl behaviour
            return await super()._call_tool(tool_call, tools_kwargs, agent_data)
        # no await before _delegate numbers the call: calls take their indices in the order of the output
        error = getattr(tool_call, "error", None)
        if error:
            return state.fail(error)
        active = getattr(agent_data, "_active_tools", self.tools)
        tool = active.get(tool_call.name)
        if tool is None:
            available = ", ".join(active) or "none"
            return state.fail(_error(f"unknown tool {tool_call.name!r}; available tools: {available}"))
        arguments, error = _decode_arguments(tool_call)
        if error:
            return state.fail(error)
        if isinstance(tool, DelegationTool):
            return await self._delegate(state, state.subs[tool.agent], tool.name, arguments)
        state.tool_uses[tool_call.name] += 1
        return await super()._call_tool(tool_call, tools_kwargs, agent_data)

    async def ct_merge_context_msg(
        self,
        previous_messages: list[dict],
        updated_messages: list[dict],
        runtime_token_ids: list[int],
        response_mask: list[int],
        response_logprobs: Optional[list[float]] = None,
        tools: Optional[list[dict]] = None,
    ):
        """verl's merge; when the appended tool responses leave less than ``answer_tokens`` of room in
        ``response_length``, the longest are replaced by an error text (each counted in ``failed_calls``
        unless it already was an error) until they fit or none is left to shorten. The messages are changed
        in place, so the chat history matches the tokens."""

        async def merge():
            return await super(ToolDelegationLoop, self).ct_merge_context_msg(
                previous_messages, updated_messages, runtime_token_ids, response_mask, response_logprobs, tools=tools
            )

        merged = await merge()
        state = _ROLLOUT.get()
        if state is None:
            return merged
        budget = max(0, self.response_length - self.settings.delegation.answer_tokens)
        dropped = _error("tool response dropped: it does not fit in the context")
        appended = updated_messages[len(previous_messages) :]
        while len(merged[1]) > budget:
            candidates = [
                m for m in appended if isinstance(m.get("content"), str) and len(m["content"]) > len(dropped)
            ]
            if not candidates:
                break
            longest = max(candidates, key=lambda m: len(m["content"]))
            if not longest["content"].startswith("<error:"):
                state.failed_calls += 1
            longest["content"] = dropped
            state.observation_truncated = True
            merged = await merge()
        return merged

    # -- delegation

    async def _delegate(
        self, state: _Rollout, sub: _SubAgent, tool_name: str, arguments: dict[str, Any]
    ) -> tuple[ToolResponse, float, dict]:
        """Run one call of ``sub`` (its own tool loop), concurrently with the other calls of the turn."""
        task = arguments.get("task")
        if not isinstance(task, str) or not task.strip():
            return state.fail(_error(f"{tool_name} needs a non-empty string argument 'task', got {task!r}"))
        limit = self.settings.delegation.max_calls
        if len(state.calls) >= limit:
            return state.fail(_error(f"delegation limit reached: at most {limit} sub-agent calls per rollout"))
        call = _SubCall(len(state.calls), sub.name, sum(c.agent == sub.name for c in state.calls))
        state.calls.append(call)

        recorder = _Recorder(sub.client, sub.response_length, sub.response_tokens,
                             seeds=state.main.seeds.child(f"{sub.name}/{call.index}"))
        context = contextvars.copy_context()
        context.run(_RECORDER.set, recorder)  # the sub loop's generations go to its own recorder
        timeout = self.settings.delegation.timeout_s
        start = time.perf_counter()
        try:
            messages = (self.settings.sub_prompt or relay.tool_sub_messages)(sub.name, task)
            run = sub.loop.run(dict(state.sampling_params), raw_prompt=list(messages), tools_kwargs=state.tools_kwargs)
            call.output = await asyncio.wait_for(asyncio.get_running_loop().create_task(run, context=context), timeout)
        except asyncio.TimeoutError:
            logger.warning("sub-agent %r call timed out after %gs", sub.name, timeout)
            return state.fail(_error(f"sub-agent {sub.name} timed out after {timeout:g}s"))
        except Exception as exc:
            logger.warning("sub-agent %r call failed: %r", sub.name, exc)
            return state.fail(_error(f"sub-agent {sub.name} failed: {type(exc).__name__}: {exc}"))
        logger.debug("sub-agent %r call %d took %.3fs", sub.name, call.index, time.perf_counter() - start)
        call.generations = recorder.generations
        call.report = recorder.final_text(sub.tokenizer)
        text = self._clip(call.report or NO_ANSWER)
        if text != (call.report or NO_ANSWER):
            state.observation_truncated = True
        return ToolResponse(text=text), 0.0, {}

    def _clip(self, text: str) -> str:
        """``text`` shortened to ``multi_turn.max_tool_response_length`` characters on verl's configured side."""
        limit = self.max_tool_response_length
        if not limit or len(text) <= limit:
            return text
        side = self.tool_response_truncate_side
        if side == "left":
            return "(truncated)..." + text[-limit:]
        if side == "right":
            return text[:limit] + delegation.TRUNCATED
        half = limit // 2
        return text[:half] + delegation.TRUNCATED + "..." + text[len(text) - half :]

    def _resolve_sub_agent(self, name: str) -> _SubAgent:
        """The sub-agent's client, tokenizer, tools and limits, and its tool loop.

        The client is ``server_manager.for_agent(name)`` (which raises for an unknown name), or the server
        manager itself without ``for_agent``. From the client's ``config`` (the agent's full config), when it
        has one: tokenizer (``actor_rollout_ref.model.tokenizer_path`` or ``.path``; the main agent's when equal
        or absent), tools (``actor_rollout_ref.rollout.multi_turn.tool_config_path`` / ``function_tool_path``),
        ``prompt_length`` / ``response_length`` and the other ``multi_turn`` settings (default: the main
        agent's), with ``max_assistant_turns = sub_max_turns``.
        """
        manager = self._manager
        client = manager.for_agent(name) if hasattr(manager, "for_agent") else manager
        agent_config = getattr(client, "config", None)
        path = common.tokenizer_path(agent_config)
        tokenizer, hf_model_type = self.tokenizer, self._hf_model_type
        if path is not None and path != common.tokenizer_path(self.config):
            if path not in common.TOKENIZERS:
                trust = bool(setting(agent_config, "actor_rollout_ref.model.trust_remote_code", False))
                common.TOKENIZERS[path] = hf_tokenizer(path, trust_remote_code=trust)
            tokenizer = common.TOKENIZERS[path]
            hf_model_type = _model_type(setting(agent_config, "actor_rollout_ref.model.path", None))

        rollout, multi_turn = "actor_rollout_ref.rollout", "actor_rollout_ref.rollout.multi_turn"
        main_rollout = self.rollout_config

        response_length = int(setting(agent_config, f"{rollout}.response_length", self.response_length))
        sub_rollout = {
            "prompt_length": int(setting(agent_config, f"{rollout}.prompt_length", self.prompt_length)),
            "response_length": response_length,
            "full_determinism": bool(
                setting(agent_config, f"{rollout}.full_determinism", setting(main_rollout, "full_determinism", False))
            ),
            "multi_turn": {
                "max_assistant_turns": self.settings.delegation.sub_max_turns,
                **{
                    key: setting(agent_config, f"{multi_turn}.{key}",
                                 setting(main_rollout, f"multi_turn.{key}", default))
                    for key, default in (
                        ("max_user_turns", None),
                        ("max_parallel_calls", 1),
                        ("max_tool_response_length", 256),
                        ("tool_response_truncate_side", "middle"),
                        ("format", "hermes"),
                    )
                },
            },
        }
        loop = _SubToolLoop(
            trainer_config=DictConfigWrap(OmegaConf.create({"actor_rollout_ref": {"rollout": sub_rollout}})),
            server_manager=_Route(client),
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=self.dataset_cls,
            data_config=DictConfigWrap(self.data_config),
            hf_model_type=hf_model_type,
            tools=ToolListWrap(_tools_for(agent_config)),
        )
        return _SubAgent(
            name, client, tokenizer, response_length,
            min(self.settings.delegation.sub_response_tokens, response_length), loop,
        )

    # -- rows

    def _rows(
        self, state: _Rollout, output: AgentLoopOutput, prefix: str, ground_truth: str, row: dict[str, Any]
    ) -> list[AgentLoopOutput]:
        answer = state.main.final_text(self.tokenizer)
        scored = common.score_trajectory(
            self.settings, row, prefix, answer, ground_truth,
            [common.SubReport(call.agent, call.index, None if call.output is None else call.report)
             for call in state.calls],
            failed_calls=state.failed_calls,
            observation_truncated=state.observation_truncated,
            main_tokens=sum(len(g.token_ids) for g in state.main.generations),
            sub_tokens=sum(len(g.token_ids) for call in state.calls for g in call.generations),
            **{f"tool/{name}": count for name, count in sorted(state.tool_uses.items())},
            **{"tool/parse_errors": state.parse_errors},
        )
        return common.trajectory_rows(
            scored, state.calls,
            lambda call, meta, info, score: _output_row(call.output, call.generations, meta, info, score),
            lambda meta, info, score: _output_row(output, state.main.generations, meta, info, score),
        )
