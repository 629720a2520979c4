"""The demonstrations are what the rollout produces: same tokens, same tool calls.

The SFT side is verl's own ``MultiTurnSFTDataset`` (through our ``JsonToolsSFTDataset``) reading the
parquet files the warm start writes; the rollout side is the real tool-delegation loop (agent loop
``mgrpo_delegate``, built as verl's worker builds it) driven by fake servers that "generate" exactly the
tokens the SFT puts its loss on, up to the stop token. If a model has learnt its demonstrations, the rows
RL trains on are then token for token the demonstrations.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.tool_parser import HermesToolParser
from verl.workers.rollout.replica import TokenOutput

from mgrpo_verl.envs import relay
from mgrpo_verl.agent_loops import tool_parser
from mgrpo_verl.agent_loops.testing import build_agent_loop
from mgrpo_verl.warmstart import demos
from mgrpo_verl.warmstart.dataset import JsonToolsSFTDataset
from mgrpo_verl.warmstart.evaluate import agent_config, loop_config

IM_END = "<|im_end|>"


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory):
    return demos.write_sft_datasets(tmp_path_factory.mktemp("demos"), n_train=12, n_val=4, seed=3)


def sft_items(path, tokenizer) -> list[dict]:
    """Every item of verl's SFT dataset (its own check that the turns add up to the whole chat template runs
    on each), as lists."""
    dataset = JsonToolsSFTDataset(str(path), tokenizer, OmegaConf.create({"pad_mode": "no_padding", "max_length": 2048}))
    return [{k: v.tolist() for k, v in dataset[i].items()} for i in range(len(dataset))]


def targets(item, im_end: int) -> list[list[int]]:
    """The item's loss-masked runs (one per assistant turn), each cut after the stop token: what a model
    that learnt the turn generates before the rollout stops it."""
    runs, run = [], []
    for token, mask in zip(item["input_ids"], item["loss_mask"], strict=True):
        if mask:
            run.append(token)
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    return [r[: r.index(im_end) + 1] for r in runs]


class Replay:
    """A rollout server that answers each generation with the next scripted token ids."""

    def __init__(self, script, config=None):
        self.script = list(script)
        self.prompts = []
        if config is not None:
            self.config = config

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        self.prompts.append(list(prompt_ids))
        return TokenOutput(token_ids=self.script.pop(0), log_probs=None, extra_fields={})


class ReplayManager(Replay):
    def __init__(self, script, sub, config=None):
        super().__init__(script, config)
        self.sub = sub

    def for_agent(self, name):
        return self if name == "main" else self.sub


def rollout(tokenizer, tokenizer_dir, main_script, sub_script, digit):
    """The rows ``[sub, main]`` of one rollout of the loop with replayed generations."""
    sub = Replay(sub_script, agent_config("/models/sub", tokenizer_dir, relay.SUB_TOOL_CONFIG))
    manager = ReplayManager(main_script, sub)
    config = loop_config("/models/main", tokenizer_dir)

    async def go():
        loop = build_agent_loop(relay.TOOLS_AGENT_LOOP_NAME, config, manager, tokenizer)
        return await loop.run(
            {"temperature": 1.0, "top_p": 1.0, "top_k": -1},
            raw_prompt=relay.tool_main_messages(),
            reward_model={"style": "rule", "ground_truth": digit},
            tools_kwargs=relay.secret_tools_kwargs(digit),
            uid="u",
            session_id=0,
        )

    rows = asyncio.run(go())
    assert not manager.script and not sub.script, "the rollout did not take every demonstrated turn"
    return rows


def test_demonstrations_render_to_the_rollouts_token_ids(sft_files, tokenizer, tiny_paths):
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    frames = {agent: __import__("pandas").read_parquet(sft_files[agent]["train"]) for agent in demos.AGENTS}
    items = {agent: sft_items(sft_files[agent]["train"], tokenizer) for agent in demos.AGENTS}
    assert len({str(d) for d in frames["main"]["digit"]}) > 1  # several digits are covered
    for i in range(len(frames["main"])):
        digit = str(frames["main"]["digit"][i])
        assert str(frames["sub"]["digit"][i]) == digit
        main_item, sub_item = items["main"][i], items["sub"][i]
        main_script, sub_script = targets(main_item, im_end), targets(sub_item, im_end)
        assert len(main_script) == len(sub_script) == 2  # a tool call, then the answer / the report

        sub_row, main_row = rollout(tokenizer, tiny_paths.tokenizer_dir, main_script, sub_script, digit)
        assert [r.extra_fields["mgrpo"]["agent"] for r in (sub_row, main_row)] == ["sub", "main"]
        for row, item in ((main_row, main_item), (sub_row, sub_item)):
            # verl's SFT dataset renders the whole conversation; the rollout stops after the last <|im_end|>,
            # before the template's turn separator
            assert item["input_ids"][-2:] == [im_end, *newline]
            assert row.prompt_ids + row.response_ids == item["input_ids"][:-1]
            # loss where the rollout's mask is 1 (the model's tokens), plus the separator after each stop
            # token, which the rollout inserts itself (mask 0)
            loss = item["loss_mask"][len(row.prompt_ids) : -1]
            ids = row.response_ids
            mask = list(row.response_mask)
            separators = [k for k in range(1, len(ids)) if ids[k - 1] == im_end and mask[k - 1] and [ids[k]] == newline]
            assert separators and all(loss[k] == 1 for k in separators)
            assert len(separators) == 1  # after the tool call; the answer is the last token
            assert mask == [0 if k in separators else m for k, m in enumerate(loss)]
            assert not any(item["loss_mask"][: len(row.prompt_ids)])
        # the episode solved the task, as demonstrated
        info = main_row.extra_fields["reward_extra_info"]
        assert info["answer"] == digit and info["calls"] == 1 and info["failed_calls"] == 0 and info["exact"] == 1.0
        assert info["tool/parse_errors"] == 0 and info[f"tool/{relay.SECRET_TOOL}"] == 1


def test_verls_hermes_parser_accepts_every_demonstrated_call(sft_files, tokenizer):
    parser = HermesToolParser(tokenizer)
    strict = tool_parser.StrictHermesToolParser(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    episodes = [*demos.demos_for("relay_tools").episodes(64, 0, "train"), *demos.demos_for("relay_tools").episodes(16, 0, "val")]
    seen = set()
    for episode in episodes:
        for agent in demos.AGENTS:
            for message in episode.messages[agent]:
                for call in message.get("tool_calls") or []:
                    function = call["function"]
                    ids = tokenizer.encode(demos.tool_call_text(function["name"], json.loads(function["arguments"])) + IM_END)
                    for p in (parser, strict):
                        content, calls = asyncio.run(p.extract_tool_calls(ids))
                        assert content.strip() == IM_END
                        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
                            (function["name"], json.loads(function["arguments"]))
                        ]
                        assert getattr(calls[0], "error", None) is None
                    seen.add(function["name"])
    assert seen == {"ask_sub", relay.SECRET_TOOL}
    # ... and the calls as verl's SFT dataset tokenises them (the loss-masked tokens) parse the same way
    for agent, name in (("main", "ask_sub"), ("sub", relay.SECRET_TOOL)):
        for item in sft_items(sft_files[agent]["val"], tokenizer):
            call_turn = targets(item, im_end)[0]
            _, calls = asyncio.run(parser.extract_tool_calls(call_turn))
            assert [c.name for c in calls] == [name]


def test_each_agents_dataset_holds_only_its_own_turns(sft_files):
    import pandas as pd

    for agent, tool_names, prompt in (
        ("main", ["ask_sub"], relay.tool_main_prompt()),
        ("sub", [relay.SECRET_TOOL], "Call the tool read_secret"),
    ):
        frame = pd.read_parquet(sft_files[agent]["train"])
        for messages, tools, digit in zip(frame["messages"], frame["tools"], frame["digit"], strict=True):
            assert [t["function"]["name"] for t in json.loads(tools)] == tool_names
            assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
            assert messages[0]["content"].startswith(prompt)
            assert messages[1]["tool_calls"][0]["function"]["name"] == tool_names[0]
            assert messages[-1]["content"] == digit
        if agent == "sub":  # the tool response is the task's own tool's
            assert all(m[2]["content"] == f"The secret digit is {d}." for m, d in zip(frame["messages"], frame["digit"]))
        else:  # the sub-agent's report, as the loop hands it over
            assert all(m[2]["content"] == d for m, d in zip(frame["messages"], frame["digit"]))


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match="no demonstrations for task 'echo'"):
        demos.demos_for("echo")


def test_sub_report_accuracy_leaves_the_sub_agent_room():
    """With ``sub_report_accuracy`` q the sub-agent's demonstration calls its tool and reports the secret in about q
    of the episodes, and otherwise answers the fixed non-answer at once, without a call (so the copy of the tool's
    digit is never shown wrong); the main agent's demonstrations still copy the secret; q = 1 draws exactly the
    episodes of the default."""
    noisy = demos.demos_for("relay_tools", sub_report_accuracy=0.3).episodes(200, 0, "train")
    reports = [e.messages["sub"][-1]["content"] for e in noisy]
    right = sum(r == e.digit for r, e in zip(reports, noisy))
    # 200 draws at p = 0.3: mean 60, std 6.5; the draw is seeded, so this count is fixed (53 when written)
    assert 40 <= right <= 80
    for e in noisy:
        roles = [m["role"] for m in e.messages["sub"]]
        if e.messages["sub"][-1]["content"] == e.digit:  # called: prompt, call, the tool's answer, the digit
            assert roles == ["user", "assistant", "tool", "assistant"] and e.digit in e.messages["sub"][2]["content"]
        else:  # lazy: the prompt, then the fallback, no call
            assert roles == ["user", "assistant"] and e.messages["sub"][-1]["content"] == demos.SUB_FALLBACK_REPORT
            assert not e.messages["sub"][-1].get("tool_calls")
    assert not demos.SUB_FALLBACK_REPORT.isdigit()  # pushing it down never pushes down a right answer
    assert all(e.messages["main"][-1]["content"] == e.digit == e.messages["main"][-2]["content"] for e in noisy)
    # the report is drawn from its own stream: the main agent's demonstrations do not depend on the accuracy
    exact = demos.demos_for("relay_tools").episodes(200, 0, "train")
    assert [e.messages["main"] for e in noisy] == [e.messages["main"] for e in exact]
    assert all(e.messages["sub"][-1]["content"] == e.digit for e in exact)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="sub_report_accuracy"):
            demos.demos_for("relay_tools", sub_report_accuracy=bad)


def test_fit_max_length_is_the_longest_demonstration_rounded_up_to_32(sft_files, tokenizer, tiny_paths):
    """verl pads every SFT sequence to data.max_length on CPU: the warm start gives it the longest demonstration
    (as verl's dataset tokenises it, read here through right padding, the other path) rounded up to 32."""
    from mgrpo_verl.warmstart.sft import fit_max_length

    for agent in demos.AGENTS:
        files = [sft_files[agent]["train"], sft_files[agent]["val"]]
        longest = 0
        for file in files:
            padded = JsonToolsSFTDataset(str(file), tokenizer, OmegaConf.create({"max_length": 2048}))
            longest = max([longest, *(int(padded[i]["attention_mask"].sum()) for i in range(len(padded)))])
        fitted = fit_max_length(files, tiny_paths.tokenizer_dir)
        assert fitted % 32 == 0 and longest <= fitted < longest + 32, (agent, longest, fitted)
        assert fitted < 1024  # verl's default, which padded these ~260-token demonstrations 4 times over


def test_each_demonstration_is_tokenised_once_and_handed_out_as_copies(sft_files, tokenizer, monkeypatch):
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    builds = []
    verls = MultiTurnSFTDataset.__getitem__
    monkeypatch.setattr(MultiTurnSFTDataset, "__getitem__", lambda self, item: builds.append(item) or verls(self, item))
    dataset = JsonToolsSFTDataset(str(sft_files["main"]["train"]), tokenizer,
                                  OmegaConf.create({"pad_mode": "right", "max_length": 512}))
    first = dataset[3]
    first["input_ids"][0] = -1  # a caller changing what it got (collation, in place) changes nothing kept
    again = dataset[3]
    assert builds == [3]  # verl's tokenisation ran once for item 3
    fresh = verls(dataset, 3)
    assert again.keys() == fresh.keys() and all(torch.equal(again[k], fresh[k]) for k in fresh)
    dataset[4]
    assert builds == [3, 4]
