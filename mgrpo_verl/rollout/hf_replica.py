"""``RolloutReplica`` for the HF rollout: one :class:`HFRolloutServer` Ray actor per replica.

verl's ``LLMServerManager`` (``workers/rollout/llm_server.py``) resolves the class with
``get_rollout_replica_class(rollout.name)`` -> ``RolloutReplicaRegistry.get`` and then calls
``init_hybrid(worker_group)`` (or ``init_colocated`` / ``init_standalone``), which ends in
:meth:`HFReplica.launch_servers`. The base class forwards ``wake_up`` / ``sleep`` / ``clear_kv_cache`` /
``release_kv_cache`` / ``resume_kv_cache`` / ``resume_generation`` / profiling to the server actor.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutReplica

from mgrpo_verl.rollout.hf_adapter import server_actor_name
from mgrpo_verl.rollout.hf_server import HFRolloutServer


class HFReplica(RolloutReplica):
    """A rollout replica served by Hugging Face transformers on CPU (no HTTP endpoint).

    ``server_address`` is a unique pseudo address ``hf://<node ip>/<actor name>``: verl uses it only as the
    load balancer's key for the server handle. OpenAI-compatible HTTP clients cannot use this replica.
    """

    def __init__(
        self,
        replica_rank: int,
        config: Any,
        model_config: Any,
        gpus_per_node: int = 8,
        is_reward_model: bool = False,
        is_teacher_model: bool = False,
        name_suffix: str = "",
    ) -> None:
        super().__init__(
            replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model, name_suffix
        )
        self.server_class = ray.remote(HFRolloutServer)

    def _server_name(self) -> str:
        role = "reward" if self.is_reward_model else "teacher" if self.is_teacher_model else ""
        return server_actor_name(self.config.name, self.replica_rank, 0, role) + self.name_suffix

    async def launch_servers(self) -> None:
        """Start the server actor on the node of the replica's first worker and load the model."""
        options: dict[str, Any] = {
            "name": self._server_name(),
            "max_concurrency": self.max_concurrency,
            # the server's compute is bounded by torch threads, not Ray CPUs; 0 keeps it schedulable on
            # machines where verl's workers already hold every logical CPU
            "num_cpus": 0,
        }
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        server = self.server_class.options(**options).remote(
            config=self.config,
            model_config=self.model_config,
            rollout_mode=self.rollout_mode,
            workers=self.workers,
            replica_rank=self.replica_rank,
            node_rank=0,
            gpus_per_node=self.gpus_per_replica_node,
            nnodes=self.nnodes,
            server_name=options["name"],
        )
        await server.launch_server.remote()
        ip, _ = await server.get_server_address.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf://{ip}/{options['name']}"

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        results = await asyncio.gather(
            *[server.abort_all_requests.remote(reject_request=reject_request) for server in self.servers]
        )
        return {
            "aborted_count": sum(r.get("aborted_count", 0) for r in results),
            "request_ids": [rid for r in results for rid in r.get("request_ids", [])],
            "server_results": results,
        }

    async def abort_request(self, request_id: str) -> dict[str, Any]:
        results = await asyncio.gather(*[server.abort_request.remote(request_id) for server in self.servers])
        for r in results:
            if r.get("aborted", False):
                return r
        return {"aborted": False, "request_id": request_id, "error": "Request not found on any server"}
