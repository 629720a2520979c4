"""LoRA agents in the multi_agent config (mgrpo_verl/config/lora.py): verl's own ``model.lora_rank`` /
``lora_alpha`` / ``target_modules`` per agent, which agents share one HF rollout engine, and the refusals,
all before Ray starts. On verl's generated trainer config."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mgrpo_verl.config.lora import adapter_hosts, shared_vllm_adapters
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.config.rules import agent_full_config


def _config(main: dict | None = None, sub: dict | None = None, **top):
    verl_dir = Path(importlib.util.find_spec("verl").origin).parent
    config = OmegaConf.load(verl_dir / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    config.algorithm.adv_estimator = "grpo"
    config.trainer.v1.trainer_mode = "multi_agent"
    config.trainer.n_gpus_per_node = 2
    config.actor_rollout_ref.rollout.name = "hf"
    config.actor_rollout_ref.model.path = "models/base"
    for key, value in top.items():
        OmegaConf.update(config, key.replace("__", "."), value, merge=False)
    config.multi_agent = {
        "enable": True,
        "agents": {"main": {"actor_rollout_ref": main or {}}, "sub": {"actor_rollout_ref": sub or {}}},
    }
    return config


def _fulls(config, ma):
    """The full configs of the model owners built here, as the trainer passes them to adapter_hosts."""
    return {spec.name: agent_full_config(config, spec) for spec in ma.local_owners}


def lora(rank=8, **model):
    return {"model": {"lora_rank": rank, **model}}


def test_two_lora_agents_on_one_base_share_one_engine_with_their_own_settings():
    config = _config(main=lora(8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
                     sub=lora(2, lora_alpha=4, target_modules="all-linear"))
    ma = build_plan(config).multi_agent
    assert adapter_hosts(_fulls(config, ma)) == {"main": "main", "sub": "main"}
    sub = agent_full_config(config, ma.agent("sub")).actor_rollout_ref.model
    main = agent_full_config(config, ma.agent("main")).actor_rollout_ref.model
    assert (sub.lora_rank, sub.lora_alpha, sub.target_modules) == (2, 4, "all-linear")
    assert (main.lora_rank, main.lora_alpha, list(main.target_modules)) == (8, 16, ["q_proj", "v_proj"])


def test_top_level_lora_makes_every_agent_an_adapter():
    config = _config(actor_rollout_ref__model__lora_rank=4)
    ma = build_plan(config).multi_agent
    assert adapter_hosts(_fulls(config, ma)) == {"main": "main", "sub": "main"}


@pytest.mark.parametrize("main,sub,hosts", [
    ({}, lora(4), {"sub": "sub"}),                                    # full main + LoRA sub
    (lora(4), lora(4, path="models/other"), {"main": "main", "sub": "sub"}),  # two bases: an engine each
    (lora(4), {"model": {"lora_rank": 4, "lora": {"merge": True}}}, {"main": "main"}),  # merged sync: own engine
    (lora(4), {**lora(4), "rollout": {"name": "vllm"}}, {"main": "main", "sub": "sub"}),  # one engine per rollout
    ({**lora(4), "rollout": {"name": "vllm"}}, {**lora(4), "rollout": {"name": "vllm"}}, {"main": "main", "sub": "main"}),
    (lora(4), {**lora(4), "rollout": {"name": "sglang"}}, {"main": "main"}),  # verl's SGLang LoRA: own engine
    ({}, {}, {}),
], ids=["full_main_lora_sub", "two_bases", "merge", "hf_and_vllm", "vllm_shared", "sglang", "no_lora"])
def test_mixed_setups(main, sub, hosts):
    config = _config(main=main, sub=sub)
    assert adapter_hosts(_fulls(config, build_plan(config).multi_agent)) == hosts


def test_shared_vllm_engine_table_gives_each_agent_an_id_and_the_largest_rank():
    """Three agents: main and sub LoRA on one base with vLLM, critic a LoRA agent on another base. The shared
    engine's table: ids 1, 2 in agent order (vLLM's ids start at 1), max_rank the larger of 8 and 2; the critic is
    alone on its engine (id 1, its own rank); the hf agents of other tests never get a table."""
    config = _config(main=lora(8), sub=lora(2), actor_rollout_ref__rollout__name="vllm")
    config.multi_agent.agents.critic = {"actor_rollout_ref": lora(16, path="models/other")}
    config.trainer.n_gpus_per_node = 3
    fulls = _fulls(config, build_plan(config).multi_agent)
    tables = shared_vllm_adapters(fulls, adapter_hosts(fulls))
    shared = {"host": "main", "ids": {"main": 1, "sub": 2}, "max_rank": 8}
    assert tables == {"main": shared, "sub": shared, "critic": {"host": "critic", "ids": {"critic": 1}, "max_rank": 16}}
    hf = _config(main=lora(8), sub=lora(2))
    hf_fulls = _fulls(hf, build_plan(hf).multi_agent)
    assert shared_vllm_adapters(hf_fulls, adapter_hosts(hf_fulls)) == {}


@pytest.mark.parametrize("kwargs,expected", [
    ({"sub": lora(4), "actor_rollout_ref__actor__strategy": "megatron"}, r"LoRA agent \(multi_agent\.agents\.sub.*strategy is 'megatron'"),
    ({"sub": {"model": {"lora": {"rank": 4}}}}, r"multi_agent\.agents\.sub\.actor_rollout_ref\.model\.lora\.rank.*Megatron"),
    ({"main": lora(4), "sub": {**lora(4), "rollout": {"response_length": 7}}},
     r"share one rollout engine.*actor_rollout_ref\.rollout\.response_length differs"),
], ids=["strategy", "megatron_key", "engine_mismatch"])
def test_refusals(kwargs, expected):
    main, sub = kwargs.pop("main", None), kwargs.pop("sub", None)
    config = _config(main=main, sub=sub, **kwargs)
    with pytest.raises(ValueError, match=expected):
        build_plan(config)


def test_agents_sharing_an_engine_need_equal_gpu_shares():
    config = _config(actor_rollout_ref__model__lora_rank=4)
    config.trainer.n_gpus_per_node = 3
    config.multi_agent.agents.sub.n_gpus_per_node = 2
    with pytest.raises(ValueError, match=r"trainer\.n_gpus_per_node differs \(1 vs 2\)"):
        build_plan(config)


def test_decoupled_lora_is_refused():
    config = _config(sub=lora(4))
    config.multi_agent.decoupled = {"role": "main", "store": "sqlite:////tmp/x.db", "sub_urls": {"sub": "http://h:1"}}
    config.trainer.v1.trainer_mode = "mgrpo_decoupled_main"
    with pytest.raises(ValueError, match="synchronous mode only"):
        build_plan(config)


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], ["o_proj", "down_proj"]])
def test_memory_estimate_counts_the_adapter_as_peft_builds_it(tmp_path, targets):
    """The pre-flight's LoRA terms: adapter parameters equal peft's trainable parameters on the real model,
    and a LoRA agent's gradients and AdamW states are those of its adapter, not of its base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mgrpo_verl.models.tiny import build_tiny_model
    from mgrpo_verl.platform.ray_session import patched_environ
    from mgrpo_verl.trainer.memory import agent_figures, count_lora_parameters

    with patched_environ({"MGRPO_VERL_CACHE": str(tmp_path)}):
        model_dir = build_tiny_model(seed=0, config_overrides={"num_attention_heads": 4, "num_key_value_heads": 2}).model_dir
    hf = json.loads((Path(model_dir) / "config.json").read_text())
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=targets))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert count_lora_parameters(hf, 4, targets) == trainable

    config = OmegaConf.create({"trainer": {"n_gpus_per_node": 1}, "actor_rollout_ref": {
        "model": {"lora_rank": 4, "target_modules": targets}, "rollout": {"name": "hf"}}})
    lora = agent_figures("sub", config, hf, 80.0, trainable=True, use_reference=False)
    config.actor_rollout_ref.model.lora_rank = 0
    full = agent_figures("sub", config, hf, 80.0, trainable=True, use_reference=False)
    assert lora.optimizer * 1e9 == pytest.approx(trainable * 8) and full.optimizer * 1e9 == pytest.approx(full.params * 8)
    assert lora.grads * 1e9 == pytest.approx(trainable * 4) and lora.actor == full.actor
    # with a KL loss the reference of a LoRA agent is its own actor, adapter off: no second copy
    config.actor_rollout_ref.model.lora_rank = 4
    assert agent_figures("sub", config, hf, 80.0, trainable=True, use_reference=True).reference == 0.0
    config.actor_rollout_ref.model.lora_rank = 0
    assert agent_figures("sub", config, hf, 80.0, trainable=True, use_reference=True).reference > 0
