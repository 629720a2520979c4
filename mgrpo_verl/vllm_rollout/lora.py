"""Several agents' LoRA adapters in one vLLM engine: vLLM's multi-LoRA inside verl's vLLM rollout.

verl's vLLM server serves one adapter per engine (``max_loras=1``, one constant id replaced at every sync);
here the LoRA agents on one base share the first one's engine, each adapter under its own id, each request
generated with the adapter of the agent it names (and refused when it names none, an unknown one or one not
synced yet). Subclasses of verl's server, replica, in-worker adapter and vLLM worker extension, nothing
patched; importing this module imports vLLM. How, and the table that drives it: ``docs/lora.md``, "What runs".
"""

from __future__ import annotations

import contextvars
from typing import Any

import ray
from verl.utils.vllm import TensorLoRARequest
from verl.workers.rollout.utils import ensure_async_iterator
from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank, vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter
from vllm.lora.request import LoRARequest

from mgrpo_verl.config.lora import VLLM_ADAPTERS_KEY as ADAPTERS_KEY

#: The adapter of the request being generated, read by :class:`_AdapterEngine` (one asyncio task per request).
_REQUEST_ADAPTER: contextvars.ContextVar[LoRARequest | None] = contextvars.ContextVar("mgrpo_request_adapter",
                                                                                      default=None)


def adapter_table(rollout_config: Any) -> dict | None:
    """The shared-engine table of an agent's rollout config (:data:`ADAPTERS_KEY`), or None."""
    custom = rollout_config.get("custom")  # verl's RolloutConfig and an OmegaConf node alike
    table = (custom or {}).get(ADAPTERS_KEY)
    return None if table is None else {"host": str(table["host"]),
                                       "ids": {str(k): int(v) for k, v in dict(table["ids"]).items()},
                                       "max_rank": int(table["max_rank"])}


def _lora_request(agent: str, adapter_id: int, **kwargs: Any) -> LoRARequest:
    cls = TensorLoRARequest if kwargs else LoRARequest
    return cls(lora_name=agent, lora_int_id=adapter_id, lora_path=f"mgrpo_agent_adapter/{agent}", **kwargs)


class _AdapterEngine:
    """vLLM's engine client as verl's ``vLLMHttpServer.generate`` sees it: ``generate`` gets the adapter of the
    request being served (:data:`_REQUEST_ADAPTER`) instead of verl's single one; everything else is vLLM's."""

    def __init__(self, engine: Any):
        self._engine = engine

    def generate(self, *args: Any, lora_request: LoRARequest | None = None, **kwargs: Any):
        return self._engine.generate(*args, lora_request=_REQUEST_ADAPTER.get(), **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


class AgentLoRAvLLMHttpServer(vLLMHttpServer):
    """verl's vLLM server for the LoRA agents on one base: ``max_loras`` = the agents, and each request generated
    with the adapter of the agent it names (``lora_name``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._adapters = adapter_table(self.config)
        if self._adapters is None:
            raise ValueError(f"{type(self).__name__} serves the agents of rollout.custom.{ADAPTERS_KEY}, "
                             "which is unset")

    def _with_agent_loras(self, args: Any) -> Any:
        args.max_loras = len(self._adapters["ids"])
        args.max_lora_rank = get_vllm_max_lora_rank(self._adapters["max_rank"])
        return args

    async def run_server(self, args: Any):
        await super().run_server(self._with_agent_loras(args))
        self.engine = _AdapterEngine(self.engine)
        print(f"mgrpo_verl: vLLM engine of replica {self.replica_rank} serves the LoRA adapters of agents "
              f"{self._adapters['ids']} (max_loras {args.max_loras}, max_lora_rank {args.max_lora_rank})", flush=True)

    async def run_headless(self, args: Any):
        await super().run_headless(self._with_agent_loras(args))

    def _get_worker_extension_cls(self) -> str:
        return f"{AgentLoRAWorkerExtension.__module__}.{AgentLoRAWorkerExtension.__qualname__}"

    async def generate(self, *args: Any, lora_name: str | None = None, **kwargs: Any):
        ids = self._adapters["ids"]
        if lora_name not in ids:
            raise ValueError(f"this vLLM engine serves the adapters of agents {sorted(ids)}; a request must name one "
                             f"(lora_name), got {lora_name!r}")
        if ids[lora_name] not in await self.engine.list_loras():
            raise RuntimeError(f"agent {lora_name!r}'s adapter has not been synced into this vLLM engine yet")
        token = _REQUEST_ADAPTER.set(_lora_request(lora_name, ids[lora_name]))
        try:
            return await super().generate(*args, **kwargs)
        finally:
            _REQUEST_ADAPTER.reset(token)


class AgentLoRAvLLMReplica(vLLMReplica):
    """verl's vLLM replica whose servers are :class:`AgentLoRAvLLMHttpServer` (verl's ``server_class`` attribute)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(AgentLoRAvLLMHttpServer)


class AgentLoRAServerAdapter(ServerAdapter):
    """verl's in-worker vLLM adapter of one LoRA agent on a shared engine: an adapter sync names the agent's adapter
    (name and id) for the worker extension; a guest's base sync is iterated (FSDP gathers need every rank) and
    dropped."""

    def agent_adapter(self) -> tuple[str, int, bool]:
        """This worker's agent (``rollout.custom.mgrpo_agent``), its adapter id on the engine, and whether it hosts
        the engine."""
        table = adapter_table(self.config)
        agent = str((self.config.get("custom") or {}).get("mgrpo_agent"))
        if table is None or agent not in table["ids"]:
            raise ValueError(f"agent {agent!r} has no adapter id in rollout.custom.{ADAPTERS_KEY} ({table})")
        return agent, table["ids"][agent], agent == table["host"]

    async def update_weights(self, weights: Any, global_steps: int | None = None, wire_format: str = "named_tensors",
                             **kwargs: Any):
        agent, adapter_id, host = self.agent_adapter()
        if kwargs.get("base_sync_done") is False and not host:
            async for _ in ensure_async_iterator(weights):
                pass
            return
        if kwargs.get("peft_config") and kwargs.get("base_sync_done"):
            kwargs["mgrpo_adapter"] = {"name": agent, "id": adapter_id}
        await super().update_weights(weights, global_steps=global_steps, wire_format=wire_format, **kwargs)


class AgentLoRAWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension whose adapter sync replaces the named agent's adapter (``mgrpo_adapter``: name
    and id, from :class:`AgentLoRAServerAdapter`) instead of verl's single one; base syncs are verl's."""

    def update_weights_from_ipc(self, peft_config: dict | None = None, base_sync_done: bool = False,
                                use_shm: bool = False, mgrpo_adapter: dict | None = None):
        self._mgrpo_adapter = mgrpo_adapter
        try:
            return super().update_weights_from_ipc(peft_config=peft_config, base_sync_done=base_sync_done,
                                                   use_shm=use_shm)
        finally:
            self._mgrpo_adapter = None

    def _update_weights(self, weights: list, peft_config: dict, base_sync_done: bool):
        adapter = getattr(self, "_mgrpo_adapter", None)
        if not (peft_config and base_sync_done):
            return super()._update_weights(weights, peft_config=peft_config, base_sync_done=base_sync_done)
        if adapter is None:
            raise ValueError("an adapter sync into a shared multi-LoRA engine must name its agent (mgrpo_adapter)")
        # clone out of the receiver's reused bucket buffer: vLLM keeps the adapter's tensors (verl does the same)
        tensors = {name: tensor.clone() for name, tensor in weights}
        self.remove_lora(adapter["id"])  # vLLM's add_lora keeps an existing id's old weights
        self.add_lora(_lora_request(adapter["name"], adapter["id"], peft_config=peft_config, lora_tensors=tensors))
