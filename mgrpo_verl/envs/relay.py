"""The built-in multi-agent CPU task "relay": the main agent can only succeed through its helper.

The main agent is asked for a secret digit it never sees; in ``relay`` (loop ``mgrpo_relay``) only the
sub-agent's prompt holds it, in ``relay_tools`` (loop ``mgrpo_delegate``) only the sub-agent's tool
``read_secret`` can read it. Dense digit scores, the echo task's rule. verl ships no multi-agent task. The
prompts, the tool, the scores: ``docs/multi_agent.md``, "The relay tasks".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgrpo_verl.envs import echo
from mgrpo_verl.envs.splits import write_splits
from mgrpo_verl.user_code import load_function

DATA_SOURCE = "mgrpo_verl/relay"

#: Agent loop that verl runs for the rows (``@register`` name of ``RelayDelegationLoop``).
AGENT_LOOP_NAME = "mgrpo_relay"

MAIN_PROMPT = "Ask your helper for the secret digit, then write it."

#: Agent loop of the "relay_tools" variant (``@register`` name of ``ToolDelegationLoop``).
TOOLS_AGENT_LOOP_NAME = "mgrpo_delegate"

#: The sub-agent's tool that reads the sample's secret digit.
SECRET_TOOL = "read_secret"

#: verl tool config (``multi_turn.tool_config_path``) giving the sub-agent :data:`SECRET_TOOL`.
SUB_TOOL_CONFIG = str(Path(__file__).resolve().parents[1] / "config" / "tools" / "relay_sub_tools.yaml")


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


#: ``scorer(role, text, ground_truth) -> float`` with ``role`` "main" (a final answer) or "sub" (one
#: sub-agent answer): how the relay loop scores its rows. Opt-in: a scorer with a parameter named ``agent``
#: (``def score(role, text, ground_truth, agent)``, or keyword-only ``*, agent``) is also told which agent wrote
#: ``text`` (:func:`accepts_agent`): the sub-agent's name for a report, the main agent's (``multi_agent.main``)
#: for the final answer, so each sub-agent can be paid for its own part.
Scorer = Callable[[str, str, str], float]


def accepts_agent(scorer: Callable[..., Any]) -> bool:
    """Whether ``scorer`` takes the keyword ``agent``: a parameter of that name that can be passed by keyword
    (``**kwargs`` alone does not opt in: such a scorer is called as before). Inspected once, when the delegation
    settings load the scorer (``agent_loops.common.DelegationSettings``)."""
    try:
        parameter = inspect.signature(scorer).parameters.get("agent")
    except (TypeError, ValueError):  # no signature (some builtins): the three-argument contract
        return False
    return parameter is not None and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                         inspect.Parameter.KEYWORD_ONLY)


def default_scorer(role: str, text: str, ground_truth: str) -> float:
    """:func:`main_score` for the main agent's answer, :func:`sub_local_score` for a sub-agent's."""
    return main_score(text, ground_truth) if role == "main" else sub_local_score(text, ground_truth)


#: :func:`exact_scorer`'s score of an answer that is one digit, the wrong one (format credit).
EXACT_FORMAT_CREDIT = 0.05


def exact_scorer(role: str, text: str, ground_truth: str) -> float:
    """A scorer that rewards exact answers only (``multi_agent.delegation.scorer=mgrpo_verl.envs.relay:exact_scorer``):
    1 when ``text``, stripped, is the digit; :data:`EXACT_FORMAT_CREDIT` when it is another single ASCII digit
    (``str.isdigit`` would also credit "７", "٧" or "²"); 0 otherwise. The dense default pays "7." as "7" and up
    to 1 for "77777777", so RL on it need not raise exact accuracy (docs/warmstart.md); nothing here pays more
    than a bare digit."""
    answer, digit = str(text).strip(), str(ground_truth).strip()
    if answer == digit:
        return 1.0
    return EXACT_FORMAT_CREDIT if len(answer) == 1 and "0" <= answer <= "9" else 0.0


def load_scorer(spec: str | None) -> Scorer:
    """The scorer named by ``multi_agent.delegation.scorer``: ``null`` for :func:`default_scorer`, or
    ``"package.module:function"`` / ``"path/to/file.py:function"`` (e.g. a task of your own, or a dense
    test reward), as it is: called ``f(role, text, ground_truth)``, plus ``agent=<name>`` when it takes that
    keyword (:data:`Scorer`, :func:`accepts_agent`).

    Raises:
        ValueError: a malformed spec, a module that cannot be imported, or a name that is not callable.
    """
    if not spec:
        return default_scorer
    return load_function(spec, "multi_agent.delegation.scorer")


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
    rows = echo.build_rows(n, seed, split)  # the same digits as the echo task for the same seed and split
    for row in rows:
        row.update(data_source=DATA_SOURCE, prompt=main_messages(), ability="relay", agent_name=AGENT_LOOP_NAME)
    return rows


def write_dataset(directory: str | Path, n_train: int = 256, n_val: int = 32, seed: int = 0) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` into ``directory`` (created); returns their paths."""
    return write_splits(directory, lambda split, n: build_rows(n, seed, split), n_train, n_val)


# ----------------------------------------------------------------------------------------------------
# variant "relay_tools": delegation by tool call, the digit behind the sub-agent's own tool


def delegation_tool_name(agent: str) -> str:
    """Name of the main agent's tool that delegates to ``agent``: ``ask_<agent>``."""
    return f"ask_{agent}"


def tool_main_prompt(sub: str = "sub") -> str:
    """The main agent's prompt of the tool variant; it never contains the digit."""
    return (
        f"Call the tool {delegation_tool_name(sub)} to find the secret digit, then answer with the digit only."
    )


def tool_main_messages(sub: str = "sub") -> list[dict[str, str]]:
    """Chat messages of the main agent in the tool variant."""
    return [{"role": "user", "content": tool_main_prompt(sub)}]


def tool_sub_messages(agent: str, task: str) -> list[dict[str, str]]:
    """Chat messages of one sub-agent call in the tool variant, built from the main agent's ``task``
    argument: call :data:`SECRET_TOOL`, then reply with the digit. The signature is the one of
    ``multi_agent.delegation.sub_prompt`` (``agent`` is the sub-agent's name, unused here)."""
    return [
        {
            "role": "user",
            "content": f"Call the tool {SECRET_TOOL} to read the secret digit, then reply with the digit only.\n"
            f"Task: {task}",
        }
    ]


#: ``sub_prompt(agent, task) -> chat messages``: how the tool-delegation loop prompts a sub-agent call.
SubPrompt = Callable[[str, str], list]


def load_sub_prompt(spec: str | None) -> SubPrompt:
    """The sub-agent prompt builder named by ``multi_agent.delegation.sub_prompt``: ``null`` for
    :func:`tool_sub_messages`, or ``"package.module:function"`` / ``"path/to/file.py:function"``.

    Raises:
        ValueError: a malformed spec, a module that cannot be imported, or a name that is not callable.
    """
    if not spec:
        return tool_sub_messages
    return load_function(spec, "multi_agent.delegation.sub_prompt")


def secret_tools_kwargs(digit: str) -> dict[str, Any]:
    """Per-sample ``tools_kwargs`` (verl's layout: tool name -> ``create_kwargs``) giving
    :data:`SECRET_TOOL` the sample's digit."""
    return {SECRET_TOOL: {"create_kwargs": {"secret": str(digit)}}}


def build_tool_rows(n: int, seed: int, split: str, sub: str = "sub") -> list[dict[str, Any]]:
    """``n`` rows of the tool variant: verl's RL layout, ``agent_name: mgrpo_delegate`` and the digit in
    ``extra_info.tools_kwargs`` (where verl's ``RLHFDataset`` takes the ``tools_kwargs`` it passes to the
    agent loop). Digits are drawn as in :func:`build_rows` (same seed and split, same digits)."""
    rows = []
    for row in build_rows(n, seed, split):
        digit = row["reward_model"]["ground_truth"]
        row.update(
            prompt=tool_main_messages(sub),
            ability="relay_tools",
            agent_name=TOOLS_AGENT_LOOP_NAME,
            extra_info={**row["extra_info"], "tools_kwargs": secret_tools_kwargs(digit)},
        )
        rows.append(row)
    return rows


def write_tool_dataset(
    directory: str | Path, n_train: int = 256, n_val: int = 32, seed: int = 0, sub: str = "sub"
) -> tuple[Path, Path]:
    """Write the tool variant's ``train.parquet`` and ``val.parquet`` into ``directory`` (created); returns
    their paths. ``sub`` is the sub-agent the main prompt names (``ask_<sub>``)."""
    return write_splits(directory, lambda split, n: build_tool_rows(n, seed, split, sub), n_train, n_val)
