"""The cooperative tasks of MAGRPO and the protocol the cooperative loop (``mgrpo_verl.agent_loops.cooperative``)
reads them through (:class:`CoopTask`, :class:`CoopReward`, :class:`Turn`).

A dataset row names its task by ``data_source`` and its item by ``reward_model.ground_truth``:

- ``mgrpo_verl/coop_code``: HumanEval coding collaboration (``mgrpo_verl/envs/coop_code.py``). Agents
  ``helper`` (writes ``aux``) and ``main`` (writes the entry point, which should call ``aux``); the item is
  the HumanEval ``task_id``; the joint reward is the tiered score of the combined program, run in the
  sandbox; the feedback for the next turn is the test outcome.
- ``mgrpo_verl/coop_writing``: writing collaboration on Wikipedia summaries
  (``mgrpo_verl/envs/coop_writing.py``). Agents ``summary`` and ``details``; the item is the article title;
  the joint reward is structure + style consistency + coherence; the feedback is the reward's parts.

``write_code_dataset`` / ``write_writing_dataset`` write verl's parquet splits (built-in tasks
``coop_code`` and ``coop_writing``, ``mgrpo_verl.task``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mgrpo_verl.envs.coop_writing import DATASET_SPLIT_SEED, DATASET_TRAIN, DATASET_VAL
from mgrpo_verl.envs.splits import write_splits

CODE_SOURCE = "mgrpo_verl/coop_code"
WRITING_SOURCE = "mgrpo_verl/coop_writing"

COOP_LOOP_NAME = "magrpo_coop"
"""The agent loop the datasets' rows name (``mgrpo_verl.agent_loops.cooperative`` registers it)."""


@dataclass(frozen=True)
class CoopReward:
    """A joint action's outcome: the joint reward, its components (logged), and feedback for the next turn."""

    reward: float
    info: dict[str, float] = field(default_factory=dict)
    feedback: str | None = None


@dataclass(frozen=True)
class Turn:
    """One earlier turn as an agent sees it: every agent's completion and the feedback that followed."""

    outputs: dict[str, str]
    feedback: str | None


class CoopTask(Protocol):
    """What the loop needs from a cooperative task (``mgrpo_verl/envs/coop_tasks.py`` registers them)."""

    agents: tuple[str, ...]
    """The agents, in the order their rows are emitted."""

    info_keys: tuple[str, ...]
    """Keys of :attr:`CoopReward.info` (every row carries the same ones)."""

    def messages(self, item: Any, agent: str, history: list[Turn]) -> list[dict[str, str]]:
        """Chat messages of ``agent`` at the next turn, given the earlier turns."""

    def reward(self, item: Any, outputs: dict[str, str]) -> CoopReward:
        """The joint reward of one joint action (every agent's completion)."""


class _CoopTask:
    """What both tasks share: later turns are the first-turn prompt plus the earlier turns (every agent's
    text through the task's ``with_peer``, the agent's own as :attr:`self_role`) and the feedback."""

    self_role = "you"

    def first_messages(self, item: Any, agent: str) -> list[dict[str, str]]:
        raise NotImplementedError

    def with_peer(self, messages: list[dict[str, str]], peer: str, text: str) -> list[dict[str, str]]:
        raise NotImplementedError

    def messages(self, item: Any, agent: str, history: list[Turn]) -> list[dict[str, str]]:
        out = self.first_messages(item, agent)
        for turn in history:
            for peer, text in turn.outputs.items():
                out = self.with_peer(out, self.self_role if peer == agent else peer, text)
            if turn.feedback:
                last = out[-1]
                out = out[:-1] + [{**last,
                                   "content": last["content"] + f"\n\nFeedback: {turn.feedback}\nImprove your part."}]
        return out


class CodeTask(_CoopTask):
    """HumanEval coding collaboration (see the module docstring)."""

    agents = ("helper", "main")
    info_keys = ("structure", "syntax", "tests_passed", "test_fraction", "cooperation")

    @functools.cached_property
    def problems(self) -> dict[str, Any]:
        from mgrpo_verl.envs.coop_code import load_humaneval

        return {p.task_id: p for p in load_humaneval()}

    def first_messages(self, item: Any, agent: str) -> list[dict[str, str]]:
        from mgrpo_verl.envs import coop_code

        problem = self.problems[str(item)]
        return coop_code.helper_messages(problem) if agent == "helper" else coop_code.main_messages(problem)

    def single_messages(self, item: Any) -> list[dict[str, str]]:
        from mgrpo_verl.envs import coop_code

        return coop_code.single_messages(self.problems[str(item)])

    def split_single(self, item: Any, text: str) -> dict[str, str]:
        """One model's whole program: both parts are the same text (each part's function is extracted from it)."""
        return {"helper": text, "main": text}

    def with_peer(self, messages: list[dict[str, str]], peer: str, text: str) -> list[dict[str, str]]:
        from mgrpo_verl.envs import coop_code

        return coop_code.with_peer(messages, peer, text)

    def reward(self, item: Any, outputs: dict[str, str]) -> CoopReward:
        from mgrpo_verl.envs.coop_code import score_coop

        s = score_coop(self.problems[str(item)], outputs["helper"], outputs["main"])
        info = {"structure": float(s.structure), "syntax": float(s.syntax), "tests_passed": float(s.tests_passed),
                "test_fraction": float(s.test_fraction), "cooperation": float(s.cooperation)}
        feedback = "all tests passed" if s.tests_passed else f"tests failed ({s.status})"
        return CoopReward(float(s.reward), info, feedback)


class WritingTask(_CoopTask):
    """Writing collaboration on Wikipedia summaries (see the module docstring)."""

    agents = ("summary", "details")
    info_keys = ("structure", "style", "coherence")

    @functools.cached_property
    def articles(self) -> dict[str, Any]:
        from mgrpo_verl.envs.coop_writing import load_wiki_summaries

        return {a.title: a for a in load_wiki_summaries()}

    def first_messages(self, item: Any, agent: str) -> list[dict[str, str]]:
        from mgrpo_verl.envs import coop_writing

        return coop_writing.agent_messages(self.articles[str(item)], agent)

    def single_messages(self, item: Any) -> list[dict[str, str]]:
        from mgrpo_verl.envs import coop_writing

        return coop_writing.single_messages(self.articles[str(item)])

    def split_single(self, item: Any, text: str) -> dict[str, str]:
        from mgrpo_verl.envs.coop_writing import split_single_response

        summary, details = split_single_response(text)
        return {"summary": summary, "details": details}

    def with_peer(self, messages: list[dict[str, str]], peer: str, text: str) -> list[dict[str, str]]:
        from mgrpo_verl.envs import coop_writing

        return coop_writing.with_peer(messages, peer, text)

    def reward(self, item: Any, outputs: dict[str, str]) -> CoopReward:
        from mgrpo_verl.envs.coop_writing import score_writing

        s = score_writing(outputs["summary"], outputs["details"], article=self.articles[str(item)])
        feedback = (
            f"structure {s.structure:.2f}, style {s.style:.2f}, coherence {s.coherence:.2f}, "
            f"relevance {s.relevance:.2f}"
        )
        info = {"structure": s.structure, "style": s.style, "coherence": s.coherence, "relevance": s.relevance}
        return CoopReward(float(s.reward), info, feedback)


#: built-in task name (``mgrpo_verl.task``) -> data_source
TASK_SOURCES = {"coop_code": CODE_SOURCE, "coop_writing": WRITING_SOURCE}


@functools.cache
def task_for(data_source: str | None) -> CodeTask | WritingTask:
    """The task of a dataset row's ``data_source`` (one instance per process)."""
    tasks = {CODE_SOURCE: CodeTask, WRITING_SOURCE: WritingTask}
    if data_source not in tasks:
        raise ValueError(f"no cooperative task for data_source {data_source!r}; known: {sorted(tasks)}")
    return tasks[data_source]()


def _row(source: str, split: str, index: int, item: str, preview: str) -> dict[str, Any]:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": preview}],
        "agent_name": COOP_LOOP_NAME,
        "ability": "cooperation",
        "reward_model": {"style": "rule", "ground_truth": item},
        "extra_info": {"split": split, "index": index},
    }


def write_code_dataset(directory: str | Path, n_train: int = 132, n_val: int = 32, seed: int = 0) -> tuple[Path, Path]:
    """HumanEval's 164 problems split into train / val (shuffled with ``seed``)."""
    import random

    from mgrpo_verl.envs.coop_code import load_humaneval

    problems = sorted(load_humaneval(), key=lambda p: p.task_id)
    random.Random(seed).shuffle(problems)
    parts = {"train": problems[:n_train], "val": problems[n_train : n_train + n_val]}
    return write_splits(
        directory,
        lambda split, n: [_row(CODE_SOURCE, split, i, p.task_id, p.prompt) for i, p in enumerate(parts[split][:n])],
        n_train, n_val,
    )


def write_writing_dataset(directory: str | Path, n_train: int = DATASET_TRAIN, n_val: int = DATASET_VAL,
                          seed: int = DATASET_SPLIT_SEED) -> tuple[Path, Path]:
    """Wikipedia articles for the writing task (``coop_writing.writing_splits``)."""
    from mgrpo_verl.envs.coop_writing import writing_splits

    train, val = writing_splits(seed, n_train, n_val)
    parts = {"train": train, "val": val}
    return write_splits(
        directory,
        lambda split, n: [_row(WRITING_SOURCE, split, i, a.title, a.title) for i, a in enumerate(parts[split][:n])],
        n_train, n_val,
    )
