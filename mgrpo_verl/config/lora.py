"""Agents as LoRA adapters (docs/lora.md): the config rules and which agents share one rollout engine.

An agent is a LoRA agent when its config (the top-level ``actor_rollout_ref`` merged with
``multi_agent.agents.<name>.actor_rollout_ref``) has verl's ``actor_rollout_ref.model.lora_rank > 0``; rank,
``lora_alpha`` and ``target_modules`` are verl's own keys, per agent. Its actor is verl's FSDP actor with a
peft adapter (the base frozen, an optimizer over the adapter only), trained on that agent's rows as any
model of ours.

Differs from verl, where one rollout engine serves one adapter: with the ``hf`` or ``vllm`` rollout, the LoRA
agents whose adapters stay separate (``model.lora.merge: false``, verl's default) and whose base is the same
``model.path`` share **one** engine, hosted by the first of them (:func:`adapter_hosts`); each agent's
weight sync sends its adapter only, under the agent's name, and each agent's requests name its adapter
(``hf``: our engine, ``mgrpo_verl/hf_rollout/adapters.py``; ``vllm``: vLLM's multi-LoRA,
``mgrpo_verl/vllm_rollout/lora.py``).
With ``lora.merge: true`` (verl syncs merged full weights) or SGLang (verl's one adapter per engine, never run
here), a LoRA agent gets an engine of its own, as a full model does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from mgrpo_verl.config import setting
from mgrpo_verl.config.schema import MultiAgentConfig

SHARED_ENGINE_ROLLOUTS = ("hf", "vllm")
"""Rollout engines that serve several agents' adapters on one base (ours; vLLM's multi-LoRA)."""

VLLM_ADAPTERS_KEY = "mgrpo_vllm_adapters"
"""Key in ``actor_rollout_ref.rollout.custom`` of the agents on a shared vLLM engine: :func:`shared_vllm_adapters`."""

LORA_STRATEGIES = ("fsdp", "fsdp2")
"""Actor strategies whose LoRA (peft) verl implements with ``model.lora_rank``."""



def _rank(config: DictConfig) -> int:
    value = setting(config, "actor_rollout_ref.model.lora_rank")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def lora_owners(fulls: Mapping[str, DictConfig]) -> dict[str, DictConfig]:
    """The LoRA agents among the model owners of ``fulls`` (name -> the agent's full config,
    ``agent_full_config``), each with its full config."""
    return {name: full for name, full in fulls.items() if _rank(full)}


def _shares_engine(full: DictConfig) -> bool:
    return setting(full, "actor_rollout_ref.rollout.name") in SHARED_ENGINE_ROLLOUTS and not bool(
        setting(full, "actor_rollout_ref.model.lora.merge"))


def adapter_hosts(fulls: Mapping[str, DictConfig]) -> dict[str, str]:
    """LoRA agent -> the agent whose rollout engine serves its adapter (itself for the first agent on a base),
    for every model owner of ``fulls`` (the owners built here, in order: name -> full config) whose adapter
    is served by a shared engine; other agents are absent."""
    hosts: dict[str, str] = {}
    first: dict[str, str] = {}
    for name, full in lora_owners(fulls).items():
        if not _shares_engine(full):
            continue
        engine = (setting(full, "actor_rollout_ref.rollout.name"), str(setting(full, "actor_rollout_ref.model.path")))
        hosts[name] = first.setdefault(engine, name)
    return hosts


def shared_vllm_adapters(fulls: Mapping[str, DictConfig], hosts: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """LoRA agent -> the table of the vLLM engine it shares (``rollout.custom.mgrpo_vllm_adapters``,
    ``mgrpo_verl/vllm_rollout/lora.py``): ``{"host": agent, "ids": {agent: id}, "max_rank": r}``, ids 1, 2, ... in the
    order of ``hosts`` (vLLM's adapter ids start at 1), the largest rank of the engine's agents; for every agent
    that ``hosts`` (:func:`adapter_hosts` of ``fulls``) puts on a vLLM engine, the host included."""
    hosts = {name: host for name, host in hosts.items()
             if setting(fulls[name], "actor_rollout_ref.rollout.name") == "vllm"}
    tables: dict[str, dict[str, Any]] = {}
    for name, host in hosts.items():
        table = tables.setdefault(host, {"host": host, "ids": {}, "max_rank": 0})
        table["ids"][name] = len(table["ids"]) + 1
        table["max_rank"] = max(table["max_rank"], _rank(fulls[name]))
    return {name: tables[host] for name, host in hosts.items()}


#: Settings that members of one shared engine must agree on: the engine is built from the host's.
_ENGINE_KEYS = (
    "actor_rollout_ref.model.tokenizer_path",
    "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.rollout.engine_kwargs",
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.data_parallel_size",
    "actor_rollout_ref.rollout.max_model_len",
    "actor_rollout_ref.rollout.prompt_length",
    "actor_rollout_ref.rollout.response_length",
    "trainer.n_gpus_per_node",
)


def check_lora(ma: MultiAgentConfig, fulls: Mapping[str, DictConfig]) -> None:
    """The LoRA rules of multi-agent mode, before Ray starts; ``ValueError`` naming the key. Called by
    :func:`~mgrpo_verl.config.rules.check_multi_agent` after the GPU shares are resolved, with
    every model owner's full config (``fulls``: name -> ``agent_full_config``)."""
    for spec in ma.model_owners:
        full = fulls[spec.name]
        megatron = setting(full, "actor_rollout_ref.model.lora.rank")
        if isinstance(megatron, int) and megatron > 0:
            raise ValueError(
                f"{spec.key_of('model.lora.rank')} makes actor_rollout_ref.model.lora.rank {megatron} for agent "
                f"{spec.name!r}: that is Megatron's LoRA, which multi-agent mode does not support; use verl's FSDP "
                f"LoRA, actor_rollout_ref.model.lora_rank"
            )
        rank = _rank(full)
        if not rank:
            continue
        what = f"agent {spec.name!r} is a LoRA agent ({spec.key_of('model.lora_rank')}={rank})"
        strategy = setting(full, "actor_rollout_ref.actor.strategy")
        if strategy not in LORA_STRATEGIES:
            raise ValueError(f"{what} but actor_rollout_ref.actor.strategy is {strategy!r}: verl's LoRA (peft) needs "
                             f"one of {list(LORA_STRATEGIES)}")
        if ma.decoupled.role is not None:
            raise ValueError(f"{what} but multi_agent.decoupled.role is {ma.decoupled.role!r}: LoRA agents are "
                             f"supported in the synchronous mode only (decoupled.role: null)")
    hosts = adapter_hosts({spec.name: fulls[spec.name] for spec in ma.local_owners})
    for name, host in hosts.items():
        if name == host:
            continue
        mine, theirs = fulls[name], fulls[host]
        for key in _ENGINE_KEYS:
            a, b = setting(mine, key), setting(theirs, key)
            if a != b:
                raise ValueError(
                    f"LoRA agents {host!r} and {name!r} share one rollout engine (same actor_rollout_ref.model.path "
                    f"and rollout.name, lora.merge false) but {key} differs ({b!r} vs {a!r}): the engine is built "
                    f"once, from "
                    f"{host!r}'s settings; make them equal (or set model.lora.merge=true on {name!r} to give it an "
                    f"engine of its own)"
                )
