"""The "relay_tools" task: dataset writer, the sub-agent's ``read_secret`` tool and its verl tool config."""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest

from verl.tools.tool_registry import initialize_tools_from_config

from mgrpo_verl.envs import builtin, relay
from mgrpo_verl.envs.relay_tools import NO_SECRET, ReadSecretTool


def test_tool_dataset_layout_and_determinism(tmp_path):
    train, val = relay.write_tool_dataset(tmp_path, n_train=20, n_val=5, seed=3)
    df = pd.read_parquet(train)
    assert len(df) == 20 and len(pd.read_parquet(val)) == 5
    assert set(df.columns) == {"data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"}
    assert (df["agent_name"] == "mgrpo_delegate").all() and (df["ability"] == "relay_tools").all()
    assert (df["data_source"] == relay.DATA_SOURCE).all()  # scored like the relay task
    for prompt, reward, extra in zip(df["prompt"], df["reward_model"], df["extra_info"], strict=True):
        (message,) = prompt
        assert message["role"] == "user" and "ask_sub" in message["content"]
        assert not any(c.isdigit() for c in message["content"])  # nobody's prompt holds the digit
        # the digit travels only in the per-sample tools_kwargs of the sub-agent's tool
        assert extra["tools_kwargs"] == {"read_secret": {"create_kwargs": {"secret": reward["ground_truth"]}}}
    assert len({r["ground_truth"] for r in df["reward_model"]}) > 1
    # the same digits as the relay task's rows of the same seed and split
    plain = relay.build_rows(20, 3, "train")
    assert [r["ground_truth"] for r in df["reward_model"]] == [r["reward_model"]["ground_truth"] for r in plain]
    again, _ = relay.write_tool_dataset(tmp_path / "again", n_train=20, n_val=5, seed=3)
    pd.testing.assert_frame_equal(df, pd.read_parquet(again))
    other, _ = relay.write_tool_dataset(tmp_path / "other", n_train=2, n_val=1, sub="helper")
    assert "ask_helper" in pd.read_parquet(other)["prompt"][0][0]["content"]


def test_prompts_of_the_tool_variant():
    assert relay.tool_main_messages() == [
        {"role": "user", "content": "Call the tool ask_sub to find the secret digit, then answer with the digit only."}
    ]
    (message,) = relay.tool_sub_messages("sub", "find the secret")
    assert message["role"] == "user" and "read_secret" in message["content"]
    assert message["content"].endswith("Task: find the secret")
    assert relay.load_sub_prompt(None) is relay.tool_sub_messages
    assert relay.load_sub_prompt("mgrpo_verl.envs.relay:tool_sub_messages") is relay.tool_sub_messages
    with pytest.raises(ValueError, match="multi_agent.delegation.sub_prompt"):
        relay.load_sub_prompt("mgrpo_verl.envs.relay:nope")


def test_registered_as_builtin_task():
    assert builtin.TASKS["relay_tools"] is relay.write_tool_dataset
    assert builtin.TASKS["relay"] is relay.write_dataset


def test_read_secret_from_the_tool_config_and_create_kwargs():
    (tool,) = initialize_tools_from_config(relay.SUB_TOOL_CONFIG)  # verl's own loader
    assert isinstance(tool, ReadSecretTool) and tool.name == relay.SECRET_TOOL == "read_secret"
    assert tool.tool_schema.function.parameters.properties == {}

    async def go():
        # what ToolAgentLoop._call_tool does with tools_kwargs[tool name]
        kwargs = relay.secret_tools_kwargs("7")[tool.name]
        first, _ = await tool.create(create_kwargs=kwargs["create_kwargs"])
        second, _ = await tool.create(create_kwargs={"secret": 3})
        bare, _ = await tool.create(create_kwargs={})
        out = [await tool.execute(i, {}) for i in (first, second, bare)]
        extra = await tool.execute(first, {"ignored": 1})
        for i in (first, second, bare):
            await tool.release(i)
        gone = await tool.execute(first, {})
        return out, extra, gone, tool._secrets

    out, extra, gone, left = asyncio.run(go())
    assert [(r.text, reward) for r, reward, _ in out] == [
        ("The secret digit is 7.", 0.0), ("The secret digit is 3.", 0.0), (NO_SECRET, 0.0)
    ]  # fmt: skip
    assert extra[0].text == "The secret digit is 7."
    assert gone[0].text == NO_SECRET and left == {}
