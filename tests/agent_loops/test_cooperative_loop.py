"""The cooperative loop (MAGRPO) with scripted servers and a toy task: tree shape, rows, histories, early
termination, joint modes, failures, and the advantages the trainer computes from its rows.

Toy task: agents ``a`` and ``b``; the joint reward is the number of the two completions that are "1"
divided by 2 (so "1"+"1" -> 1.0, "1"+"0" -> 0.5, "0"+"0" -> 0.0); feedback "r=<reward>".
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from omegaconf import OmegaConf

from verl.workers.rollout.replica import TokenOutput

from mgrpo_verl.algorithms.config import MAGRPOConfig
from mgrpo_verl.envs import coop_tasks
from mgrpo_verl.envs.coop_tasks import CoopReward
from mgrpo_verl.agent_loops.cooperative import AGENT_LOOP_NAME
from mgrpo_verl.agent_loops.testing import build_agent_loop
from mgrpo_verl.trainer.rows import build_row_table, scalar_advantages

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


class ToyTask:
    agents = ("a", "b")
    info_keys = ("ones",)

    def __init__(self):
        self.seen: list[tuple[str, int, str]] = []  # (agent, turns of history, last user content)

    def messages(self, item, agent, history):
        content = f"task {item} for {agent}" + "".join(f" | prev {t.outputs[agent]} fb {t.feedback}" for t in history)
        self.seen.append((agent, len(history), content))
        return [{"role": "user", "content": content}]

    def reward(self, item, outputs):
        if outputs["a"].strip() == "boom":  # a reward that raises on this output (as score_coop did on deep code)
            raise RecursionError("maximum recursion depth exceeded")
        if outputs["a"].strip() == "nan":
            return CoopReward(float("nan"), {"ones": 0.0})
        ones = sum(outputs[a].strip() == "1" for a in self.agents)
        return CoopReward(ones / 2, {"ones": float(ones)}, f"r={ones / 2}")


class Server:
    """Answers each agent's calls from its own script of texts (None: raise)."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.prompts = tokenizer, list(script), []

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        text = self.script.pop(0)
        if isinstance(text, tuple):  # (seconds, text): a slow answer
            await asyncio.sleep(text[0])
            text = text[1]
        if text is None:
            raise RuntimeError("server down")
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), extra_fields={"min_global_steps": 1, "max_global_steps": 1})


class Manager:
    def __init__(self, servers):
        self.servers = servers

    def for_agent(self, name):
        return self.servers[name]

    async def generate(self, **kwargs):  # the main agent's server (unused by the loop)
        raise AssertionError("the cooperative loop asks for_agent")


def config(G=2, mode="aligned", turns=1, threshold=None, timeout_s=None):
    return OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": "/m"}, "rollout": {"prompt_length": 256, "response_length": 16}},
        "data": {},
        "multi_agent": {"magrpo": {"num_generations": G, "joint_mode": mode},
                        "cooperation": {"num_turns": turns, "termination_threshold": threshold, "response_tokens": 4,
                                        "timeout_s": timeout_s}},
    })


@pytest.fixture
def toy(monkeypatch):
    task = ToyTask()
    monkeypatch.setattr(coop_tasks, "task_for", lambda source: task)
    return task


def run(tokenizer, cfg, scripts):
    servers = {name: Server(tokenizer, s) for name, s in scripts.items()}

    async def go():
        loop = build_agent_loop(AGENT_LOOP_NAME, cfg, Manager(servers), tokenizer)
        return await loop.run(dict(SAMPLING), data_source="toy", reward_model={"ground_truth": "7"}, uid="u", session_id=0)

    return asyncio.run(go()), servers


def meta(row):
    m, t = row.extra_fields["mgrpo"], row.extra_fields["magrpo"]
    return (t["node_id"], t["parent_node_id"], t["turn"], m["agent"], m["score"])


def test_single_turn_aligned(tokenizer, toy):
    rows, _ = run(tokenizer, config(G=2), {"a": ["1", "0"], "b": ["1", "1"]})
    # joint actions by index: (a1, b1) -> 1.0, (a0, b1) -> 0.5
    assert [meta(r) for r in rows] == [("0", "", 0, "a", 1.0), ("0", "", 0, "b", 1.0), ("1", "", 0, "a", 0.5), ("1", "", 0, "b", 0.5)]
    assert tokenizer.decode(rows[2].response_ids) == "0" and rows[2].response_mask == [1]
    assert rows[0].extra_fields["mgrpo"]["traj_id"] == "u/0/0/a" and rows[0].extra_fields["mgrpo"]["parent_traj_id"] == ""
    # acc: mean joint reward of the leaves (0.75); the task's reward parts on every row
    assert rows[0].extra_fields["reward_extra_info"] == {"acc": 0.75, "ones": 2.0, "reward/errors": 0.0, "generation/errors": 0.0}
    assert rows[3].extra_fields["reward_extra_info"] == {"acc": 0.75, "ones": 1.0, "reward/errors": 0.0, "generation/errors": 0.0}


def test_cross_mode_takes_every_combination(tokenizer, toy):
    rows, _ = run(tokenizer, config(G=2, mode="cross"), {"a": ["1", "0"], "b": ["1", "0"]})
    # G^n = 4 joint actions: (1,1) 1.0, (1,0) 0.5, (0,1) 0.5, (0,0) 0.0
    scores = [r.extra_fields["mgrpo"]["score"] for r in rows if r.extra_fields["mgrpo"]["agent"] == "a"]
    assert scores == [1.0, 0.5, 0.5, 0.0]


def test_two_turns_histories_and_early_termination(tokenizer, toy):
    # turn 0: (1,1) -> 1.0 reaches the threshold and stops; (0,1) -> 0.5 is expanded into 2 children
    rows, servers = run(tokenizer, config(G=2, turns=2, threshold=1.0), {"a": ["1", "0", "1", "0"], "b": ["1", "1", "1", "0"]})
    nodes = sorted({meta(r)[:3] for r in rows})
    assert nodes == [("0", "", 0), ("1", "", 0), ("1.0", "1", 1), ("1.1", "1", 1)]
    # the second turn's prompts show each agent its own previous completion and the feedback
    turn1 = [c for agent, n, c in toy.seen if n == 1]
    assert turn1 == ["task 7 for a | prev 0 fb r=0.5", "task 7 for b | prev 1 fb r=0.5"]
    # leaves: node 0 (1.0), 1.0 (1.0), 1.1 (0.0): acc = 2/3
    assert rows[0].extra_fields["reward_extra_info"]["acc"] == pytest.approx(2 / 3)


def test_failed_generation_is_an_empty_completion(tokenizer, toy):
    """A failed generation is scored as the empty text; its row holds one masked EOS token (no loss), because verl's
    row writes the reward on the last response token: an empty response crashed the step (a SmolLM2 run whose
    step-2 generations all timed out, 2026-12-07)."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    rows, _ = run(tokenizer, config(G=2), {"a": ["1", None], "b": ["1", "1"]})
    failed = [r for r in rows if r.extra_fields["magrpo"]["node_id"] == "1" and r.extra_fields["mgrpo"]["agent"] == "a"][0]
    assert failed.response_ids == [tokenizer.eos_token_id] and failed.response_mask == [0]
    assert failed.response_logprobs == [0.0] and failed.extra_fields["mgrpo"]["score"] == 0.5
    list_of_dict_to_tensordict([r.as_dict() for r in rows])  # what verl's TransferQueue loop does with them
    assert all(r.extra_fields["mgrpo"]["failed_calls"] == 1 for r in rows)
    # the failure rate validation reports: 1 on the failed row only (b's row of node 1 holds a real completion)
    assert [r.extra_fields["reward_extra_info"]["generation/errors"] for r in rows] == [0.0, 0.0, 1.0, 0.0]
    assert [meta(r)[:4:3] for r in rows] == [("0", "a"), ("0", "b"), ("1", "a"), ("1", "b")]


def test_a_slow_generation_fails_only_past_the_configured_timeout(tokenizer, toy):
    """The limit includes the wait in the server's queue, so by default there is none (validation sends every
    task at once: a 120 s limit failed 241 of 256 SmolLM2 generations on 2 CPU cores)."""
    slow = {"a": [(0.3, "1"), "1"], "b": ["1", "1"]}
    rows, _ = run(tokenizer, config(G=2), {k: list(v) for k, v in slow.items()})  # no limit: waits, scores 1.0
    assert [r.extra_fields["mgrpo"]["score"] for r in rows] == [1.0] * 4
    assert all(r.extra_fields["reward_extra_info"]["generation/errors"] == 0.0 for r in rows)
    rows, _ = run(tokenizer, config(G=2, timeout_s=0.1), {k: list(v) for k, v in slow.items()})
    assert [r.extra_fields["mgrpo"]["score"] for r in rows] == [0.5, 0.5, 1.0, 1.0]  # a's first completion timed out
    assert [r.extra_fields["reward_extra_info"]["generation/errors"] for r in rows] == [1.0, 0.0, 0.0, 0.0]


def test_rows_give_magrpo_advantages(tokenizer, toy):
    """The trainer's view: one-turn tree with rewards {1.0, 0.5}: mean baseline 0.75 -> +0.25 / -0.25 for both
    agents' rows of each node."""
    rows, _ = run(tokenizer, config(G=2), {"a": ["1", "0"], "b": ["1", "1"]})
    table = build_row_table([f"u_0_{i}" for i in range(len(rows))], ["u"] * len(rows), [r.extra_fields for r in rows])
    adv = scalar_advantages(table, "magrpo", MAGRPOConfig(num_generations=2))
    np.testing.assert_allclose(adv, [0.25, 0.25, -0.25, -0.25])


def test_settings_are_validated(tokenizer, toy):
    with pytest.raises(Exception, match="num_generations must be set"):
        run(tokenizer, OmegaConf.create({**OmegaConf.to_container(config()), "multi_agent": {"magrpo": {}}}), {})


def test_a_reward_that_fails_scores_zero_and_is_counted(tokenizer, toy):
    # node 0 raises, node 1 returns NaN, node 2 scores 1.0: the loop goes on, both failures score 0
    rows, _ = run(tokenizer, config(G=3), {"a": ["boom", "nan", "1"], "b": ["1", "1", "1"]})
    by_node = {r.extra_fields["magrpo"]["node_id"]: r for r in rows if r.extra_fields["mgrpo"]["agent"] == "b"}
    assert {n: r.extra_fields["mgrpo"]["score"] for n, r in by_node.items()} == {"0": 0.0, "1": 0.0, "2": 1.0}
    assert {n: r.extra_fields["reward_extra_info"]["reward/errors"] for n, r in by_node.items()} == {"0": 1.0, "1": 1.0, "2": 0.0}
    assert rows[0].extra_fields["reward_extra_info"]["acc"] == pytest.approx(1 / 3)
    assert all(set(r.extra_fields["reward_extra_info"]) == {"acc", "ones", "reward/errors", "generation/errors"} for r in rows)


def test_the_coding_task_scores_deeply_nested_code_instead_of_raising(tokenizer):
    # the real task: ast.parse raised RecursionError on this helper and ended the agent loop
    task = coop_tasks.CodeTask()
    deep = "def aux(a, b):\n    return " + "-" * 5000 + "1"
    main_text = "def has_close_elements(numbers, threshold):\n    return aux(numbers, threshold)\n"
    outcome = task.reward("HumanEval/0", {"helper": deep, "main": main_text})
    assert outcome.reward == 0.25 and outcome.info["syntax"] == 0.0


def test_trajectory_seeds_one_per_agent_and_completion(tokenizer, toy):
    """``multi_agent.trajectory_seeds``: each of the G completions of each agent at a node carries its own seed,
    the same on every run of the row (by agent and completion index, whatever order they reach the servers)."""
    cfg = config(G=2, turns=2)
    cfg.multi_agent.trajectory_seeds = True

    def seeds():
        seen: dict[str, list[int]] = {"a": [], "b": []}

        class Recording(Server):
            async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
                seen[self.name].append(sampling_params["seed"])
                return await super().generate(request_id, prompt_ids, sampling_params, **kwargs)

        servers = {}
        for name in "ab":
            servers[name] = Recording(tokenizer, ["1"] * 6)
            servers[name].name = name

        async def go():
            loop = build_agent_loop(AGENT_LOOP_NAME, cfg, Manager(servers), tokenizer)
            return await loop.run(dict(SAMPLING), data_source="toy", reward_model={"ground_truth": "7"}, uid="u",
                                  session_id=0, index=4, extra_info={"split": "train", "index": 4}, global_steps=2)

        asyncio.run(go())
        return seen

    first = seeds()
    assert [len(first[a]) for a in "ab"] == [6, 6]  # 2 roots + 2 x 2 children, per agent
    assert len(set(first["a"] + first["b"])) == 12
    assert seeds() == first
