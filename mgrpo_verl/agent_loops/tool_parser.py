"""verl tool parser ``hermes_strict`` (``actor_rollout_ref.rollout.multi_turn.format: hermes_strict``).

verl's ``hermes`` parser logs and drops a call it cannot read, so the model never learns why nothing
happened. :class:`StrictHermesToolParser` keeps such a call as a :class:`ToolCall` with ``error`` set (the
``<error: ...>`` observation the agent sees); ``mgrpo_delegate`` counts these in ``tool/parse_errors`` and
answers them (docs/agent_loops.md). Registered in verl's ``ToolParser`` registry when verl's parser module
is imported (:func:`mgrpo_verl.plugin.register_multi_agent`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from verl.experimental.agent_loop.tool_parser import FunctionCall, HermesToolParser, ToolParser
from verl.utils.ray_utils import get_event_loop

#: ``multi_turn.format`` of :class:`StrictHermesToolParser`.
FORMAT = "hermes_strict"

#: The longest call (the text between ``<tool_call>`` and ``</tool_call>``) and the longest ``arguments`` string
#: read, in characters; longer ones are errors before any JSON decoding or tool work (docs/agent_loops.md).
MAX_CALL_CHARS = 16_384

#: ``<tool_call>...</tool_call>`` blocks, and a trailing unclosed ``<tool_call>...`` (group 2 empty).
CALL_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def error_text(text: str) -> str:
    """An error observation as the agent sees it: ``<error: text>``."""
    return f"<error: {text}>"


class ToolCall(FunctionCall):
    """A parsed tool call; ``error`` set when the call is not to be run (its error text, the observation)."""

    error: Optional[str] = None


@ToolParser.register(FORMAT)
class StrictHermesToolParser(HermesToolParser):
    """verl's ``hermes`` format, but a call that cannot be read is kept as a :class:`ToolCall` with ``error``
    set: JSON that does not parse, not an object with a non-empty string ``name``, a ``<tool_call>`` without
    ``</tool_call>``, a call over :data:`MAX_CALL_CHARS`, or ``arguments`` written as a JSON string that the
    decoder cannot read without raising something else than a syntax error (verl decodes them as soon as the
    parser returns, where only syntax errors are caught). ``arguments`` may be an object (serialised to JSON)
    or a JSON string (kept as is); the loop checks that they decode to an object."""

    async def extract_tool_calls(self, responses_ids: list[int], tools: Any = None) -> tuple[str, list[FunctionCall]]:
        text = await get_event_loop().run_in_executor(None, self.tokenizer.decode, responses_ids)
        if "<tool_call>" not in text:
            return text, []
        calls = [parse_call(body, closed) for body, closed in CALL_BLOCK.findall(text)]
        return CALL_BLOCK.sub("", text), calls


def _malformed(reason: str) -> ToolCall:
    return ToolCall(name="", arguments="{}", error=error_text(f"malformed tool call: {reason}"))


def parse_call(body: str, closed: str) -> ToolCall:
    """One call's text as a :class:`ToolCall`; never raises on model output (JSON nested too deeply for
    the decoder or the encoder, huge numbers: a malformed call, like verl's parser, which catches all)."""
    if not closed:
        return _malformed("<tool_call> is not closed by </tool_call>")
    if len(body) > MAX_CALL_CHARS:
        return _malformed(f"{len(body)} characters, more than {MAX_CALL_CHARS}")
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return _malformed(f"invalid JSON ({exc})")
    except (RecursionError, MemoryError, ValueError) as exc:  # e.g. nested 1,000 deep; an int of 5,000 digits
        return _malformed(f"JSON the decoder cannot read ({type(exc).__name__})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return _malformed('expected {"name": <tool name>, "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # a JSON string: verl decodes it right after parsing (the assistant message)
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            pass  # kept: the loop answers "not valid JSON", verl's message builder keeps it raw
        except (RecursionError, MemoryError, ValueError) as exc:  # e.g. nested 1,500 deep; an int of 5,000 digits
            return _malformed(f"arguments the decoder cannot read ({type(exc).__name__})")
        return ToolCall(name=call["name"], arguments=arguments)
    try:
        arguments = json.dumps(arguments, ensure_ascii=False)
    except (RecursionError, MemoryError, ValueError) as exc:
        return _malformed(f"arguments the encoder cannot write ({type(exc).__name__})")
    return ToolCall(name=call["name"], arguments=arguments)
