"""ToolDelegationLoop (agent loop ``mgrpo_delegate``) driven with scripted fake rollout servers.

The loop is built as verl's ``AgentLoopWorker._run_agent_loop`` builds loops (hydra ``instantiate`` of the
registry entry), with a minimal trainer config holding only what the loop reads. Token ids come from the
tiny tokenizer: it has ``<tool_call>`` / ``</tool_call>`` as single ordinary tokens and encodes and decodes
hermes tool-call text exactly, so verl's own tokenization and parsing run unchanged (no fake tokenizer).

Fake servers answer from a script (main agent: one step per generation, in order) or from a function of
the decoded prompt (sub-agents, whose calls run concurrently, so their order is not fixed): a step is the
text to "generate", an exception to raise, or an async function returning the text. Scores follow the relay
task's echo rule: over the first 8 characters, 1 per right digit, 0.25 per other digit, divided by 8.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from hydra.errors import InstantiationException
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.tools.function_tool import FunctionTool
from verl.tools.schemas import OpenAIFunctionToolSchema
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.rollout.replica import TokenOutput

from mgrpo_verl.envs import relay
from mgrpo_verl.agent_loops import tool_delegation, tool_parser
from mgrpo_verl.agent_loops.common import DelegationSettings
from mgrpo_verl.agent_loops.testing import build_agent_loop

DIGIT = "4"
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
END = "<|im_end|>"
READ_SECRET = '<tool_call>{"name": "read_secret", "arguments": {}}</tool_call>' + END


def call(name: str, **arguments) -> str:
    """A hermes tool call."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def ask(task: str, agent: str = "sub") -> str:
    return call(f"ask_{agent}", task=task)


class FakeAgent:
    """One agent's rollout server. ``script``: steps popped in order; ``respond(prompt_text)``: a step chosen
    from the decoded prompt. Outputs carry log-prob ``logprob`` per token (``None``: the backend returned
    none) and ``min_global_steps = max_global_steps = steps`` (or the next of a list)."""

    def __init__(self, tokenizer, script=(), respond=None, steps=0, logprob=None, config=None):
        self.tokenizer = tokenizer
        self.script = list(script)
        self.respond = respond
        self.steps = steps
        self.logprob = logprob
        self.calls: list[dict] = []
        if config is not None:
            self.config = config

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        prompt = self.tokenizer.decode(prompt_ids)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "prompt": prompt, "params": dict(sampling_params)})
        step = self.respond(prompt) if self.respond else self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        if callable(step):
            step = await step()
        token_ids = self.tokenizer.encode(step, add_special_tokens=False)
        k = self.steps.pop(0) if isinstance(self.steps, list) else self.steps
        log_probs = None if self.logprob is None else [self.logprob] * len(token_ids)
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, extra_fields={"min_global_steps": k, "max_global_steps": k})


class FakeManager(FakeAgent):
    """The main agent's server plus ``for_agent`` (what ``MultiAgentLLMClient`` offers)."""

    def __init__(self, tokenizer, script, subs: dict[str, FakeAgent], **kwargs):
        super().__init__(tokenizer, script, **kwargs)
        self.subs = subs

    def for_agent(self, name):
        if name == "main":
            return self
        if name not in self.subs:
            raise ValueError(f"unknown agent {name!r}; known agents are {sorted(['main', *self.subs])}")
        return self.subs[name]


def secret_sub(answers: dict[str, str] | None = None, first=None):
    """``respond`` of a sub-agent that calls ``read_secret`` first, then answers with the digit its tool
    returned, or with ``answers[task]``. ``first(text)``, when given, wraps the first step (e.g. a barrier)."""

    def respond(prompt: str):
        found = re.findall(r"The secret digit is (\d)\.", prompt)
        if not found:
            return first(READ_SECRET) if first else READ_SECRET
        task = re.search(r"Task: (.*?)<\|im_end\|>", prompt).group(1)
        return (answers or {}).get(task, found[-1]) + END

    return respond


def sub_config(response_length=256, tools=True, path="/models/main", **multi_turn):
    """The full config of a sub-agent's client (only what the loop reads)."""
    if tools:
        multi_turn = {"tool_config_path": relay.SUB_TOOL_CONFIG, **multi_turn}
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": path},
                "rollout": {"prompt_length": 1024, "response_length": response_length, "multi_turn": multi_turn},
            }
        }
    )


def main_config(response_length=512, agents=None, max_parallel_calls=2, max_assistant_turns=4, **delegation):
    section = {"main": "main", "delegation": {"timeout_s": 5, "sub_response_tokens": 64, **delegation}}
    if agents is not None:
        section["agents"] = {name: {} for name in agents}
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": "/models/main"},
                "rollout": {
                    "prompt_length": 1024,
                    "response_length": response_length,
                    "full_determinism": False,
                    "multi_turn": {
                        "max_assistant_turns": max_assistant_turns,
                        "max_user_turns": None,
                        "max_parallel_calls": max_parallel_calls,
                        "max_tool_response_length": 256,
                        "tool_response_truncate_side": "right",
                        "format": tool_parser.FORMAT,
                    },
                },
            },
            "data": {},
            "multi_agent": section,
        }
    )


def build(manager, tokenizer, config, tools=()):
    return build_agent_loop(relay.TOOLS_AGENT_LOOP_NAME, config, manager, tokenizer, tools)


def run(manager, tokenizer, config, digit=DIGIT, tools=(), **row):
    """One ``run`` of a loop built as verl's worker builds it; returns the rows."""

    async def go():
        loop = build(manager, tokenizer, config, tools)
        kwargs = {
            "raw_prompt": relay.tool_main_messages(),
            "reward_model": {"style": "rule", "ground_truth": digit},
            "tools_kwargs": relay.secret_tools_kwargs(digit),
            "uid": "u1",
            "session_id": 2,
            **row,
        }
        return await loop.run(dict(SAMPLING), **kwargs)

    return asyncio.run(go())


def function(name, fn, **parameters) -> FunctionTool:
    """A verl function tool of the main agent (built directly: verl's decorator registers globally)."""
    schema = {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in parameters.items()},
                           "required": list(parameters)},
        },
    }
    return FunctionTool(name=name, fn=fn, tool_schema=OpenAIFunctionToolSchema.model_validate(schema))


def observed(tokenizer, row) -> str:
    """Text of the response tokens with mask 0 (what the environment appended)."""
    return tokenizer.decode([t for t, m in zip(row.response_ids, row.response_mask, strict=True) if m == 0])


def generated(tokenizer, row) -> str:
    return tokenizer.decode([t for t, m in zip(row.response_ids, row.response_mask, strict=True) if m == 1])


def meta(row) -> dict:
    return row.extra_fields["mgrpo"]


def check_contract(rows, main_score):
    """What every call must satisfy: main last, own traj ids, one field set, team reward everywhere."""
    assert meta(rows[-1])["agent"] == "main" and meta(rows[-1])["parent_traj_id"] == ""
    assert all(meta(r)["parent_traj_id"] == "u1/2/main" for r in rows[:-1])
    assert len({tuple(sorted(r.as_dict())) for r in rows}) == 1
    assert all(r.reward_score == main_score for r in rows)
    for r in rows:
        assert len(r.response_ids) == len(r.response_mask) == len(r.response_logprobs)
        info = r.extra_fields["reward_extra_info"]
        assert (info["acc"], info["calls"]) == (main_score, meta(rows[-1])["calls"])
        assert info["failed_calls"] == meta(rows[-1])["failed_calls"]
        # tokens generated: the main row's and the sub rows' mask-1 tokens (nothing cut in these tests)
        assert info["main_tokens"] == sum(rows[-1].response_mask)
        assert info["sub_tokens"] == sum(sum(s.response_mask) for s in rows[:-1])
        assert (info["source"], info["level"], info["id"]) == ("", "", "")
        assert isinstance(info["answer"], str)
        assert info["exact"] == float(info["answer"].strip() == DIGIT)  # every test's ground truth
        assert set(meta(r)) == {"agent", "traj_id", "parent_traj_id", "score", "calls", "failed_calls", "observation_truncated"}
    list_of_dict_to_tensordict([r.as_dict() for r in rows])  # what AgentLoopWorkerTQ stores


# ----------------------------------------------------------------------------------------------------
# the happy paths


def test_delegation_runs_the_sub_agents_own_tool_loop_and_reports_back(tokenizer):
    sub = FakeAgent(tokenizer, respond=secret_sub(), steps=7, config=sub_config())
    main = FakeManager(tokenizer, [ask("find the secret") + END, "4" + END], {"sub": sub}, steps=[3, 5], logprob=-0.5)
    rows = run(main, tokenizer, main_config())

    # routing: two main generations on the main server, the sub-agent's two turns on its own server
    assert len(main.calls) == 2 and len(sub.calls) == 2
    assert [meta(r)["agent"] for r in rows] == ["sub", "main"]
    sub_row, top = rows

    # the sub-agent was prompted from the task, with its own tools, and ran read_secret on the sample's digit
    assert "Task: find the secret" in sub.calls[0]["prompt"] and '"name": "read_secret"' in sub.calls[0]["prompt"]
    assert "ask_sub" not in sub.calls[0]["prompt"]  # sub-agents cannot delegate
    assert "<tool_response>\nThe secret digit is 4.\n</tool_response>" in sub.calls[1]["prompt"]
    assert sub.calls[0]["request_id"] == sub.calls[1]["request_id"]  # one sticky session per call
    # ... and its report reached the main agent as the tool response
    assert observed(tokenizer, top) == "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert '"name": "ask_sub"' in main.calls[0]["prompt"]  # the delegation tool is offered
    assert main.calls[1]["prompt_ids"] == top.prompt_ids + top.response_ids[: len(main.calls[1]["prompt_ids"]) - len(top.prompt_ids)]

    # rows: main = call ⊕ observation ⊕ answer, log-probs of generated tokens kept, zeros elsewhere
    assert generated(tokenizer, top) == ask("find the secret") + END + "4" + END
    assert all(lp == (-0.5 if m else 0.0) for lp, m in zip(top.response_logprobs, top.response_mask, strict=True))
    assert sub_row.prompt_ids == sub.calls[0]["prompt_ids"]
    assert generated(tokenizer, sub_row) == READ_SECRET + "4" + END
    assert "The secret digit is 4." in observed(tokenizer, sub_row)
    assert sub_row.response_logprobs == [0.0] * len(sub_row.response_ids)  # the sub backend returned none
    assert (sub_row.num_turns, top.num_turns) == (4, 4)

    # scores: main "4" -> 1/8, sub report "4" -> 1/8
    assert [meta(r) for r in rows] == [
        {"agent": "sub", "traj_id": "u1/2/sub/0", "parent_traj_id": "u1/2/main", "score": 0.125, "calls": 1,
         "failed_calls": 0, "observation_truncated": False},
        {"agent": "main", "traj_id": "u1/2/main", "parent_traj_id": "", "score": 0.125, "calls": 1,
         "failed_calls": 0, "observation_truncated": False},
    ]  # fmt: skip
    check_contract(rows, 0.125)
    assert top.extra_fields["reward_extra_info"]["exact"] == 1.0  # the answer "4" is the digit
    # staleness tags: the sub's own weight version; main = min / max over its two generations
    assert [(r.extra_fields["min_global_steps"], r.extra_fields["max_global_steps"]) for r in rows] == [(7, 7), (3, 5)]

    # new-token caps: main = room left in response_length; sub = sub_response_tokens (and its room)
    used = len(main.calls[1]["prompt_ids"]) - len(top.prompt_ids)
    assert [c["params"]["max_tokens"] for c in main.calls] == [512, 512 - used]
    assert [c["params"]["max_tokens"] for c in sub.calls] == [64, 64]
    assert main.calls[0]["params"] == {**SAMPLING, "max_tokens": 512}


def test_two_calls_in_one_turn_run_concurrently_rows_in_call_order(tokenizer):
    arrived, both = [0], asyncio.Event()

    def barrier(text):
        async def wait():  # each call's first generation waits until both calls have started
            arrived[0] += 1
            if arrived[0] == 2:
                both.set()
            await both.wait()
            return text

        return wait

    sub = FakeAgent(tokenizer, respond=secret_sub({"A": "4", "B": "7"}, first=barrier), config=sub_config())
    main = FakeManager(tokenizer, [ask("A") + ask("B") + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(timeout_s=5))

    assert len(sub.calls) == 4 and arrived[0] == 2
    assert [meta(r)["traj_id"] for r in rows] == ["u1/2/sub/0", "u1/2/sub/1", "u1/2/main"]
    assert ["Task: A" in tokenizer.decode(r.prompt_ids) for r in rows[:2]] == [True, False]
    assert [tokenizer.decode(r.response_ids, skip_special_tokens=True).strip()[-1] for r in rows[:2]] == ["4", "7"]
    # both reports, in call order, as two tool responses of one user turn
    assert "<tool_response>\n4\n</tool_response>\n<tool_response>\n7\n</tool_response>" in observed(tokenizer, rows[-1])
    assert [meta(r)["score"] for r in rows] == [0.125, 0.25 / 8, 0.125]
    assert (meta(rows[-1])["calls"], meta(rows[-1])["failed_calls"]) == (2, 0)
    check_contract(rows, 0.125)


def test_one_tool_per_sub_agent_routed_to_its_own_server(tokenizer):
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    helper = FakeAgent(tokenizer, respond=secret_sub({"X": "44"}), config=sub_config())
    main = FakeManager(tokenizer, [ask("X", "helper") + ask("Y") + END, ask("Z") + END, "4" + END], {"sub": sub, "helper": helper})
    rows = run(main, tokenizer, main_config(agents=["main", "sub", "helper"]))
    assert '"name": "ask_sub"' in main.calls[0]["prompt"] and '"name": "ask_helper"' in main.calls[0]["prompt"]
    assert (len(main.calls), len(sub.calls), len(helper.calls)) == (3, 4, 2)
    assert [meta(r)["traj_id"] for r in rows] == ["u1/2/helper/0", "u1/2/sub/0", "u1/2/sub/1", "u1/2/main"]
    assert [meta(r)["agent"] for r in rows] == ["helper", "sub", "sub", "main"]
    assert [meta(r)["score"] for r in rows] == [0.25, 0.125, 0.125, 0.125]
    assert meta(rows[-1])["calls"] == 3
    check_contract(rows, 0.125)


def test_without_for_agent_the_main_server_plays_the_sub_agent(tokenizer):
    single = FakeAgent(tokenizer, [ask("find it") + END, READ_SECRET, "4" + END, "44" + END], config=sub_config())
    rows = run(single, tokenizer, main_config())
    assert len(single.calls) == 4  # main call, the sub-agent's two turns, main answer: all on one server
    assert "Task: find it" in single.calls[1]["prompt"] and "The secret digit is 4." in single.calls[2]["prompt"]
    assert [meta(r)["agent"] for r in rows] == ["sub", "main"]
    assert [meta(r)["score"] for r in rows] == [0.125, 0.25]
    check_contract(rows, 0.25)


def test_sub_agent_with_its_own_tokenizer_and_lengths(tokenizer, tiny_paths, monkeypatch):
    from mgrpo_verl.agent_loops import common

    monkeypatch.setattr(common, "TOKENIZERS", {})
    monkeypatch.setattr(tool_delegation, "_MODEL_TYPES", {})
    config = sub_config(response_length=64)
    config.actor_rollout_ref.model = {"path": tiny_paths.model_dir, "tokenizer_path": tiny_paths.tokenizer_dir}
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=config)
    main = FakeManager(tokenizer, [ask("find it") + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(sub_response_tokens=100))
    assert common.TOKENIZERS[tiny_paths.tokenizer_dir] is not tokenizer  # loaded from its own path
    assert tool_delegation._MODEL_TYPES == {tiny_paths.model_dir: "qwen2"}  # its Continuous-Token builder
    used = len(sub.calls[1]["prompt_ids"]) - len(sub.calls[0]["prompt_ids"])
    assert [c["params"]["max_tokens"] for c in sub.calls] == [64, 64 - used]  # its response_length, not 100
    assert len(rows[0].response_ids) <= 64 and [meta(r)["score"] for r in rows] == [0.125, 0.125]


def test_sub_max_turns_bounds_the_sub_agents_loop(tokenizer):
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [ask("find it") + END, "0" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(sub_max_turns=1))
    assert len(sub.calls) == 1  # its one turn was a tool call: not run, and nothing to report
    assert "<tool_response>\n(no answer)\n</tool_response>" in observed(tokenizer, rows[-1])
    assert [meta(r)["score"] for r in rows] == [0.0, 0.25 / 8]
    check_contract(rows, 0.25 / 8)


def test_main_agent_may_answer_without_delegating(tokenizer):
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, ["7" + END], {"sub": sub})
    (top,) = run(main, tokenizer, main_config())
    assert sub.calls == [] and meta(top)["calls"] == 0 and meta(top)["score"] == 0.25 / 8
    assert top.response_mask == [1] * len(top.response_ids) and top.num_turns == 2
    check_contract([top], 0.25 / 8)


def test_main_agents_own_tools_run_beside_delegation(tokenizer):
    add = function("add", lambda a, b: str(a + b), a="integer", b="integer")
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [call("add", a=1, b=2) + ask("find it") + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(), tools=[add])
    assert '"name": "add"' in main.calls[0]["prompt"] and '"name": "ask_sub"' in main.calls[0]["prompt"]
    assert "<tool_response>\n3\n</tool_response>\n<tool_response>\n4\n</tool_response>" in observed(tokenizer, rows[-1])
    assert (meta(rows[-1])["calls"], meta(rows[-1])["failed_calls"]) == (1, 0)
    # per-query tool usage: the main agent's add once, the sub-agent's read_secret once; delegation not counted
    info = rows[-1].extra_fields["reward_extra_info"]
    assert (info["tool/add"], info["tool/read_secret"]) == (1, 1) and "tool/ask_sub" not in info


def test_custom_scorer_and_sub_prompt(tokenizer, tmp_path):
    module = tmp_path / "task.py"
    module.write_text(
        "def score(role, text, ground_truth):\n    return {'main': 0.75, 'sub': 0.5}[role] + len(text) / 100\n"
        "def prompt(agent, task):\n    return [{'role': 'user', 'content': f'{agent}, use read_secret. Task: {task}'}]\n"
    )
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [ask("go") + END, "44" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(scorer=f"{module}:score", sub_prompt=f"{module}:prompt"))
    assert "sub, use read_secret. Task: go" in sub.calls[0]["prompt"]
    assert [meta(r)["score"] for r in rows] == [0.51, 0.77]
    check_contract(rows, 0.77)


# ----------------------------------------------------------------------------------------------------
# bad input: an error observation, counted, never a crash


@pytest.mark.parametrize(
    "first_turn, error",
    [
        ('<tool_call>{"name": "ask_sub", "arguments": {"task": </tool_call>', "<error: malformed tool call: invalid JSON"),
        ('<tool_call>{"arguments": {"task": "x"}}</tool_call>', '<error: malformed tool call: expected {"name"'),
        ('<tool_call>{"name": "ask_sub", "arguments": {"task": "x"}}', "<error: malformed tool call: <tool_call> is not closed"),
        (call("ask_boss", task="x"), "<error: unknown tool 'ask_boss'; available tools: ask_sub>"),
        ('<tool_call>{"name": "ask_sub", "arguments": "{oops"}</tool_call>', "<error: arguments of ask_sub are not valid JSON"),
        ('<tool_call>{"name": "ask_sub", "arguments": "[1]"}</tool_call>', "<error: arguments of ask_sub must be a JSON object"),
        (call("ask_sub"), "<error: ask_sub needs a non-empty string argument 'task', got None>"),
        (call("ask_sub", task=5), "<error: ask_sub needs a non-empty string argument 'task', got 5>"),
        (call("ask_sub", task="  "), "<error: ask_sub needs a non-empty string argument 'task'"),
    ],
    ids=["bad_json", "no_name", "unclosed", "unknown_tool", "args_not_json", "args_not_object", "no_task",
         "task_not_string", "task_blank"],
)
def test_bad_calls_become_error_observations(tokenizer, first_turn, error):
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [first_turn + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config())
    assert sub.calls == [] and len(rows) == 1 and len(main.calls) == 2  # the main agent saw it and went on
    assert error in observed(tokenizer, rows[0])
    assert (meta(rows[0])["calls"], meta(rows[0])["failed_calls"]) == (0, 1)
    malformed = error.startswith("<error: malformed")
    assert rows[0].extra_fields["reward_extra_info"]["tool/parse_errors"] == int(malformed)
    check_contract(rows, 0.125)


@pytest.mark.parametrize("depth", [1000, 8000])
def test_the_parser_never_raises_on_deep_json(tokenizer, depth):
    # json.loads raised RecursionError out of the parser on JSON nested 1,000 deep (8,000 deep: 16,000
    # characters, under MAX_CALL_CHARS; deeper is refused by size before decoding, below)
    deep = "[" * depth + "]" * depth
    assert tool_parser.parse_call(deep, "</tool_call>").error == (
        "<error: malformed tool call: JSON the decoder cannot read (RecursionError)>"
    )
    assert tool_parser.parse_call("[" * 100_000, "</tool_call>").error == (
        "<error: malformed tool call: 100000 characters, more than 16384>"
    )
    nested = '{"name": "f", "arguments": {"a": ' + deep + "}}"
    assert tool_parser.parse_call(nested, "</tool_call>").error.startswith("<error: malformed tool call: JSON")
    assert tool_parser.parse_call('{"name": "f", "arguments": ' + "9" * 5000 + "}", "x").error.startswith(
        "<error: malformed tool call: JSON the decoder cannot read (ValueError)"  # over int_max_str_digits
    )
    parser = tool_parser.StrictHermesToolParser(tokenizer)
    text = f"<tool_call>{deep}</tool_call>" + ask("A")
    _, calls = asyncio.run(parser.extract_tool_calls(tokenizer.encode(text, add_special_tokens=False)))
    assert [(c.name, c.error is None) for c in calls] == [("", False), ("ask_sub", True)]


def hostile(name: str, arguments: str) -> str:
    """A call whose ``arguments`` are the JSON *string* ``arguments`` (the loop decodes it)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


DEEP_ARGUMENTS = "[" * 1500 + "]" * 1500  # json.loads: RecursionError
LONG_INT_ARGUMENTS = "1" * 5000  # json.loads: ValueError (over sys.get_int_max_str_digits(), 4,300)
UNREADABLE = "<error: malformed tool call: arguments the decoder cannot read"


@pytest.mark.parametrize(
    "first_turn, error, parse_error",
    [
        (hostile("ask_sub", DEEP_ARGUMENTS), UNREADABLE + " (RecursionError)>", 1),
        (hostile("ask_sub", LONG_INT_ARGUMENTS), UNREADABLE + " (ValueError)>", 1),
        # a call over MAX_CALL_CHARS (16,384) is refused before any decoding: a parse error
        (ask("x" * 20_000), "<error: malformed tool call: 20046 characters, more than 16384>", 1),
    ],
    ids=["deep_string", "long_int_string", "oversized_call"],
)
def test_hostile_arguments_become_error_observations(tokenizer, first_turn, error, parse_error):
    # issue 29 item 5: arguments written as a JSON string were kept as they were by the parser, and verl decodes
    # them right after it (ToolAgentLoop._build_assistant_message), catching only JSONDecodeError: RecursionError /
    # ValueError escaped ToolDelegationLoop.run and verl dropped the prompt group, uncounted. Now: parse errors.
    # The oversized call: '{"name": ' 9 + '"ask_sub"' 9 + ', ' 2 + '"arguments": ' 13 + '{"task": ' 9
    # + 20,000 x in quotes 20,002 + '}}' 2 = 20,046 characters
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [first_turn + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(response_length=30_000))
    assert sub.calls == [] and len(rows) == 1 and len(main.calls) == 2  # the main agent saw it and went on
    assert error in observed(tokenizer, rows[0])
    assert (meta(rows[0])["calls"], meta(rows[0])["failed_calls"]) == (0, 1)
    assert rows[0].extra_fields["reward_extra_info"]["tool/parse_errors"] == parse_error
    check_contract(rows, 0.125)


def test_hostile_arguments_of_a_sub_agent_are_its_error_observation(tokenizer):
    # sub-agents inherit multi_turn.format (hermes_strict in the presets): without the parser's decoding the
    # same string would raise out of the sub-agent's verl loop, the delegation would fail and its row be lost;
    # the sub-agent sees the error instead, reads the secret and reports
    def respond(prompt: str):
        if "<error:" not in prompt:
            return hostile("read_secret", DEEP_ARGUMENTS) + END
        return secret_sub()(prompt)

    sub = FakeAgent(tokenizer, respond=respond, config=sub_config(response_length=20_000))
    main = FakeManager(tokenizer, [ask("go") + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(sub_max_turns=3, sub_response_tokens=20_000))
    assert [meta(r)["traj_id"] for r in rows] == ["u1/2/sub/0", "u1/2/main"]
    assert UNREADABLE + " (RecursionError)>" in observed(tokenizer, rows[0])
    assert "The secret digit is 4." in observed(tokenizer, rows[0]) and meta(rows[1])["failed_calls"] == 0
    check_contract(rows, 0.125)


def test_a_scorer_that_raises_scores_zero_and_is_counted(tokenizer, tmp_path):
    module = tmp_path / "raising.py"
    module.write_text(
        "def score(role, text, ground_truth):\n"
        "    if role == 'sub':\n        raise RecursionError('deep')\n"
        "    return float('nan') if text == '4' else 1.0\n"
    )
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [ask("go") + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(scorer=f"{module}:score"))
    assert [meta(r)["score"] for r in rows] == [0.0, 0.0]  # the sub's raised, the main's was NaN
    info = rows[-1].extra_fields["reward_extra_info"]
    assert (info["reward/errors"], info["tool/parse_errors"], info["acc"]) == (2, 0, 0.0)
    check_contract(rows, 0.0)


def test_failed_and_timed_out_sub_calls_yield_no_row(tokenizer):
    # call 0 raises, call 1 succeeds: one row (sub/1), the error reaches the main agent
    def respond(prompt):
        return RuntimeError("boom") if "Task: A" in prompt else secret_sub()(prompt)

    sub = FakeAgent(tokenizer, respond=respond, config=sub_config())
    main = FakeManager(tokenizer, [ask("A") + ask("B") + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config())
    assert [meta(r)["traj_id"] for r in rows] == ["u1/2/sub/1", "u1/2/main"]
    assert "<tool_response>\n<error: sub-agent sub failed: RuntimeError: boom>\n</tool_response>\n<tool_response>\n4\n" in (
        observed(tokenizer, rows[-1])
    )
    assert (meta(rows[-1])["calls"], meta(rows[-1])["failed_calls"]) == (2, 1)
    check_contract(rows, 0.125)

    async def slow():
        await asyncio.sleep(2.0)
        return READ_SECRET

    sub = FakeAgent(tokenizer, [slow], config=sub_config())
    main = FakeManager(tokenizer, [ask("A") + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(timeout_s=0.05))
    assert len(rows) == 1 and "<error: sub-agent sub timed out after 0.05s>" in observed(tokenizer, rows[0])
    assert (meta(rows[0])["calls"], meta(rows[0])["failed_calls"]) == (1, 1)
    check_contract(rows, 0.125)


def test_calls_beyond_max_calls_and_beyond_the_turn_cap_are_refused(tokenizer):
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    script = [ask("A") + ask("B") + END, ask("C") + END, "4" + END]
    main = FakeManager(tokenizer, script, {"sub": sub})
    rows = run(main, tokenizer, main_config(max_calls=1))
    assert len(sub.calls) == 2 and [meta(r)["traj_id"] for r in rows] == ["u1/2/sub/0", "u1/2/main"]
    assert "Task: A" in tokenizer.decode(rows[0].prompt_ids)  # the first call in the output ran
    text = observed(tokenizer, rows[-1])
    assert text.count("<error: delegation limit reached: at most 1 sub-agent calls per rollout>") == 2
    assert (meta(rows[-1])["calls"], meta(rows[-1])["failed_calls"]) == (1, 2)
    check_contract(rows, 0.125)

    # verl's max_parallel_calls: a third call in one turn is answered with an error instead of being ignored
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [ask("A") + ask("B") + ask("C") + END, "4" + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(max_parallel_calls=2))
    assert len(rows) == 3 and len(sub.calls) == 4
    assert "<tool_response>\n<error: too many tool calls in one turn: at most 2 are run>\n</tool_response>" in (
        observed(tokenizer, rows[-1])
    )
    assert (meta(rows[-1])["calls"], meta(rows[-1])["failed_calls"]) == (2, 1)
    check_contract(rows, 0.125)


def test_context_overflow_replaces_the_tool_response_with_an_error(tokenizer):
    chatter = "the helper talks and talks about many things " * 3
    sub = FakeAgent(tokenizer, respond=secret_sub({"A": chatter}), config=sub_config())
    config = main_config(response_length=90, answer_tokens=8)
    config.actor_rollout_ref.rollout.multi_turn.max_tool_response_length = 10_000
    main = FakeManager(tokenizer, [ask("A") + END, "4" * 8 + END], {"sub": sub})
    rows = run(main, tokenizer, config)
    top = rows[-1]
    assert "<tool_response>\n<error: tool response dropped: it does not fit in the context>\n</tool_response>" in (
        observed(tokenizer, top)
    )
    assert len(top.response_ids) <= 90 and len(main.calls) == 2
    assert main.calls[1]["params"]["max_tokens"] >= 8  # answer_tokens of room were kept
    assert (meta(top)["calls"], meta(top)["failed_calls"], meta(top)["observation_truncated"]) == (1, 1, True)
    assert [meta(r)["agent"] for r in rows] == ["sub", "main"]  # the sub-agent's call itself succeeded
    assert meta(top)["score"] == 1.0
    check_contract(rows, 1.0)

    # a report longer than max_tool_response_length is shortened like verl shortens tool responses (the
    # sub-agent's own multi_turn settings are its config's: its read_secret response is not shortened)
    sub = FakeAgent(tokenizer, respond=secret_sub({"A": chatter}), config=sub_config(max_tool_response_length=256))
    main = FakeManager(tokenizer, [ask("A") + END, "4" + END], {"sub": sub})
    config = main_config()
    config.actor_rollout_ref.rollout.multi_turn.max_tool_response_length = 12
    rows = run(main, tokenizer, config)
    assert f"<tool_response>\n{chatter[:12]}...(truncated)\n</tool_response>" in observed(tokenizer, rows[-1])
    assert meta(rows[-1])["observation_truncated"] is True and meta(rows[-1])["failed_calls"] == 0


def test_strict_parser_keeps_good_calls_beside_bad_ones(tokenizer):
    parser = tool_parser.StrictHermesToolParser(tokenizer)
    text = "hi " + ask("A") + '<tool_call>{"name": 1}</tool_call>' + ask("B") + END
    content, calls = asyncio.run(parser.extract_tool_calls(tokenizer.encode(text, add_special_tokens=False)))
    assert content == "hi " + END
    assert [(c.name, json.loads(c.arguments), c.error is None) for c in calls] == [
        ("ask_sub", {"task": "A"}, True), ("", {}, False), ("ask_sub", {"task": "B"}, True)
    ]  # fmt: skip
    assert asyncio.run(parser.extract_tool_calls(tokenizer.encode("plain", add_special_tokens=False))) == ("plain", [])


def test_the_strict_parser_is_chosen_by_verls_format_setting(tokenizer):
    # registered in verl's ToolParser registry (on import of verl's parser module: plugin.py), and picked by
    # verl's own ToolAgentLoop.__init__ from multi_turn.format; "hermes" keeps verl's parser (not swapped)
    from verl.experimental.agent_loop.tool_parser import HermesToolParser, ToolParser

    assert type(ToolParser.get_tool_parser("hermes_strict", tokenizer)) is tool_parser.StrictHermesToolParser
    main = FakeManager(tokenizer, [], {"sub": FakeAgent(tokenizer)})
    assert type(build(main, tokenizer, main_config()).tool_parser) is tool_parser.StrictHermesToolParser
    config = main_config()
    config.actor_rollout_ref.rollout.multi_turn.format = "hermes"
    assert type(build(main, tokenizer, config).tool_parser) is HermesToolParser


# ----------------------------------------------------------------------------------------------------
# configuration errors raise


def test_configuration_errors_raise(tokenizer):
    main = FakeManager(tokenizer, [], {"sub": FakeAgent(tokenizer)})
    with pytest.raises(ValueError, match="unknown agent 'critic'"):
        run(main, tokenizer, main_config(agents=["main", "sub", "critic"]))
    assert main.calls == []

    with pytest.raises(InstantiationException, match="already have a tool named 'ask_sub'"):
        run(main, tokenizer, main_config(), tools=[function("ask_sub", lambda task: task, task="string")])
    for bad, field in (({"sub_max_turns": 0}, "sub_max_turns"), ({"sub_prompt": "nocolon"}, "sub_prompt"),
                       ({"max_calls": -1}, "max_calls"), ({"timeout_s": 0}, "timeout_s")):  # fmt: skip
        with pytest.raises(InstantiationException, match=f"multi_agent.delegation.{field}"):
            run(main, tokenizer, main_config(**bad))


def test_settings():
    cfg = OmegaConf.create({"multi_agent": {"main": "planner", "agents": {"planner": {}, "coder": {}, "tester": {}}}})
    settings = DelegationSettings.from_config(cfg)
    assert settings.sub_agents == ("coder", "tester") and settings.delegation.sub_max_turns == 2
    assert settings.sub_prompt is None and settings.main == "planner"  # None: the loop's relay.tool_sub_messages
    bare = DelegationSettings.from_config(OmegaConf.create({"multi_agent": {"delegation": {"sub_max_turns": 5}}}))
    assert bare.sub_agents == ("sub",) and bare.delegation.sub_max_turns == 5
    assert _agent_loop_registry["mgrpo_delegate"] == {"_target_": "mgrpo_verl.agent_loops.tool_delegation.ToolDelegationLoop"}


def test_from_verls_dataset_row_to_rows(tokenizer, tmp_path):
    """A relay_tools parquet row read by verl's RLHFDataset: ``extra_info.tools_kwargs`` arrives as the row's
    ``tools_kwargs``, and the sub-agent's read_secret reads that row's digit."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    train, _ = relay.write_tool_dataset(tmp_path, n_train=4, n_val=1, seed=1)
    dataset = RLHFDataset(
        data_files=[str(train)], tokenizer=tokenizer, config=OmegaConf.create({"max_prompt_length": 256, "filter_overlong_prompts": False})
    )
    sample = dataset[1]
    digit = sample["reward_model"]["ground_truth"]
    assert sample["tools_kwargs"] == relay.secret_tools_kwargs(digit) and sample["agent_name"] == "mgrpo_delegate"
    row = {k: sample[k] for k in ("raw_prompt", "reward_model", "tools_kwargs", "extra_info")}
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [ask("find the secret") + END, digit + END], {"sub": sub})
    rows = run(main, tokenizer, main_config(), digit="unused", **row)
    assert f"The secret digit is {digit}." in sub.calls[1]["prompt"]
    assert [meta(r)["score"] for r in rows] == [0.125, 0.125]


# ----------------------------------------------------------------------------------------------------
# trajectory seeds (multi_agent.trajectory_seeds)


def seeded_config(choice=True, rollout_name=None):
    cfg = main_config(timeout_s=5)
    cfg.multi_agent.trajectory_seeds = choice
    if rollout_name is not None:
        cfg.actor_rollout_ref.rollout.name = rollout_name
    return cfg


def seeds_of_a_rollout(tokenizer, cfg, first_task="A", **row):
    """Seeds the main agent's two requests and the two sub calls' requests carried, by task: the main agent asks
    ``first_task`` then the other of A / B in one turn; call A's first generation waits until call B has
    answered, so B's requests reach the server first."""
    b_done = asyncio.Event()

    def first(text):
        async def wait():
            await b_done.wait()
            return text
        return wait

    def respond(prompt):
        found = re.findall(r"The secret digit is (\d)\.", prompt)
        if "Task: A" in prompt and not found:
            return first(READ_SECRET)
        if "Task: B" in prompt and found:
            b_done.set()
        return READ_SECRET if not found else found[-1] + END

    sub = FakeAgent(tokenizer, respond=respond, config=sub_config())
    other = "B" if first_task == "A" else "A"
    main = FakeManager(tokenizer, [ask(first_task) + ask(other) + END, "4" + END], {"sub": sub})
    row = {"index": 5, "extra_info": {"split": "train", "index": 5}, "global_steps": 3, **row}
    run(main, tokenizer, cfg, **row)
    by_task = {task: [c["params"].get("seed") for c in sub.calls if f"Task: {task}" in c["prompt"]] for task in "AB"}
    return [c["params"].get("seed") for c in main.calls], by_task


def test_trajectory_seeds_follow_the_trajectory_not_the_arrival_order(tokenizer):
    main, subs = seeds_of_a_rollout(tokenizer, seeded_config())
    seeds = main + subs["A"] + subs["B"]
    assert len(seeds) == 6 and all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)
    assert len(set(seeds)) == 6  # every request of the trajectory its own seed
    # the same row again, in a fresh loop: the same seeds, request by request
    assert seeds_of_a_rollout(tokenizer, seeded_config()) == (main, subs)
    # the main agent asks B first: the calls swap places (call 0 is now B), their seeds swap with them
    main2, subs2 = seeds_of_a_rollout(tokenizer, seeded_config(), first_task="B")
    assert main2[0] == main[0] and (subs2["B"], subs2["A"]) == (subs["A"], subs["B"])


@pytest.mark.parametrize("change", [{"session_id": 3}, {"index": 6}, {"global_steps": 4},
                                    {"extra_info": {"split": "val", "index": 5}},
                                    {"raw_prompt": relay.tool_main_messages("helper")}])
def test_trajectory_seeds_differ_when_the_identity_differs(tokenizer, change):
    base = seeds_of_a_rollout(tokenizer, seeded_config())
    other = seeds_of_a_rollout(tokenizer, seeded_config(), **change)
    assert not set(base[0]) & set(other[0])


def test_trajectory_seeds_off_auto_and_a_requests_own_seed(tokenizer):
    assert seeds_of_a_rollout(tokenizer, seeded_config(False)) == ([None, None], {"A": [None, None], "B": [None, None]})
    assert seeds_of_a_rollout(tokenizer, seeded_config("auto", "vllm"))[0] == [None, None]
    assert None not in seeds_of_a_rollout(tokenizer, seeded_config("auto", "hf"))[0]
    # no index (a row that did not come through verl's dataset): nothing to key on, no seed added
    sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
    main = FakeManager(tokenizer, [ask("A") + END, "4" + END], {"sub": sub})
    run(main, tokenizer, seeded_config())
    assert [c["params"].get("seed") for c in main.calls + sub.calls] == [None] * 4

    async def own_seed():
        sub = FakeAgent(tokenizer, respond=secret_sub(), config=sub_config())
        main = FakeManager(tokenizer, [ask("A") + END, "4" + END], {"sub": sub})
        loop = build(main, tokenizer, seeded_config())
        await loop.run({**SAMPLING, "seed": 11}, raw_prompt=relay.tool_main_messages(), uid="u1", session_id=0,
                       reward_model={"ground_truth": DIGIT}, tools_kwargs=relay.secret_tools_kwargs(DIGIT), index=1)
        return [c["params"]["seed"] for c in main.calls + sub.calls]

    assert asyncio.run(own_seed()) == [11] * 4
    with pytest.raises(InstantiationException, match="multi_agent.trajectory_seeds"):
        seeds_of_a_rollout(tokenizer, seeded_config("yes"))


def test_trajectory_seeds_of_a_prompt_held_in_a_numpy_array(tokenizer):
    """verl may hand ``raw_prompt`` over as a numpy array of messages (parquet): the same seeds as the list."""
    import numpy as np

    messages = [{"role": "system", "content": "Be brief."}, *relay.tool_main_messages()]
    as_list = seeds_of_a_rollout(tokenizer, seeded_config(), raw_prompt=messages)
    as_array = seeds_of_a_rollout(tokenizer, seeded_config(), raw_prompt=np.array(messages, dtype=object))
    assert as_list == as_array and None not in as_list[0]
