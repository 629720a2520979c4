"""Rows of the deep-research task in verl's RL dataset layout, shared by the built-in multi-hop questions
(:mod:`.questions`) and the benchmark loaders (:mod:`.loaders`).

One row per question::

    data_source   "mgrpo_verl/research/<source>" (the rewards module scores every such source)
    prompt        the main agent's chat messages (prompts.main_messages)
    ability       "research"
    reward_model  {"style": "rule", "ground_truth": JSON list of accepted answers}
    extra_info    {"split", "index", "question", "answers", "level", "source", ...extra}

No ``agent_name`` column: the trainer config's ``actor_rollout_ref.rollout.agent.default_agent_loop`` picks
the rollout, ``mgrpo_delegate`` (delegation and tools by tool call, for models that call tools) or
``mgrpo_relay`` (forced delegation, for the tiny CPU models), so one dataset serves both.

``ground_truth`` is a JSON-encoded list so that every row has the same column type whatever the number of
accepted answers (aliases); :func:`decode_answers` reads it back (a plain string is one answer).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Optional

from mgrpo_verl.envs.research import prompts

#: Prefix of every research ``data_source``.
DATA_SOURCE_PREFIX = "mgrpo_verl/research"


def data_source(source: str) -> str:
    """``data_source`` of a research source: ``"mgrpo_verl/research/<source>"``."""
    return f"{DATA_SOURCE_PREFIX}/{source}"


def encode_answers(answers: Sequence[str]) -> str:
    """The ``ground_truth`` of a row: the non-empty answers (stripped, in order, without duplicates) as JSON.

    Raises:
        ValueError: no non-empty answer.
    """
    kept = list(dict.fromkeys(a.strip() for a in answers if isinstance(a, str) and a.strip()))
    if not kept:
        raise ValueError(f"a research question needs at least one non-empty answer, got {list(answers)!r}")
    return json.dumps(kept, ensure_ascii=False)


def decode_answers(ground_truth: Any) -> list[str]:
    """The accepted answers of a ``ground_truth``: a JSON list, a list, or a plain string (one answer)."""
    if isinstance(ground_truth, (list, tuple)):
        return [str(a) for a in ground_truth]
    if hasattr(ground_truth, "tolist"):  # numpy array from parquet
        return [str(a) for a in ground_truth.tolist()]
    text = str(ground_truth)
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            return [text]
        if isinstance(value, list):
            return [str(a) for a in value]
    return [text]


def make_row(
    question: str,
    answers: Sequence[str],
    *,
    source: str,
    index: int,
    split: str,
    level: str = "",
    sub: str = "sub",
    extra: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """One dataset row (layout in the module docstring). ``sub`` is the sub-agent the prompt names.

    Raises:
        ValueError: an empty question or no non-empty answer.
    """
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"a research question must be non-empty text, got {question!r}")
    ground_truth = encode_answers(answers)
    return {
        "data_source": data_source(source),
        "prompt": prompts.main_messages(question.strip(), sub),
        "ability": "research",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "split": split,
            "index": int(index),
            "question": question.strip(),
            "answers": json.loads(ground_truth),
            "level": str(level),
            "source": source,
            **(extra or {}),
        },
    }
