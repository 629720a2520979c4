"""The batched HF generation engine on the tiny model, in process (no Ray)."""

from __future__ import annotations

import pytest
import torch

from mgrpo_verl.hf_rollout.engine import GenerationRequest, HFGenerationEngine
from mgrpo_verl.hf_rollout.sampling import parse_sampling_params

PROMPTS = [
    "What is 12 + 34?",
    "Alice has 3 apples.",
    "def add(a, b):\n    return",
    "x",
    "The quick brown fox jumps over the lazy dog and then",
]


def req(engine, ids, **params) -> GenerationRequest:
    sp = parse_sampling_params(
        params, prompt_len=len(ids), max_model_len=4096, default_max_tokens=16, vocab_size=engine.vocab_size
    )
    return GenerationRequest(prompt_ids=list(ids), params=sp)


def forward_logprobs(model, prompt, response, temperature=1.0):
    """log p(response | prompt) per token from one plain forward pass (what verl's actor computes)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    logits = logits[len(prompt) - 1 : -1]
    if temperature > 0:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(p) for p in PROMPTS]


def test_greedy_is_argmax_and_batching_does_not_change_it(engine, prompts):
    batch = engine.generate_batch([req(engine, p, temperature=0, max_tokens=12, ignore_eos=True) for p in prompts])
    for p, r in zip(prompts, batch, strict=True):
        assert len(r.token_ids) == 12 and r.finish_reason == "length"
        # step-by-step argmax with full forward passes (no cache, no padding)
        seq = list(p)
        with torch.no_grad():
            for _ in range(12):
                seq.append(int(engine.model(torch.tensor([seq])).logits[0, -1].argmax()))
        assert r.token_ids == seq[len(p) :]
        single = engine.generate_batch([req(engine, p, temperature=0, max_tokens=12, ignore_eos=True)])[0]
        assert single.token_ids == r.token_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_forward_pass(engine, prompts, temperature):
    batch = engine.generate_batch(
        [req(engine, p, temperature=temperature, max_tokens=16, logprobs=True, seed=i) for i, p in enumerate(prompts)]
    )
    for p, r in zip(prompts, batch, strict=True):
        ref = forward_logprobs(engine.model, p, r.token_ids, temperature)
        assert torch.allclose(torch.tensor(r.log_probs), ref, atol=1e-4), (r.log_probs, ref.tolist())


def test_no_logprobs_unless_asked(engine, prompts):
    r = engine.generate_batch([req(engine, prompts[0], max_tokens=3)])[0]
    assert r.log_probs is None and len(r.token_ids) <= 3


def test_max_tokens_and_stop_tokens(engine, prompts):
    p = prompts[1]
    ref = engine.generate_batch([req(engine, p, temperature=0, max_tokens=10, ignore_eos=True)])[0].token_ids
    for n in (1, 4):
        r = engine.generate_batch([req(engine, p, temperature=0, max_tokens=n, ignore_eos=True)])[0]
        assert r.token_ids == ref[:n] and r.finish_reason == "length"
    stop = ref[5]
    first = ref.index(stop)
    r = engine.generate_batch([req(engine, p, temperature=0, max_tokens=10, stop_token_ids=[stop], ignore_eos=True)])[0]
    assert r.token_ids == ref[: first + 1] and r.finish_reason == "stop"  # the stop token is included
    # min_tokens forbids stopping early
    r = engine.generate_batch(
        [req(engine, p, temperature=0, max_tokens=10, min_tokens=first + 2, stop_token_ids=[stop], ignore_eos=True)]
    )[0]
    assert len(r.token_ids) >= first + 2 and stop not in r.token_ids[: first + 2]


def test_eos_ends_sequence_unless_ignore_eos(engine, prompts):
    eos = engine.eos_token_ids[0]
    saved = engine.model.lm_head.bias if hasattr(engine.model.lm_head, "bias") else None
    assert saved is None
    # make EOS the most likely token after a few steps by forcing it through the stop-set path:
    ref = engine.generate_batch([req(engine, prompts[0], temperature=0, max_tokens=8, ignore_eos=True)])[0].token_ids
    engine_eos = HFGenerationEngine(engine.model, eos_token_ids=[ref[2]], pad_token_id=0)
    r = engine_eos.generate_batch([req(engine_eos, prompts[0], temperature=0, max_tokens=8)])[0]
    assert r.token_ids == ref[: ref.index(ref[2]) + 1] and r.finish_reason == "stop"
    r = engine_eos.generate_batch([req(engine_eos, prompts[0], temperature=0, max_tokens=8, ignore_eos=True)])[0]
    assert r.token_ids == ref and r.finish_reason == "length"
    assert eos in engine.eos_token_ids


def test_seeded_sampling_is_reproducible_and_batch_independent(engine, prompts):
    alone = engine.generate_batch([req(engine, prompts[2], max_tokens=12, seed=123, ignore_eos=True)])[0]
    mixed = engine.generate_batch(
        [req(engine, p, max_tokens=12, ignore_eos=True) for p in prompts[:2]]
        + [req(engine, prompts[2], max_tokens=12, seed=123, ignore_eos=True)]
    )
    assert mixed[2].token_ids == alone.token_ids
    other = engine.generate_batch([req(engine, prompts[2], max_tokens=12, seed=124, ignore_eos=True)])[0]
    assert other.token_ids != alone.token_ids


def test_temperature_changes_distribution(engine, prompts):
    # (the exact law, softmax(logits / T), is checked on the sampler in test_sampling.py)
    p = prompts[0]
    n = 64
    greedy = engine.generate_batch([req(engine, p, temperature=0, max_tokens=1)])[0].token_ids[0]
    hot = engine.generate_batch([req(engine, p, temperature=1.0, max_tokens=1) for _ in range(n)])
    cold = engine.generate_batch([req(engine, p, temperature=1e-4, max_tokens=1) for _ in range(n)])
    assert len({r.token_ids[0] for r in hot}) > n // 4
    assert {r.token_ids[0] for r in cold} == {greedy}


def test_prompt_logprobs_layout(engine, prompts):
    p = prompts[0]
    r = engine.generate_batch([req(engine, p, max_tokens=1, prompt_logprobs=0)])[0]
    assert len(r.prompt_logprobs) == len(p) and r.prompt_logprob_ids[-1] == [0]
    with torch.no_grad():
        ref = engine.model(torch.tensor([p])).logits[0, :-1].log_softmax(-1)
    expect = ref.gather(-1, torch.tensor(p[1:])[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor([v[0] for v in r.prompt_logprobs[:-1]]), expect, atol=1e-4)
    assert [i[0] for i in r.prompt_logprob_ids[:-1]] == p[1:]
    top = engine.generate_batch([req(engine, p, max_tokens=1, prompt_logprobs=3)])[0]
    assert all(len(v) == 3 for v in top.prompt_logprobs)


def test_abort_flag_returns_partial(engine, prompts):
    r = req(engine, prompts[0], max_tokens=50, ignore_eos=True)
    r.aborted = True
    out = engine.generate_batch([r, req(engine, prompts[1], max_tokens=5, ignore_eos=True)])
    assert out[0].finish_reason == "abort" and out[0].token_ids == []
    assert out[1].finish_reason == "length" and len(out[1].token_ids) == 5


def test_load_weights_changes_outputs(tiny_paths, prompts):
    eng = HFGenerationEngine.from_pretrained(tiny_paths.model_dir, seed=0)
    before = eng.generate_batch([req(eng, prompts[0], temperature=0, max_tokens=8, logprobs=True, ignore_eos=True)])[0]
    g = torch.Generator().manual_seed(5)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in eng.model.state_dict().items()}
    report = eng.load_weights(("_fsdp_wrapped_module." + k, v) for k, v in new.items())
    assert report["unknown"] == [] and len(report["loaded"]) == len(new)
    after = eng.generate_batch([req(eng, prompts[0], temperature=0, max_tokens=8, logprobs=True, ignore_eos=True)])[0]
    assert after.token_ids != before.token_ids or not torch.allclose(
        torch.tensor(after.log_probs), torch.tensor(before.log_probs)
    )
    ref = forward_logprobs(eng.model, prompts[0], after.token_ids, 0.0)
    assert torch.allclose(torch.tensor(after.log_probs), ref, atol=1e-4)
    assert eng.load_weights([("not.a.weight", torch.zeros(1))])["unknown"] == ["not.a.weight"]
    with pytest.raises(ValueError, match="shape"):
        eng.load_weights([("lm_head.weight", torch.zeros(3, 3))])
