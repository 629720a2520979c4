"""RelayDelegationLoop driven directly with scripted fake rollout servers and the tiny tokenizer.

The loop is built the way verl's ``AgentLoopWorker._run_agent_loop`` builds loops (hydra ``instantiate`` of
the registry entry, trainer config wrapped in ``DictConfigWrap``), with a minimal trainer config holding
only what the loop reads. Token ids come from the tiny tokenizer (digits ``"0"``..``"9"`` are single tokens),
so every score below is worked out from the scripted text with the echo rule: over the first 8 characters,
1 point per right digit, 0.25 per other digit, divided by 8.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hydra.errors import InstantiationException
from omegaconf import OmegaConf
from verl.utils import normalize_token_ids
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.rollout.replica import TokenOutput

from mgrpo_verl.config.schema import DelegationConfig
from mgrpo_verl.envs import relay
from mgrpo_verl.agent_loops import common
from mgrpo_verl.agent_loops.common import DelegationSettings
from mgrpo_verl.agent_loops.delegation import SUB_CALL_LOOP_NAME
from mgrpo_verl.agent_loops.remote_sub import RemoteCallError, RemoteSubAgent, SubCallReply
from mgrpo_verl.agent_loops.testing import build_agent_loop

DIGIT = "4"
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


class FakeAgent:
    """A rollout server of one agent: answers each call with the next scripted step.

    A step is ``(token_ids, log_probs)``, an exception (raised), or ``("sleep", seconds, token_ids)``. Every
    output carries ``min_global_steps = max_global_steps = k``, the weight version: ``steps``, or the next
    item when ``steps`` is a list."""

    def __init__(self, script, steps: int | list[int] = 0, config=None):
        self.script = list(script)
        self.steps = steps
        self.calls: list[dict] = []
        if config is not None:
            self.config = config

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        if step[0] == "sleep":
            await asyncio.sleep(step[1])
            step = (step[2], None)
        token_ids, log_probs = step
        k = self.steps.pop(0) if isinstance(self.steps, list) else self.steps
        extra = {"min_global_steps": k, "max_global_steps": k}
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, extra_fields=extra)


class FakeManager(FakeAgent):
    """The main agent's server plus ``for_agent`` (what ``MultiAgentLLMClient`` offers)."""

    def __init__(self, script, sub: FakeAgent, steps: int | list[int] = 0):
        super().__init__(script, steps)
        self.sub = sub

    def for_agent(self, name):
        if name != "sub":
            raise ValueError(f"unknown agent {name!r}; known agents are ['main', 'sub']")
        return self.sub


def _config(response_length=64, **delegation):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": "/models/main"},
                "rollout": {"prompt_length": 64, "response_length": response_length},
            },
            "data": {},
            "multi_agent": {"main": "main", "delegation": {"timeout_s": 5, **delegation}},
        }
    )


def _run(manager, tokenizer, config, digit=DIGIT, **row):
    """One ``run`` of a loop built as verl's worker builds it; returns the rows."""

    async def go():
        loop = build_agent_loop("mgrpo_relay", config, manager, tokenizer)
        kwargs = {
            "raw_prompt": relay.main_messages(),
            "reward_model": {"style": "rule", "ground_truth": digit},
            "uid": "u1",
            "session_id": 2,
            **row,
        }
        return await loop.run(dict(SAMPLING), **kwargs)

    return asyncio.run(go())


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def _chat_ids(tokenizer, messages):
    return normalize_token_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


def _fields_set(rows):
    return {tuple(sorted(row.as_dict())) for row in rows}


def test_three_calls_rows_routing_tokens_and_fields(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    plan_ids = _ids(tokenizer, "76") + [im_end]  # "7" 25 + "6" 24 + <|im_end|> 2 = 51
    assert sum(plan_ids) % 4 == 3, "the scripted plan must give d = 0 + 51 % (3 - 0 + 1) = 3"
    answer_ids = _ids(tokenizer, "4")
    sub = FakeAgent(
        [(_ids(tokenizer, "44"), [-0.1, -0.2]), (_ids(tokenizer, "41"), None), (_ids(tokenizer, "x"), None)], steps=7
    )
    main = FakeManager([(plan_ids, [-0.5, -0.25, -0.125]), (answer_ids, [-1.0])], sub, steps=[3, 5])
    rows = _run(main, tokenizer, _config(plan_tokens=4, answer_tokens=3, sub_response_tokens=5))

    # routing: two main generations on the main server, three sub calls on the sub server
    assert len(main.calls) == 2 and len(sub.calls) == 3
    # order: sub rows in call order, main row last
    assert [r.extra_fields["mgrpo"]["agent"] for r in rows] == ["sub", "sub", "sub", "main"]
    *subs, top = rows

    # main row: prompt, then plan ⊕ observation ⊕ answer with mask 1 / 0 / 1 and log-probs 0 on the observation
    prompt_ids = _chat_ids(tokenizer, relay.main_messages())
    assert top.prompt_ids == prompt_ids
    n_obs = len(top.response_ids) - len(plan_ids) - len(answer_ids)
    assert top.response_ids[: len(plan_ids)] == plan_ids and top.response_ids[-1:] == answer_ids
    observation = tokenizer.decode(top.response_ids[len(plan_ids) : -1])
    # Qwen's CT builder inserts the newline that follows <|im_end|> in the chat template
    assert observation == "\n<|im_start|>user\nHelper said: 44 | 41 | x<|im_end|>\n<|im_start|>assistant\n"
    assert top.response_mask == [1] * 3 + [0] * n_obs + [1]
    assert top.response_logprobs == [-0.5, -0.25, -0.125] + [0.0] * n_obs + [-1.0]
    assert len(top.response_ids) == len(top.response_mask) == len(top.response_logprobs)
    # the answer was generated from prompt ⊕ plan ⊕ observation, by the same request id (sticky session)
    assert main.calls[1]["prompt_ids"] == prompt_ids + top.response_ids[:-1]
    assert main.calls[0]["request_id"] == main.calls[1]["request_id"]

    # max-token caps per generation, other sampling params passed through
    assert main.calls[0]["params"] == {**SAMPLING, "max_tokens": 4}
    assert main.calls[1]["params"]["max_tokens"] == 3
    assert [c["params"]["max_tokens"] for c in sub.calls] == [5, 5, 5]

    # sub rows: the sub prompt contains the digit and the plan text, the response is the sub's generation
    sub_prompt = _chat_ids(tokenizer, relay.sub_messages(DIGIT, "76"))
    assert all(c["prompt_ids"] == sub_prompt for c in sub.calls)
    assert [r.prompt_ids for r in subs] == [sub_prompt] * 3
    assert [r.response_ids for r in subs] == [_ids(tokenizer, t) for t in ("44", "41", "x")]
    assert [r.response_mask for r in subs] == [[1] * len(r.response_ids) for r in subs]
    assert subs[0].response_logprobs == [-0.1, -0.2]
    assert subs[1].response_logprobs == [0.0] * len(subs[1].response_ids)  # backend returned none

    # own scores: main "4" -> 1/8; subs "44" -> 2/8, "41" -> (1 + .25)/8, "x" -> 0
    assert [r.extra_fields["mgrpo"] for r in rows] == [
        {"agent": "sub", "traj_id": "u1/2/sub/0", "parent_traj_id": "u1/2/main", "score": 0.25, "calls": 1,
         "failed_calls": 0, "observation_truncated": False},
        {"agent": "sub", "traj_id": "u1/2/sub/1", "parent_traj_id": "u1/2/main", "score": 0.15625, "calls": 1,
         "failed_calls": 0, "observation_truncated": False},
        {"agent": "sub", "traj_id": "u1/2/sub/2", "parent_traj_id": "u1/2/main", "score": 0.0, "calls": 1,
         "failed_calls": 0, "observation_truncated": False},
        {"agent": "main", "traj_id": "u1/2/main", "parent_traj_id": "", "score": 0.125, "calls": 3,
         "failed_calls": 0, "observation_truncated": False},
    ]  # fmt: skip
    # team reward on every row (what verl would copy from the final row anyway); no reward loop needed
    assert [r.reward_score for r in rows] == [0.125] * 4
    # per-query statistics: main generated plan (3 tokens) + answer (1); the subs "44", "41", "x"
    sub_tokens = sum(len(_ids(tokenizer, t)) for t in ("44", "41", "x"))
    assert top.extra_fields["reward_extra_info"] == {
        "acc": 0.125, "exact": 1.0, "calls": 3, "failed_calls": 0, "main_tokens": 4, "sub_tokens": sub_tokens,
        "answer": "4", "source": "", "level": "", "id": "", "reward/errors": 0,
    }
    # global-step tags: the sub's own weight version; main = min / max over its plan (3) and answer (5)
    tags = [(r.extra_fields["min_global_steps"], r.extra_fields["max_global_steps"]) for r in rows]
    assert tags == [(7, 7)] * 3 + [(3, 5)]
    assert [r.num_turns for r in rows] == [2, 2, 2, 4]
    assert len(_fields_set(rows)) == 1  # one field set for the whole call (list_of_dict_to_tensordict)
    # what AgentLoopWorkerTQ stores: one TransferQueue row per output
    stored = list_of_dict_to_tensordict([r.as_dict() for r in rows])
    assert stored["rm_scores"][-1][-1].item() == 0.125
    traj_ids = [f["mgrpo"]["traj_id"] for f in stored["extra_fields"]]
    assert traj_ids == ["u1/2/sub/0", "u1/2/sub/1", "u1/2/sub/2", "u1/2/main"]


def test_zero_and_one_call(tokenizer):
    plan0 = _ids(tokenizer, "75")  # 25 + 23 = 48, 48 % 4 = 0
    plan1 = _ids(tokenizer, "76")  # 25 + 24 = 49, 49 % 4 = 1
    assert (sum(plan0) % 4, sum(plan1) % 4) == (0, 1)

    sub = FakeAgent([])
    main = FakeManager([(plan0, None), (_ids(tokenizer, "44"), None)], sub)
    (top,) = _run(main, tokenizer, _config())
    assert sub.calls == []
    assert "Helper was not asked." in tokenizer.decode(top.response_ids)
    assert top.extra_fields["mgrpo"]["calls"] == 0 and top.extra_fields["mgrpo"]["score"] == 0.25  # "44": 2/8
    assert top.response_logprobs == [0.0] * len(top.response_ids)
    assert top.num_turns == 4

    sub = FakeAgent([(_ids(tokenizer, "4"), None)], steps=1)
    main = FakeManager([(plan1, None), (_ids(tokenizer, "4"), None)], sub)
    rows = _run(main, tokenizer, _config())
    assert len(sub.calls) == 1 and len(rows) == 2
    assert rows[0].extra_fields["mgrpo"]["traj_id"] == "u1/2/sub/0"
    assert rows[0].extra_fields["mgrpo"]["score"] == 0.125
    assert "Helper said: 4<|im_end|>" in tokenizer.decode(rows[1].response_ids)


def test_min_calls_shifts_the_range(tokenizer):
    plan = _ids(tokenizer, "75")  # sum 48: d = 2 + 48 % (3 - 2 + 1) = 2
    sub = FakeAgent([(_ids(tokenizer, "4"), None)] * 2)
    main = FakeManager([(plan, None), (_ids(tokenizer, "4"), None)], sub)
    rows = _run(main, tokenizer, _config(min_calls=2, max_calls=3))
    assert rows[-1].extra_fields["mgrpo"]["calls"] == 2 and len(rows) == 3


def test_failed_and_timed_out_calls_become_error_text_without_rows(tokenizer):
    plan = _ids(tokenizer, "77")  # 25 + 25 = 50, 50 % 4 = 2 calls
    assert sum(plan) % 4 == 2
    sub = FakeAgent([(_ids(tokenizer, "4"), None), RuntimeError("boom")])
    main = FakeManager([(plan, None), (_ids(tokenizer, "4"), None)], sub)
    rows = _run(main, tokenizer, _config())
    assert len(rows) == 2  # one sub row (call 0), the main row
    assert rows[0].extra_fields["mgrpo"]["traj_id"] == "u1/2/sub/0"
    assert "Helper said: 4 | <error: RuntimeError: boom>" in tokenizer.decode(rows[-1].response_ids)
    assert rows[-1].extra_fields["mgrpo"]["failed_calls"] == 1 and rows[-1].extra_fields["mgrpo"]["calls"] == 2

    sub = FakeAgent([("sleep", 2.0, _ids(tokenizer, "4")), (_ids(tokenizer, "4"), None)])
    main = FakeManager([(plan, None), (_ids(tokenizer, "4"), None)], sub)
    rows = _run(main, tokenizer, _config(timeout_s=0.05))
    assert [r.extra_fields["mgrpo"]["traj_id"] for r in rows] == ["u1/2/sub/1", "u1/2/main"]
    assert "Helper said: <error: timed out after 0.05s> | 4" in tokenizer.decode(rows[-1].response_ids)
    assert rows[-1].extra_fields["mgrpo"]["failed_calls"] == 1
    assert len(_fields_set(rows)) == 1


def test_long_observation_is_shortened_to_leave_room_for_the_answer(tokenizer):
    plan = _ids(tokenizer, "76") + [tokenizer.convert_tokens_to_ids("<|im_end|>")]  # d = 3
    chatter = _ids(tokenizer, "the helper talks and talks about many things")
    sub = FakeAgent([(chatter, None)] * 3)
    main = FakeManager([(plan, None), (_ids(tokenizer, "4") * 8, [-1.0] * 8)], sub)
    rows = _run(main, tokenizer, _config(response_length=40, answer_tokens=8, sub_response_tokens=16))
    top = rows[-1]
    assert len(rows) == 4 and top.extra_fields["mgrpo"]["observation_truncated"] is True
    assert main.calls[1]["params"]["max_tokens"] == 8  # the full answer budget was kept
    assert len(top.response_ids) == len(top.response_mask) == len(top.response_logprobs) <= 40
    assert top.response_ids[-8:] == _ids(tokenizer, "4") * 8 and top.response_mask[-8:] == [1] * 8
    observation = tokenizer.decode(top.response_ids[len(plan) : -8])
    assert observation.startswith("\n<|im_start|>user\nHelper said: the helper")
    assert observation.endswith("...(truncated)<|im_end|>\n<|im_start|>assistant\n")
    assert top.extra_fields["mgrpo"]["score"] == 1.0  # "44444444"


def test_truncation_keeps_ids_mask_logprobs_aligned(tokenizer):
    plan = _ids(tokenizer, "75")  # d = 0
    # 6 tokens: not even a shortened observation fits; the row is cut, there is no room for an answer
    main = FakeManager([(plan, [-0.5, -0.5])], FakeAgent([]))
    (top,) = _run(main, tokenizer, _config(response_length=6))
    assert len(main.calls) == 1
    assert len(top.response_ids) == len(top.response_mask) == len(top.response_logprobs) == 6
    assert top.response_mask == [1, 1, 0, 0, 0, 0] and top.response_logprobs == [-0.5, -0.5, 0, 0, 0, 0]
    assert top.extra_fields["mgrpo"]["observation_truncated"] is True
    assert top.extra_fields["mgrpo"]["score"] == 0.0 and top.num_turns == 3

    # exactly answer_tokens of room; both generations over-produce and are cut to what was asked
    (free,) = _run(FakeManager([(plan, None), (_ids(tokenizer, "4"), None)], FakeAgent([])), tokenizer, _config())
    used = len(free.response_ids) - 1  # plan ⊕ observation
    main = FakeManager([(plan * 5, [-0.5] * 10), (_ids(tokenizer, "4") * 8, [-1.0] * 8)], FakeAgent([]))
    (top,) = _run(main, tokenizer, _config(response_length=used + 3, plan_tokens=2, answer_tokens=3))
    assert main.calls[1]["params"]["max_tokens"] == 3
    assert len(top.response_ids) == len(top.response_mask) == len(top.response_logprobs) == used + 3
    assert top.response_ids[:2] == plan and top.response_mask[-3:] == [1, 1, 1]
    assert top.response_logprobs[:2] == [-0.5, -0.5] and top.response_logprobs[-3:] == [-1.0] * 3
    assert top.extra_fields["mgrpo"]["observation_truncated"] is False
    assert top.extra_fields["mgrpo"]["score"] == 3 / 8  # "444"


def test_without_for_agent_the_main_server_plays_the_sub_agent(tokenizer):
    plan = _ids(tokenizer, "76")  # d = 1
    single = FakeAgent([(plan, None), (_ids(tokenizer, "4"), None), (_ids(tokenizer, "4"), None)])
    rows = _run(single, tokenizer, _config())
    assert len(single.calls) == 3  # plan, the sub call, the answer: all on the one server
    assert single.calls[1]["prompt_ids"] == _chat_ids(tokenizer, relay.sub_messages(DIGIT, "76"))
    assert [r.extra_fields["mgrpo"]["agent"] for r in rows] == ["sub", "main"]


def test_sub_agent_with_its_own_tokenizer_path(tokenizer, tiny_paths, monkeypatch):
    monkeypatch.setattr(common, "TOKENIZERS", {})
    sub_config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": "/models/sub", "tokenizer_path": tiny_paths.tokenizer_dir},
                "rollout": {"prompt_length": 64, "response_length": 2},
            }
        }
    )
    sub = FakeAgent([(_ids(tokenizer, "444"), None)], config=sub_config)
    main = FakeManager([(_ids(tokenizer, "76"), None), (_ids(tokenizer, "4"), None)], sub)
    rows = _run(main, tokenizer, _config(sub_response_tokens=16))
    loaded = common.TOKENIZERS[tiny_paths.tokenizer_dir]
    assert loaded is not tokenizer  # loaded from the sub-agent's own path (same files here)
    assert sub.calls[0]["params"]["max_tokens"] == 2  # capped by the sub-agent's response_length
    assert rows[0].response_ids == _ids(tokenizer, "44")


def test_unknown_sub_agent_raises_before_generating(tokenizer):
    # multi_agent.delegation.sub_agent names no agent of the config: the loop's settings reject it when
    # the loop is built (hydra wraps the ValueError), before any generation
    main = FakeManager([], FakeAgent([]))
    with pytest.raises(InstantiationException, match="multi_agent.delegation.sub_agent .*'critic'"):
        _run(main, tokenizer, _config(sub_agent="critic"))
    assert main.calls == []


@pytest.mark.parametrize(
    "delegation_cfg, field",
    [
        ({"min_calls": -1}, "min_calls"),
        ({"min_calls": 3, "max_calls": 1}, "min_calls"),
        ({"max_calls": 1.5}, "max_calls"),
        ({"plan_tokens": 0}, "plan_tokens"),
        ({"answer_tokens": 0}, "answer_tokens"),
        ({"sub_response_tokens": 0}, "sub_response_tokens"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_delegation_config(tokenizer, delegation_cfg, field):
    with pytest.raises(ValueError, match=f"multi_agent.delegation.{field}"):
        DelegationSettings.from_config(_config(**delegation_cfg))
    # built by verl's hydra instantiate, which wraps the ValueError and keeps its message
    with pytest.raises(InstantiationException, match=f"multi_agent.delegation.{field}"):
        _run(FakeManager([], FakeAgent([])), tokenizer, _config(**delegation_cfg))


def test_settings_defaults_and_sub_agent_resolution():
    defaults = DelegationSettings.from_config(OmegaConf.create({"actor_rollout_ref": {}}))
    assert defaults == DelegationSettings(delegation=DelegationConfig(sub_agent="sub"), main="main", sub_agents=("sub",))
    assert defaults.sub_agent == "sub" and defaults.delegation.sub_response_tokens == 8
    agents = {"planner": {}, "helper": {}, "checker": {}}
    cfg = OmegaConf.create({"multi_agent": {"main": "planner", "agents": agents}})
    assert DelegationSettings.from_config(cfg).sub_agent == "helper"  # first agent that is not the main one
    with pytest.raises(ValueError, match="multi_agent.delegation.sub_agent"):
        DelegationSettings.from_config(OmegaConf.create({"multi_agent": {"agents": {"main": {}}}}))
    # d over all plans stays in [min_calls, max_calls] and takes every value
    settings = DelegationSettings(delegation=DelegationConfig(min_calls=1, max_calls=3))
    assert {settings.num_calls(list(p)) for p in itertools.product(range(20, 30), repeat=2)} == {1, 2, 3}


# ------------------------------------------------------- decoupled mode: remote sub-agent (both sides)


class FakeRemote(RemoteSubAgent):
    """A remote sub-agent answering from a script: text, an exception, or ("sleep", s, text)."""

    def __init__(self, script):
        super().__init__("sub", "http://sub.invalid", 5.0, "s" * 32)
        self.script, self.requests = list(script), []

    async def call(self, req):
        self.requests.append(req)
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        if isinstance(step, tuple):
            await asyncio.sleep(step[1])
            step = step[2]
        return SubCallReply(req.traj_id, step, 3, 1)


class RemoteManager(FakeAgent):
    def __init__(self, script, remote):
        super().__init__(script)
        self.remote = remote

    def for_agent(self, name):
        assert name == "sub"
        return self.remote


def _run_main(manager, tokenizer, config):
    async def go():
        loop = build_agent_loop("mgrpo_relay", config, manager, tokenizer)
        kwargs = {"raw_prompt": relay.main_messages(), "reward_model": {"ground_truth": DIGIT}, "uid": "u1",
                  "session_id": 2, "global_steps": 6}
        return await loop.run(dict(SAMPLING), **kwargs)

    return asyncio.run(go())


def test_main_side_loop_calls_remote_and_returns_the_main_row_only(tokenizer):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    plan_ids = _ids(tokenizer, "76") + [im_end]  # 51 % 4 = 3 calls
    remote = FakeRemote(["44", RemoteCallError("gone"), ("sleep", 2.0, "9")])
    main = RemoteManager([(plan_ids, None), (_ids(tokenizer, "4"), None)], remote)
    rows = _run_main(main, tokenizer, _config(response_length=256, timeout_s=0.5))

    assert len(rows) == 1  # the sub side keeps its rows
    meta = rows[0].extra_fields["mgrpo"]
    assert meta["traj_id"] == "u1/2/main" and meta["session"] == 2 and meta["calls"] == 3
    assert meta["sub_calls"] == ["u1/2/sub/0"]  # only the answer the main agent saw
    assert meta["failed_calls"] == 2
    text = tokenizer.decode(rows[0].response_ids)
    assert "Helper said: 44 | <error: RemoteCallError: gone> | <error: timed out after 0.5s>" in text
    # answer "4" is the digit: 1 point of 8 -> 0.125
    assert meta["score"] == pytest.approx(1 / 8)
    plan_text = tokenizer.decode(plan_ids, skip_special_tokens=True)
    first = remote.requests[0]
    assert first.messages == relay.sub_messages(DIGIT, plan_text)
    assert (first.agent, first.agent_loop, first.uid, first.session, first.main_step) == ("sub", SUB_CALL_LOOP_NAME, "u1", 2, 6)
    assert [r.traj_id for r in remote.requests] == ["u1/2/sub/0", "u1/2/sub/1", "u1/2/sub/2"]
    assert {r.parent_traj_id for r in remote.requests} == {"u1/2/main"} and first.ground_truth == DIGIT


def test_sub_side_loop_is_the_synchronous_call(tokenizer):
    """The sub side's loop builds the same prompt ids as the synchronous loop's call and scores the same."""
    plan_text = "76"
    messages = relay.sub_messages(DIGIT, plan_text)
    server = FakeAgent([(_ids(tokenizer, "4x"), [-0.5, -0.25])], steps=4)

    async def go():
        loop = build_agent_loop(SUB_CALL_LOOP_NAME, _config(sub_response_tokens=5), server, tokenizer)
        return await loop.run(dict(SAMPLING), raw_prompt=messages, reward_model={"ground_truth": DIGIT},
                              mgrpo_call={"agent": "sub", "traj_id": "u1/2/sub/0", "parent_traj_id": "u1/2/main"})

    (row,) = asyncio.run(go())
    assert row.prompt_ids == _chat_ids(tokenizer, messages)[-64:]
    assert server.calls[0]["params"]["max_tokens"] == 5
    assert row.response_ids == _ids(tokenizer, "4x") and row.response_mask == [1, 1]
    assert row.response_logprobs == [-0.5, -0.25]
    meta = row.extra_fields["mgrpo"]
    # "4x": the right digit (1 point) over 8 characters -> 0.125
    assert (meta["agent"], meta["traj_id"], meta["parent_traj_id"]) == ("sub", "u1/2/sub/0", "u1/2/main")
    assert meta["score"] == pytest.approx(relay.default_scorer("sub", "4x", DIGIT)) == row.reward_score
    assert row.extra_fields["min_global_steps"] == 4


def test_sub_prompt_hook_delegates_the_row_question_and_tags_the_query(tokenizer):
    """With ``delegation.sub_prompt`` set (another task on the forced-delegation loop, e.g. deep research),
    each call is prompted with ``sub_prompt(sub, question + "\\n" + plan)``; the query's tags come from
    ``extra_info`` and the answer text is kept for the evaluation."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    plan_ids = _ids(tokenizer, "76") + [im_end]  # d = 51 % 4 = 3 with min 0 / max 3, as above; cap max to 1
    sub = FakeAgent([(_ids(tokenizer, "Paris"), None)])
    main = FakeManager([(plan_ids, None), (_ids(tokenizer, "Answer: Paris"), None)], sub)
    config = _config(plan_tokens=4, answer_tokens=8, min_calls=1, max_calls=1,
                     sub_prompt="mgrpo_verl.envs.research.prompts:sub_messages")  # fmt: skip
    extra = {"question": "Capital of France?", "source": "gaia", "level": "2", "id": "q7"}
    rows = _run(main, tokenizer, config, extra_info=extra)
    from mgrpo_verl.envs.research import prompts

    # left-truncated to the sub-agent's prompt_length (64 in _config), as every sub prompt
    expected = _chat_ids(tokenizer, prompts.sub_messages("sub", "Capital of France?\n76"))[-64:]
    assert len(sub.calls) == 1 and sub.calls[0]["prompt_ids"] == expected
    info = rows[-1].extra_fields["reward_extra_info"]
    assert (info["source"], info["level"], info["id"], info["answer"]) == ("gaia", "2", "q7", "Answer: Paris")
    assert (info["calls"], info["failed_calls"], info["sub_tokens"]) == (1, 0, len(_ids(tokenizer, "Paris")))


def test_sub_prompt_hook_without_a_question_delegates_the_plan(tokenizer):
    """A row without ``extra_info.question``: the task is the plan alone."""
    from mgrpo_verl.envs.research import prompts

    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sub = FakeAgent([(_ids(tokenizer, "x"), None)])
    main = FakeManager([(_ids(tokenizer, "76") + [im_end], None), (_ids(tokenizer, "4"), None)], sub)
    config = _config(plan_tokens=4, answer_tokens=3, min_calls=1, max_calls=1,
                     sub_prompt="mgrpo_verl.envs.research.prompts:sub_messages")  # fmt: skip
    _run(main, tokenizer, config)
    assert sub.calls[0]["prompt_ids"] == _chat_ids(tokenizer, prompts.sub_messages("sub", "76"))[-64:]


def test_trajectory_seeds_per_main_turn_and_per_sub_call(tokenizer):
    """``multi_agent.trajectory_seeds``: the two main turns and each of the three calls carry seeds of their own,
    the same on a second run of the same row, others for another session of its group."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    plan_ids = _ids(tokenizer, "76") + [im_end]  # d = 3 (test_three_calls_rows_routing_tokens_and_fields)

    def seeds(session):
        sub = FakeAgent([(_ids(tokenizer, "4"), None)] * 3)
        main = FakeManager([(plan_ids, None), (_ids(tokenizer, "4"), None)], sub)
        cfg = _config(plan_tokens=4, answer_tokens=3, sub_response_tokens=5)
        cfg.multi_agent.trajectory_seeds = True
        _run(main, tokenizer, cfg, index=0, extra_info={"split": "train", "index": 0}, global_steps=1,
             session_id=session)
        return [c["params"]["seed"] for c in main.calls], sorted(c["params"]["seed"] for c in sub.calls)

    main, sub = seeds(0)
    assert len(set(main + sub)) == 5
    assert seeds(0) == (main, sub)
    assert not set(seeds(1)[0] + seeds(1)[1]) & set(main + sub)
