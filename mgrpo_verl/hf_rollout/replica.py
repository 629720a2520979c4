"""``RolloutReplica`` for the HF rollout: one :class:`HFRolloutServer` Ray actor per replica.

verl's ``LLMServerManager`` (``workers/rollout/llm_server.py``) resolves the class with
``get_rollout_replica_class(rollout.name)`` -> ``RolloutReplicaRegistry.get`` and then calls
``init_hybrid(worker_group)`` (or ``init_colocated`` / ``init_standalone``), which ends in
:meth:`HFReplica.launch_servers`. The base class forwards ``wake_up`` / ``sleep`` / ``clear_kv_cache`` /
``release_kv_cache`` / ``resume_kv_cache`` / ``resume_generation`` / profiling to the server actor.

Device: the server generates on the device its replica's first actor worker trains on (``cpu`` on our CPU
platform, ``cuda`` on verl's NVIDIA platform; ``rollout.engine_kwargs.hf.device`` may force ``cpu``),
on that worker's GPU, as verl's vLLM replica does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutReplica

from mgrpo_verl.hf_rollout.adapter import server_actor_name
from mgrpo_verl.hf_rollout.server import ENGINE_KWARGS_KEY, HFRolloutServer, resolve_rollout_device


def worker_placement(worker: Any) -> tuple[str, str, list[str]]:
    """Run inside an actor worker (``__ray_call__``): its node id, verl's device name there, and the ids of
    the accelerators Ray gave it (logical GPUs on the CPU platform)."""
    from verl.utils.device import get_device_name, get_resource_name

    ctx = ray.get_runtime_context()
    ids = ctx.get_accelerator_ids().get(get_resource_name(), [])
    return ctx.get_node_id(), get_device_name(), [str(i) for i in ids]


def server_launch_options(device: str, noset_envvars: list[str]) -> dict[str, Any]:
    """Extra Ray options of the server actor for ``device``: none on CPU; on an accelerator, Ray is told
    not to rewrite the visible-device variables (as verl does for its vLLM server), so the server sees the
    node's devices and picks its worker's GPU itself (:func:`~mgrpo_verl.hf_rollout.server.cuda_index`)."""
    if device == "cpu":
        return {}
    return {"runtime_env": {"env_vars": {name: "1" for name in noset_envvars}}}


class HFReplica(RolloutReplica):
    """A rollout replica served by Hugging Face transformers on CPU or one CUDA GPU (no HTTP endpoint).

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

    def _requested_device(self) -> Any:
        kwargs = getattr(self.config, "engine_kwargs", None)
        hf = kwargs.get(ENGINE_KWARGS_KEY) if isinstance(kwargs, Mapping) else None
        return hf.get("device") if isinstance(hf, Mapping) else None

    async def launch_servers(self) -> None:
        """Start the server actor on the node (and device) of the replica's first worker and load the model."""
        from verl.plugin.platform import get_platform

        options: dict[str, Any] = {
            "name": self._server_name(),
            "max_concurrency": self.max_concurrency,
            # the server's compute is bounded by torch threads, not Ray CPUs; 0 keeps it schedulable on
            # machines where verl's workers already hold every logical CPU
            "num_cpus": 0,
        }
        gpu_ids: list[str] = []
        if self.workers:
            node_id, worker_device, gpu_ids = await self.workers[0].__ray_call__.remote(worker_placement)
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        else:
            worker_device = get_platform().device_name
        device = resolve_rollout_device(self._requested_device(), worker_device)
        if device != "cpu":
            options.update(server_launch_options(device, get_platform().ray_noset_envvars()))
        server = self.server_class.options(**options).remote(
            config=self.config,
            model_config=self.model_config,
            rollout_mode=self.rollout_mode,
            workers=self.workers,
            replica_rank=self.replica_rank,
            node_rank=0,
            gpus_per_node=self.gpus_per_replica_node,
            nnodes=self.nnodes,
            cuda_visible_devices=",".join(gpu_ids) if device != "cpu" else None,
            server_name=options["name"],
            device=device,
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
