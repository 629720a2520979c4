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


def test_research_presets_set_the_research_task():
    """research=cpu (mgrpo_verl/config/research/cpu.yaml): the research task, its scorer and sub-agent prompt, the main agent's reason
    tool at the top level and the sub-agent's search / visit tools in its own section (checked by loading
    them as the tool-delegation loop would, through verl's tool registry)."""
    from verl.tools.tool_registry import load_all_tools

    from mgrpo_verl.rollout.delegation import DelegationSettings
    from mgrpo_verl.envs.research import prompts, rewards

    assert "research" not in _compose("mgrpo_trainer").mgrpo_verl.task  # no preset by default
    cfg = _compose("mgrpo_trainer", "research=cpu")
    assert cfg.mgrpo_verl.task == "research" and cfg.trainer.v1.trainer_mode == "mgrpo"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_relay"
    settings = DelegationSettings.from_config(cfg)
    assert settings.scorer is rewards.scorer and settings.sub_prompt is prompts.sub_messages_with_evidence
    assert (settings.min_calls, settings.max_calls) == (1, 2)
    main_tools = load_all_tools(tool_config_path=cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path, function_tool_path=None)
    sub_path = cfg.multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path
    assert sorted(t.name for t in main_tools) == ["reason"]
    assert sorted(t.name for t in load_all_tools(tool_config_path=sub_path, function_tool_path=None)) == ["search", "visit"]
    # every prompt fits: the sub-agent's prompt with three search hits is the longest (about 600 tokens)
    assert cfg.data.max_prompt_length >= 768
    # research=gpu: delegation and tools by tool call, K = 8, each agent on its own GPUs, vLLM
    gpu = _compose("mgrpo_trainer", "research=gpu")
    assert gpu.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_delegate"
    assert gpu.actor_rollout_ref.rollout.n == 8 and gpu.actor_rollout_ref.rollout.name == "vllm"
    parsed = parse_multi_agent(gpu)
    assert {a.name: a.n_gpus_per_node for a in parsed.agents} == {"main": 4, "sub": 4}
    assert DelegationSettings.from_config(gpu).sub_prompt is prompts.sub_messages
