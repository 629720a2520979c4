"""The HF rollout server as a Ray actor, called the way verl's LLMServerClient calls it."""

from __future__ import annotations

import time

import pytest
import torch

from mgrpo_verl.hf_rollout.engine import GenerationRequest
from mgrpo_verl.hf_rollout.sampling import InvalidRequestError, parse_sampling_params

MAX_MODEL_LEN = 1024


@pytest.fixture(scope="module")
def server(ray_local, tiny_paths):
    from verl.workers.config import HFModelConfig, RolloutConfig

    from mgrpo_verl.hf_rollout.server import HFRolloutServer

    rollout = RolloutConfig(
        name="hf",
        tensor_model_parallel_size=1,
        dtype="float32",
        prompt_length=64,
        response_length=16,
        max_model_len=MAX_MODEL_LEN,
        engine_kwargs={"hf": {"num_threads": 1, "max_batch_wait_ms": 100}},
    )
    model = HFModelConfig(path=tiny_paths.model_dir, tokenizer_path=tiny_paths.tokenizer_dir)
    actor = (
        ray_local.remote(HFRolloutServer)
        .options(max_concurrency=1000, num_cpus=0)
        .remote(rollout, model, replica_rank=0, server_name="test_hf_server")
    )
    ray_local.get(actor.launch_server.remote())
    yield actor
    ray_local.kill(actor)


def gen(server, ids, rid="r", **params):
    return server.generate.remote(
        request_id=rid, prompt_ids=ids, sampling_params=params, image_data=None, video_data=None
    )


def local(engine, ids, **params):
    sp = parse_sampling_params(
        params, prompt_len=len(ids), max_model_len=MAX_MODEL_LEN, default_max_tokens=16, vocab_size=engine.vocab_size
    )
    return engine.generate_batch([GenerationRequest(list(ids), sp)])[0]


def wait_until(pred, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.01)
    raise TimeoutError


def test_token_output_contract(server, tokenizer, ray_local):
    from verl.workers.rollout.replica import TokenOutput

    ids = tokenizer.encode("What is 2 + 3?")
    out = ray_local.get(gen(server, ids, temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True))
    assert isinstance(out, TokenOutput)
    assert 1 <= len(out.token_ids) <= 16  # default max tokens = response_length
    assert len(out.log_probs) == len(out.token_ids)
    assert out.stop_reason == "completed" and out.extra_fields["finish_reason"] in ("stop", "length")
    assert "global_steps" in out.extra_fields and out.routed_experts is None
    no_lp = ray_local.get(gen(server, ids, temperature=1.0, logprobs=False))
    assert no_lp.log_probs is None


def test_concurrent_requests_are_batched_and_each_answered_correctly(server, tokenizer, engine, ray_local):
    prompts = [tokenizer.encode(f"Question {i}: what is {i} * {i + 1}?") for i in range(12)]
    before = len(ray_local.get(server.get_stats.remote())["batch_sizes"])
    refs = [gen(server, p, f"c{i}", temperature=0, max_tokens=10, logprobs=True) for i, p in enumerate(prompts)]
    outs = ray_local.get(refs)
    sizes = ray_local.get(server.get_stats.remote())["batch_sizes"][before:]
    assert sum(sizes) == 12 and max(sizes) > 1, sizes
    for p, out in zip(prompts, outs, strict=True):
        ref = local(engine, p, temperature=0, max_tokens=10, logprobs=True)
        assert out.token_ids == ref.token_ids
        assert torch.allclose(torch.tensor(out.log_probs), torch.tensor(ref.log_probs), atol=1e-4)


def test_requests_arriving_during_a_batch_join_the_next_batch(server, tokenizer, ray_local):
    long_ref = gen(server, tokenizer.encode("Once upon a time"), "long", max_tokens=700, ignore_eos=True)
    wait_until(lambda: ray_local.get(server.get_stats.remote())["running"] == 1)
    short = [gen(server, tokenizer.encode(f"item {i}"), f"s{i}", max_tokens=3, ignore_eos=True) for i in range(4)]
    outs = ray_local.get(short)
    assert all(len(o.token_ids) == 3 for o in outs)
    assert len(ray_local.get(long_ref).token_ids) == 700
    sizes = ray_local.get(server.get_stats.remote())["batch_sizes"]
    assert sizes[-2:] == [1, 4], sizes


def test_samples_depend_on_what_is_asked_not_on_batching(server, tokenizer, ray_local):
    """A request without a seed is sampled from a seed of (server seed, step, prompt, how many copies of that
    prompt came before it this step): the same step asked twice, once as one batch of 3 copies of each of two
    prompts, once one request at a time in the other order, gives the same samples per prompt; the copies
    differ from each other, and the next step draws new ones (its counts start afresh)."""
    a, b = tokenizer.encode("Tell me about apples"), tokenizer.encode("Name a colour")

    def ask(order, at_once):
        outs = {"a": [], "b": []}
        if at_once:
            refs = [(k, gen(server, a if k == "a" else b, f"{k}{i}", temperature=1.0, max_tokens=8, ignore_eos=True))
                    for i, k in enumerate(order)]  # fmt: skip
            for k, ref in refs:
                outs[k].append(tuple(ray_local.get(ref).token_ids))
        else:
            for i, k in enumerate(order):
                ref = gen(server, a if k == "a" else b, f"{k}{i}", temperature=1.0, max_tokens=8, ignore_eos=True)
                outs[k].append(tuple(ray_local.get(ref).token_ids))
        return {k: sorted(v) for k, v in outs.items()}

    ray_local.get(server.set_global_steps.remote(70))
    batched = ask("aaabbb", at_once=True)
    ray_local.get(server.set_global_steps.remote(71))
    step_71 = ask("aaabbb", at_once=True)
    ray_local.get(server.set_global_steps.remote(70))
    one_by_one = ask("bababa", at_once=False)
    assert batched == one_by_one
    assert len(set(batched["a"])) == 3 and len(set(batched["b"])) == 3  # the copies of a prompt differ
    assert step_71 != batched


@pytest.mark.parametrize(
    ("ids", "params", "kwargs", "match"),
    [
        ([], {}, {}, "prompt_ids is empty"),
        (list(range(MAX_MODEL_LEN)), {}, {}, "max_model_len=1024"),
        ([1, 10**6], {}, {}, "outside the model's vocabulary"),
        ([1, 2], {"temperature": -1}, {}, "temperature"),
        ([1, 2], {"top_p": 0}, {}, "top_p"),
        ([1, 2], {"best_of": 3}, {}, "unsupported sampling param"),
        ([1, 2], {"stop": ["x"]}, {}, "stop strings"),
        ([1, 2], {}, {"image_data": ["img"]}, "text-only"),
        ([1, 2], {}, {"lora_request": "x"}, "unexpected generate"),
    ],
)
def test_bad_requests_raise_clear_errors(server, ray_local, ids, params, kwargs, match):
    ref = server.generate.remote(request_id="bad", prompt_ids=ids, sampling_params=params, **kwargs)
    with pytest.raises(InvalidRequestError, match=match):
        ray_local.get(ref)
    assert len(ray_local.get(gen(server, [5, 6, 7], max_tokens=2)).token_ids) >= 1  # still serving


def test_abort_pause_resume(server, tokenizer, ray_local):
    long_ref = gen(server, tokenizer.encode("Tell me a story"), "to-abort", max_tokens=700, ignore_eos=True)
    wait_until(lambda: ray_local.get(server.get_stats.remote())["running"] == 1)
    report = ray_local.get(server.abort_all_requests.remote())
    assert "to-abort" in report["request_ids"]
    out = ray_local.get(long_ref)
    assert out.stop_reason == "aborted" and len(out.token_ids) < 700
    parked = gen(server, [5, 6, 7], "parked", max_tokens=2)
    ready, _ = ray_local.wait([parked], timeout=0.5)
    assert not ready  # held until resume_generation
    ray_local.get(server.resume_generation.remote())
    assert len(ray_local.get(parked).token_ids) >= 1
    ray_local.get(server.abort_all_requests.remote(reject_request=True))
    rejected = ray_local.get(gen(server, [5, 6, 7], "rejected", max_tokens=2))
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    ray_local.get(server.resume_generation.remote())


def test_lifecycle_calls_from_replica(server, ray_local):
    for name in (
        "sleep",
        "wake_up",
        "clear_kv_cache",
        "release_kv_cache",
        "resume_kv_cache",
        "start_profile",
        "stop_profile",
        "wait_for_requests_to_drain",
    ):
        ray_local.get(getattr(server, name).remote())
    ray_local.get(server.sleep.remote())
    assert ray_local.get(server.get_stats.remote())["asleep"] is True
    ray_local.get(server.wake_up.remote(tags=["weights"]))
    assert ray_local.get(server.get_stats.remote())["asleep"] is False


def test_weight_update_changes_generations_and_logprobs(server, tokenizer, engine, ray_local):
    ids = tokenizer.encode("What is 7 + 8?")
    before = ray_local.get(gen(server, ids, temperature=0, max_tokens=8, logprobs=True, ignore_eos=True))
    original = ray_local.get(server.get_weights.remote())
    g = torch.Generator().manual_seed(11)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    items = list(new.items())
    ray_local.get(server.begin_weight_update.remote())
    ray_local.get(server.update_weights_bucket.remote(items[: len(items) // 2]))
    ray_local.get(server.update_weights_bucket.remote(items[len(items) // 2 :]))
    report = ray_local.get(server.finish_weight_update.remote(global_steps=3))
    assert report["global_steps"] == 3 and report["loaded"] == len(items)
    try:
        after = ray_local.get(gen(server, ids, temperature=0, max_tokens=8, logprobs=True, ignore_eos=True))
        assert after.extra_fields["global_steps"] == 3
        assert after.token_ids != before.token_ids or after.log_probs != before.log_probs
        # log-probs agree with a plain forward pass of the new weights
        model = engine.model
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(new)
        try:
            with torch.no_grad():
                logits = model(torch.tensor([ids + after.token_ids])).logits[0, len(ids) - 1 : -1]
            ref = logits.log_softmax(-1).gather(-1, torch.tensor(after.token_ids)[:, None]).squeeze(-1)
            assert after.token_ids == logits.argmax(-1).tolist()
        finally:
            model.load_state_dict(saved)
        assert torch.allclose(torch.tensor(after.log_probs), ref, atol=1e-4)
        # a name that matches nothing is an error, and the server keeps serving
        with pytest.raises(ValueError, match="match no parameter"):
            ray_local.get(server.update_weights.remote([("model.nope.weight", torch.zeros(2))]))
        assert len(ray_local.get(gen(server, ids, max_tokens=2)).token_ids) >= 1
    finally:
        ray_local.get(server.update_weights.remote(list(original.items())))
    restored = ray_local.get(gen(server, ids, temperature=0, max_tokens=8, logprobs=True, ignore_eos=True))
    assert restored.token_ids == before.token_ids


def test_requests_wait_for_a_weight_update_in_progress(server, tokenizer, ray_local):
    ray_local.get(server.begin_weight_update.remote())
    ref = gen(server, tokenizer.encode("hello"), "during-update", max_tokens=2)
    ready, _ = ray_local.wait([ref], timeout=0.3)
    assert not ready
    ray_local.get(server.finish_weight_update.remote())
    assert len(ray_local.get(ref).token_ids) >= 1
