"""Prompts of the deep-research task: the main agent (planner) and one sub-agent call (researcher).

The main agent runs the tool-delegation loop (``mgrpo_delegate``): its tools are ``reason(thought)`` (a
scratchpad, ``research_main_tools.yaml``) and ``ask_<sub>(task)`` (a call to the sub-agent, added by the
loop). Each call prompts the sub-agent with :func:`sub_messages` (``multi_agent.delegation.sub_prompt``),
whose tools are ``search(query)`` and ``visit(doc, page)`` over the offline corpus
(``research_sub_tools.yaml``). Both end with ``Answer: <short answer>``, which
:func:`mgrpo_verl.envs.research.rewards.extract_answer` reads.

:func:`sub_messages_with_evidence` is the variant for models too small to call tools (the CPU recipe's
tiny models): the sub-agent's prompt already holds the corpus's top BM25 hits for the task, so the answer
is reachable by reading, and the tools stay available to a model that can use them.
"""

from __future__ import annotations

from mgrpo_verl.envs.relay import delegation_tool_name

#: The line both agents end with; the rewards read what follows it.
ANSWER_PREFIX = "Answer:"

#: BM25 hits shown by :func:`sub_messages_with_evidence`.
EVIDENCE_HITS = 3


def main_prompt(question: str, sub: str = "sub") -> str:
    """The main agent's instructions and the question; ``sub`` names the sub-agent (tool ``ask_<sub>``)."""
    return (
        "Answer the question. You cannot read documents yourself: delegate research to your assistant with "
        f"the tool {delegation_tool_name(sub)}(task), which searches and reads an offline encyclopedia and "
        "reports back. Use the tool reason(thought) to plan. Delegate as many focused tasks as you need, "
        f"then reply with one line: {ANSWER_PREFIX} <short answer>\n"
        f"Question: {question}"
    )


def main_messages(question: str, sub: str = "sub") -> list[dict[str, str]]:
    """Chat messages of the main agent for ``question`` (the dataset's ``prompt`` column)."""
    return [{"role": "user", "content": main_prompt(question, sub)}]


def sub_prompt(task: str) -> str:
    """The sub-agent's instructions for one delegated ``task``."""
    return (
        "You are a research assistant. Use the tools search(query) to find documents in an offline "
        "encyclopedia and visit(doc, page) to read one. Then report what you found in one or two sentences "
        f"and end with one line: {ANSWER_PREFIX} <short answer>\n"
        f"Task: {task}"
    )


def sub_messages(agent: str, task: str) -> list[dict[str, str]]:
    """``multi_agent.delegation.sub_prompt`` of the research task (``agent``, the sub-agent's name, unused)."""
    return [{"role": "user", "content": sub_prompt(task)}]


def sub_messages_with_evidence(agent: str, task: str) -> list[dict[str, str]]:
    """:func:`sub_messages` plus the corpus's top :data:`EVIDENCE_HITS` BM25 hits for ``task`` (a search
    run for the sub-agent before its first turn); an empty task gets the plain prompt."""
    from mgrpo_verl.envs.research.corpus import Corpus, format_hits

    text = sub_prompt(task)
    if task.strip():
        text += "\nSearch results for the task:\n" + format_hits(task, Corpus.default().search(task, EVIDENCE_HITS))
    return [{"role": "user", "content": text}]
