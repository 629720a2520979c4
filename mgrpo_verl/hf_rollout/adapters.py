"""Several agents' LoRA adapters on one base model in one HF rollout engine (docs/lora.md).

Differs from verl, whose rollout engines serve at most one adapter each (vLLM's ``LoRARequest`` with a
fixed name and id per engine, SGLang likewise): here one :class:`~mgrpo_verl.hf_rollout.engine.HFGenerationEngine`
holds the base weights once and any number of named adapters, and each request names the adapter it is
generated with (``lora_name``). A batch may mix adapters: peft's mixed-adapter forward
(``adapter_names=[...]``, one name per row) applies to each row only its own adapter's ``B @ A`` delta, so
rows of different agents never see each other's adapter, and the base weights are never written.

Pieces:

* :class:`AdapterSet`: the peft wrapper around the engine's model, adapters added / reloaded by name;
* :func:`base_fingerprint`: a fingerprint of the base weights alone, equal to
  :func:`~mgrpo_verl.hf_rollout.engine.weights_fingerprint` of the plain model (so "the base is bit-identical"
  can be checked against the model folder);
* :class:`AdapterLLMServerClient`: verl's ``LLMServerClient`` whose every request names one adapter (the
  client of one agent on a shared engine).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from verl.workers.rollout.llm_server import LLMServerClient

#: peft's name for "no adapter" in a mixed-adapter batch.
BASE_ADAPTER = "__base__"

#: Keys of a peft ``LoraConfig.to_dict()`` that change what an adapter computes; two pushes of one adapter
#: must agree on them (the tensors' shapes would not catch a changed ``lora_alpha``).
_CONFIG_KEYS = ("r", "lora_alpha", "target_modules", "exclude_modules", "use_rslora", "use_dora", "bias",
                "fan_in_fan_out", "layers_to_transform", "modules_to_save")


def _normalise(value: Any) -> Any:
    if isinstance(value, (set, frozenset, list, tuple)):
        return sorted(str(v) for v in value)
    return value


def lora_signature(peft_config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a LoRA config dict that defines the adapter's computation (:data:`_CONFIG_KEYS`)."""
    return {k: _normalise(peft_config.get(k)) for k in _CONFIG_KEYS}


def lora_config(peft_config: Mapping[str, Any]):
    """A peft ``LoraConfig`` from the dict verl's engine sends (``LoraConfig.to_dict()``), for inference."""
    from peft import LoraConfig

    fields = set(LoraConfig.__dataclass_fields__)
    kwargs = {k: v for k, v in dict(peft_config).items() if k in fields and k not in ("peft_type", "task_type")}
    kwargs["inference_mode"] = True
    if isinstance(kwargs.get("target_modules"), (set, frozenset)):
        kwargs["target_modules"] = sorted(kwargs["target_modules"])
    peft_type = str(peft_config.get("peft_type", "LORA")).split(".")[-1].upper()
    if peft_type != "LORA":
        raise ValueError(f"the HF rollout serves LoRA adapters only, got peft_type {peft_config.get('peft_type')!r}")
    return LoraConfig(task_type="CAUSAL_LM", **kwargs)


def _base_name(name: str) -> str:
    """A parameter name of the peft-wrapped model as the plain model names it."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    return name.replace(".base_layer.", ".")


def base_fingerprint(model: torch.nn.Module) -> str:
    """16 hex digits of sha256 over the base weights (LoRA parameters left out, names as the plain model has
    them): equal to ``weights_fingerprint`` of the unwrapped model with the same base weights."""
    digest = hashlib.sha256()
    params = {_base_name(n): p for n, p in model.named_parameters() if "lora_" not in n}
    for name in sorted(params):
        digest.update(name.encode())
        digest.update(params[name].detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def tensors_fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """16 hex digits of sha256 over ``(name, tensor)`` pairs in name order (float32 bytes): an adapter as
    pushed, to show that a resumed run serves exactly the adapter its checkpoint saved."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class AdapterSet:
    """Named LoRA adapters on one base model (peft), for inference.

    The first :meth:`load` wraps ``model`` with peft (the wrapper shares the base tensors; nothing is copied);
    every adapter keeps the config it was first loaded with, and a later push with another config is refused
    (its computation would silently change). ``names`` excludes :data:`BASE_ADAPTER`.
    """

    def __init__(self, model: torch.nn.Module):
        self.base = model
        self.model: Any = None  # the PeftModel, after the first load
        self.signatures: dict[str, dict[str, Any]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.signatures)

    def load(self, name: str, peft_config: Mapping[str, Any],
             named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict:
        """Add adapter ``name`` (first time) and copy its tensors in; returns ``{"loaded": n, "bytes": b}``.

        Names are those of ``peft.get_peft_model_state_dict`` (what verl's engine yields with
        ``base_sync_done=True``), e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``.

        Raises:
            ValueError: a bad name, a tensor name the adapter lacks, a missing tensor, a changed config.
        """
        from peft import get_peft_model, set_peft_model_state_dict

        if not name or name == BASE_ADAPTER or "lora_" in name:
            raise ValueError(f"adapter name {name!r} is not allowed (empty, {BASE_ADAPTER!r}, or containing 'lora_')")
        signature = lora_signature(peft_config)
        if name in self.signatures:
            if self.signatures[name] != signature:
                changed = {k: (self.signatures[name][k], v) for k, v in signature.items()
                           if self.signatures[name][k] != v}
                raise ValueError(f"adapter {name!r} was loaded with another LoRA config; changed (old, new): {changed}")
        else:
            config = lora_config(peft_config)
            if self.model is None:
                self.model = get_peft_model(self.base, config, adapter_name=name)
            else:
                self.model.add_adapter(name, config)
            self.model.eval()
            self.signatures[name] = signature
        state = {}
        for key, tensor in named_tensors:
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            state[key] = tensor.detach()
        if not state:
            raise ValueError(f"adapter {name!r}: no tensors received")
        expected = {k for k in self.model.state_dict() if "lora_" in k and f".{name}." in k}
        result = set_peft_model_state_dict(self.model, state, adapter_name=name)
        unexpected = [k for k in result.unexpected_keys if "lora_" in k]
        if unexpected:
            raise ValueError(f"adapter {name!r}: {len(unexpected)} tensor(s) match no LoRA parameter, "
                             f"e.g. {unexpected[:3]}")
        missing = sorted(k for k in result.missing_keys if k in expected)
        if missing:
            raise ValueError(f"adapter {name!r}: {len(missing)} LoRA parameter(s) received no tensor, "
                             f"e.g. {missing[:3]}")
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        return {"loaded": len(state), "bytes": nbytes}


class AdapterLLMServerClient(LLMServerClient):
    """verl's ``LLMServerClient`` whose requests are generated with one named adapter (``lora_name``) of a
    shared HF engine: the client of one LoRA agent. verl's client forwards extra ``generate`` keywords to the
    server actor, whose ``generate`` takes ``lora_name``; everything else (load balancing, sticky sessions) is
    verl's."""

    def __init__(self, config, load_balancer_handle=None, lora_name: str | None = None, **kwargs):
        super().__init__(config=config, load_balancer_handle=load_balancer_handle, **kwargs)
        if not lora_name:
            raise ValueError("AdapterLLMServerClient needs the adapter's name (lora_name)")
        self.lora_name = lora_name

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        kwargs["lora_name"] = self.lora_name
        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
