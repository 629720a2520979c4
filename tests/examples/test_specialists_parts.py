"""examples/specialists/specialists.py piece by piece (fast): the reward per agent, attacked; the demonstrations'
shape (a specialist either calls its tool and copies the digit or answers the fallback without a call); the tool."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "examples" / "specialists" / "specialists.py"


@pytest.fixture(scope="module")
def S():
    spec = importlib.util.spec_from_file_location("specialists_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("role, agent, text, expected", [
    ("sub", "alice", "3", 1.0),         # alice is paid for the first digit of "37"
    ("sub", "alice", "7", 0.0),         # ... not for bob's
    ("sub", "bob", "7", 1.0),
    ("sub", "bob", " 7\n", 1.0),        # surrounding whitespace is not an answer of its own
    ("sub", "bob", "37", 0.0),          # the whole code is not bob's digit
    ("sub", "carol", "3", 0.0),         # an agent with no part is paid nothing
    ("main", "main", "37", 1.0),        # half a point per right digit
    ("main", "main", "30", 0.5),
    ("main", "main", "?7", 0.5),
    ("main", "main", "73", 0.0),
    ("main", "main", "377", 0.0),       # not two characters: nothing, so padding never pays
    ("main", "main", "3 7", 0.0),
    ("main", "main", "", 0.0),
    ("main", "main", "３７", 0.0),       # full-width digits are not the digits
])
def test_score_pays_each_agent_its_own_part_only(S, role, agent, text, expected):
    assert S.score(role, text, "37", agent) == expected


def test_score_of_a_malformed_ground_truth_is_zero(S):
    assert S.score("main", "37", "377", "main") == 0.0 and S.score("sub", "3", "", "alice") == 0.0


def test_a_specialist_either_calls_and_copies_or_answers_the_fallback_at_once(S):
    episodes = S.demonstrations(400, 0, "train")
    rows = S.rows(400, 0, "train")
    calls = 0
    for episode, row in zip(episodes, rows):
        code = row["reward_model"]["ground_truth"]
        for agent, part in S.PARTS.items():
            messages = episode[agent]
            if len(messages) == 4:  # prompt, call, the tool's answer, the digit it shows
                calls += 1
                assert messages[1]["tool_calls"][0]["function"]["name"] == S.TOOLS[agent]
                assert messages[2]["content"] == S.tool_text(code, part) and messages[3]["content"] == code[part]
            else:  # the lazy answer: no call, the fallback, never a digit
                assert len(messages) == 2 and messages[1]["content"] == S.FALLBACK and not S.FALLBACK.isdigit()
        # the main agent is always shown the right reports and the right answer
        main = episode["main"]
        assert [main[2]["content"], main[4]["content"], main[-1]["content"]] == [code[0], code[1], code]
    # 800 draws at CALL_RATE 0.4: mean 320, std 14; the draw is seeded, so the count is fixed
    assert abs(calls - 800 * S.CALL_RATE) < 60


def test_the_tool_reads_its_own_digit_of_its_sample(S):
    async def read(part: int, code):
        from verl.tools.schemas import OpenAIFunctionToolSchema

        schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
            "name": "read", "description": "", "parameters": {"type": "object", "properties": {}, "required": []}}})
        tool = S.ReadPartTool({"part": part}, schema)
        instance, _ = await tool.create(create_kwargs={"code": code})
        response, reward, _ = await tool.execute(instance, {})
        await tool.release(instance)
        return response.text

    assert asyncio.run(read(0, "37")) == "Your digit is 3." and asyncio.run(read(1, "37")) == "Your digit is 7."
    assert asyncio.run(read(1, None)).startswith("<error")  # a row without a code is an error the model sees


def test_the_report_rewrites_its_table_and_keeps_the_notes(tmp_path):
    spec = importlib.util.spec_from_file_location("specialists_compare_under_test", PATH.with_name("compare.py"))
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    page = tmp_path / "results" / "specialists_baselines.md"
    compare.write_table(page, "| old |\n")
    first = page.read_text()
    assert first.startswith("Held-out exact accuracy") and "| old |\n" in first
    page.write_text(first + "\nNotes written by hand.\n")
    compare.write_table(page, "| new |\n")
    text = page.read_text()
    # the table between the markers replaced, the heading and the notes kept, once each
    assert text == first.replace("| old |", "| new |") + "\nNotes written by hand.\n"
    existing = tmp_path / "plain.md"
    existing.write_text("Notes of a page without markers.\n")
    compare.write_table(existing, "| t |\n")
    assert existing.read_text().endswith(f"{compare.END}\n\nNotes of a page without markers.\n")
