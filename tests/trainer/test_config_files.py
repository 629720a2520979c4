"""The shipped Hydra configs compose, and their resolvers give what the docs say."""

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from mgrpo_verl.config.resolvers import register_resolvers
from mgrpo_verl.trainer.multi_agent_config import multi_agent_enabled, parse_multi_agent

register_resolvers()


def _compose(name: str, *overrides: str):
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        return compose(name, overrides=list(overrides))


def test_default_config_is_multi_agent_relay():
    cfg = _compose("mgrpo_trainer")
    assert cfg.trainer.v1.trainer_mode == "mgrpo" and multi_agent_enabled(cfg)
    parsed = parse_multi_agent(cfg)
    assert [a.name for a in parsed.agents] == ["main", "sub"] and parsed.delegation.sub_agent == "sub"
    assert cfg.mgrpo_verl.task == "relay"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_relay"


def test_single_agent_config_is_verl_grpo():
    cfg = _compose("single_agent")
    assert cfg.trainer.v1.trainer_mode == "sync" and not multi_agent_enabled(cfg)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.mgrpo_verl.task == "echo"


def test_tool_config_resolver_finds_the_shipped_sub_agent_tools():
    cfg = _compose(
        "mgrpo_trainer",
        "multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path=${mgrpo_config_file:tools/relay_sub_tools.yaml}",
    )
    path = cfg.multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path
    assert path.endswith("mgrpo_verl/config/tools/relay_sub_tools.yaml")
    assert "read_secret" in open(path).read()
    with pytest.raises(Exception, match="no file"):
        OmegaConf.create({"p": "${mgrpo_config_file:tools/nope.yaml}"}).p
