"""Parsing and validation of the ``multi_agent:`` config section, and the per-agent full configs."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ReadonlyConfigError

from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.config.schema import AgentConfig, DecoupledConfig, DelegationConfig, MultiAgentConfig, load_multi_agent
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.config.rules import agent_full_config, check_multi_agent, multi_agent_enabled

_DELETE = object()


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def base_config(**overrides) -> DictConfig:
    """A small config with only the keys multi-agent parsing reads; ``overrides`` are top-level
    sections deep-merged onto it (a dict value merges, anything else replaces)."""
    config = {
        "actor_rollout_ref": {
            "model": {"path": "models/base", "tokenizer_path": "${actor_rollout_ref.model.path}", "lora_rank": 0},
            "actor": {"optim": {"lr": 1e-6}},
            "rollout": {
                "n": 4,
                "response_length": 32,
                "n_gpus_per_node": "${oc.select:trainer.n_gpus_per_node,8}",
            },
        },
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False, "rollout_correction": None},
        "reward": {"reward_model": {"enable": False}},
        "trainer": {"nnodes": 1, "n_gpus_per_node": 2, "v1": {"trainer_mode": "multi_agent"}},
        "multi_agent": {
            "enable": True,
            "main": "main",
            "agents": {"main": {"n_gpus_per_node": 1}, "sub": {"n_gpus_per_node": 1}},
        },
    }
    return OmegaConf.create(_merge(config, overrides))


def with_updates(config: DictConfig, updates: dict) -> DictConfig:
    """A copy of ``config`` with dotted ``key: value`` updates (``_DELETE`` removes the key)."""
    config = copy.deepcopy(config)
    for key, value in updates.items():
        if value is _DELETE:
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(config, parent) if parent else config
            del node[leaf]
        else:
            OmegaConf.update(config, key, value, merge=False)
    return config


# ----------------------------------------------------------------------------------------------------
# parsing


def test_defaults():
    parsed = build_plan(base_config()).multi_agent
    assert isinstance(parsed, MultiAgentConfig)
    assert parsed.main == "main"
    assert parsed.algorithm == "mgrpo"
    assert parsed.mgrpo == MGRPOConfig()
    assert parsed.d_max == "auto"
    assert parsed.delegation == DelegationConfig(
        sub_agent="sub", min_calls=0, max_calls=3, plan_tokens=8, answer_tokens=8, sub_response_tokens=8, timeout_s=120.0
    )
    assert isinstance(parsed.delegation.timeout_s, float)
    assert parsed.agents == {
        "main": AgentConfig(name="main", trainable=True, n_gpus_per_node=1),
        "sub": AgentConfig(name="sub", trainable=True, n_gpus_per_node=1),
    }
    assert parsed.sub_agents == ("sub",)
    assert [a.name for a in parsed.model_owners] == ["main", "sub"]
    assert [a.name for a in parsed.trainable_owners] == ["main", "sub"]
    assert parsed.owner_of("sub") == "sub"


def test_main_first_even_when_listed_later_and_sub_agent_is_first_non_main():
    config = base_config(multi_agent={"main": "planner"}, trainer={"n_gpus_per_node": 3})
    config.multi_agent.agents = {  # replaces base_config's agents
        "coder": {"n_gpus_per_node": 1},
        "planner": {"n_gpus_per_node": 1},
        "searcher": {"n_gpus_per_node": 1},
    }
    parsed = build_plan(config).multi_agent
    assert list(parsed.agents) == ["planner", "coder", "searcher"]
    assert parsed.sub_agents == ("coder", "searcher")
    assert parsed.delegation.sub_agent == "coder"


def test_explicit_settings():
    config = base_config(
        multi_agent={
            "algorithm": "grpo",
            "d_max": 3,
            "mgrpo": {"sub_reward_local_weight": 0.25, "norm_scope": "agent"},
            "delegation": {"sub_agent": "sub", "min_calls": 1, "max_calls": 1, "timeout_s": 5},
            "agents": {"sub": {"trainable": False, "actor_rollout_ref": {"model": {"path": "models/sub"}}}},
        }
    )
    parsed = build_plan(config).multi_agent
    assert parsed.algorithm == "grpo"
    assert parsed.d_max == 3
    assert parsed.mgrpo == MGRPOConfig(sub_reward_local_weight=0.25, norm_scope="agent")
    assert (parsed.delegation.min_calls, parsed.delegation.max_calls, parsed.delegation.timeout_s) == (1, 1, 5.0)
    sub = parsed.agent("sub")
    assert sub.trainable is False and sub.actor_rollout_ref == {"model": {"path": "models/sub"}}
    assert [a.name for a in parsed.trainable_owners] == ["main"]


def test_agent_lookup_error_names_known_agents():
    parsed = build_plan(base_config()).multi_agent
    with pytest.raises(ValueError, match=r"unknown agent 'nope'.*\['main', 'sub'\]"):
        parsed.agent("nope")
    with pytest.raises(ValueError, match="nope"):
        parsed.owner_of("nope")


def test_replica_offsets():
    parsed = build_plan(base_config()).multi_agent
    assert parsed.replica_offsets({"main": 1, "sub": 2}) == {"main": 0, "sub": 1}
    assert parsed.replica_offsets({"sub": 2, "main": 3}) == {"main": 0, "sub": 3}

    three = build_plan(
        base_config(
            trainer={"n_gpus_per_node": 4},
            multi_agent={"agents": {"a": {"n_gpus_per_node": 2}, "b": {"share_model_with": "main"}}},
        )
    ).multi_agent
    # owners: main, sub, a (b shares main's model)
    assert three.replica_offsets({"main": 2, "sub": 1, "a": 4}) == {"main": 0, "sub": 2, "a": 3}
    with pytest.raises(ValueError, match="'a'"):
        three.replica_offsets({"main": 2, "sub": 1})
    with pytest.raises(ValueError, match="not model owners"):
        three.replica_offsets({"main": 2, "sub": 1, "a": 1, "b": 1})
    with pytest.raises(ValueError, match="int >= 0"):
        three.replica_offsets({"main": 2, "sub": -1, "a": 1})


def test_shared_model():
    config = base_config(
        multi_agent={"agents": {"sub": {"share_model_with": "main", "n_gpus_per_node": 5}}},
        trainer={"n_gpus_per_node": 1},
    )
    parsed = build_plan(config).multi_agent
    sub = parsed.agent("sub")
    assert sub.share_model_with == "main" and not sub.owns_model
    assert sub.n_gpus_per_node == 0  # ignored: no workers of its own
    assert parsed.owner_of("sub") == "main"
    assert parsed.owner_of("main") == "main"
    assert [a.name for a in parsed.model_owners] == ["main"]
    assert parsed.sub_agents == ("sub",)
    assert parsed.delegation.sub_agent == "sub"
    assert parsed.replica_offsets({"main": 1}) == {"main": 0}
    with pytest.raises(ValueError, match="shares the model of 'main'"):
        agent_full_config(config, sub)


def test_multi_agent_enabled():
    assert multi_agent_enabled(base_config()) is True
    assert multi_agent_enabled(base_config(multi_agent={"enable": False})) is False
    assert multi_agent_enabled(OmegaConf.create({"trainer": {}})) is False
    assert multi_agent_enabled(OmegaConf.create({"multi_agent": None})) is False
    assert multi_agent_enabled(OmegaConf.create({"multi_agent": {"agents": {}}})) is False
    with pytest.raises(ValueError, match="multi_agent.enable"):
        multi_agent_enabled(OmegaConf.create({"multi_agent": {"enable": "yes"}}))


def test_section_values_may_be_interpolations():
    config = base_config(
        my={"d": 2, "gpus": 1},
        multi_agent={"d_max": "${my.d}", "agents": {"sub": {"n_gpus_per_node": "${my.gpus}"}}},
    )
    parsed = build_plan(config).multi_agent
    assert parsed.d_max == 2
    assert parsed.agent("sub").n_gpus_per_node == 1


# ----------------------------------------------------------------------------------------------------
# agent_full_config


def _override_config() -> DictConfig:
    return base_config(
        multi_agent={
            "agents": {
                "sub": {
                    "actor_rollout_ref": {
                        "model": {"path": "models/sub"},
                        "rollout": {"response_length": 7},
                        "actor": {"optim": {"lr": 3e-5}},
                    }
                }
            }
        },
        trainer={"n_gpus_per_node": 3},
    )


def test_agent_full_config_merges_overrides():
    config = _override_config()
    config.multi_agent.agents.sub.n_gpus_per_node = 2
    config.actor_rollout_ref.rollout.custom = {"other": 1}
    before = OmegaConf.to_container(config)
    parsed = build_plan(config).multi_agent

    sub = agent_full_config(config, parsed.agent("sub"))
    assert sub.actor_rollout_ref.model.path == "models/sub"
    assert sub.actor_rollout_ref.model.tokenizer_path == "models/sub"  # interpolation resolved in the agent's config
    assert sub.actor_rollout_ref.rollout.response_length == 7
    assert sub.actor_rollout_ref.actor.optim.lr == 3e-5
    assert sub.actor_rollout_ref.rollout.n == 4
    assert sub.trainer.n_gpus_per_node == 2
    assert sub.actor_rollout_ref.rollout.n_gpus_per_node == 2
    assert sub.trainer.nnodes == 1
    assert OmegaConf.to_container(sub.actor_rollout_ref.rollout.custom) == {"other": 1, "mgrpo_agent": "sub"}
    assert sub.multi_agent.enable is True  # everything else is kept

    main = agent_full_config(config, parsed.agent("main"))
    assert main.actor_rollout_ref.model.path == "models/base"
    assert main.actor_rollout_ref.model.tokenizer_path == "models/base"
    assert main.actor_rollout_ref.rollout.response_length == 32
    assert main.trainer.n_gpus_per_node == 1
    assert main.actor_rollout_ref.rollout.n_gpus_per_node == 1
    assert main.actor_rollout_ref.rollout.custom == {"other": 1, "mgrpo_agent": "main"}

    # the input is unchanged, and the results do not share nodes with it or with each other
    assert OmegaConf.to_container(config) == before
    sub.actor_rollout_ref.model.path = "changed"
    assert config.actor_rollout_ref.model.path == "models/base"
    assert main.actor_rollout_ref.model.path == "models/base"


def test_agent_full_config_creates_custom_when_absent():
    config = base_config()
    full = agent_full_config(config, build_plan(config).multi_agent.agent("main"))
    assert full.actor_rollout_ref.rollout.custom == {"mgrpo_agent": "main"}
    assert "custom" not in config.actor_rollout_ref.rollout


def test_agent_full_config_on_struct_readonly_input():
    config = _override_config()
    before = OmegaConf.to_container(config)
    OmegaConf.set_struct(config, True)
    OmegaConf.set_readonly(config, True)
    parsed = build_plan(config).multi_agent
    sub = agent_full_config(config, parsed.agent("sub"))
    assert sub.actor_rollout_ref.model.path == "models/sub"
    assert sub.actor_rollout_ref.rollout.custom == {"mgrpo_agent": "sub"}
    assert sub.trainer.n_gpus_per_node == 1
    sub.trainer.new_key = 1  # the result is an ordinary, writable config
    with pytest.raises(ReadonlyConfigError):
        config.trainer.n_gpus_per_node = 5
    assert OmegaConf.to_container(config) == before
    assert OmegaConf.is_readonly(config) and OmegaConf.is_struct(config)


# ----------------------------------------------------------------------------------------------------
# validation errors: each case is (dotted updates on base_config(), text the message must contain)

_A = "multi_agent.agents"
_D = "multi_agent.delegation"

INVALID = {
    "disabled": ({"multi_agent.enable": False}, "multi_agent.enable is false"),
    "section_missing": ({"multi_agent": _DELETE}, "multi_agent.enable is false"),
    "unknown_key": ({"multi_agent.agnets": {}}, "multi_agent.agnets"),
    "unknown_delegation_key": ({f"{_D}.max_call": 2}, f"{_D}.max_call"),
    "unknown_agent_key": ({f"{_A}.sub.gpus": 1}, f"{_A}.sub.gpus"),
    "agents_empty": ({"multi_agent.agents": {}}, "multi_agent.agents is empty"),
    "agents_missing": ({"multi_agent.agents": _DELETE}, "multi_agent.agents is empty"),
    "main_not_agent": ({"multi_agent.main": "boss"}, "multi_agent.main"),
    "main_not_string": ({"multi_agent.main": 3}, "multi_agent.main"),
    "bad_agent_name": ({f"{_A}.bad name": {"n_gpus_per_node": 0}}, "'bad name'"),
    "agent_entry_not_mapping": ({f"{_A}.sub": 3}, f"{_A}.sub"),
    "algorithm": ({"multi_agent.algorithm": "ppo"}, "multi_agent.algorithm"),
    "d_max_zero": ({"multi_agent.d_max": 0}, "multi_agent.d_max"),
    "d_max_string": ({"multi_agent.d_max": "max"}, "multi_agent.d_max"),
    "d_max_bool": ({"multi_agent.d_max": True}, "multi_agent.d_max"),
    "d_max_float": ({"multi_agent.d_max": 2.5}, "multi_agent.d_max"),
    "mgrpo_unknown": ({"multi_agent.mgrpo": {"weight": 1}}, "multi_agent.mgrpo"),
    "mgrpo_invalid": ({"multi_agent.mgrpo": {"norm_scope": "batch"}}, "multi_agent.mgrpo"),
    "min_calls_negative": ({f"{_D}.min_calls": -1}, f"{_D}.min_calls"),
    "min_calls_float": ({f"{_D}.min_calls": 0.5}, f"{_D}.min_calls"),
    "min_gt_max": ({f"{_D}.min_calls": 3, f"{_D}.max_calls": 2}, f"{_D}.min_calls"),
    "max_calls_zero": ({f"{_D}.max_calls": 0}, f"{_D}.max_calls"),
    "plan_tokens": ({f"{_D}.plan_tokens": 0}, f"{_D}.plan_tokens"),
    "answer_tokens": ({f"{_D}.answer_tokens": 0}, f"{_D}.answer_tokens"),
    "sub_response_tokens": ({f"{_D}.sub_response_tokens": -4}, f"{_D}.sub_response_tokens"),
    "timeout_zero": ({f"{_D}.timeout_s": 0}, f"{_D}.timeout_s"),
    "timeout_string": ({f"{_D}.timeout_s": "1m"}, f"{_D}.timeout_s"),
    "coop_timeout_zero": ({"multi_agent.cooperation.timeout_s": 0}, "multi_agent.cooperation.timeout_s"),
    "coop_timeout_inf": ({"multi_agent.cooperation.timeout_s": float("inf")}, "multi_agent.cooperation.timeout_s"),
    "sub_agent_is_main": ({f"{_D}.sub_agent": "main"}, f"{_D}.sub_agent"),
    "sub_agent_unknown": ({f"{_D}.sub_agent": "helper"}, f"{_D}.sub_agent"),
    "no_sub_agent": ({f"{_A}.sub": _DELETE}, f"{_D}.sub_agent"),
    "share_unknown": ({f"{_A}.sub.share_model_with": "ghost"}, f"{_A}.sub.share_model_with"),
    "share_self": ({f"{_A}.sub.share_model_with": "sub"}, f"{_A}.sub.share_model_with"),
    "main_shares": ({f"{_A}.main.share_model_with": "sub"}, f"{_A}.main.share_model_with"),
    "share_chain": (
        {f"{_A}.sub.share_model_with": "main", f"{_A}.third": {"share_model_with": "sub"}},
        f"{_A}.third.share_model_with",
    ),
    "share_trainable_differs": (
        {f"{_A}.sub.share_model_with": "main", f"{_A}.sub.trainable": False},
        f"{_A}.sub.trainable",
    ),
    # OmegaConf's bool: "yes"/"no"/"on"/"off"/"true"/"false" are bools, anything else is refused
    "trainable_not_bool": ({f"{_A}.sub.trainable": "perhaps"}, f"{_A}.sub.trainable"),
    "overrides_not_mapping": ({f"{_A}.sub.actor_rollout_ref": "models/sub"}, f"{_A}.sub.actor_rollout_ref"),
    "gpus_zero": ({f"{_A}.sub.n_gpus_per_node": 0}, f"{_A}.sub.n_gpus_per_node"),
    "gpus_float": ({f"{_A}.sub.n_gpus_per_node": 1.5}, f"{_A}.sub.n_gpus_per_node"),
    "gpus_over_total": ({f"{_A}.sub.n_gpus_per_node": 2}, "need 3 GPUs in all (main=1, sub=2) but trainer.n_gpus_per_node is 2"),
    "trainer_gpus_missing": ({"trainer.n_gpus_per_node": _DELETE}, "trainer.n_gpus_per_node"),
    "nnodes": ({"trainer.nnodes": 2}, "trainer.nnodes"),
    "nothing_trainable": (
        {f"{_A}.main.trainable": False, f"{_A}.sub.trainable": False},
        f"{_A}.*.trainable",
    ),
    "nothing_trainable_shared": (
        {f"{_A}.main.trainable": False, f"{_A}.sub.trainable": False, f"{_A}.sub.share_model_with": "main"},
        f"{_A}.*.trainable",
    ),
    "trainer_mode": ({"trainer.v1.trainer_mode": "sync"}, "trainer.v1.trainer_mode"),
    "trainer_mode_missing": ({"trainer.v1": _DELETE}, "trainer.v1.trainer_mode"),
    "critic": ({"critic": {"enable": True}}, "critic.enable"),
    "gae": ({"algorithm.adv_estimator": "gae"}, "algorithm.adv_estimator"),
    "kl_in_reward": ({"algorithm.use_kl_in_reward": True}, "algorithm.use_kl_in_reward"),
    "rollout_correction_is": (
        {"algorithm.rollout_correction": {"rollout_is": "token", "rollout_rs": None, "bypass_mode": False}},
        "algorithm.rollout_correction",
    ),
    "rollout_correction_rs": ({"algorithm.rollout_correction": {"rollout_rs": "seq_mean_k1"}}, "algorithm.rollout_correction"),
    "rollout_correction_bypass": ({"algorithm.rollout_correction": {"bypass_mode": True}}, "algorithm.rollout_correction"),
    "reward_model": ({"reward.reward_model.enable": True}, "reward.reward_model.enable"),
    "legacy_reward_model": ({"reward_model": {"enable": True}}, "reward_model.enable"),
    # Megatron's LoRA key; verl's FSDP lora_rank is accepted (tests/trainer/test_lora_config.py)
    "lora_dict_rank": ({"actor_rollout_ref.model.lora": {"rank": 16}}, "actor_rollout_ref.model.lora.rank"),
    "agent_lora_dict_rank": (
        {f"{_A}.sub.actor_rollout_ref": {"model": {"lora": {"rank": 4}}}},
        f"{_A}.sub.actor_rollout_ref.model.lora.rank",
    ),
    "distillation": ({"distillation": {"enabled": True}}, "distillation.enabled"),
    "agent_rollout_n": ({f"{_A}.sub.actor_rollout_ref": {"rollout": {"n": 8}}}, f"{_A}.sub.actor_rollout_ref.rollout.n"),
    "node_resource_empty": ({f"{_A}.sub.node_resource": ""}, f"{_A}.sub.node_resource"),
    "node_resource_sharing_agent": (
        {f"{_A}.sub.node_resource": "node_b", f"{_A}.sub.share_model_with": "main", "trainer.n_gpus_per_node": 1},
        "plays 'main'",
    ),
    "node_resource_shared_placement": (
        {f"{_A}.sub.node_resource": "node_b", "multi_agent.placement": "shared", f"{_A}.main.n_gpus_per_node": None,
         f"{_A}.sub.n_gpus_per_node": None},
        "placement is 'shared'",
    ),
}


@pytest.mark.parametrize("updates,expected", list(INVALID.values()), ids=list(INVALID))
def test_invalid_config(updates, expected):
    config = with_updates(base_config(), updates)
    with pytest.raises(ValueError) as info:
        check_multi_agent(config)
    assert expected in str(info.value)


def test_a_config_without_multi_agent_plans_one_model():
    for updates in ({"multi_agent.enable": False}, {"multi_agent": _DELETE}):
        plan = build_plan(with_updates(base_config(), updates))
        assert plan.multi_agent is None and plan.agent_configs == {} and plan.local_configs == {}


def test_error_messages_show_the_value():
    config = with_updates(base_config(), {f"{_A}.sub.n_gpus_per_node": -3})
    with pytest.raises(ValueError, match=r"multi_agent\.agents\.sub\.n_gpus_per_node.*-3"):
        build_plan(config)
    config = with_updates(base_config(), {"multi_agent.foo": 1, "multi_agent.bar": 2})
    with pytest.raises(ValueError, match=r"multi_agent\.foo: unknown key; the keys of multi_agent are \[.*'agents'"):
        build_plan(config)


def test_accepted_edge_cases():
    # equal n in an override, lora_rank 0, inert rollout_correction, adv_estimator mgrpo, null entries
    config = with_updates(
        base_config(),
        {
            f"{_A}.sub.actor_rollout_ref": {"rollout": {"n": 4}, "model": {"lora_rank": 0}},
            "algorithm.adv_estimator": "mgrpo",
            "algorithm.rollout_correction": {"rollout_is": None, "rollout_rs": None, "bypass_mode": False},
            "critic": {"enable": False},
            "distillation": {"enabled": False},
            f"{_A}.main": None,
            "multi_agent.delegation": None,
            "multi_agent.mgrpo": None,
            "trainer.n_gpus_per_node": 5,
        },
    )
    parsed = build_plan(config).multi_agent
    assert parsed.agent("main") == AgentConfig(name="main", n_gpus_per_node=1)
    assert parsed.delegation.sub_agent == "sub"


# ----------------------------------------------------------------------------------------------------
# verl's real config


def _verl_config() -> DictConfig:
    # located without importing verl (which would start loading Ray and friends)
    verl_dir = Path(importlib.util.find_spec("verl").origin).parent
    path = verl_dir / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    config = OmegaConf.load(path)
    config.algorithm.adv_estimator = "grpo"  # verl's default (gae) needs a critic
    config.trainer.v1.trainer_mode = "multi_agent"
    config.trainer.n_gpus_per_node = 2
    config.multi_agent = {
        "enable": True,
        "main": "main",
        "algorithm": "mgrpo",
        "mgrpo": {"sub_reward_local_weight": 0.5, "sub_reward_main_weight": 0.5, "norm_adv_by_std": True,
                  "epsilon": 1.0e-6, "norm_scope": "group"},
        "d_max": "auto",
        "delegation": {"sub_agent": None, "min_calls": 0, "max_calls": 3, "plan_tokens": 8, "answer_tokens": 8,
                       "sub_response_tokens": 16, "timeout_s": 120},
        "agents": {
            "main": {"trainable": True, "n_gpus_per_node": 1, "share_model_with": None, "actor_rollout_ref": {}},
            "sub": {"trainable": True, "n_gpus_per_node": 1, "share_model_with": None,
                    "actor_rollout_ref": {"model": {"path": "models/sub"}, "rollout": {"response_length": 64}}},
        },
    }
    return config


def test_verl_generated_config():
    config = _verl_config()
    OmegaConf.set_struct(config, True)
    OmegaConf.set_readonly(config, True)
    parsed = build_plan(config).multi_agent
    assert list(parsed.agents) == ["main", "sub"]
    assert parsed.delegation.sub_agent == "sub"

    sub = agent_full_config(config, parsed.agent("sub"))
    assert sub.actor_rollout_ref.model.path == "models/sub"
    assert sub.actor_rollout_ref.rollout.response_length == 64
    assert sub.actor_rollout_ref.rollout.n_gpus_per_node == 1
    assert sub.trainer.n_gpus_per_node == 1
    assert sub.actor_rollout_ref.rollout.custom == {"mgrpo_agent": "sub"}
    assert OmegaConf.is_missing(sub.actor_rollout_ref.rollout, "name")  # `???` stays mandatory
    assert config.actor_rollout_ref.model.path == "~/models/deepseek-llm-7b-chat"
    assert config.trainer.n_gpus_per_node == 2


def test_verl_generated_config_default_is_rejected_for_gae():
    config = _verl_config()
    config.algorithm.adv_estimator = "gae"
    with pytest.raises(ValueError, match="algorithm.adv_estimator"):
        build_plan(config)


def test_sharing_agent_overrides_are_dropped_with_a_warning(caplog):
    # the single-agent baseline is one switch: share_model_with=main on a config whose sub-agent had
    # its own model settings; they cannot apply to main's model, so they are dropped and logged
    config = with_updates(
        base_config(), {f"{_A}.sub.share_model_with": "main", f"{_A}.sub.actor_rollout_ref": {"model": {"path": "x"}}}
    )
    with caplog.at_level("WARNING"):
        parsed = build_plan(config).multi_agent
    assert parsed.agent("sub").actor_rollout_ref == {}
    assert "multi_agent.agents.sub.actor_rollout_ref is ignored" in caplog.text


# ------------------------------------------------------------------- multi_agent.decoupled (decoupled M-GRPO)

STORE = "sqlite:////tmp/run/stats.db"
SUB_URL = {"sub": "http://127.0.0.1:8470"}


def side(role, trainer=None, **decoupled):
    section = {"role": role, "store": STORE, **decoupled}
    if role == "main":
        section.setdefault("sub_urls", SUB_URL)
    t = {"n_gpus_per_node": 1}
    if role == "sub":
        t.update(val_before_train=False, test_freq=-1)
    return base_config(multi_agent={"decoupled": section}, trainer={**t, **(trainer or {})})


def test_default_is_the_synchronous_mode():
    ma = build_plan(base_config()).multi_agent
    assert ma.decoupled == DecoupledConfig()
    assert [a.name for a in ma.local_owners] == ["main", "sub"]


def test_main_side():
    ma = build_plan(side("main", sub_urls={"sub": "http://10.0.0.2:9000/"})).multi_agent
    assert ma.decoupled.role == "main" and ma.decoupled.store == STORE
    assert ma.decoupled.sub_urls == {"sub": "http://10.0.0.2:9000"}  # trailing slash dropped
    assert [a.name for a in ma.local_owners] == ["main"]  # one GPU is enough: only the main model is here


def test_sub_side_defaults_to_the_delegation_target():
    ma = build_plan(side("sub", serve_port=9001, wait_timeout_s=5, max_policy_lag=1)).multi_agent
    d = ma.decoupled
    assert (d.role, d.train_agent, d.serve_port, d.wait_timeout_s, d.max_policy_lag) == ("sub", "sub", 9001, 5.0, 1)
    assert [a.name for a in ma.local_owners] == ["sub"]


def test_null_urls_are_unset():
    assert build_plan(base_config(multi_agent={"decoupled": {"sub_urls": {"sub": None}}})).multi_agent.decoupled.sub_urls == {}


@pytest.mark.parametrize(
    "config, match",
    [
        (lambda: side("both"), "role must be null, 'main' or 'sub'"),
        (lambda: side("main", store=None), "store must be the store's URL"),
        (lambda: side("main", store="/tmp/x.db"), "store must be the store's URL"),
        (lambda: side("main", sub_urls={}), r"sub_urls has no URL for sub-agent\(s\) \['sub'\]"),
        (lambda: side("main", sub_urls={"sub": "127.0.0.1:8470"}), "must be a base URL"),
        (lambda: side("main", sub_urls={"sub": "http://h:1/path"}), "must be a base URL"),
        (lambda: side("main", sub_urls={"ghost": "http://h:1", **SUB_URL}), "'ghost' is not a sub-agent"),
        (lambda: side("sub", train_agent="main"), "train_agent must name a sub-agent"),
        (lambda: side("sub", train_agent="ghost"), "train_agent must name a sub-agent"),
        (lambda: side("sub", serve_port=0), "serve_port must be a TCP port"),
        (lambda: side("sub", serve_port=70000), "serve_port must be a TCP port"),
        (lambda: side("sub", serve_host=""), "serve_host"),
        (lambda: side("sub", wait_timeout_s=0), "wait_timeout_s must be a finite number > 0"),
        (lambda: side("sub", poll_s=float("inf")), "poll_s must be a finite number > 0"),
        (lambda: side("sub", idle_timeout_s=-1), "idle_timeout_s"),
        (lambda: side("sub", max_policy_lag=-1), "max_policy_lag must be null or an int >= 0"),
        (lambda: side("sub", missing_policy="zero"), "missing_policy must be 'skip' or 'error'"),
        (lambda: side("sub", missing_policy="drop"), "missing_policy must be 'skip' or 'error'"),
        (lambda: side("sub", typo=1), "typo"),
        (lambda: side("sub", trainer={"val_before_train": True}), "set trainer.val_before_train=false trainer.test_freq=-1"),
        (lambda: side("sub", trainer={"test_freq": 5}), "validation is on"),
        (lambda: base_config(multi_agent={"decoupled": {"role": "main", "store": STORE, "sub_urls": SUB_URL},
                                          "algorithm": "grpo"}), "computes M-GRPO advantages only"),
        (lambda: base_config(multi_agent={"decoupled": {"role": "main", "store": STORE},
                                          "agents": {"main": {}, "sub": {"share_model_with": "main"}}}),
         "nothing to decouple"),
        (lambda: base_config(multi_agent={"decoupled": {"role": "sub", "store": STORE}, "agents": {"sub": {"trainable": False}}},
                             trainer={"val_before_train": False, "test_freq": -1}), "trainable: false"),
    ],
)
def test_bad_decoupled_values(config, match):
    with pytest.raises(ValueError, match=match):
        build_plan(config())


# ------------------------------------------------------------------------------------ MAGRPO batch sizes


def _magrpo(turns, **sizes):
    return base_config(
        multi_agent={"algorithm": "magrpo", "magrpo": {"num_generations": 4}, "cooperation": {"num_turns": turns}},
        actor_rollout_ref={"rollout": {"n": 1, **sizes.get("rollout", {})}, "actor": sizes.get("actor", {})},
        data={"train_batch_size": 4},
    )


def test_magrpo_batch_sizes():
    # one turn: 4 tasks x G 4 = 16 rows per model: 8 divides, 6 does not
    assert build_plan(_magrpo(1, actor={"ppo_mini_batch_size": 8})).multi_agent.cooperation.num_turns == 1
    with pytest.raises(ValueError, match="ppo_mini_batch_size is 6 .* multiples of 16"):
        build_plan(_magrpo(1, actor={"ppo_mini_batch_size": 6}))
    # two turns: rows come in multiples of G = 4, so a micro-batch of 8 may not divide them
    with pytest.raises(ValueError, match="log_prob_micro_batch_size_per_gpu is 8 .* multiples of 4 .*num_generations"):
        build_plan(_magrpo(2, rollout={"log_prob_micro_batch_size_per_gpu": 8}))
    with pytest.raises(ValueError, match="rollout.n is 4 but multi_agent.algorithm is magrpo"):
        build_plan(base_config(multi_agent={"algorithm": "magrpo", "magrpo": {"num_generations": 4}}))
    with pytest.raises(ValueError, match="num_generations must be set"):
        build_plan(base_config(multi_agent={"algorithm": "magrpo"}, actor_rollout_ref={"rollout": {"n": 1}}))


# ------------------------------------------------------------------------------------ placement


def _shared(**overrides) -> DictConfig:
    """base_config() with placement shared on one GPU and no GPU shares written."""
    config = base_config(**overrides)
    return with_updates(config, {
        "multi_agent.placement": "shared", "trainer.n_gpus_per_node": 1,
        f"{_A}.main.n_gpus_per_node": _DELETE, f"{_A}.sub.n_gpus_per_node": _DELETE,
    })


def test_placement_defaults_to_separate():
    parsed = build_plan(base_config()).multi_agent
    assert parsed.placement == "separate" and parsed.gpu_memory_gb is None
    # null shares mean one GPU each, as before
    parsed = build_plan(with_updates(base_config(), {f"{_A}.main.n_gpus_per_node": None})).multi_agent
    assert [a.n_gpus_per_node for a in parsed.model_owners] == [1, 1]


def test_shared_placement_puts_every_owner_on_all_gpus():
    parsed = build_plan(_shared()).multi_agent
    assert parsed.placement == "shared"
    assert [a.n_gpus_per_node for a in parsed.model_owners] == [1, 1]  # 2 owners on 1 GPU: allowed
    # every owner spans all GPUs; a written share equal to the total is accepted
    parsed = build_plan(with_updates(_shared(), {"trainer.n_gpus_per_node": 4, f"{_A}.sub.n_gpus_per_node": 4})).multi_agent
    assert [a.n_gpus_per_node for a in parsed.model_owners] == [4, 4]
    sub = agent_full_config(with_updates(_shared(), {"trainer.n_gpus_per_node": 4}), parsed.agent("sub"))
    assert sub.trainer.n_gpus_per_node == 4 and sub.actor_rollout_ref.rollout.n_gpus_per_node == 4
    # replica ranks still count over both agents (one replica each per GPU): 0 and 4
    assert parsed.replica_offsets({"main": 4, "sub": 4}) == {"main": 0, "sub": 4}
    # a sharing agent still has no workers
    single = build_plan(with_updates(_shared(), {f"{_A}.sub.share_model_with": "main"})).multi_agent
    assert [a.n_gpus_per_node for a in single.agents.values()] == [1, 0]


def test_gpu_memory_gb():
    assert build_plan(with_updates(base_config(), {"multi_agent.gpu_memory_gb": 80})).multi_agent.gpu_memory_gb == 80.0
    assert build_plan(with_updates(base_config(), {"multi_agent.gpu_memory_gb": 79.5})).multi_agent.gpu_memory_gb == 79.5


def test_shared_engines_fraction_sum():
    vllm = {"actor_rollout_ref.rollout.name": "vllm"}
    ok = with_updates(_shared(), {**vllm, "actor_rollout_ref.rollout.gpu_memory_utilization": 0.3})
    assert build_plan(ok).multi_agent.placement == "shared"
    # per-agent override: 0.3 + 0.6 < 1
    ok = with_updates(ok, {f"{_A}.sub.actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 0.6}}})
    build_plan(ok)
    too_much = with_updates(ok, {f"{_A}.sub.actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 0.7}}})
    with pytest.raises(ValueError, match=r"reserve 1 of every GPU together .*main=0.3, sub=0.7"):
        build_plan(too_much)
    # the same fractions on GPUs of their own are fine
    separate = with_updates(too_much, {"multi_agent.placement": "separate", "trainer.n_gpus_per_node": 2})
    assert build_plan(separate).multi_agent.placement == "separate"
    # the CPU rollout (hf) reserves nothing
    build_plan(with_updates(_shared(), {"actor_rollout_ref.rollout.name": "hf",
                                               "actor_rollout_ref.rollout.gpu_memory_utilization": 0.9}))


PLACEMENT_INVALID = {
    "unknown_placement": ({"multi_agent.placement": "colocated"}, "multi_agent.placement must be one of ['separate', 'shared'], got 'colocated'"),
    "placement_null_is_default": None,
    "share_with_shared": (
        {"multi_agent.placement": "shared", f"{_A}.main.n_gpus_per_node": _DELETE},
        f"{_A}.sub.n_gpus_per_node is 1 but multi_agent.placement is 'shared': every agent's workers use all "
        f"trainer.n_gpus_per_node=2 GPUs",
    ),
    "gpu_memory_zero": ({"multi_agent.gpu_memory_gb": 0}, "multi_agent.gpu_memory_gb must be null"),
    "gpu_memory_string": ({"multi_agent.gpu_memory_gb": "80GB"}, "got '80GB'"),
    "gpu_memory_bool": ({"multi_agent.gpu_memory_gb": True}, "multi_agent.gpu_memory_gb"),
    "concurrent_updates": ({"multi_agent.concurrent_updates": "yes"}, "multi_agent.concurrent_updates must be 'auto' or false"),
    "engine_fraction_one": (
        {"multi_agent.placement": "shared", "trainer.n_gpus_per_node": 1, f"{_A}.main.n_gpus_per_node": _DELETE,
         f"{_A}.sub.n_gpus_per_node": _DELETE, "actor_rollout_ref.rollout.name": "vllm",
         "actor_rollout_ref.rollout.gpu_memory_utilization": 1.0},
        "gpu_memory_utilization of agent 'main' must be a fraction in (0, 1), got 1.0",
    ),
    "gpus_over_total_hint": ({f"{_A}.sub.n_gpus_per_node": 2}, "multi_agent.placement=shared"),
}
del PLACEMENT_INVALID["placement_null_is_default"]


@pytest.mark.parametrize("updates,expected", list(PLACEMENT_INVALID.values()), ids=list(PLACEMENT_INVALID))
def test_invalid_placement(updates, expected):
    with pytest.raises(ValueError) as info:
        build_plan(with_updates(base_config(), updates))
    assert expected in str(info.value)


def test_placement_null_is_separate():
    assert build_plan(with_updates(base_config(), {"multi_agent.placement": None})).multi_agent.placement == "separate"


def test_node_resource_pins_an_agent():
    parsed = build_plan(with_updates(base_config(), {f"{_A}.sub.node_resource": "node_b"})).multi_agent
    assert parsed.agent("sub").node_resource == "node_b"
    assert parsed.agent("main").node_resource is None


def test_trainer_mode_is_mgrpo_or_the_roles_own():
    """main_ppo sets trainer.v1.trainer_mode from the role before Ray; the trainer parses the config again with
    that mode, so both "multi_agent" and the role's mode pass, and another role's mode is refused."""
    for mode in ("multi_agent", "mgrpo_decoupled_sub"):
        config = side("sub")
        config.trainer.v1.trainer_mode = mode
        assert build_plan(config).multi_agent.decoupled.role == "sub"
    config = side("sub")
    config.trainer.v1.trainer_mode = "mgrpo_decoupled_main"
    with pytest.raises(ValueError, match="trainer.v1.trainer_mode='mgrpo_decoupled_main' contradicts"):
        build_plan(config)


def test_the_cooperation_timeout_is_off_by_default_and_a_number_when_set():
    assert load_multi_agent(base_config()).cooperation.timeout_s is None
    set_ = load_multi_agent(with_updates(base_config(), {"multi_agent.cooperation.timeout_s": 30})).cooperation
    assert set_.timeout_s == 30.0 and isinstance(set_.timeout_s, float)
