"""Request validation and the batched sampler, without a model."""

from __future__ import annotations

import math

import pytest
import torch

from mgrpo_verl.hf_rollout.sampling import (
    BatchSampler,
    InvalidRequestError,
    SamplingParams,
    parse_sampling_params,
    validate_prompt_ids,
)

V = 50


def parse(raw, prompt_len=5, max_model_len=100, default_max_tokens=16):
    return parse_sampling_params(
        raw, prompt_len=prompt_len, max_model_len=max_model_len, default_max_tokens=default_max_tokens, vocab_size=V
    )


def test_verl_default_params_parse():
    # exactly what verl's agent loop sends (experimental/agent_loop/agent_loop.py)
    p = parse(dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True))
    assert (p.temperature, p.top_p, p.top_k, p.logprobs, p.max_tokens) == (1.0, 1.0, 0, True, 16)
    greedy = parse(dict(temperature=0, top_p=1.0, top_k=-1, logprobs=False))
    assert greedy.greedy and not greedy.logprobs


def test_max_tokens_aliases_and_clamp():
    assert parse({"max_tokens": 7}).max_tokens == 7
    assert parse({"max_new_tokens": 9}).max_tokens == 9
    assert parse({"max_tokens": 1000}, prompt_len=90, max_model_len=100).max_tokens == 10
    assert parse({}, default_max_tokens=50, prompt_len=90, max_model_len=100).max_tokens == 10
    assert parse({"logprobs": 0}).logprobs is False  # vLLM: int logprobs=0 -> falsy, as verl maps it
    assert parse({"logprobs": 3}).logprobs is True


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "finite"),
        ({"temperature": "hot"}, "number"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "integer"),
        ({"min_p": 2.0}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": 4, "max_new_tokens": 5}, "conflicting"),
        ({"min_tokens": 20, "max_tokens": 5}, "min_tokens"),
        ({"n": 2}, "'n' must be 1"),
        ({"stop": ["\n"]}, "stop_token_ids"),
        ({"stop_token_ids": [V]}, "outside the model's vocabulary"),
        ({"stop_token_ids": 3}, "list of token ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"beam_width": 4}, "unsupported sampling param"),
        ({"logit_bias": {1: 2.0}}, "unsupported sampling param"),
    ],
)
def test_bad_sampling_params_raise_clear_errors(raw, match):
    with pytest.raises(InvalidRequestError, match=match):
        parse(raw)


def test_prompt_validation():
    assert validate_prompt_ids([1, 2, 3], vocab_size=V, max_model_len=10) == [1, 2, 3]
    assert validate_prompt_ids(torch.tensor([4, 5]), vocab_size=V, max_model_len=10) == [4, 5]
    with pytest.raises(InvalidRequestError, match="empty"):
        validate_prompt_ids([], vocab_size=V, max_model_len=10)
    with pytest.raises(InvalidRequestError, match="max_model_len=10"):
        validate_prompt_ids(list(range(10)), vocab_size=V, max_model_len=10)
    with pytest.raises(InvalidRequestError, match="outside the model's vocabulary"):
        validate_prompt_ids([1, V], vocab_size=V, max_model_len=10)
    with pytest.raises(InvalidRequestError, match="integers"):
        validate_prompt_ids([1, 2.5], vocab_size=V, max_model_len=10)
    with pytest.raises(InvalidRequestError, match="list of token ids"):
        validate_prompt_ids("hello", vocab_size=V, max_model_len=10)


def _sampler(params, seeds=None, prompts=None, mode="processed_logprobs", seed=0):
    seeds = seeds or [None] * len(params)
    gens = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
    prompts = prompts or [[0]] * len(params)
    return BatchSampler(params, prompts, V, gens, torch.Generator().manual_seed(seed), mode)


def _freq(logits, params, n=20000, seed=0):
    """Empirical distribution of one row sampled n times (n identical rows in one batch)."""
    s = _sampler([params] * n, seed=seed)
    toks, lps = s.sample(logits.expand(n, -1), [None] * n)
    return torch.bincount(toks, minlength=V).float() / n, toks, lps


def test_temperature_matches_softmax_distribution():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1)) * 2
    for temp in (1.0, 0.5, 2.0):
        freq, toks, lps = _freq(logits, SamplingParams(max_tokens=1, temperature=temp))
        expected = (logits[0] / temp).softmax(-1)
        assert (freq - expected).abs().max() < 0.02, temp
        # processed log-probs are log_softmax(logits / T) of the sampled token
        assert torch.allclose(lps, (logits[0] / temp).log_softmax(-1)[toks], atol=1e-5)


def test_greedy_top_k_top_p_min_p():
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(2)) * 3
    order = logits[0].argsort(descending=True)
    freq, toks, _ = _freq(logits, SamplingParams(max_tokens=1, temperature=0.0), n=50)
    assert (toks == order[0]).all()
    freq, _, lps = _freq(logits, SamplingParams(max_tokens=1, top_k=3))
    assert set(torch.nonzero(freq).flatten().tolist()) <= set(order[:3].tolist())
    top3 = logits[0, order[:3]].softmax(-1)
    assert (freq[order[:3]] - top3).abs().max() < 0.02
    probs = logits[0].softmax(-1)[order]
    keep = int((probs.cumsum(0) - probs < 0.6).sum())
    freq, _, _ = _freq(logits, SamplingParams(max_tokens=1, top_p=0.6))
    assert set(torch.nonzero(freq).flatten().tolist()) <= set(order[:keep].tolist())
    freq, _, _ = _freq(logits, SamplingParams(max_tokens=1, min_p=0.5))
    allowed = torch.nonzero(logits[0].softmax(-1) >= 0.5 * logits[0].softmax(-1).max()).flatten().tolist()
    assert set(torch.nonzero(freq).flatten().tolist()) <= set(allowed)


def test_raw_vs_processed_logprobs():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(3))
    p = SamplingParams(max_tokens=1, temperature=0.5, top_k=5)
    toks, processed = _sampler([p] * 4).sample(logits, [None] * 4)
    toks2, raw = _sampler([p] * 4, mode="raw_logprobs").sample(logits, [None] * 4)
    assert torch.equal(toks, toks2)
    assert torch.allclose(raw, logits.log_softmax(-1).gather(-1, toks[:, None]).squeeze(-1), atol=1e-6)
    top = (logits / 0.5).topk(5, dim=-1)
    renorm = top.values.log_softmax(-1)
    expected = torch.stack([renorm[i][top.indices[i] == toks[i]][0] for i in range(4)])
    assert torch.allclose(processed, expected, atol=1e-5)


def test_seeded_rows_are_reproducible_and_independent_of_batch():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(4))
    p = SamplingParams(max_tokens=1, temperature=1.0, seed=7)
    alone = [_sampler([p], seeds=[7], seed=s).sample(logits[1:2], [None])[0].item() for s in range(3)]
    batched = _sampler([SamplingParams(max_tokens=1), p, SamplingParams(max_tokens=1)], seeds=[None, 7, None], seed=9)
    toks, _ = batched.sample(logits, [None] * 3)
    assert alone == [alone[0]] * 3 and toks[1].item() == alone[0]


def test_penalties_and_stop_masks():
    logits = torch.zeros(1, V)
    logits[0, 3] = 5.0
    logits[0, 4] = 4.9
    # token 3 was in the prompt: a strong repetition penalty moves greedy to token 4
    p = SamplingParams(max_tokens=1, temperature=0.0, repetition_penalty=2.0)
    toks, _ = _sampler([p], prompts=[[3]]).sample(logits, [None])
    assert toks.item() == 4
    # min_tokens-style mask forbids tokens 3 and 4
    toks, lps = _sampler([SamplingParams(max_tokens=1, temperature=0.0)]).sample(logits, [[3, 4]])
    assert toks.item() not in (3, 4) and math.isfinite(lps.item())
    # frequency penalty accumulates over generated tokens
    s = _sampler([SamplingParams(max_tokens=3, temperature=0.0, frequency_penalty=2.0)])
    first, _ = s.sample(logits, [None])
    second, _ = s.sample(logits, [None])
    assert (first.item(), second.item()) == (3, 4)
