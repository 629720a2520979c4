"""The in-worker rollout adapter (``BaseRollout``) for the HF rollout server.

verl builds one per hybrid actor worker through ``get_rollout_class(rollout.name, rollout.mode)``
(``workers/engine_workers.py``; ``checkpoint_engine/base.py`` for colocated / standalone replicas), which
reads the private ``_ROLLOUT_REGISTRY`` dict; :func:`mgrpo_verl.hf_rollout.register` inserts this class there.

After each training step verl's naive checkpoint-engine path runs, in every actor worker
(``ActorRolloutRefWorker.update_weights(mode="naive")``)::

    await rollout.resume(tags=["weights"])
    await rollout.update_weights(engine.get_per_tensor_param(), peft_config=..., base_sync_done=True,
                                 global_steps=...)
    await rollout.resume(tags=["kv_cache"])

and :meth:`HFServerAdapter.update_weights` streams the ``(name, tensor)`` pairs, in buckets of
``rollout.checkpoint_engine.update_weights_bucket_megabytes``, to the replica's server actor through Ray.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import torch
from verl.workers.rollout.base import BaseRollout

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


async def _aiter(weights: Any) -> AsyncIterator[tuple[str, torch.Tensor]]:
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


def server_actor_name(rollout_name: str, replica_rank: int, node_rank: int = 0, role: str = "") -> str:
    """Ray actor name of a replica's server, shared by :class:`HFReplica` and the adapter.

    ``role`` is ``""`` (policy), ``"reward"`` or ``"teacher"`` as in verl's vLLM replica naming.
    """
    role_part = f"{role}_" if role else ""
    return f"{rollout_name}_server_{role_part}{replica_rank}_{node_rank}"


class HFServerAdapter(BaseRollout):
    """Client side of the HF rollout server inside a hybrid actor worker: forwards sleep / wake-up and
    pushes weights. Generation requests do not pass through here (the agent loop calls the server).

    Args:
        config: ``RolloutConfig``.
        model_config: ``HFModelConfig``.
        device_mesh: unused (verl passes its rollout mesh, or ``None`` for standalone replicas).
        replica_rank: the replica this worker belongs to; ``-1`` derives it from ``RANK``.
    """

    def __init__(self, config, model_config, device_mesh=None, replica_rank: int = -1, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        # one server per replica, owned by the replica's first rank
        self._has_server = self.rollout_rank == 0
        self.server_handle = None
        self.sleep_level = 2

    @property
    def is_leader_rank(self) -> bool:
        return self._has_server

    def _server(self):
        if not self._has_server:
            return None
        if self.server_handle is None:  # the server is launched after the hybrid workers
            import ray

            self.server_handle = ray.get_actor(server_actor_name(self.config.name, self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]):
        """Forward to the server's ``wake_up`` (the server never frees its weights, on CPU or GPU)."""
        server = self._server()
        if server is not None and self.config.free_cache_engine:
            await server.wake_up.remote(tags=tags)

    async def release(self):
        server = self._server()
        if server is not None and self.config.free_cache_engine:
            await server.sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ):
        """Send full weights to the server in buckets; with a ``peft_config`` (LoRA, ``lora.merge=false``) the
        adapter only (:meth:`_update_adapter`).

        Every rank must iterate ``weights``: with FSDP each item is all-gathered across the group, and a
        rank that stopped early would deadlock the others; ranks without a server just drop the tensors.
        Tensors travel through host memory (``.to("cpu")``) whatever the actor's device, so a CUDA actor
        feeds a CPU or CUDA server alike; the server copies them onto its own device.
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"the HF rollout takes full named tensors; checkpoint_engine wire_format={wire_format!r} "
                "(delta sync) is not supported: use checkpoint_engine.backend=naive"
            )
        peft_config = kwargs.get("peft_config")
        if peft_config:
            await self._update_adapter(weights, peft_config, bool(kwargs.get("base_sync_done", True)), global_steps)
            return
        start = time.perf_counter()
        server = self._server()
        bucket_bytes = int(self.config.checkpoint_engine.update_weights_bucket_megabytes) << 20
        if server is not None:
            await server.begin_weight_update.remote()
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        total = 0
        count = 0
        try:
            async for name, tensor in _aiter(weights):
                if server is None:
                    continue
                t = tensor.detach()
                if hasattr(t, "full_tensor"):
                    t = t.full_tensor()
                t = t.to("cpu").contiguous()
                bucket.append((name, t))
                size += t.numel() * t.element_size()
                count += 1
                if size >= bucket_bytes:
                    total += await server.update_weights_bucket.remote(bucket)
                    bucket, size = [], 0
            if server is not None and bucket:
                total += await server.update_weights_bucket.remote(bucket)
        finally:
            if server is not None:
                report = await server.finish_weight_update.remote(global_steps)
        if server is not None:
            logger.info(
                "HF rollout replica %d: %d tensors (%.1f MB) synced in %.3fs, weight_version=%s, global_steps=%s%s",
                self.replica_rank,
                count,
                total / 2**20,
                time.perf_counter() - start,
                report.get("weight_version"),
                report.get("global_steps"),
                f", fingerprint={report['fingerprint']}" if "fingerprint" in report else "",
            )

    def adapter_name(self) -> str:
        """The name this worker's LoRA adapter has on the server: the agent whose model this worker trains
        (``rollout.custom.mgrpo_agent``, set per agent by the multi-agent trainer), else ``default``."""
        custom = getattr(self.config, "custom", None) or {}
        return str(custom.get("mgrpo_agent") or "default")

    async def _update_adapter(self, weights: Any, peft_config: dict, base_sync_done: bool, global_steps: int | None):
        """Adapter-only weight sync: the LoRA tensors go to the server as adapter :meth:`adapter_name`.

        Differs from verl's vLLM / SGLang adapters, which replace the engine's single adapter: the HF server
        keeps one adapter per agent on one base. A base sync (``base_sync_done=False``, verl's first sync with
        a ``dummy`` load format) is iterated (FSDP gathers need every rank) and dropped: the server loaded the
        base from the model path, which every agent sharing it trains frozen."""
        server = self._server()
        named = []
        async for name, tensor in _aiter(weights):
            if server is None or not base_sync_done:
                continue
            t = tensor.detach()
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            named.append((name, t.to("cpu").contiguous()))
        if server is None or not base_sync_done:
            return
        start = time.perf_counter()
        report = await server.update_adapter.remote(self.adapter_name(), dict(peft_config), named, global_steps)
        logger.info(
            "HF rollout replica %d: adapter %r, %d tensors (%.2f MB) synced in %.3fs, weight_version=%s%s",
            self.replica_rank, report["adapter"], report["loaded"], report["bytes"] / 2**20,
            time.perf_counter() - start, report.get("weight_version"),
            f", global_steps={report.get('global_steps')}, base_fingerprint={report['base_fingerprint']}, "
            f"adapter_fingerprint={report['adapter_fingerprint']}" if "base_fingerprint" in report else "",
        )

    def generate_sequences(self, prompts):
        raise NotImplementedError(
            "the HF rollout serves generation through its server actor (agent loop); "
            "generate_sequences() is not supported"
        )
