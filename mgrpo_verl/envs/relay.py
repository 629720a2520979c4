"""The built-in multi-agent CPU task "relay": the main agent can only succeed through its helper.

Each sample has a secret digit ``g`` (the ground truth). The main agent (planner) is asked

    "Ask your helper for the secret digit, then write it."

and never sees ``g``. The rollout loop (:class:`mgrpo_verl.rollout.delegation.RelayDelegationLoop`) lets
the main agent write a short plan, then calls the sub-agent, whose prompt does contain the digit
(:func:`sub_messages`), shows the main agent what the helper said, and lets it write its final answer.
The main agent therefore scores well only when the sub-agent repeats the digit and the main agent copies
it, which makes the credit assignment between the two agents real.

Scores are dense, with the rule of the single-agent echo task (:func:`mgrpo_verl.envs.echo.compute_score`,
reused here, not copied): over the first characters of the answer, 1 point for the right digit, 0.25 for
any other digit, 0 otherwise, divided by the window size.

* :func:`main_score`: the main agent's final answer against ``g``;
* :func:`sub_local_score`: one sub-agent answer against ``g`` (the sub-agent's own, local score);
* :func:`compute_score`: verl's reward-function signature, scoring a main answer (used when verl's
  reward loop scores the rows itself, e.g. a single-agent run or validation through
  ``mgrpo_verl.envs.rewards``).

Dataset rows carry ``agent_name: "mgrpo_relay"`` so verl runs the relay loop for them.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from mgrpo_verl.envs import echo

DATA_SOURCE = "mgrpo_verl/relay"

#: Agent loop that verl runs for the rows (``@register`` name of ``RelayDelegationLoop``).
AGENT_LOOP_NAME = "mgrpo_relay"

MAIN_PROMPT = "Ask your helper for the secret digit, then write it."


def main_messages() -> list[dict[str, str]]:
    """Chat messages of the main agent; they never contain the digit."""
    return [{"role": "user", "content": MAIN_PROMPT}]


def sub_messages(digit: str, plan: str) -> list[dict[str, str]]:
    """Chat messages of one sub-agent call: the digit, then the main agent's plan as its request."""
    return [{"role": "user", "content": f"The secret digit is {digit}. Repeat the digit {digit}.\nRequest: {plan}"}]


def digit_score(text: str, digit: str) -> float:
    """The echo task's dense digit score of ``text`` against ``digit`` (see :mod:`mgrpo_verl.envs.echo`)."""
    return echo.compute_score(echo.DATA_SOURCE, text, str(digit))


def main_score(answer_text: str, digit: str) -> float:
    """Score of the main agent's final answer: format + correctness.

    Emitting digits is the format (0.25 per digit character in the window), the right digit is the
    correctness (1 per character); see :func:`digit_score`.
    """
    return digit_score(answer_text, digit)


def sub_local_score(sub_answer_text: str, digit: str) -> float:
    """Local score of one sub-agent answer: how well it repeated the digit it was given."""
    return digit_score(sub_answer_text, digit)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """verl reward-function signature: ``solution_str`` is a decoded main answer, ``ground_truth`` the digit.

    Raises:
        ValueError: ``data_source`` is not :data:`DATA_SOURCE`, or the ground truth is not one digit.
    """
    if data_source != DATA_SOURCE:
        raise ValueError(f"mgrpo_verl.envs.relay scores data_source {DATA_SOURCE!r}, got {data_source!r}")
    return main_score(solution_str, ground_truth)


def build_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` dataset rows in verl's RL layout plus ``agent_name`` (the loop verl runs for them)."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for i in range(n):
        digit = str(rng.randrange(10))
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": main_messages(),
                "ability": "relay",
                "reward_model": {"style": "rule", "ground_truth": digit},
                "extra_info": {"split": split, "index": i},
                "agent_name": AGENT_LOOP_NAME,
            }
        )
    return rows


def write_dataset(directory: str | Path, n_train: int = 256, n_val: int = 32, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` into ``directory`` (created); returns their paths."""
    import pandas as pd

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", n_train), ("val", n_val)):
        path = out / f"{split}.parquet"
        pd.DataFrame(build_rows(n, seed, split)).to_parquet(path)
        paths.append(path)
    return paths[0], paths[1]
