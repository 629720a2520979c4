"""A three-model system of your own: a planner (``main``) and two specialists, ``alice`` and ``bob``.

Each sample hides a two-digit code. Only alice's tool ``read_a`` reads its first digit and only bob's tool
``read_b`` its second, so the main agent can answer only by asking both (``ask_alice`` / ``ask_bob``, the
delegation tools mgrpo_verl gives it) and writing the two reports side by side. Everything here is user code:
nothing in ``mgrpo_verl/`` knows this task. What each piece is for (docs/your_system.md walks through it):

* :class:`ReadPartTool`: a verl ``BaseTool``, one class for both tools (``config.part`` says which digit); named
  by ``tools_alice.yaml`` / ``tools_bob.yaml``, so this folder must be on ``PYTHONPATH`` (``run.sh`` sets it);
* :func:`rows` / ``python specialists.py DATA_DIR``: the RL dataset (verl's layout, the code in
  ``extra_info.tools_kwargs`` where verl's tool loop hands it to the tools);
* :func:`sub_prompt`: what a specialist is asked (``multi_agent.delegation.sub_prompt``);
* :func:`score`: the reward per agent (``multi_agent.delegation.scorer``): the main agent for the whole code,
  alice for the first digit, bob for the second: each specialist is paid for its own part;
* :func:`demonstrations`: what the warm start fine-tunes each model on (``mgrpo_verl.warmstart.demos``), so
  that untrained models start out delegating. The specialists' demonstrations call their tool only part of the
  time (:data:`CALL_RATE`) and otherwise answer :data:`FALLBACK` at once: RL has to teach them to use their tool,
  and a frozen specialist stays lazy. The warm start of each model is what it was shown; the main agent is always
  shown right reports.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

DATA_SOURCE = "specialists"
#: which digit of the code each specialist's tool reads
PARTS = {"alice": 0, "bob": 1}
TOOLS = {"alice": "read_a", "bob": "read_b"}
#: fraction of a specialist's demonstrations that call its tool and report the digit; the others answer FALLBACK
#: without calling. Below one half, so that a specialist's greedy answer starts as FALLBACK.
CALL_RATE = 0.4
#: what a demonstrated specialist says when it does not call its tool: not a digit, the same every time
FALLBACK = "?"

#: what the main agent asks each specialist (one phrase per sample)
TASKS = ("Read your digit and report it.", "What is your digit?", "Find your digit.")


# ------------------------------------------------------------------------------------------ the tools


class ReadPartTool(BaseTool):
    """``read_a()`` / ``read_b()``: "Your digit is <d>." for the sample's code; ``config.part`` is 0 or 1."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        super().__init__(config, tool_schema)
        self.part = int(config["part"])
        self._codes: dict[str, Optional[str]] = {}

    async def create(self, instance_id: Optional[str] = None, create_kwargs: Optional[dict] = None, **kwargs: Any):
        instance_id = instance_id or uuid4().hex
        self._codes[instance_id] = (create_kwargs or {}).get("code")
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        return ToolResponse(text=tool_text(self._codes.get(instance_id), self.part)), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._codes.pop(instance_id, None)


def tool_text(code: Optional[str], part: int) -> str:
    """What the tool answers (the demonstrations show the same text)."""
    if not code or len(str(code)) != 2:
        return "<error: no code for this sample>"
    return f"Your digit is {str(code)[part]}."


# ------------------------------------------------------------------------------------------ data, prompts, reward


MAIN_PROMPT = "Ask alice for the first digit and bob for the second digit, then answer with the two digits only."


def rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` RL rows in verl's layout; the code reaches each tool through ``tools_kwargs``."""
    rng = random.Random(f"specialists-{seed}-{split}")
    out = []
    for i in range(n):
        code = f"{rng.randrange(10)}{rng.randrange(10)}"
        out.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": MAIN_PROMPT}],
            "ability": "specialists",
            "agent_name": "mgrpo_delegate",
            "reward_model": {"style": "rule", "ground_truth": code},
            "extra_info": {"split": split, "index": i,
                           "tools_kwargs": {tool: {"create_kwargs": {"code": code}} for tool in TOOLS.values()}},
        })
    return out


def sub_prompt(agent: str, task: str) -> list[dict[str, str]]:
    """A specialist's prompt for one call: which tool to call, then the main agent's request."""
    return [{"role": "user", "content": f"Call the tool {TOOLS.get(agent, 'read_a')} to read your digit, then "
                                        f"reply with the digit only.\nTask: {task}"}]


def score(role: str, text: str, ground_truth: str, agent: str) -> float:
    """A specialist: 1 for its own digit, else 0. The main agent: half a point per right digit of a two-character
    answer, else 0. What was tried first: a wrong digit paid 0.05 to the specialists, and two wrong digits 0.05 to
    the main agent. The specialists then learnt to say one fixed digit. The main agent learnt to make up two digits
    after alice's "?" instead of asking bob (bob's rows fell from 49 to 5 a step in 4 steps). A main agent paid
    per right digit gains from asking bob, whatever alice said."""
    answer, truth = str(text).strip(), str(ground_truth).strip()
    if len(truth) != 2:
        return 0.0
    if role == "sub":
        return float(agent in PARTS and answer == truth[PARTS[agent]])
    return sum(a == t for a, t in zip(answer, truth)) / 2 if len(answer) == 2 else 0.0


# ------------------------------------------------------------------------------------------ demonstrations


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def demonstrations(n: int, seed: int, split: str) -> list[dict[str, list[dict[str, Any]]]]:
    """One episode per RL row of the same seed and split: each agent's whole conversation as the rollout would
    build it. The main agent asks alice, then bob, then writes the two digits; each specialist calls its tool and
    reports its digit or, drawn per episode, answers :data:`FALLBACK` without calling.

    What was tried first: every specialist called its tool and reported :data:`FALLBACK` instead of the digit in half
    of the episodes. Both answers then followed the same tool response, the specialists did not learn to copy the
    digit in their 40 steps (teacher-forced p(right digit) 0.08 alice, 0.04 bob) and bob's RL never took off (its
    training score stayed 0.02-0.16 for 15 steps). Apart, the copy is learnt (p 0.99 after 140 steps, probed) and
    calling or not is one token that RL moves."""
    rng, report_rng = random.Random(f"demos-{seed}-{split}"), random.Random(f"reports-{seed}-{split}")
    episodes = []
    for row in rows(n, seed, split):
        code = row["reward_model"]["ground_truth"]
        task = rng.choice(TASKS)
        episode: dict[str, list[dict[str, Any]]] = {}
        for agent, part in PARTS.items():
            if report_rng.random() < CALL_RATE:
                episode[agent] = [
                    *sub_prompt(agent, task),
                    {"role": "assistant", "content": "", "tool_calls": [_call(TOOLS[agent], {})]},
                    {"role": "tool", "content": tool_text(code, part)},
                    {"role": "assistant", "content": code[part]},
                ]
            else:
                episode[agent] = [*sub_prompt(agent, task), {"role": "assistant", "content": FALLBACK}]
        # The main agent is shown right reports only: shown FALLBACK in 30 % of them too, it did not learn to copy
        # a digit within its 400 + 150 steps (teacher-forced p(right digit) 0.10; 0.56 when shown digits only).
        # One call per turn: verl's SFT dataset renders each message on its own, and the chat template merges the
        # responses of calls made in one turn into one block, so parallel calls cannot be demonstrated as the
        # rollout shows them.
        episode["main"] = [
            *row["prompt"],
            {"role": "assistant", "content": "", "tool_calls": [_call("ask_alice", {"task": task})]},
            {"role": "tool", "content": code[0]},
            {"role": "assistant", "content": "", "tool_calls": [_call("ask_bob", {"task": task})]},
            {"role": "tool", "content": code[1]},
            {"role": "assistant", "content": code},
        ]
        episodes.append(episode)
    return episodes


def write_data(directory: str | Path, n_train: int = 256, n_val: int = 32, seed: int = 0) -> None:
    import pandas as pd

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("val", n_val)):
        pd.DataFrame(rows(n, seed, split)).to_parquet(out / f"{split}.parquet")
        print(f"wrote {out / f'{split}.parquet'} ({n} rows)")


if __name__ == "__main__":
    write_data(sys.argv[1] if len(sys.argv) > 1 else "data")
