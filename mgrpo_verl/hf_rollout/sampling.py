"""Request validation and token sampling for the Hugging Face CPU rollout.

Semantics follow vLLM's (what verl's agent loops are written against):

* ``temperature == 0`` is greedy (argmax after penalties); ``top_k`` of ``-1`` or ``0`` and ``top_p == 1``
  disable those filters.
* penalties: ``repetition_penalty`` over prompt and output tokens (divide positive logits, multiply
  negative ones); ``presence_penalty`` / ``frequency_penalty`` over output tokens only.
* processing order: penalties -> temperature -> min_p -> top_k -> top_p -> sample.
* log-probs (``logprobs_mode``): ``processed_logprobs`` (vLLM's and verl's default) are the log-softmax of
  the logits after that processing, i.e. ``log_softmax(logits / T)`` when no filter is active, which is
  exactly what verl's actor computes; ``raw_logprobs`` are ``log_softmax`` of the model's raw logits.
* the EOS / stop token that ends a sequence is part of the returned ``token_ids`` (as with vLLM).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")

#: Accepted and ignored: they only concern detokenised text, and this server returns token ids.
_IGNORED_KEYS = frozenset(
    {"skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "detokenize"}
)
_KNOWN_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "max_tokens",
        "max_new_tokens",
        "min_tokens",
        "stop_token_ids",
        "stop",
        "ignore_eos",
        "logprobs",
        "prompt_logprobs",
        "seed",
        "n",
    }
    | _IGNORED_KEYS
)


class InvalidRequestError(ValueError):
    """A generation request that cannot be served as given (bad prompt or sampling parameter)."""


@dataclass(frozen=True)
class SamplingParams:
    """Validated per-request sampling parameters (see :func:`parse_sampling_params`)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    prompt_logprobs: int | None = None
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_sort(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _number(
    name: str, value: Any, *, low: float | None = None, high: float | None = None, low_open: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"sampling param {name!r} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidRequestError(f"sampling param {name!r} must be finite, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise InvalidRequestError(f"sampling param {name!r} must be {bound}, got {value!r}")
    if high is not None and value > high:
        raise InvalidRequestError(f"sampling param {name!r} must be <= {high}, got {value!r}")
    return value


def _integer(name: str, value: Any, *, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        # numpy integers are fine
        if hasattr(value, "__index__") and not isinstance(value, bool | float):
            value = int(value.__index__())
        else:
            raise InvalidRequestError(f"sampling param {name!r} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise InvalidRequestError(f"sampling param {name!r} must be >= {low}, got {value!r}")
    return int(value)


def validate_prompt_ids(prompt_ids: Any, *, vocab_size: int, max_model_len: int) -> list[int]:
    """Return ``prompt_ids`` as a list of ints, or raise :class:`InvalidRequestError`."""
    ids = prompt_ids
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # a BatchEncoding
        ids = ids["input_ids"] if isinstance(ids, Mapping) else ids.input_ids
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, list | tuple) and len(ids) == 1 and isinstance(ids[0], list | tuple):
        ids = ids[0]
    if not isinstance(ids, list | tuple):
        raise InvalidRequestError(f"prompt_ids must be a list of token ids, got {type(prompt_ids).__name__}")
    if len(ids) == 0:
        raise InvalidRequestError("prompt_ids is empty: a request needs at least one prompt token")
    out: list[int] = []
    for tok in ids:
        if isinstance(tok, bool) or not hasattr(tok, "__index__"):
            raise InvalidRequestError(f"prompt_ids must contain integers, got {tok!r}")
        tok = int(tok.__index__())
        if not 0 <= tok < vocab_size:
            raise InvalidRequestError(f"prompt token id {tok} is outside the model's vocabulary [0, {vocab_size})")
        out.append(tok)
    if len(out) >= max_model_len:
        raise InvalidRequestError(
            f"prompt length ({len(out)}) leaves no room to generate within the maximum context length "
            f"max_model_len={max_model_len}; need at least 1 token of headroom"
        )
    return out


def parse_sampling_params(
    raw: Mapping[str, Any] | None,
    *,
    prompt_len: int,
    max_model_len: int,
    default_max_tokens: int,
    vocab_size: int,
    default_seed: int | None = None,
) -> SamplingParams:
    """Validate a verl/vLLM-style ``sampling_params`` dict.

    ``max_tokens`` (or sglang's ``max_new_tokens``) defaults to ``default_max_tokens`` and is clamped to the
    room left in the context (``max_model_len - prompt_len``), as verl's vLLM server does.

    Raises:
        InvalidRequestError: unknown keys, wrong types or out-of-range values, with the reason.
    """
    raw = dict(raw or {})
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise InvalidRequestError(
            f"unsupported sampling param(s) {unknown}; the HF rollout supports {sorted(_KNOWN_KEYS)}"
        )
    get = {k: v for k, v in raw.items() if v is not None}

    temperature = _number("temperature", get.get("temperature", 1.0), low=0.0)
    top_p = _number("top_p", get.get("top_p", 1.0), low=0.0, high=1.0, low_open=True)
    top_k = _integer("top_k", get.get("top_k", -1))
    if top_k < -1:
        raise InvalidRequestError(f"sampling param 'top_k' must be -1 (disabled), 0 (disabled) or >= 1, got {top_k}")
    top_k = max(top_k, 0)
    min_p = _number("min_p", get.get("min_p", 0.0), low=0.0, high=1.0)
    repetition_penalty = _number("repetition_penalty", get.get("repetition_penalty", 1.0), low=0.0, low_open=True)
    presence_penalty = _number("presence_penalty", get.get("presence_penalty", 0.0), low=-2.0, high=2.0)
    frequency_penalty = _number("frequency_penalty", get.get("frequency_penalty", 0.0), low=-2.0, high=2.0)

    n = _integer("n", get.get("n", 1))
    if n != 1:
        raise InvalidRequestError(f"sampling param 'n' must be 1 (send one request per sample), got {n}")
    stop = get.get("stop")
    if stop:
        raise InvalidRequestError(
            f"stop strings are not supported by the HF rollout (token ids in, token ids out), got stop={stop!r}; "
            "pass 'stop_token_ids' instead"
        )

    room = max_model_len - prompt_len
    if room < 1:
        raise InvalidRequestError(
            f"prompt length ({prompt_len}) leaves no room to generate within max_model_len={max_model_len}"
        )
    if "max_tokens" in get and "max_new_tokens" in get and get["max_tokens"] != get["max_new_tokens"]:
        raise InvalidRequestError(
            f"conflicting 'max_tokens'={get['max_tokens']!r} and 'max_new_tokens'={get['max_new_tokens']!r}"
        )
    if "max_tokens" in get:
        max_tokens = _integer("max_tokens", get["max_tokens"], low=1)
    elif "max_new_tokens" in get:
        max_tokens = _integer("max_new_tokens", get["max_new_tokens"], low=1)
    else:
        max_tokens = max(1, int(default_max_tokens))
    max_tokens = min(max_tokens, room)
    min_tokens = _integer("min_tokens", get.get("min_tokens", 0), low=0)
    if min_tokens > max_tokens:
        raise InvalidRequestError(f"'min_tokens' ({min_tokens}) is larger than max_tokens ({max_tokens})")

    stop_token_ids = get.get("stop_token_ids", ())
    if isinstance(stop_token_ids, int | str | bytes) or not isinstance(stop_token_ids, Sequence | torch.Tensor):
        if hasattr(stop_token_ids, "tolist"):
            stop_token_ids = stop_token_ids.tolist()
        else:
            raise InvalidRequestError(f"'stop_token_ids' must be a list of token ids, got {stop_token_ids!r}")
    stops = []
    for tok in list(stop_token_ids):
        tok = _integer("stop_token_ids[]", tok)
        if not 0 <= tok < vocab_size:
            raise InvalidRequestError(f"stop token id {tok} is outside the model's vocabulary [0, {vocab_size})")
        stops.append(tok)

    ignore_eos = get.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise InvalidRequestError(f"'ignore_eos' must be a bool, got {ignore_eos!r}")
    logprobs = get.get("logprobs", False)
    if isinstance(logprobs, bool):
        want_logprobs = logprobs
    else:
        # vLLM: an int asks for that many top log-probs besides the sampled one; verl's vLLM server maps
        # truthy -> 0 (sampled token only). We always return the sampled token's log-prob.
        want_logprobs = _integer("logprobs", logprobs, low=0) > 0
    prompt_logprobs = get.get("prompt_logprobs")
    if prompt_logprobs is not None:
        prompt_logprobs = _integer("prompt_logprobs", prompt_logprobs, low=0)
        if prompt_logprobs > vocab_size:
            raise InvalidRequestError(f"'prompt_logprobs' ({prompt_logprobs}) exceeds the vocabulary size")
    seed = get.get("seed", default_seed)
    if seed is not None:
        seed = _integer("seed", seed)

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        min_tokens=min_tokens,
        stop_token_ids=tuple(stops),
        ignore_eos=ignore_eos,
        logprobs=want_logprobs,
        prompt_logprobs=prompt_logprobs,
        seed=seed,
    )


# --------------------------------------------------------------------------------------------------
# batched logits processing
# --------------------------------------------------------------------------------------------------


class BatchSampler:
    """Per-row sampling state for one batch of requests (rows may leave as they finish)."""

    def __init__(
        self,
        params: Sequence[SamplingParams],
        prompts: Sequence[Sequence[int]],
        vocab_size: int,
        generators: Sequence[torch.Generator | None],
        default_generator: torch.Generator,
        logprobs_mode: str = "processed_logprobs",
        device: torch.device | str = "cpu",
    ):
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        self.params = list(params)
        self.vocab_size = vocab_size
        self.generators = list(generators)
        self.default_generator = default_generator
        self.logprobs_mode = logprobs_mode
        self.device = dev = torch.device(device)
        n = len(self.params)
        self.temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in self.params], device=dev)
        self.greedy = torch.tensor([p.greedy for p in self.params], device=dev)
        self.all_greedy = all(p.greedy for p in self.params)  # from the host values: no device sync
        self.any_greedy = any(p.greedy for p in self.params)
        self.top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab_size for p in self.params], device=dev)
        self.top_p = torch.tensor([p.top_p for p in self.params], device=dev)
        self.min_p = torch.tensor([p.min_p for p in self.params], device=dev)
        self.needs_sort = any(p.needs_sort for p in self.params)
        self.needs_min_p = any(p.min_p > 0 for p in self.params)
        self.needs_temperature = any(p.temperature not in (0.0, 1.0) for p in self.params)
        self.needs_penalties = any(p.needs_penalties for p in self.params)
        if self.needs_penalties:
            self.rep = torch.tensor([p.repetition_penalty for p in self.params], device=dev)
            self.presence = torch.tensor([p.presence_penalty for p in self.params], device=dev)
            self.frequency = torch.tensor([p.frequency_penalty for p in self.params], device=dev)
            self.seen = torch.zeros(n, vocab_size, dtype=torch.bool, device=dev)
            for i, prompt in enumerate(prompts):
                self.seen[i, torch.as_tensor(list(prompt), dtype=torch.long, device=dev)] = True
            self.counts = torch.zeros(n, vocab_size, dtype=torch.float32, device=dev)
        self.seeded = [i for i, g in enumerate(self.generators) if g is not None]

    def select(self, keep: torch.Tensor) -> None:
        """Keep only rows ``keep`` (indices into the current rows)."""
        idx = keep.tolist()
        self.params = [self.params[i] for i in idx]
        self.generators = [self.generators[i] for i in idx]
        self.seeded = [j for j, g in enumerate(self.generators) if g is not None]
        for name in ("temperature", "greedy", "top_k", "top_p", "min_p"):
            setattr(self, name, getattr(self, name)[keep])
        if self.needs_penalties:
            for name in ("rep", "presence", "frequency", "seen", "counts"):
                setattr(self, name, getattr(self, name)[keep])

    def _mask_stops(self, logits: torch.Tensor, stop_masks: list[list[int] | None]) -> torch.Tensor:
        rows = [(i, ids) for i, ids in enumerate(stop_masks) if ids]
        if rows:
            logits = logits.clone()
            for i, ids in rows:
                logits[i, ids] = float("-inf")
        return logits

    def sample(self, logits: torch.Tensor, stop_masks: list[list[int] | None]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick one token per row; return ``(tokens, logprobs)``, both of shape ``(rows,)``.

        ``stop_masks[i]`` lists the tokens row ``i`` may not emit yet (EOS/stop tokens before ``min_tokens``).
        """
        raw = logits.float()
        x = raw
        if self.needs_penalties:
            x = torch.where(self.seen, torch.where(x > 0, x / self.rep[:, None], x * self.rep[:, None]), x)
            x = x - self.frequency[:, None] * self.counts - self.presence[:, None] * (self.counts > 0)
        x = self._mask_stops(x, stop_masks)

        if self.all_greedy:
            processed = x
            tokens = x.argmax(dim=-1)
        else:
            processed = x / self.temperature[:, None] if self.needs_temperature else x
            if self.needs_min_p:
                probs = processed.softmax(dim=-1)
                thresh = self.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
                processed = processed.masked_fill(probs < thresh, float("-inf"))
            if self.needs_sort:
                sorted_logits, sorted_idx = processed.sort(dim=-1, descending=True)
                ranks = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device)
                sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= self.top_k[:, None], float("-inf"))
                sorted_probs = sorted_logits.softmax(dim=-1)
                exclusive_cum = sorted_probs.cumsum(dim=-1) - sorted_probs
                sorted_logits = sorted_logits.masked_fill(exclusive_cum > self.top_p[:, None], float("-inf"))
                processed = torch.empty_like(processed).scatter_(-1, sorted_idx, sorted_logits)
            if self.any_greedy:
                # greedy rows: no temperature / filters (vLLM semantics)
                processed = torch.where(self.greedy[:, None], x, processed)
            processed_lp = processed.log_softmax(dim=-1)
            # exponential race: argmax(p / E), E ~ Exp(1) = -log(U), is a draw from p (as in vLLM); uniform
            # draws + log are ~4x cheaper on CPU than Tensor.exponential_
            uniform = torch.empty_like(processed_lp)
            unseeded = [i for i in range(len(self.generators)) if self.generators[i] is None]
            if len(unseeded) == len(self.generators):
                uniform.uniform_(generator=self.default_generator)
            else:
                if unseeded:
                    idx = torch.tensor(unseeded, device=uniform.device)
                    uniform[idx] = torch.rand(
                        len(unseeded), uniform.shape[-1], generator=self.default_generator, device=uniform.device
                    )
                for i in self.seeded:
                    uniform[i].uniform_(generator=self.generators[i])
            noise = uniform.log_().neg_()
            sampled = (processed_lp.exp() / noise).argmax(dim=-1)
            tokens = torch.where(self.greedy, x.argmax(dim=-1), sampled) if self.any_greedy else sampled

        if self.logprobs_mode == "raw_logprobs":
            logprobs = raw.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        elif self.all_greedy:
            logprobs = processed.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        else:
            logprobs = processed_lp.gather(-1, tokens[:, None]).squeeze(-1)

        if self.needs_penalties:
            rows = torch.arange(tokens.shape[0], device=tokens.device)
            self.seen[rows, tokens] = True
            self.counts[rows, tokens] += 1
        return tokens, logprobs
