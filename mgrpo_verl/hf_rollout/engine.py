"""Batched token-in / token-out generation with a Hugging Face causal LM (CPU, or one CUDA device).

:class:`HFGenerationEngine` is synchronous and knows nothing of Ray or verl's server protocol; the Ray
actor in :mod:`mgrpo_verl.hf_rollout.server` runs it on one worker thread and feeds it batches.

One batch = left-padded prompts, one prefill, then one decode step per token with a KV cache
(:class:`transformers.DynamicCache`). Rows that finish (EOS, stop token, ``max_tokens``, abort) leave the
batch at once (``batch_select_indices``), so short answers do not pay for long ones.

Device: every tensor of a batch (inputs, cache, sampling state, random generators) lives on the model's
device; only the sampled token ids and log-probs come back to the host, once per decode step.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mgrpo_verl.hf_rollout.adapters import BASE_ADAPTER, AdapterSet
from mgrpo_verl.hf_rollout.sampling import BatchSampler, SamplingParams

logger = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}

#: Wrapper prefixes that FSDP / torch.compile / activation checkpointing may leave on parameter names.
_STRIP_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower().replace("torch.", "")]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


@dataclass
class GenerationRequest:
    """One prompt to continue. ``aborted`` may be set from another thread; the engine checks it each step."""

    prompt_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    aborted: bool = False
    #: the LoRA adapter to generate with (:meth:`HFGenerationEngine.load_adapter`); ``None``: the base model
    adapter: str | None = None


@dataclass
class GenerationResult:
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_logprobs: list[list[float]] | None = None
    prompt_logprob_ids: list[list[int]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class HFGenerationEngine:
    """A causal LM plus batched sampling. Not thread-safe: call from one thread at a time.

    Args:
        model: a loaded ``transformers`` causal LM (eval mode).
        eos_token_ids: tokens that end a sequence unless a request sets ``ignore_eos``.
        pad_token_id: filler for left padding (never attended to).
        seed: seed of the generator used by requests that carry no ``seed``.
        logprobs_mode: ``processed_logprobs`` or ``raw_logprobs`` (see :mod:`.sampling`).

    The device is the model's (its first parameter's); random generators are created on it, so seeded
    requests are reproducible on one device type (CPU and CUDA random streams differ).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: Iterable[int],
        pad_token_id: int | None = None,
        seed: int = 0,
        logprobs_mode: str = "processed_logprobs",
    ):
        self.model = model.eval()
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids = tuple(sorted({int(t) for t in eos_token_ids}))
        self.pad_token_id = int(pad_token_id) if pad_token_id is not None else 0
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(int(seed))
        self.logprobs_mode = logprobs_mode
        self.dtype = next(model.parameters()).dtype
        self._weights: dict[str, torch.Tensor] | None = None
        self.adapters = AdapterSet(self.model)
        self.stats = {"batches": 0, "sequences": 0, "generated_tokens": 0, "generate_seconds": 0.0}

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        dtype: str | torch.dtype | None = "float32",
        attn_implementation: str = "sdpa",
        eos_token_ids: Iterable[int] | None = None,
        pad_token_id: int | None = None,
        seed: int = 0,
        logprobs_mode: str = "processed_logprobs",
        trust_remote_code: bool = False,
        device: str | torch.device = "cpu",
    ) -> HFGenerationEngine:
        """Load ``path`` in ``dtype`` onto ``device`` (``cpu``, ``cuda`` or ``cuda:<i>``)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=resolve_dtype(dtype),
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )
        if torch.device(device).type != "cpu":
            model = model.to(device)
        if eos_token_ids is None:
            eos_token_ids = _model_eos_ids(model)
        if pad_token_id is None:
            pad_token_id = getattr(model.config, "pad_token_id", None)
        return cls(model, eos_token_ids, pad_token_id=pad_token_id, seed=seed, logprobs_mode=logprobs_mode)

    def _named_tensors(self) -> dict[str, torch.Tensor]:
        if self._weights is None:
            named = dict(self.model.named_parameters(remove_duplicate=False))
            for name, buf in self.model.named_buffers(remove_duplicate=False):
                named.setdefault(name, buf)
            self._weights = named
        return self._weights

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Copy ``(name, tensor)`` pairs into the model in place (dtype cast as needed).

        Names are Hugging Face parameter names (what verl's ``get_per_tensor_param`` yields); FSDP /
        compile wrapper prefixes are stripped.

        Returns:
            ``{"loaded": [...names...], "unknown": [...names...], "bytes": int}``.

        Raises:
            ValueError: a tensor whose shape differs from the model's parameter.
        """
        if self.adapters.names:
            raise ValueError(
                f"this engine serves LoRA adapters {list(self.adapters.names)} on a base model shared by them; a full "
                f"weight update would change every adapter's base: sync adapters only "
                f"(actor_rollout_ref.model.lora.merge=false)"
            )
        named = self._named_tensors()
        loaded, unknown, nbytes = [], [], 0
        for name, tensor in weights:
            key = name
            while key not in named:
                for prefix in _STRIP_PREFIXES:
                    if key.startswith(prefix):
                        key = key[len(prefix) :]
                        break
                else:
                    break
            target = named.get(key)
            if target is None:
                unknown.append(name)
                continue
            if hasattr(tensor, "full_tensor"):  # a DTensor that slipped through
                tensor = tensor.full_tensor()
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"weight {name!r}: shape {tuple(tensor.shape)} does not match the rollout model's "
                    f"{tuple(target.shape)}"
                )
            target.copy_(tensor.detach().to(device=target.device))
            loaded.append(key)
            nbytes += tensor.numel() * tensor.element_size()
        return {"loaded": loaded, "unknown": unknown, "bytes": nbytes}

    @torch.no_grad()
    def load_adapter(self, name: str, peft_config: dict, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Add LoRA adapter ``name`` on the base model (first call) and load its tensors (every call); requests
        with ``adapter=name`` are then generated with it. The base weights are not written. See
        :class:`~mgrpo_verl.hf_rollout.adapters.AdapterSet` (names, errors)."""
        return self.adapters.load(name, peft_config, ((k, t.to(device=self.device)) for k, t in weights))

    def state_dict_names(self) -> list[str]:
        return list(self._named_tensors())

    # ------------------------------------------------------------------ generation

    def make_generator(self, seed: int | None) -> torch.Generator | None:
        return None if seed is None else torch.Generator(device=self.device).manual_seed(int(seed))

    @torch.inference_mode()
    def generate_batch(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate for every request together; returns one result per request, in order."""
        from transformers import DynamicCache

        start = time.perf_counter()
        n = len(requests)
        if n == 0:
            return []
        lens = [len(r.prompt_ids) for r in requests]
        width = max(lens)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(requests):
            input_ids[i, width - lens[i] :] = torch.as_tensor(r.prompt_ids, dtype=torch.long)
            attention_mask[i, width - lens[i] :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
        if self.device.type != "cpu":
            input_ids = input_ids.to(self.device)
            attention_mask = attention_mask.to(self.device)
            position_ids = position_ids.to(self.device)

        want_prompt_lp = any(r.params.prompt_logprobs is not None for r in requests)
        unknown = sorted({r.adapter for r in requests
                          if r.adapter is not None and r.adapter not in self.adapters.names})
        if unknown:
            raise ValueError(f"unknown LoRA adapter(s) {unknown}; loaded: {list(self.adapters.names)}")
        # once adapters exist, peft's LoRA layers sit inside the base model's modules: every forward names each
        # row's adapter (BASE_ADAPTER: none), else peft would apply its active adapter to every row
        has_adapters = self.adapters.model is not None
        row_adapters = [r.adapter or BASE_ADAPTER for r in requests] if has_adapters else None
        model = self.adapters.model if has_adapters else self.model

        def forward(names, **kw):
            return model(**kw, adapter_names=names) if names is not None else model(**kw)

        cache = DynamicCache(config=self.model.config)
        out = forward(
            row_adapters,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=0 if want_prompt_lp else 1,
        )
        results: list[GenerationResult | None] = [None] * n
        prompt_lp: dict[int, tuple[list[list[float]], list[list[int]]]] = {}
        if want_prompt_lp:
            for i, r in enumerate(requests):
                if r.params.prompt_logprobs is not None:
                    prompt_lp[i] = self._prompt_logprobs(
                        out.logits[i, width - lens[i] :], r.prompt_ids, r.params.prompt_logprobs
                    )
        logits = out.logits[:, -1, :]
        del out

        generators = [self.make_generator(r.params.seed) for r in requests]
        sampler = BatchSampler(
            [r.params for r in requests],
            [r.prompt_ids for r in requests],
            self.vocab_size,
            generators,
            self.generator,
            self.logprobs_mode,
            device=self.device,
        )
        rows = list(range(n))  # request index of each live batch row
        tokens_out: list[list[int]] = [[] for _ in range(n)]
        logprobs_out: list[list[float]] = [[] for _ in range(n)]
        stop_sets = [
            frozenset(r.params.stop_token_ids) | (frozenset() if r.params.ignore_eos else frozenset(self.eos_token_ids))
            for r in requests
        ]
        last_pos = position_ids[:, -1].clone()
        generated = 0

        while True:
            stop_masks = [
                sorted(stop_sets[i]) if len(tokens_out[i]) < requests[i].params.min_tokens and stop_sets[i] else None
                for i in rows
            ]
            next_tokens, next_lp = sampler.sample(logits, stop_masks)
            toks = next_tokens.tolist()
            lps = next_lp.tolist()
            keep: list[int] = []
            for j, i in enumerate(rows):
                req = requests[i]
                if req.aborted:
                    results[i] = self._result(req, tokens_out[i], logprobs_out[i], "abort", prompt_lp.get(i))
                    continue
                tokens_out[i].append(toks[j])
                logprobs_out[i].append(lps[j])
                generated += 1
                if toks[j] in stop_sets[i]:
                    results[i] = self._result(req, tokens_out[i], logprobs_out[i], "stop", prompt_lp.get(i))
                elif len(tokens_out[i]) >= req.params.max_tokens:
                    results[i] = self._result(req, tokens_out[i], logprobs_out[i], "length", prompt_lp.get(i))
                else:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(rows):
                keep_t = torch.tensor(keep, dtype=torch.long, device=self.device)
                cache.batch_select_indices(keep_t)
                attention_mask = attention_mask[keep_t]
                last_pos = last_pos[keep_t]
                next_tokens = next_tokens[keep_t]
                sampler.select(keep_t)
                rows = [rows[j] for j in keep]
                if row_adapters is not None:
                    row_adapters = [row_adapters[j] for j in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(rows), 1))], dim=1)
            last_pos = last_pos + 1
            out = forward(
                row_adapters,
                input_ids=next_tokens[:, None],
                attention_mask=attention_mask,
                position_ids=last_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
            del out

        self.stats["batches"] += 1
        self.stats["sequences"] += n
        self.stats["generated_tokens"] += generated
        self.stats["generate_seconds"] += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def _result(self, req, tokens, logprobs, reason, prompt_lp) -> GenerationResult:
        return GenerationResult(
            token_ids=list(tokens),
            log_probs=list(logprobs) if req.params.logprobs else None,
            finish_reason=reason,
            prompt_logprobs=prompt_lp[0] if prompt_lp else None,
            prompt_logprob_ids=prompt_lp[1] if prompt_lp else None,
        )

    def _prompt_logprobs(self, logits: torch.Tensor, prompt: list[int], k: int):
        """vLLM layout (see verl's ``extract_prompt_logprobs``): entry ``t`` scores prompt token ``t + 1``;
        a dummy entry pads the end so there is one entry per prompt token."""
        lp = logits[:-1].float().log_softmax(dim=-1)  # position t predicts token t+1
        target = torch.as_tensor(prompt[1:], dtype=torch.long, device=logits.device)
        if k == 0:
            vals = lp.gather(-1, target[:, None])
            values, ids = vals.tolist(), target[:, None].tolist()
        else:
            top = lp.topk(k, dim=-1)
            values, ids = top.values.tolist(), top.indices.tolist()
        width = max(k, 1)
        values.append([0.0] * width)
        ids.append([0] * width)
        return values, ids


def weights_fingerprint(model: torch.nn.Module) -> str:
    """16 hex digits of sha256 over every parameter's name and float32 bytes, in name order.

    Equal for two models exactly when their weights are bit-identical (up to hash collisions), whichever
    process or checkpoint they come from; used to show that the actor's weights reached the rollout.
    """
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def _model_eos_ids(model) -> list[int]:
    ids: set[int] = set()
    for cfg in (getattr(model, "generation_config", None), model.config):
        eos = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if eos is None:
            continue
        ids.update([eos] if isinstance(eos, int) else list(eos))
    return sorted(ids)
