"""The embedded single-agent CPU task: echo a digit.

The prompt asks the model to repeat one digit; the reward is dense, so that a tiny random model trained
from scratch on 2 CPU cores shows a rising reward within a few minutes of GRPO:

    score = mean over the first ``ECHO_WINDOW`` characters of the answer of
            1.0 for the asked digit, 0.25 for any other digit, 0 otherwise

(an empty answer scores 0). A random model scores near 0; emitting digits is learnt first, the right
digit next. It exists to prove the whole trainer path (rollout → reward → advantage → update → weight
sync) on CPU; the multi-agent tasks live beside it.

Used by verl through ``reward.custom_reward_function.path=pkg://mgrpo_verl.envs.echo`` and
``reward.custom_reward_function.name=compute_score``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from mgrpo_verl.envs.splits import write_splits

DATA_SOURCE = "mgrpo_verl/echo"

#: How many characters of the answer are scored.
ECHO_WINDOW = 8


def make_prompt(digit: str) -> list[dict[str, str]]:
    """Chat messages asking for ``digit``."""
    return [{"role": "user", "content": f"Repeat the digit {digit}."}]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """verl reward-function signature. ``solution_str`` is the decoded answer, ``ground_truth`` the digit."""
    if data_source != DATA_SOURCE:
        raise ValueError(f"mgrpo_verl.envs.echo scores data_source {DATA_SOURCE!r}, got {data_source!r}")
    if len(ground_truth) != 1 or not ground_truth.isdigit():
        raise ValueError(f"echo ground truth must be one digit, got {ground_truth!r}")
    text = solution_str.strip()[:ECHO_WINDOW]
    if not text:
        return 0.0
    points = sum(1.0 if c == ground_truth else 0.25 if c.isdigit() else 0.0 for c in text)
    return points / ECHO_WINDOW


def build_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` dataset rows in verl's RL layout (``prompt`` messages, ``reward_model.ground_truth``)."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for i in range(n):
        digit = str(rng.randrange(10))
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": make_prompt(digit),
                "ability": "echo",
                "reward_model": {"style": "rule", "ground_truth": digit},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


def write_dataset(directory: str | Path, n_train: int = 256, n_val: int = 32, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` into ``directory`` (created); returns their paths."""
    return write_splits(directory, lambda split, n: build_rows(n, seed, split), n_train, n_val)
