"""A rollout backend for verl 0.9.1: a Ray actor server generating with Hugging Face transformers (CPU or CUDA).

Select it with ``actor_rollout_ref.rollout.name=hf`` once :func:`register` has run in the process (the
``verl.plugins`` entry point calls it in the driver and every Ray worker). The CPU config selects it by default;
on GPUs select it explicitly (the GPU default is vLLM); the model then goes to the actor worker's GPU.

Pieces:

* :class:`~mgrpo_verl.hf_rollout.replica.HFReplica` — the ``RolloutReplica`` (``RolloutReplicaRegistry``);
* :class:`~mgrpo_verl.hf_rollout.server.HFRolloutServer` — the server actor (batched generation);
* :class:`~mgrpo_verl.hf_rollout.adapter.HFServerAdapter` — the in-worker ``BaseRollout`` through which
  verl's naive checkpoint-engine path pushes new weights after each step (``_ROLLOUT_REGISTRY``);
* :class:`~mgrpo_verl.hf_rollout.engine.HFGenerationEngine` — the Ray-free batched generator underneath.
"""

from __future__ import annotations

ROLLOUT_NAME = "hf"
ADAPTER_FQN = "mgrpo_verl.hf_rollout.adapter.HFServerAdapter"


def _load_replica():
    from mgrpo_verl.hf_rollout.replica import HFReplica

    return HFReplica


def register(name: str = ROLLOUT_NAME) -> None:
    """Register the HF rollout under ``name`` with verl (idempotent, cheap: nothing heavy is imported).

    * ``RolloutReplicaRegistry.register(name, loader)`` — used by ``LLMServerManager`` to build replicas;
    * ``_ROLLOUT_REGISTRY[(name, "async")]`` — verl 0.9.1 has no public function for the in-worker
      adapter, so the private dict of ``verl.workers.rollout.base`` is extended in place.

    Raises:
        RuntimeError: verl's registries are not where verl 0.9.1 keeps them.
    """
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout import replica as rollout_replica

    registry = getattr(rollout_replica, "RolloutReplicaRegistry", None)
    adapters = getattr(rollout_base, "_ROLLOUT_REGISTRY", None)
    if registry is None or not isinstance(adapters, dict):
        raise RuntimeError(
            "verl's rollout registries moved (expected RolloutReplicaRegistry in verl.workers.rollout.replica and "
            "the dict _ROLLOUT_REGISTRY in verl.workers.rollout.base, as in verl 0.9.1)"
        )
    registry.register(name, _load_replica)
    adapters[(name, "async")] = ADAPTER_FQN


def is_registered(name: str = ROLLOUT_NAME) -> bool:
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    return name in RolloutReplicaRegistry._registry and (name, "async") in rollout_base._ROLLOUT_REGISTRY


__all__ = ["ADAPTER_FQN", "ROLLOUT_NAME", "is_registered", "register"]
