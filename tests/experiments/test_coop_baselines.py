"""MAGRPO's no-training baselines (mgrpo_verl/experiments/coop_baselines.py): who sees what under each
protocol, the summary table, and one real run of the command on the writing task with the tiny models."""

from __future__ import annotations

import pytest

from mgrpo_verl.experiments import coop_baselines
from mgrpo_verl.envs.coop_tasks import CoopReward


class Toy:
    """Agents a, b. A prompt is a list with one user message whose content accumulates what it was shown."""

    agents = ("a", "b")
    info_keys = ("tests_passed", "cooperation")
    self_role = "you"

    def first_messages(self, item, agent):
        return [{"role": "user", "content": f"{agent}:{item}"}]

    def single_messages(self, item):
        return [{"role": "user", "content": f"single:{item}"}]

    def split_single(self, item, text):
        return {"a": text + "/a", "b": text + "/b"}

    def with_peer(self, messages, peer, text):
        return [{"role": "user", "content": messages[-1]["content"] + f" [{peer}={text}]"}]

    def reward(self, item, outputs):
        passed = outputs["a"].startswith("A") and outputs["b"].startswith("B")
        return CoopReward(float(passed), {"tests_passed": float(passed), "cooperation": float(passed and "x" in item)})


def scripted():
    """Each agent answers its upper-case name, a counter, and echoes how many peers it was shown."""
    seen = []
    count = {"a": 0, "b": 0}

    def generate(agent, prompts):
        out = []
        for messages in prompts:
            seen.append((agent, messages[-1]["content"]))
            count[agent] += 1
            out.append(f"{agent.upper()}{count[agent]}")
        return out

    return generate, seen


def test_protocols_show_the_right_texts():
    task = Toy()
    gen, seen = scripted()
    assert coop_baselines.run_protocol(task, "q", "single", gen, 1) == [{"a": "A1/a", "b": "A1/b"}]
    assert seen == [("a", "single:q")]  # the first agent's model writes everything

    gen, seen = scripted()
    assert coop_baselines.run_protocol(task, "q", "parallel", gen, 2) == [{"a": "A1", "b": "B1"}, {"a": "A2", "b": "B2"}]
    assert all("[" not in content for _, content in seen)  # no communication

    gen, seen = scripted()
    assert coop_baselines.run_protocol(task, "q", "sequential", gen, 1) == [{"a": "A1", "b": "B1"}]
    assert seen == [("a", "a:q"), ("b", "b:q [a=A1]")]  # b sees a's part

    gen, seen = scripted()
    out = coop_baselines.run_protocol(task, "q", "discussion", gen, 1)
    # round 1 in parallel (A1, B1), then each sees its own draft and the other's, and writes again
    assert seen == [("a", "a:q"), ("b", "b:q"), ("a", "a:q [you=A1] [b=B1]"), ("b", "b:q [you=B1] [a=A1]")]
    assert out == [{"a": "A2", "b": "B2"}]

    with pytest.raises(ValueError, match="unknown protocol"):
        coop_baselines.run_protocol(task, "q", "vote", gen, 1)


def test_summary_has_pass_acc_coop_at_k():
    task = Toy()
    gen, _ = scripted()
    records = coop_baselines.evaluate(task, ["x1", "y2"], ["parallel", "single"], gen, samples=2)
    assert len(records) == 8
    summary = coop_baselines.summarize(records, task.info_keys, ks=(1, 2))
    # parallel: every joint sample passes (A.., B..); cooperation only on item "x1" -> coop@1 = 0.5
    assert summary["parallel"]["reward"] == 1.0 and summary["parallel"]["pass@1"] == 1.0
    assert summary["parallel"]["coop@1"] == 0.5
    # single: b's part starts with "A" -> never passes
    assert summary["single"]["reward"] == 0.0 and summary["single"]["pass@2"] == 0.0
    table = coop_baselines.markdown(summary, "toy")
    assert "| parallel | 4 | 1.000 |" in table


@pytest.mark.slow
def test_command_on_the_writing_task(tmp_path, monkeypatch):
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(tmp_path / "cache"))
    coop_baselines.main(["--task", "coop_writing", "--problems", "2", "--samples", "2", "--max-tokens", "16",
                         "--out", str(tmp_path)])
    table = (tmp_path / "coop_writing_baselines.md").read_text()
    for protocol in coop_baselines.PROTOCOLS:
        assert f"| {protocol} | 4 |" in table
    assert len((tmp_path / "coop_writing_records.jsonl").read_text().splitlines()) == 16
