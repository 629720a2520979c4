"""One model per agent: the Ray pieces verl builds once for its single policy, built once per agent.

For every agent that owns a model (``multi_agent.agents.<name>``, ``share_model_with: null``) the
trainer gets an :class:`AgentRuntime`: its full config, its resource pool, its hybrid actor + reference
+ rollout worker group, its rollout servers (``LLMServerManager``) and its checkpoint engine (weight
sync from its actor to its servers). Nothing here touches training data; the step lives in
``per_agent.py``.

Why the two small subclasses below exist: verl names a rollout server actor by its replica rank only
(``<backend>_server_<rank>_<node>``), and both the replica object and the rollout adapter inside the
worker derive that rank from the worker group (ranks start at 0 in every group). Two agents would both
own "replica 0" and their servers' names would clash. Each agent's replicas therefore get a rank offset
(the number of replicas of the agents before it): :class:`AgentLLMServerManager` passes verl's own
``start_rank`` and slices the agent's worker group with the local rank, and
:class:`AgentActorRolloutRefWorker` shifts the adapter's rank by the same offset, so server and adapter
agree on ``<backend>_server_<offset + r>_0``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import RolloutMode, get_rollout_replica_class

logger = logging.getLogger(__name__)

#: Key in ``actor_rollout_ref.rollout.custom`` (verl's free-form extension dict) carrying the offset.
REPLICA_OFFSET_KEY = "mgrpo_replica_rank_offset"


class AgentActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid worker whose rollout adapter addresses the agent's offset replica rank."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        custom = self.config.rollout.get("custom") or {}
        offset = int(custom.get(REPLICA_OFFSET_KEY, 0))
        rollout = getattr(self, "rollout", None)
        if offset and rollout is not None and hasattr(rollout, "replica_rank"):
            rollout.replica_rank += offset


def _offset_replica_class(base: type, offset: int) -> type:
    """``base`` (a verl ``RolloutReplica`` class) whose hybrid init slices the agent's own worker group by
    the local replica rank ``replica_rank - offset``."""

    async def init_hybrid(self, worker_group):
        local = self.replica_rank - offset
        self.rollout_mode = RolloutMode.HYBRID
        self.workers = worker_group.workers[self.world_size * local : self.world_size * (local + 1)]
        await self.launch_servers()

    return type(f"{base.__name__}Offset{offset}", (base,), {"init_hybrid": init_hybrid})


class AgentLLMServerManager(LLMServerManager):
    """verl's server manager for one agent's replicas, numbered from ``start_rank``."""

    def __init__(self, config: DictConfig, worker_group=None, rollout_resource_pool=None, start_rank: int = 0, **kwargs):
        rollout = config.actor_rollout_ref.rollout
        base = get_rollout_replica_class(rollout.name, disaggregation_enabled=rollout.disaggregation.enabled)
        # verl's documented hook: a subclass sets rollout_replica_class before __init__ ("for recipe to change")
        self.rollout_replica_class = _offset_replica_class(base, start_rank)
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
