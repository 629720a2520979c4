"""Rewards of the deep-research task: exact match and token F1 on the final answer, and an optional LLM
judge.

Both agents end their reply with ``Answer: <short answer>`` (:data:`.prompts.ANSWER_PREFIX`);
:func:`extract_answer` reads it, :func:`normalize_answer` normalises it the SQuAD way, and
:func:`exact_match` / :func:`f1` compare it with the accepted answers (the best match counts).

Entry points:

* :func:`scorer` (``multi_agent.delegation.scorer: "mgrpo_verl.envs.research.rewards:scorer"``): the
  tool-delegation loop's ``f(role, text, ground_truth)``: the F1 of the main agent's final answer
  (role ``"main"``) or of one sub-agent report (role ``"sub"``: the sub-agent's local reward; M-GRPO adds
  the main agent's outcome to it elsewhere). :func:`em_scorer` is the same with exact match.
* :func:`compute_score`: verl's reward-function signature; returns ``{"score": f1, "acc": em, "f1", "em"}``
  (verl's reward managers take ``"score"`` as the reward and log the other keys).
* :func:`judge_scorer`: the main agent judged by an LLM through an OpenAI-compatible endpoint
  (:class:`LLMJudge`, configured by environment variables, off unless named), the sub-agents by F1.
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
import time
import unicodedata
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from mgrpo_verl.envs.research import dataset
from mgrpo_verl.envs.research.prompts import ANSWER_PREFIX

Answers = Union[str, Sequence[str]]

# ----------------------------------------------------------------------------------------------------
# answer extraction

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL | re.IGNORECASE)
_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)
_ANSWER_LINE = re.compile(
    r"\b" + re.escape(ANSWER_PREFIX.rstrip(":")) + r"\b[*_ ]*:[ \t]*(?P<rest>[^\n]*)", re.IGNORECASE
)
_ANSWER_TAG = re.compile(r"<(/?)answer>", re.IGNORECASE)
_DECORATION = " \t*_`\"'."


def strip_reasoning(text: str) -> str:
    """``text`` without tool calls and thinking: ``<tool_call>...</tool_call>`` blocks (an unclosed one runs
    to the end: a truncated call) and ``<think>...</think>`` blocks are removed; before a stray
    ``</think>`` (the chat template opened the block) everything is removed; a stray ``<think>`` tag is
    dropped but its text kept (an unclosed block may still hold the answer line)."""
    text = _TOOL_CALL_BLOCK.sub("", text)
    kept = [text[start:end] for start, end in _outside_blocks(text, _THINK_TAG)]
    text = "".join(kept)
    closing = [m.end() for m in _THINK_TAG.finditer(text) if m.group(1)]
    if closing:
        text = text[closing[-1] :]
    return _THINK_TAG.sub("", text)


def _blocks(text: str, tag: re.Pattern) -> list[tuple[int, int, int, int]]:
    """``(open_start, open_end, close_start, close_end)`` of every block ``<x>...</x>`` of ``text``, as
    ``re`` finds ``<x>.*?</x>`` left to right (a block opens at the first tag after the previous block and
    closes at the next closing tag; opening tags inside it are text), in one pass over the tags: linear
    time, where the lazy pattern rescans the rest of the text from every unclosed opening tag (quadratic:
    16,000 stray ``<think>`` took 8.5 s). ``tag`` matches both tags, group 1 is ``"/"`` for a closing one."""
    found, opened = [], None
    for m in tag.finditer(text):
        if not m.group(1):
            if opened is None:
                opened = m
        elif opened is not None:
            found.append((opened.start(), opened.end(), m.start(), m.end()))
            opened = None
    return found


def _outside_blocks(text: str, tag: re.Pattern) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of ``text`` outside the blocks of :func:`_blocks`."""
    spans, position = [], 0
    for start, _, _, end in _blocks(text, tag):
        spans.append((position, start))
        position = end
    spans.append((position, len(text)))
    return spans


def _clean(answer: str) -> str:
    return _ANSWER_TAG.sub("", answer).strip(_DECORATION).strip()


def extract_answer(text: str) -> str:
    """The short answer in a reply, after :func:`strip_reasoning`:

    1. the text after the LAST ``Answer:`` (any case; ``**Answer:**`` too) up to the end of its line, or
       the next non-empty line when the answer line is empty (``Answer:\\nParis``);
    2. else the content of the last ``<answer>...</answer>``;
    3. else the last non-empty line.

    Markdown emphasis, quotes, end periods and ``<answer>`` tags around the answer are stripped; "" if
    nothing is left.
    """
    body = strip_reasoning(text or "")
    matches = list(_ANSWER_LINE.finditer(body))
    if matches:
        last = matches[-1]
        answer = _clean(last["rest"])
        if answer:
            return answer
        for line in body[last.end() :].splitlines():
            if _clean(line):
                return _clean(line)
        return ""
    tagged = _blocks(body, _ANSWER_TAG)
    if tagged:
        _, inner_start, inner_end, _ = tagged[-1]
        return _clean(body[inner_start:inner_end])
    lines = [line for line in body.splitlines() if _clean(line)]
    return _clean(lines[-1]) if lines else ""


# ----------------------------------------------------------------------------------------------------
# metrics

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _is_punctuation(char: str) -> bool:
    return char in string.punctuation or unicodedata.category(char).startswith("P")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, punctuation removed, articles (a, an, the) removed, whitespace
    collapsed. Unlike SQuAD's ASCII-only punctuation, every Unicode punctuation mark is removed too, so
    that the en dashes and curly quotes of Wikipedia's text compare equal to ASCII ones
    (``1775–1817`` and ``1775-1817`` both become ``17751817``)."""
    s = s.lower()
    s = "".join(" " if ch.isspace() else ch for ch in s if not _is_punctuation(ch))
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _answer_list(answers: Answers) -> list[str]:
    return [answers] if isinstance(answers, str) else [str(a) for a in answers]


def exact_match(prediction: str, answers: Answers) -> float:
    """1.0 if the normalised prediction equals a normalised answer, else 0.0. An empty normalised
    prediction never matches (so that exact match is never above :func:`f1`)."""
    pred = normalize_answer(prediction)
    if not pred:
        return 0.0
    return max((1.0 if pred == normalize_answer(a) else 0.0 for a in _answer_list(answers)), default=0.0)


def _token_f1(prediction_tokens: list[str], answer_tokens: list[str]) -> float:
    if not prediction_tokens or not answer_tokens:
        return 0.0
    common = sum((Counter(prediction_tokens) & Counter(answer_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(prediction_tokens)
    recall = common / len(answer_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, answers: Answers) -> float:
    """Token F1 of the normalised prediction against the best answer; 0.0 when either side is empty after
    normalisation."""
    tokens = normalize_answer(prediction).split()
    return max((_token_f1(tokens, normalize_answer(a).split()) for a in _answer_list(answers)), default=0.0)


METRICS: dict[str, Callable[[str, Answers], float]] = {"f1": f1, "em": exact_match}


def score(prediction_text: str, answers: Answers, metric: str = "f1") -> float:
    """``metric`` (``"f1"`` or ``"em"``) of the answer extracted from a full reply (:func:`extract_answer`).

    Raises:
        ValueError: an unknown metric.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    return METRICS[metric](extract_answer(prediction_text), answers)


# ----------------------------------------------------------------------------------------------------
# entry points


def _check_role(role: str) -> None:
    if role not in ("main", "sub"):
        raise ValueError(f"a research scorer scores role 'main' or 'sub', got {role!r}")


def scorer(role: str, text: str, ground_truth: Any) -> float:
    """``multi_agent.delegation.scorer``: F1 of the answer in ``text`` against the row's answers. Role
    ``"main"``: the main agent's final reply; ``"sub"``: one sub-agent report (its local reward).

    Raises:
        ValueError: a role other than ``"main"`` or ``"sub"``.
    """
    _check_role(role)
    return score(text, dataset.decode_answers(ground_truth), "f1")


def em_scorer(role: str, text: str, ground_truth: Any) -> float:
    """:func:`scorer` with exact match instead of F1 (a sparse 0/1 reward)."""
    _check_role(role)
    return score(text, dataset.decode_answers(ground_truth), "em")


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **_: Any
) -> dict[str, float]:
    """verl's reward-function signature for a research row: ``{"score": f1, "acc": em, "f1": f1, "em": em}``
    of the answer in ``solution_str`` (the main agent's reply).

    Raises:
        ValueError: ``data_source`` is not a research source (``"mgrpo_verl/research/..."``).
    """
    prefix = dataset.DATA_SOURCE_PREFIX
    if not (data_source == prefix or str(data_source).startswith(prefix + "/")):
        raise ValueError(f"mgrpo_verl.envs.research.rewards scores data sources {prefix}/..., got {data_source!r}")
    answers = dataset.decode_answers(ground_truth)
    prediction = extract_answer(solution_str)
    f1_value, em_value = f1(prediction, answers), exact_match(prediction, answers)
    return {"score": f1_value, "acc": em_value, "f1": f1_value, "em": em_value}


# ----------------------------------------------------------------------------------------------------
# LLM judge (optional)

#: Environment variables of :func:`judge_scorer_from_env`.
ENV_BASE_URL = "MGRPO_JUDGE_BASE_URL"
ENV_MODEL = "MGRPO_JUDGE_MODEL"
ENV_API_KEY_ENV = "MGRPO_JUDGE_API_KEY_ENV"

JUDGE_SYSTEM = (
    "You grade answers. Reply with exactly one word: CORRECT if the predicted answer means the same as one "
    "of the reference answers (ignore case, articles, formatting and harmless extra detail), INCORRECT "
    "otherwise."
)


class JudgeError(RuntimeError):
    """The judge could not grade: the endpoint failed (after the retries) or replied something other than
    ``CORRECT`` / ``INCORRECT``."""


@dataclass(frozen=True)
class JudgeConfig:
    """An OpenAI-compatible chat-completions endpoint: ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``;
    ``/chat/completions`` is appended), ``model``, ``api_key_env`` (the name of the environment variable
    holding the key; ``None``: no key, e.g. a local server), ``timeout_s`` per request, ``max_retries``
    after a failed request (HTTP 429 / 5xx, connection errors, timeouts) and the pause before retry ``k``
    (``retry_backoff_s * k``)."""

    base_url: str
    model: str
    api_key_env: Optional[str] = None
    timeout_s: float = 30.0
    max_retries: int = 2
    retry_backoff_s: float = 0.5


def judge_messages(question: str, prediction: str, answers: Sequence[str]) -> list[dict[str, str]]:
    """The grading prompt; without a question, the judge is told to compare the answers only."""
    lines = [f"Question: {question}"] if question.strip() else ["(The question is not shown: compare the answers.)"]
    lines.append("Reference answers: " + " | ".join(answers))
    lines.append(f"Predicted answer: {prediction}")
    lines.append("Is the predicted answer correct? Reply CORRECT or INCORRECT.")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def parse_verdict(reply: str) -> float:
    """1.0 for ``CORRECT``, 0.0 for ``INCORRECT``: the reply, stripped of whitespace and one final period,
    must be exactly one of the two words (any case).

    Raises:
        JudgeError: anything else, quoted.
    """
    word = reply.strip()
    word = word[:-1].rstrip() if word.endswith(".") else word
    verdict = {"CORRECT": 1.0, "INCORRECT": 0.0}.get(word.upper())
    if verdict is None:
        raise JudgeError(f"the judge must reply CORRECT or INCORRECT, it replied {reply!r}")
    return verdict


class LLMJudge:
    """Grades a prediction with an LLM (:class:`JudgeConfig`); synchronous, one request per call.

    Raises (constructor):
        ValueError: ``api_key_env`` names an unset or empty environment variable.
    """

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config
        self._api_key: Optional[str] = None
        if config.api_key_env:
            key = os.environ.get(config.api_key_env, "")
            if not key:
                raise ValueError(f"the LLM judge's API key variable {config.api_key_env} is not set")
            self._api_key = key

    @property
    def url(self) -> str:
        return self.config.base_url.rstrip("/") + "/chat/completions"

    def judge(self, question: str, prediction: str, answers: Answers) -> float:
        """1.0 if the judge finds ``prediction`` correct, 0.0 if not; an empty prediction is 0.0 without a
        request (nothing to grade).

        Raises:
            JudgeError: the endpoint failed after the retries, or its reply is no verdict.
        """
        answer_list = _answer_list(answers)
        if not prediction.strip():
            return 0.0
        reply = self._complete(judge_messages(question, prediction, answer_list))
        return parse_verdict(reply)

    def _complete(self, messages: list[dict[str, str]]) -> str:
        body = json.dumps(
            {"model": self.config.model, "messages": messages, "temperature": 0, "max_tokens": 8}
        ).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        last_error = ""
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self.config.retry_backoff_s * attempt)
            request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                    payload = response.read().decode("utf-8", errors="replace")
            except urllib.error.HTTPError as e:
                last_error = f"HTTP {e.code}: {e.read()[:500].decode('utf-8', errors='replace')}"
                if e.code != 429 and e.code < 500:
                    break  # a client error will not improve by retrying
                continue
            except (urllib.error.URLError, TimeoutError, OSError) as e:
                last_error = f"{type(e).__name__}: {e}"
                continue
            return _reply_text(payload)
        raise JudgeError(f"the LLM judge at {self.url} failed after {attempt + 1} attempt(s): {last_error}")


def _reply_text(payload: str) -> str:
    """The first choice's message content of a chat-completions response.

    Raises:
        JudgeError: the response is not in that shape (quoted).
    """
    try:
        content = json.loads(payload)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise JudgeError(f"the LLM judge's response is not a chat completion: {payload[:500]!r}") from e
    if not isinstance(content, str):
        raise JudgeError(f"the LLM judge's reply has no text content: {payload[:500]!r}")
    return content


def judge_config_from_env() -> JudgeConfig:
    """:class:`JudgeConfig` from ``MGRPO_JUDGE_BASE_URL``, ``MGRPO_JUDGE_MODEL`` (both required) and
    ``MGRPO_JUDGE_API_KEY_ENV`` (optional: the name of the variable holding the key).

    Raises:
        ValueError: a required variable is unset or empty (named in the message).
    """
    values = {}
    for name in (ENV_BASE_URL, ENV_MODEL):
        values[name] = os.environ.get(name, "").strip()
        if not values[name]:
            raise ValueError(f"the LLM judge needs the environment variable {name} (unset or empty)")
    return JudgeConfig(values[ENV_BASE_URL], values[ENV_MODEL], os.environ.get(ENV_API_KEY_ENV, "").strip() or None)


def judge_scorer_from_env() -> Callable[[str, str, Any], float]:
    """A ``scorer(role, text, ground_truth)``: the main agent's answer graded by the judge of
    :func:`judge_config_from_env`, a sub-agent's report by F1 (:func:`scorer`).

    The scorer signature carries no question, so the judge sees only the accepted answers and the
    prediction (:func:`judge_messages` says so in the prompt). A judge failure raises :class:`JudgeError`:
    no silent fallback to F1.

    Raises:
        ValueError: a missing environment variable (see :func:`judge_config_from_env`).
    """
    judge = LLMJudge(judge_config_from_env())

    def judged(role: str, text: str, ground_truth: Any) -> float:
        _check_role(role)
        if role == "sub":
            return scorer(role, text, ground_truth)
        return judge.judge("", extract_answer(text), dataset.decode_answers(ground_truth))

    return judged


@functools.lru_cache(maxsize=8)
def _judge_scorer_for(config_key: tuple[str, str, str]) -> Callable[[str, str, Any], float]:
    return judge_scorer_from_env()


def judge_scorer(role: str, text: str, ground_truth: Any) -> float:
    """``multi_agent.delegation.scorer: "mgrpo_verl.envs.research.rewards:judge_scorer"``: the scorer of
    :func:`judge_scorer_from_env`, built once per set of environment values.

    Raises:
        ValueError: a missing environment variable, or a bad role.
        JudgeError: the judge failed.
    """
    key = tuple(os.environ.get(name, "") for name in (ENV_BASE_URL, ENV_MODEL, ENV_API_KEY_ENV))
    return _judge_scorer_for(key)(role, text, ground_truth)
