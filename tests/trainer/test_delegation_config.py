"""``multi_agent.delegation`` keys of delegation by tool call: ``sub_max_turns`` and ``sub_prompt``."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import dataclasses

from mgrpo_verl.config.schema import DelegationConfig
from mgrpo_verl.config.plan import build_plan

DELEGATION_KEYS = [f.name for f in dataclasses.fields(DelegationConfig) if f.name != "_target_"]

def config(**delegation):
    """The smallest config multi-agent parsing accepts, with ``delegation`` as the delegation section."""
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": "models/base"}, "rollout": {"n": 2, "response_length": 32}},
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 2, "v1": {"trainer_mode": "multi_agent"}},
            "multi_agent": {
                "enable": True,
                "main": "main",
                "delegation": delegation,
                "agents": {"main": {}, "sub": {}},
            },
        }
    )


def test_defaults_and_keys():
    assert {"sub_max_turns", "sub_prompt"} <= set(DELEGATION_KEYS)
    parsed = build_plan(config()).multi_agent.delegation
    assert (parsed.sub_max_turns, parsed.sub_prompt) == (2, None)
    assert parsed == DelegationConfig(sub_agent="sub")


def test_values_are_kept():
    parsed = build_plan(config(sub_max_turns=5, sub_prompt="mgrpo_verl.envs.relay:tool_sub_messages")).multi_agent.delegation
    assert parsed.sub_max_turns == 5 and parsed.sub_prompt == "mgrpo_verl.envs.relay:tool_sub_messages"
    assert build_plan(config(sub_max_turns=None, sub_prompt=None)).multi_agent.delegation.sub_max_turns == 2  # null: default


@pytest.mark.parametrize(
    "delegation, field",
    [
        ({"sub_max_turns": 0}, "sub_max_turns"),
        ({"sub_max_turns": -2}, "sub_max_turns"),
        ({"sub_max_turns": 1.5}, "sub_max_turns"),
        ({"sub_max_turns": True}, "sub_max_turns"),
        ({"sub_prompt": "no_colon"}, "sub_prompt"),
        ({"sub_prompt": 3}, "sub_prompt"),
        ({"sub_max_turn": 2}, "sub_max_turn"),  # a typo is an unknown key
    ],
)
def test_bad_values(delegation, field):
    with pytest.raises(ValueError, match=f"multi_agent.delegation.{field}"):
        build_plan(config(**delegation))


@pytest.mark.parametrize("where", ["top", "sub"])
def test_batch_must_split_into_whole_mini_batches_for_every_model(where):
    # B = 4 prompts; a mini-batch of 3 prompts would leave a partial mini-batch (and padding rows)
    cfg = config()
    cfg.data = {"train_batch_size": 4}
    if where == "top":
        cfg.actor_rollout_ref.actor = {"ppo_mini_batch_size": 3}
    else:
        cfg.actor_rollout_ref.actor = {"ppo_mini_batch_size": 2}
        cfg.multi_agent.agents.sub = {"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 3}}}
    agent = "main" if where == "top" else "sub"
    with pytest.raises(ValueError, match=f"not a multiple of .*ppo_mini_batch_size 3 of agent '{agent}'"):
        build_plan(cfg)
    cfg.data.train_batch_size = 6 if where == "top" else 12
    build_plan(cfg)  # 6 = 2 x 3, 12 = 4 x 3 (and 6 x 2)
