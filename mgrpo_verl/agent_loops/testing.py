"""A minimal hybrid actor worker for exercising the HF rollout through verl's own machinery without FSDP.

:class:`ToyHybridWorker` holds a plain Hugging Face model and the rollout adapter that verl's
``get_rollout_class`` returns, and its ``update_weights`` does what ``ActorRolloutRefWorker.update_weights``
(``verl/workers/engine_workers.py``) does on the naive checkpoint-engine path. Put it in a
``RayWorkerGroup`` and hand that to ``LLMServerManager`` / ``CheckpointEngineManager`` (backend
``naive``), and the replica, the server, the adapter and the weight sync run exactly as in training.

:func:`build_agent_loop` builds an agent loop the way verl's agent-loop worker does, for tests and
benchmarks that drive a loop with a fake server manager.
"""

from __future__ import annotations

from typing import Any

import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register


class ToyHybridWorker(Worker):
    def __init__(self, rollout_config: Any, model_config: Any, rollout_name: str = "hf"):
        super().__init__()
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig
        from verl.workers.rollout.base import get_rollout_class

        from mgrpo_verl.hf_rollout import register as register_rollout

        register_rollout(rollout_name)  # the plugin entry point does this in real runs
        self.rollout_config = omega_conf_to_dataclass(rollout_config, dataclass_type=RolloutConfig)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_config.local_path, dtype=torch.float32)
        rollout_cls = get_rollout_class(self.rollout_config.name, self.rollout_config.mode)
        self.rollout = rollout_cls(config=self.rollout_config, model_config=self.model_config, device_mesh=None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def perturb_weights(self, seed: int, scale: float = 0.05) -> None:
        """Add the same seeded noise to every weight on every rank (a stand-in for an optimizer step)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, p in sorted(self.model.named_parameters()):
                p.add_(scale * torch.randn(p.shape, generator=g))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto"):
        """The naive path of ``ActorRolloutRefWorker.update_weights`` with a plain module as the engine."""
        free = self.rollout_config.free_cache_engine
        if free:
            await self.rollout.resume(tags=["weights"])
        per_tensor_param = ((name, t.detach()) for name, t in self.model.state_dict().items())
        await self.rollout.update_weights(
            per_tensor_param, peft_config=None, base_sync_done=True, global_steps=global_steps
        )
        if free:
            await self.rollout.resume(tags=["kv_cache"])


def build_agent_loop(agent_name: str, config: Any, server_manager: Any, tokenizer: Any, tools: Any = ()) -> Any:
    """One loop object of the registered ``agent_name``, built as verl's ``AgentLoopWorker._run_agent_loop``
    builds it (hydra ``instantiate`` of the registry entry, the trainer config wrapped in
    ``DictConfigWrap``), with ``tools`` as its tool list."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry

    return hydra.utils.instantiate(
        config=_agent_loop_registry[agent_name],
        trainer_config=DictConfigWrap(config=config),
        server_manager=server_manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen2",
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap(list(tools)),
    )
