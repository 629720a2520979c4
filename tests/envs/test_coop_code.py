"""The cooperative HumanEval task (mgrpo_verl/envs/coop_code.py): loaders, prompts, extraction, tiered scores."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from mgrpo_verl.envs import coop_code
from mgrpo_verl.envs.coop_code import CodeProblem, extract_function, score_coop
from mgrpo_verl.envs.sandbox import SandboxLimits

PROBLEMS = {p.task_id: p for p in coop_code.load_humaneval()}

# HumanEval/0: has_close_elements(numbers, threshold); check() has 7 assertions, expecting
# True, False, True, False, True, True, False.
P0 = PROBLEMS["HumanEval/0"]
AUX = """Here is my helper:

```python
def aux(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
```
It returns whether two numbers are close."""
OWN = "any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])"


def main(body: str) -> str:
    return f"```python\ndef has_close_elements(numbers, threshold):\n{body}\n```"


def with_aux_call(problem: CodeProblem) -> str:
    """The canonical solution as the main answer, made to call aux and use its result."""
    return problem.prompt + "    assert aux(True)\n" + problem.canonical_solution


TRIVIAL_AUX = "def aux(x):\n    return x\n"


# ----------------------------------------------------------------------------------------------------
# problems


def test_load_humaneval():
    problems = coop_code.load_humaneval()
    assert len(problems) == 164 and len(PROBLEMS) == 164
    assert [p.task_id for p in problems[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert P0.entry_point == "has_close_elements" and "def check(candidate)" in P0.test
    assert P0.prompt.startswith("from typing import List") and P0.canonical_solution.startswith("    for idx")


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/10", "HumanEval/32", "HumanEval/38", "HumanEval/162"])
def test_canonical_solution_with_a_trivial_aux_scores_full_reward(task_id):
    # 10, 32 and 38 use helper functions of the prompt (is_palindrome, poly, encode_cyclic); 32 imports
    # math, random and copy in check(); 162 imports hashlib
    score = score_coop(PROBLEMS[task_id], TRIVIAL_AUX, with_aux_call(PROBLEMS[task_id]))
    assert score.status == "ok", score.details
    assert (score.structure, score.syntax, score.tests_passed, score.cooperation) == (True, True, True, True)
    assert score.reward == 1.0 and score.test_fraction == 1.0 and score.details["asserts_failed"] == 0


@pytest.mark.slow
def test_every_canonical_solution_scores_full_reward():
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda p: score_coop(p, TRIVIAL_AUX, with_aux_call(p)), PROBLEMS.values()))
    failed = {p: s.details.get("stderr") for p, s in zip(PROBLEMS, scores) if s.reward != 1.0}
    assert not failed


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ROW = {"task_id": "Coop/0", "prompt": P0.prompt, "entry_point": P0.entry_point, "test": P0.test}


def test_load_coop_humaneval(tmp_path):
    rows = [ROW, "", {**ROW, "task_id": "Coop/1", "canonical_solution": P0.canonical_solution}]
    problems = coop_code.load_coop_humaneval(write_jsonl(tmp_path / "coop.jsonl", rows))
    assert [p.task_id for p in problems] == ["Coop/0", "Coop/1"]
    assert problems[0].canonical_solution is None and problems[1].canonical_solution == P0.canonical_solution
    packed = tmp_path / "coop.jsonl.gz"
    packed.write_bytes(gzip.compress((tmp_path / "coop.jsonl").read_bytes()))
    assert coop_code.load_coop_humaneval(str(packed)) == problems
    # a problem of the file scores like its HumanEval twin
    assert score_coop(problems[1], TRIVIAL_AUX, with_aux_call(problems[1])).reward == 1.0


@pytest.mark.parametrize(
    "bad_row, match",
    [
        ('{"task_id": "Coop/9", ', "line 3: not valid JSON"),
        ("[1, 2]", "line 3: expected a JSON object, got list"),
        ({k: v for k, v in ROW.items() if k != "test"}, "line 3: key 'test' must be a non-empty string"),
        ({**ROW, "prompt": 7}, "line 3: key 'prompt' must be a non-empty string, got 7"),
        ({**ROW, "canonical_solution": ["x"]}, "line 3: key 'canonical_solution' must be a string or null"),
        ({**ROW, "entry_point": "has close"}, "line 3: entry_point 'has close' is not a Python identifier"),
        ({**ROW, "test": "def check(:"}, "line 3: the test code does not parse"),
        ({**ROW, "test": "def test(candidate):\n    pass"}, "line 3: the test code defines no function check"),
        (ROW, "line 3: task_id 'Coop/0' appears twice"),
    ],
)
def test_malformed_coop_lines_are_named(tmp_path, bad_row, match):
    path = write_jsonl(tmp_path / "coop.jsonl", [ROW, "", bad_row])
    with pytest.raises(ValueError, match=match) as error:
        coop_code.load_coop_humaneval(path)
    assert str(path) in str(error.value)


def test_empty_coop_file_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="no problems"):
        coop_code.load_coop_humaneval(write_jsonl(tmp_path / "empty.jsonl", ["", "  "]))


# ----------------------------------------------------------------------------------------------------
# prompts


def test_prompts():
    (helper,) = coop_code.helper_messages(P0)
    assert helper["role"] == "user" and P0.prompt.strip() in helper["content"]
    assert "`def aux(...)`" in helper["content"] and "do not write `has_close_elements`" in helper["content"]
    (main_message,) = coop_code.main_messages(P0)
    assert "Write the function `has_close_elements`" in main_message["content"]
    assert "must call `aux` and use its result" in main_message["content"]
    assert "do not define it yourself" in main_message["content"]
    (single,) = coop_code.single_messages(P0)
    assert "`def aux(...)`" in single["content"] and "`has_close_elements`" in single["content"]


def test_with_peer_shows_the_teammates_code_and_copies():
    messages = coop_code.main_messages(P0)
    original = messages[0]["content"]
    shown = coop_code.with_peer(messages, "helper", "def aux(x):\n    return x\n\n")
    assert messages[0]["content"] == original  # not modified in place
    assert len(shown) == 1 and shown[0]["content"].startswith(original)
    assert shown[0]["content"].endswith(
        "Your teammate (the helper) wrote:\n\n```python\ndef aux(x):\n    return x\n```\n\nMake your code work with it."
    )
    turns = [*messages, {"role": "assistant", "content": "draft"}, {"role": "user", "content": "Try again."}]
    later = coop_code.with_peer(turns, "helper", "x = 1")
    assert later[:2] == turns[:2] and later[2]["content"].startswith("Try again.\n\nYour teammate (the helper)")
    with pytest.raises(ValueError, match="peer_role must be 'helper', 'main' or 'you', got 'critic'"):
        coop_code.with_peer(messages, "critic", "x = 1")
    with pytest.raises(ValueError, match="end with a user message"):
        coop_code.with_peer(turns[:2], "main", "x = 1")


# ----------------------------------------------------------------------------------------------------
# extraction


@pytest.mark.parametrize(
    "text, expected",
    [
        ("def aux(x):\n    return x", "def aux(x):\n    return x"),
        ("Sure! Here it is:\n```python\ndef aux(x):\n    return x + 1\n```\nThis adds one. Don't worry.",
         "def aux(x):\n    return x + 1"),
        # plain text with prose right after, no blank line
        ("Answer:\ndef aux(x):\n    y = x * 2\n\n    return y\nThat's it (it's simple).",
         "def aux(x):\n    y = x * 2\n\n    return y"),
        # the last definition wins; an unrelated function with a similar name is ignored
        ("def aux(x):\n    return 1\n\ndef auxiliary(x):\n    return 2\n\ndef aux(x):\n    return 3\n",
         "def aux(x):\n    return 3"),
        # a broken last definition falls back to an earlier one that parses
        ("def aux(x):\n    return 1\n\nWait, better:\ndef aux(x):\n    return (\n", "def aux(x):\n    return 1"),
        # multi-line signature closed at column 0, docstring with lines at column 0
        ('def aux(\n    a,\n    b,\n) -> int:\n    """Sum.\n\nLong text.\n"""\n    return a + b\nprint(aux(1, 2))',
         'def aux(\n    a,\n    b,\n) -> int:\n    """Sum.\n\nLong text.\n"""\n    return a + b'),
        # indented inside a markdown list
        ("1. Helper:\n   ```python\n   def aux(x):\n       if x:\n           return 1\n       return 0\n   ```\n",
         "def aux(x):\n    if x:\n        return 1\n    return 0"),
        ("def aux(x): return x\nprint(aux(3))", "def aux(x): return x"),
        ("def aux(x):\n    return x +* 2\n", None),
        ("I would compute the helper first.", None),
        ("", None),
    ],
)
def test_extract_function(text, expected):
    assert extract_function(text, "aux") == expected


# ----------------------------------------------------------------------------------------------------
# tiered scores (points: aux defined .5, main defined .5, syntax .5, tests 1.5 x passed fraction,
# cooperation 1; reward = points / 4)


@pytest.mark.parametrize(
    "helper, main_text, expected",
    [
        # no aux: structure 0.5 (main only) -> 0.5 / 4
        ("I think you should compare all pairs.", main("    return aux(numbers, threshold)"), 0.125),
        # both defined, main does not parse: structure 1 -> 1 / 4
        (AUX, main("    return aux(numbers, threshold) +* 1"), 0.25),
        # wrong answer (uses aux, all 7 assertions fail): 1 + 0.5 + 0 + 0 (no passing test, no cooperation points)
        (AUX, main("    return not aux(numbers, threshold)"), 0.375),
        # always False passes 3 of 7, uses aux: 1 + 0.5 + 1.5 * 3/7 + 1 = 3.142857... -> 0.785714...
        (AUX, main("    return aux(numbers, threshold) and False"), (2.5 + 1.5 * 3 / 7) / 4),
        # right answer without calling aux: 1 + 0.5 + 1.5 = 3
        (AUX, main(f"    return {OWN}"), 0.75),
        # right answer calling aux but discarding its result: 3
        (AUX, main(f"    aux(numbers, threshold)\n    return {OWN}"), 0.75),
        # right answer calling a local aux, not the helper's: 3
        (AUX, main(f"    def aux(n, t):\n        return {OWN}\n    return aux(numbers, threshold)"), 0.75),
        # right answer using aux: 1 + 0.5 + 1.5 + 1 = 4
        (AUX, main("    return aux(numbers, threshold)"), 1.0),
        (AUX, main("    close = aux(numbers, threshold)\n    print('debug', close)\n    return close"), 1.0),
    ],
    ids=["missing-aux", "syntax-error", "wrong-answer", "partial", "no-aux-call", "aux-result-discarded",
         "local-aux", "uses-aux", "uses-aux-prints"],
)
def test_tiers_by_hand(helper, main_text, expected):
    score = score_coop(P0, helper, main_text)
    assert score.reward == pytest.approx(expected), score.details
    assert 0 <= score.reward <= 1
    assert sum(score.details["points"].values()) / coop_code.MAX_POINTS == pytest.approx(score.reward)


def test_tier_flags_and_details():
    missing = score_coop(P0, "no code", main("    return aux(numbers, threshold)"))
    assert (missing.structure, missing.syntax, missing.status) == (False, False, "not run")
    assert missing.details["aux_defined"] is False and missing.details["main_defined"] is True
    broken = score_coop(P0, AUX, main("    return aux(numbers, threshold) +* 1"))
    assert (broken.structure, broken.syntax, broken.status) == (True, False, "not run")
    wrong = score_coop(P0, AUX, main("    return not aux(numbers, threshold)"))
    assert (wrong.syntax, wrong.tests_passed, wrong.cooperation, wrong.status) == (True, False, True, "ok")
    assert (wrong.details["asserts_passed"], wrong.details["asserts_failed"], wrong.test_fraction) == (0, 7, 0.0)
    partial = score_coop(P0, AUX, main("    return aux(numbers, threshold) and False"))
    assert (partial.tests_passed, partial.test_fraction, partial.details["asserts_passed"]) == (False, 3 / 7, 3)
    discarded = score_coop(P0, AUX, main(f"    aux(numbers, threshold)\n    return {OWN}"))
    assert (discarded.tests_passed, discarded.cooperation) == (True, False)
    good = score_coop(P0, AUX, main("    close = aux(numbers, threshold)\n    print('debug', close)\n    return close"))
    assert (good.structure, good.syntax, good.tests_passed, good.cooperation) == (True, True, True, True)
    assert "debug" in good.details["stderr"]  # the program's prints go to stderr, the counts to stdout


def test_single_agent_answer_and_main_defining_its_own_aux():
    entry = "def has_close_elements(numbers, threshold):\n    return aux(numbers, threshold)"
    both = f"```python\n{extract_function(AUX, 'aux')}\n\n\n{entry}\n```"
    assert score_coop(P0, both, both).reward == 1.0  # the single-agent baseline
    # main's own (wrong) aux is ignored: the helper's is the one in the program
    own_aux = "def aux(numbers, threshold):\n    return False\n\n" + main("    return aux(numbers, threshold)")
    score = score_coop(P0, AUX, own_aux)
    assert score.reward == 1.0 and score.details["program"].count("def aux") == 1


def test_only_the_two_functions_and_imports_of_the_answers_run(precious):
    helper = f"import os\nos.remove({precious!r})\n{AUX}\nprint(aux([1.0, 1.05], 0.1))"
    score = score_coop(P0, helper, main("    return aux(numbers, threshold)"))
    assert score.reward == 1.0 and "os.remove" not in score.details["program"]
    with open(precious) as f:
        assert f.read() == "keep me"


def test_imports_of_the_answers_are_kept():
    helper = (
        "```python\nimport itertools\n\ndef aux(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold for a, b in itertools.combinations(numbers, 2))\n```"
    )
    main_text = main("    from math import fabs\n    return aux(numbers, threshold) and fabs(1) == 1")
    score = score_coop(P0, helper, main_text)
    assert score.reward == 1.0, score.details
    assert "import itertools" in score.details["program"]


# ----------------------------------------------------------------------------------------------------
# hostile or broken answers: tests score 0, the rest is still computed (1 + 0.5 = 1.5 -> 0.375)


@pytest.fixture()
def precious():
    directory = tempfile.mkdtemp(prefix="mgrpo-coop-test-")
    os.chmod(directory, 0o777)
    path = os.path.join(directory, "precious.txt")
    with open(path, "w") as f:
        f.write("keep me")
    os.chmod(path, 0o666)
    yield path
    shutil.rmtree(directory)


@pytest.mark.parametrize(
    "body, status",
    [
        ("    import os\n    while True:\n        os.fork()", "violation"),
        ("    import subprocess\n    subprocess.run(['true'])\n    return aux(numbers, threshold)", "violation"),
        ("    while True:\n        pass", "timeout"),
        ("    import os\n    os.remove({path!r})\n    return aux(numbers, threshold)", "violation"),
        ("    print(open('/etc/passwd').read())\n    return aux(numbers, threshold)", "violation"),
    ],
    ids=["fork-bomb", "subprocess", "infinite-loop", "delete-file", "read-passwd"],
)
def test_hostile_main_scores_zero_for_tests(precious, body, status):
    score = score_coop(P0, AUX, main(body.format(path=precious)), SandboxLimits(cpu_s=1, wall_s=2))
    assert score.status == status, score.details
    assert (score.syntax, score.tests_passed, score.test_fraction) == (True, False, 0.0)
    assert score.reward == pytest.approx(0.375)
    assert (score.details["violation"] is not None) == (status == "violation")
    with open(precious) as f:
        assert f.read() == "keep me"


@pytest.mark.parametrize(
    "body",
    [
        "    import sys\n    sys.exit(0)",  # SystemExit inside every assertion: 7 failures
        "    import os\n    os._exit(0)",  # exits before the counts are written: no test passed
        "    print('0 7 0')\n    return True",  # a forged count without the run's marker is ignored
    ],
)
def test_exits_and_forged_counts_earn_no_test_points(body):
    score = score_coop(P0, AUX, main(body))
    assert not score.tests_passed and score.details["asserts_passed"] <= 4
    assert score.reward <= (1.5 + 1.5 * 4 / 7) / 4


def test_with_peer_shows_the_agents_own_earlier_answer():
    from mgrpo_verl.envs.coop_code import SELF_ROLE, load_humaneval, main_messages, with_peer

    problem = load_humaneval()[0]
    out = with_peer(main_messages(problem), SELF_ROLE, "def f(): pass")
    assert out[-1]["content"].endswith("Your previous answer was:\n\n```python\ndef f(): pass\n```\n\nRevise it.")
