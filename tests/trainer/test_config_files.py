"""The shipped Hydra configs compose, and their resolvers give what the docs say."""

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import mgrpo_verl.config
from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.config.schema import AgentConfig, MultiAgentConfig, load_multi_agent
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.config.rules import multi_agent_enabled

register_resolvers()


def _compose(name: str, *overrides: str):
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        return compose(name, overrides=list(overrides))


def test_default_task_is_relay_tools():
    """The default choice of the ``task`` group of mgrpo_trainer.yaml: delegation by tool call from the warm
    start. Every test and recipe that relies on the forced relay names ``task=relay``."""
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        cfg = compose("mgrpo_trainer", return_hydra_config=True)
    assert cfg.hydra.runtime.choices.task == "relay_tools" and cfg.mgrpo_verl.task == "relay_tools"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_delegate"


def test_relay_config_is_multi_agent_relay():
    cfg = _compose("mgrpo_trainer", "task=relay")
    assert cfg.trainer.v1.trainer_mode == "multi_agent" and multi_agent_enabled(cfg)
    parsed = build_plan(cfg).multi_agent
    assert list(parsed.agents) == ["main", "sub"] and parsed.delegation.sub_agent == "sub"
    assert cfg.mgrpo_verl.task == "relay"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_relay"


def test_single_agent_config_is_verl_grpo():
    cfg = _compose("single_agent")
    assert cfg.trainer.v1.trainer_mode == "sync" and not multi_agent_enabled(cfg)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.mgrpo_verl.task == "echo"


def test_tool_config_resolver_finds_the_shipped_sub_agent_tools():
    cfg = _compose(
        "mgrpo_trainer", "task=relay",
        "multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path=${mgrpo_config_file:tools/relay_sub_tools.yaml}",
    )
    path = cfg.multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path
    assert path.endswith("mgrpo_verl/config/tools/relay_sub_tools.yaml")
    assert "read_secret" in open(path).read()
    with pytest.raises(Exception, match="no file"):
        _ = OmegaConf.create({"p": "${mgrpo_config_file:tools/nope.yaml}"}).p


def test_research_presets_set_the_research_task():
    """research=cpu (mgrpo_verl/config/research/cpu.yaml): the research task, its scorer and sub-agent prompt, the main agent's reason
    tool at the top level and the sub-agent's search / visit tools in its own section (checked by loading
    them as the tool-delegation loop would, through verl's tool registry)."""
    from verl.tools.tool_registry import load_all_tools

    from mgrpo_verl.agent_loops.common import DelegationSettings
    from mgrpo_verl.envs.research import prompts, rewards

    assert "research" not in _compose("mgrpo_trainer", "task=relay").mgrpo_verl.task  # no preset by default
    cfg = _compose("mgrpo_trainer", "task=relay", "research=cpu")
    assert cfg.mgrpo_verl.task == "research" and cfg.trainer.v1.trainer_mode == "multi_agent"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_relay"
    settings = DelegationSettings.from_config(cfg)
    assert settings.scorer is rewards.scorer and settings.sub_prompt is prompts.sub_messages_with_evidence
    assert (settings.delegation.min_calls, settings.delegation.max_calls) == (1, 2)
    main_tools = load_all_tools(tool_config_path=cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path, function_tool_path=None)
    sub_path = cfg.multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path
    assert sorted(t.name for t in main_tools) == ["reason"]
    assert sorted(t.name for t in load_all_tools(tool_config_path=sub_path, function_tool_path=None)) == ["search", "visit"]
    # every prompt fits: the sub-agent's prompt with three search hits is the longest (about 600 tokens)
    assert cfg.data.max_prompt_length >= 768
    # research=gpu: delegation and tools by tool call, K = 8, each agent on its own GPUs, vLLM
    gpu = _compose("mgrpo_trainer", "task=relay", "research=gpu")
    assert gpu.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_delegate"
    assert gpu.actor_rollout_ref.rollout.n == 8 and gpu.actor_rollout_ref.rollout.name == "vllm"
    parsed = build_plan(gpu).multi_agent
    assert {a.name: a.n_gpus_per_node for a in parsed.agents.values()} == {"main": 4, "sub": 4}
    assert DelegationSettings.from_config(gpu).sub_prompt is prompts.sub_messages


# ----------------------------------------------------------------------------------------------------
# the multi_agent schema: one dataclass, the YAML restates its defaults once (mgrpo_base.yaml)

CONFIG_DIR = Path(mgrpo_verl.config.__file__).parent


def _defaults(cls) -> dict:
    """A dataclass's defaults as plain data, nested sections included (BaseConfig's ``_target_`` and the
    agents' ``name``, set from their key, left out)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in ("_target_", "name"):
            continue
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = _defaults(type(value)) if dataclasses.is_dataclass(value) else value
    return out


def test_the_yaml_defaults_are_the_dataclass_defaults():
    """mgrpo_base.yaml lists every key of multi_agent (so the command line can override any) with exactly the
    defaults of MultiAgentConfig; a default changed in one place only fails here."""
    section = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "mgrpo_base.yaml").multi_agent)
    assert section.pop("_target_") == "mgrpo_verl.config.schema.MultiAgentConfig"
    assert section == _defaults(MultiAgentConfig)
    # and the loader agrees: the section as written builds the default object
    assert load_multi_agent({"multi_agent": section}) == MultiAgentConfig()


def test_agent_entries_restate_the_agent_defaults():
    """Agent entries in the shipped YAMLs list AgentConfig's keys (for command-line overrides); apart from
    the model overrides they set, their values are the defaults."""
    defaults = _defaults(AgentConfig)
    deliberate = {("preset/one_gpu.yaml", "n_gpus_per_node"), ("research/gpu.yaml", "n_gpus_per_node"),
                  ("coop_task/code.yaml", "n_gpus_per_node"), ("coop_task/writing.yaml", "n_gpus_per_node")}
    for path in sorted(CONFIG_DIR.rglob("*.yaml")):
        section = OmegaConf.to_container(OmegaConf.load(path)).get("multi_agent") or {}
        for name, entry in (section.get("agents") or {}).items():
            rel = str(path.relative_to(CONFIG_DIR))
            assert set(entry) <= set(defaults), f"{rel}: agents.{name} has keys {set(entry) - set(defaults)}"
            for key, value in entry.items():
                if key != "actor_rollout_ref" and (rel, key) not in deliberate:
                    assert value == defaults[key], f"{rel}: agents.{name}.{key} is {value!r}, the default is {defaults[key]!r}"


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("mgrpo_trainer", ("task=relay",)),
        ("mgrpo_trainer", ("task=relay", "research=cpu")),
        ("mgrpo_trainer", ("task=relay", "research=gpu")),
        ("mgrpo_trainer", ("task=relay", "+preset=one_gpu")),
        ("magrpo_trainer", ()),
        ("magrpo_trainer", ("coop_task=code",)),
        ("magrpo_trainer", ("+preset=magrpo_gpu",)),
        ("single_agent", ()),
    ],
)
def test_every_shipped_config_loads_through_the_schema(name, overrides):
    """Each shipped config and preset composes and its multi_agent section builds the typed object (types
    checked, unknown keys refused, the rules within the section applied)."""
    cfg = _compose(name, *overrides)
    ma = load_multi_agent(cfg)
    assert ma.enable is (name != "single_agent")
    if ma.enable:
        assert ma.agents and next(iter(ma.agents)) == ma.main
