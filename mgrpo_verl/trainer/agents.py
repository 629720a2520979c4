"""One model per agent: the Ray pieces verl builds once for its single policy, built once per agent.

:class:`AgentRuntime` holds an agent's config, resource pool, worker group, rollout servers and checkpoint
engine. verl names rollout servers by replica rank, which starts at 0 in every worker group, so two small
subclasses (:class:`AgentLLMServerManager`, :class:`AgentActorRolloutRefWorker`) give each agent's replicas a
rank offset. Why, and what the offset must reach: ``docs/multi_agent.md``, "One runtime per agent".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import RolloutMode, get_rollout_replica_class

from mgrpo_verl.config.lora import VLLM_ADAPTERS_KEY
from mgrpo_verl.trainer.balancer import balancer_class

if TYPE_CHECKING:
    from mgrpo_verl.config.schema import MultiAgentConfig

logger = logging.getLogger(__name__)

#: Key in ``actor_rollout_ref.rollout.custom`` (verl's free-form extension dict) carrying the offset.
REPLICA_OFFSET_KEY = "mgrpo_replica_rank_offset"


def replica_offset(rollout_config: Any) -> int:
    """The agent's replica rank offset, from ``rollout.custom`` (0 when absent: a single agent)."""
    custom = rollout_config.get("custom") or {}
    return int(custom.get(REPLICA_OFFSET_KEY, 0))


def offset_rollout_adapter(rollout: BaseRollout, offset: int, cls: type[BaseRollout] | None = None) -> BaseRollout:
    """verl's rollout adapter ``rollout``, built again by its own class (or ``cls``, a subclass) for replica
    ``rollout.replica_rank + offset``; ``rollout`` itself when ``offset`` is 0 and no ``cls`` is given.

    verl builds the adapter with the rank local to the agent's worker group (``RANK // replica size``) and
    derives from it, inside the constructor, every name that must match the agent's replica: the server
    actor's name and, for vLLM, the weight-sync socket path. The constructor's ``replica_rank`` argument
    (vLLM, SGLang, our HF adapter) sets the rank before any of that is derived, so passing it here keeps
    all of them consistent without knowing which attributes depend on it. ``RuntimeError`` when the class
    ignores the argument (TRT-LLM's hybrid adapter takes the rank from its device mesh).
    """
    if not offset and cls is None:
        return rollout
    wanted = rollout.replica_rank + offset
    rebuilt = (cls or type(rollout))(
        config=rollout.config, model_config=rollout.model_config, device_mesh=rollout.device_mesh, replica_rank=wanted
    )
    if rebuilt.replica_rank != wanted:
        raise RuntimeError(
            f"{type(rollout).__qualname__} ignored replica_rank={wanted} (it has {rebuilt.replica_rank}): this rollout "
            f"backend cannot serve an agent whose replicas are offset (multi-agent mode needs vllm, sglang or hf)"
        )
    return rebuilt


def _shares_vllm_engine(rollout_config: Any) -> bool:
    """Whether the agent is a LoRA agent on a shared vLLM engine (``mgrpo_verl/vllm_rollout/lora.py``)."""
    return rollout_config.get("name") == "vllm" and VLLM_ADAPTERS_KEY in (rollout_config.get("custom") or {})


class AgentActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid worker whose rollout adapter addresses the agent's offset replica rank
    (:func:`offset_rollout_adapter`); a LoRA agent on a shared vLLM engine gets the adapter that names its
    LoRA adapter at each sync (``vllm_lora.AgentLoRAServerAdapter``)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        if getattr(self, "rollout", None) is not None:
            cls = None
            if _shares_vllm_engine(self.config.rollout):
                from mgrpo_verl.vllm_rollout.lora import AgentLoRAServerAdapter as cls
            self.rollout = offset_rollout_adapter(self.rollout, replica_offset(self.config.rollout), cls)


def _offset_replica_class(base: type, offset: int) -> type:
    """``base`` (a verl ``RolloutReplica`` class) whose hybrid init slices the agent's own worker group by
    the local replica rank ``replica_rank - offset``."""

    async def init_hybrid(self, worker_group):
        local = self.replica_rank - offset
        self.rollout_mode = RolloutMode.HYBRID
        self.workers = worker_group.workers[self.world_size * local : self.world_size * (local + 1)]
        await self.launch_servers()

    return type(f"{base.__name__}Offset{offset}", (base,), {"init_hybrid": init_hybrid})


def with_agent_vllm_tokenizer(config: DictConfig) -> DictConfig:
    """``config`` (one agent's full config) whose vLLM server loads the agent's own tokenizer.

    verl starts ``vllm serve <model dir>`` with ``engine_kwargs.vllm`` as extra arguments and no
    ``--tokenizer``, so vLLM reads the tokenizer from the model folder; our built-in models keep theirs
    in a folder of its own (``model.tokenizer_path``). The YAML's ``engine_kwargs.vllm.tokenizer:
    ${actor_rollout_ref.model.tokenizer_path}`` is resolved once for the whole config (the main agent's
    value), before the agents' overrides are merged; here it becomes the agent's ``tokenizer_path`` when
    that differs from ``model.path`` and is dropped otherwise (vLLM then uses the model folder, as verl's
    actor does). Other rollout engines: ``config`` unchanged. A copy is returned when anything changes.
    """
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm":
        return config
    model = config.actor_rollout_ref.model
    tokenizer = model.get("tokenizer_path")
    wanted = None if tokenizer is None or str(tokenizer) == str(model.path) else str(tokenizer)
    current = OmegaConf.select(rollout, "engine_kwargs.vllm.tokenizer", default=None)
    if current == wanted:
        return config
    if current is not None:
        logger.info("vLLM tokenizer of this agent: %s (model.tokenizer_path) instead of %s", wanted, current)
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    OmegaConf.update(config, "actor_rollout_ref.rollout.engine_kwargs.vllm.tokenizer", wanted, merge=False)
    return config


def side_replica_offsets(ma: "MultiAgentConfig", local_replicas: Mapping[str, int]) -> dict[str, int]:
    """Replica rank offsets of the model owners, counting an owner that is not built here
    (``local_replicas`` lacks it: decoupled mode, another side's) as ``n_gpus_per_node`` replicas, the most
    it can have.

    Differs from counting it as 0 in decoupled mode only: the two sides are separate Ray clusters, both with
    job id ``01000000``, and verl names vLLM's weight-sync socket from job id, replica rank and local rank
    only; with both sides on one host, two replicas 0 would share a socket. Both sides
    read the same ``multi_agent.agents``, so their ranges are disjoint.
    """
    counts = {s.name: local_replicas[s.name] if s.name in local_replicas else s.n_gpus_per_node
              for s in ma.model_owners}
    return ma.replica_offsets(counts)


class AgentLLMServerManager(LLMServerManager):
    """verl's server manager for one agent's replicas, numbered from ``start_rank``, its vLLM servers loading
    the agent's tokenizer (:func:`with_agent_vllm_tokenizer`), routed by our :class:`RequestBalancer` (verl's
    routing without verl's imports: ~250 MiB less per agent) unless ``rollout.router_config_path`` names a router."""

    def __init__(self, config: DictConfig, worker_group=None, rollout_resource_pool=None, start_rank: int = 0,
                 **kwargs):
        config = with_agent_vllm_tokenizer(config)
        rollout = config.actor_rollout_ref.rollout
        if start_rank and rollout.name == "trtllm":
            raise ValueError(
                "actor_rollout_ref.rollout.name is 'trtllm': its replicas slice the worker group by their own rank "
                "(init_hybrid_colocated), so an agent whose replicas are offset cannot use it; use vllm or sglang"
            )
        base = get_rollout_replica_class(rollout.name, disaggregation_enabled=rollout.disaggregation.enabled)
        if _shares_vllm_engine(rollout):
            from mgrpo_verl.vllm_rollout.lora import AgentLoRAvLLMReplica as base
        # verl's documented hook: a subclass sets rollout_replica_class before __init__ ("for recipe to change")
        self.rollout_replica_class = _offset_replica_class(base, start_rank)
        if not rollout.get("router_config_path"):
            kwargs.setdefault("load_balancer_cls", balancer_class(rollout))
        super().__init__(config, worker_group, rollout_resource_pool, start_rank=start_rank, **kwargs)


@dataclass
class AgentRuntime:
    """Everything one model-owning agent has in the Ray cluster.

    Attributes:
        name: agent name (``multi_agent.agents`` key).
        trainable: whether its actor is updated (``false``: frozen, rollout only).
        config: the agent's full trainer config (``agent_full_config``): its own ``actor_rollout_ref``.
        plays: names of the agents whose rows this model produces and trains on (itself first, then the
            agents that ``share_model_with`` it).
        worker_group, llm: its hybrid worker group and its ``AgentLLMServerManager``.
        checkpoint: its ``CheckpointEngineManager`` (actor → its own servers).
        tokenizer: its tokenizer.
        use_reference_policy: whether a reference model is computed for it (KL loss).
        ref_in_actor: the reference is the actor with its LoRA adapter off (a LoRA agent, as in verl), not a
            model of its own.
    """

    name: str
    trainable: bool
    config: DictConfig
    plays: tuple[str, ...]
    worker_group: Any = None
    llm: Any = None
    checkpoint: Any = None
    tokenizer: Any = None
    use_reference_policy: bool = False
    ref_in_actor: bool = False
