"""Held-out evaluation of (warm-started) models on a delegation task, through the rollout's own loop.

Each episode runs the real tool-delegation loop (agent loop ``mgrpo_delegate``,
:class:`mgrpo_verl.agent_loops.tool_delegation.ToolDelegationLoop`, built as verl's agent-loop worker builds it)
with Hugging Face ``generate`` on CPU standing in for the rollout servers: one client per agent, the
sub-agent's with its own model and its tool config. Tokenisation, tool-call parsing, tool execution and
the hand-over of the report are therefore exactly the rollout's.

Figures (:class:`EvalResult`), each over the held-out samples of the task (its ``val`` split):

* ``exact``: the main agent's final answer, stripped, is the digit (what RL has to raise);
* ``score``: the task's own dense score of that answer (``acc`` of the loop's ``QueryStats``);
* ``main_parse``: the main agent's first turn holds a tool call that verl's ``hermes`` parser reads
  (``HermesToolParser``) into a call of the delegation tool with a JSON-object argument with a non-empty
  ``task``;
* ``sub_parse``: the same for each sub-agent call's first turn and ``read_secret``;
* ``sub_exact``: a sub-agent call's report is the digit;
* ``calls``, ``failed_calls``: per episode, from the loop's main row (``agent_loops.common.QueryStats``);
* ``main_digit_prob``, ``sub_digit_prob``: teacher-forced on the held-out demonstrations, the probability
  each agent's model gives the right digit as the first token of its answer turn (0.1: a uniform guess,
  1: solved), which says what the exact rates of a few dozen episodes say only noisily.

``temperature=0`` is greedy decoding; ``1.0`` samples as the RL rollout does by default.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from mgrpo_verl.envs import relay

#: Rollout settings of the evaluation (and the values the RL run should use for the task: docs/warmstart.md).
PROMPT_LENGTH = 512
RESPONSE_LENGTH = 128
SUB_RESPONSE_TOKENS = 48


@dataclass
class EvalResult:
    temperature: float
    episodes: int
    exact: float
    score: float
    main_parse: float
    sub_parse: float
    sub_exact: float
    calls: float
    failed_calls: float
    main_digit_prob: float
    sub_digit_prob: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _HFAgent:
    """One agent's "rollout server": ``generate`` of a Hugging Face model, recording every generation."""

    def __init__(self, name: str, model: Any, config: Any, temperature: float, log: list, seed: int):
        self.name = name
        self.model = model
        self.config = config
        self.temperature = temperature
        self.log = log
        self.generator_seed = seed

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        from verl.workers.rollout.replica import TokenOutput

        max_tokens = int(sampling_params.get("max_tokens") or 32)
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        kwargs: dict[str, Any] = {"do_sample": False}
        if self.temperature > 0:
            torch.manual_seed(self.generator_seed + len(self.log))
            kwargs = {"do_sample": True, "temperature": self.temperature, "top_p": 1.0, "top_k": 0}
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_tokens, **kwargs
            )
        token_ids = out[0, len(prompt_ids) :].tolist()
        self.log.append({"agent": self.name, "request_id": request_id, "token_ids": token_ids})
        return TokenOutput(token_ids=token_ids, log_probs=None, extra_fields={})


class _Manager(_HFAgent):
    """The main agent's client plus ``for_agent`` (what the multi-agent client offers the loop)."""

    def __init__(self, *args: Any, subs: dict[str, _HFAgent], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.subs = subs

    def for_agent(self, name: str) -> _HFAgent:
        return self if name == "main" else self.subs[name]


def _load(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or model.config.pad_token_id
    return model


def agent_config(model_dir: str, tokenizer_dir: str, tool_config_path: Optional[str] = None) -> Any:
    """An agent's full config, as far as the loop reads it."""
    multi_turn: dict[str, Any] = {
        "max_assistant_turns": None,
        "max_user_turns": None,
        "max_parallel_calls": 1,
        "max_tool_response_length": 256,
        "tool_response_truncate_side": "middle",
        "format": "hermes_strict",
    }
    if tool_config_path:
        multi_turn["tool_config_path"] = tool_config_path
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": model_dir, "tokenizer_path": tokenizer_dir},
                "rollout": {
                    "prompt_length": PROMPT_LENGTH,
                    "response_length": RESPONSE_LENGTH,
                    "full_determinism": False,
                    "multi_turn": multi_turn,
                },
            },
            "data": {},
        }
    )


def loop_config(main_dir: str, tokenizer_dir: str) -> Any:
    """The trainer config the tool-delegation loop reads: the main agent's settings and ``multi_agent``."""
    config = agent_config(main_dir, tokenizer_dir)
    config.multi_agent = {
        "main": "main",
        "agents": {"main": {}, "sub": {}},
        "delegation": {
            "timeout_s": 600, "sub_response_tokens": SUB_RESPONSE_TOKENS, "max_calls": 3, "sub_max_turns": 2,
        },
    }
    return config


async def _parsed_call(parser: Any, token_ids: list[int], name: str, required: tuple[str, ...]) -> bool:
    """Whether verl's hermes parser reads a call of ``name`` with object arguments holding ``required``
    (non-empty strings) from ``token_ids``."""
    _, calls = await parser.extract_tool_calls(token_ids)
    for call in calls:
        try:
            arguments = json.loads(call.arguments)
        except (TypeError, ValueError):
            continue
        if call.name == name and isinstance(arguments, dict):
            if all(isinstance(arguments.get(k), str) and arguments[k].strip() for k in required):
                return True
    return False


def digit_probability(model: Any, tokenizer: Any, episodes: list, agent: str) -> float:
    """Mean probability ``model`` gives the demonstrated answer's first token after the agent's demonstrated
    context (prompt with tools, tool call, tool response), over ``episodes``."""
    total = 0.0
    for episode in episodes:
        messages = episode.messages[agent]
        ids = tokenizer.apply_chat_template(
            messages[:-1], tools=episode.tools[agent], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        target = tokenizer.encode(messages[-1]["content"], add_special_tokens=False)[0]
        with torch.no_grad():
            logits = model(torch.tensor([ids], dtype=torch.long)).logits[0, -1]
        total += torch.softmax(logits.float(), -1)[target].item()
    return total / len(episodes)


def evaluate(
    main_dir: str,
    sub_dir: str,
    tokenizer_dir: str,
    n: int = 64,
    seed: int = 0,
    temperatures: tuple[float, ...] = (0.0, 1.0),
    split: str = "val",
) -> list[EvalResult]:
    """Run ``n`` held-out episodes of the relay_tools task per temperature; one :class:`EvalResult` each."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import HermesToolParser

    from mgrpo_verl.agent_loops.common import QueryStats
    from mgrpo_verl.agent_loops.testing import build_agent_loop

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    parser = HermesToolParser(tokenizer)
    models = {"main": _load(main_dir), "sub": _load(sub_dir)}
    rows = relay.build_tool_rows(n, seed, split)
    from mgrpo_verl.warmstart.demos import demos_for

    episodes = demos_for("relay_tools").episodes(n, seed, split)
    digit_prob = {agent: digit_probability(models[agent], tokenizer, episodes, agent) for agent in models}
    results = []
    for temperature in temperatures:
        log: list[dict[str, Any]] = []
        sub_config = agent_config(sub_dir, tokenizer_dir, relay.SUB_TOOL_CONFIG)
        sub = _HFAgent("sub", models["sub"], sub_config, temperature, log, seed + 1)
        manager = _Manager("main", models["main"], None, temperature, log, seed, subs={"sub": sub})
        config = loop_config(main_dir, tokenizer_dir)
        manager.config = config
        totals = dict.fromkeys(("exact", "score", "main_parse", "calls", "failed_calls"), 0.0)
        sub_calls = sub_parse = sub_exact = 0
        start = time.perf_counter()

        async def run_all() -> None:
            nonlocal sub_calls, sub_parse, sub_exact
            loop = build_agent_loop(relay.TOOLS_AGENT_LOOP_NAME, config, manager, tokenizer)
            sampling = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": False}
            for i, row in enumerate(rows):
                first = len(log)
                digit = str(row["reward_model"]["ground_truth"])
                out = await loop.run(
                    dict(sampling),
                    raw_prompt=list(row["prompt"]),
                    reward_model=row["reward_model"],
                    tools_kwargs=row["extra_info"]["tools_kwargs"],
                    extra_info=row["extra_info"],
                    uid=f"eval{i}",
                    session_id=0,
                )
                stats = QueryStats.read(out[-1].extra_fields["reward_extra_info"], f"episode {i}'s main row")
                totals["exact"] += float(stats.answer.strip() == digit)
                totals["score"] += stats.acc
                totals["calls"] += stats.calls
                totals["failed_calls"] += stats.failed_calls
                generations = log[first:]
                mains = [g for g in generations if g["agent"] == "main"]
                if mains:
                    totals["main_parse"] += float(
                        await _parsed_call(parser, mains[0]["token_ids"], relay.delegation_tool_name("sub"), ("task",))
                    )
                by_call: dict[str, list[list[int]]] = {}
                for g in generations:
                    if g["agent"] == "sub":
                        by_call.setdefault(g["request_id"], []).append(g["token_ids"])
                for turns in by_call.values():
                    sub_calls += 1
                    sub_parse += await _parsed_call(parser, turns[0], relay.SECRET_TOOL, ())
                    report = tokenizer.decode(turns[-1], skip_special_tokens=True)
                    sub_exact += "<tool_call>" not in report and report.strip() == digit

        asyncio.run(run_all())
        results.append(
            EvalResult(
                temperature=temperature,
                episodes=n,
                exact=totals["exact"] / n,
                score=totals["score"] / n,
                main_parse=totals["main_parse"] / n,
                sub_parse=sub_parse / sub_calls if sub_calls else 0.0,
                sub_exact=sub_exact / sub_calls if sub_calls else 0.0,
                calls=totals["calls"] / n,
                failed_calls=totals["failed_calls"] / n,
                main_digit_prob=digit_prob["main"],
                sub_digit_prob=digit_prob["sub"],
                seconds=time.perf_counter() - start,
            )
        )
    return results


def main(argv: Optional[list[str]] = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", required=True, help="main agent's model directory")
    parser.add_argument("--sub", required=True, help="sub-agent's model directory")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the main model's)")
    parser.add_argument("-n", type=int, default=64, help="held-out episodes per temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    args = parser.parse_args(argv)
    results = evaluate(args.main, args.sub, args.tokenizer or args.main, args.n, args.seed, tuple(args.temperatures))
    for result in results:
        print(json.dumps(result.as_dict()))


if __name__ == "__main__":
    main()
