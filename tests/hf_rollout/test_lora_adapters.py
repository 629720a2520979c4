"""Several LoRA adapters on one base in one HF engine (mgrpo_verl/hf_rollout/adapters.py): each request is
generated with its own adapter only, mixed batches included, and the base weights never change.

The reference for "adapter A only" is independent of the engine's adapter code: a fresh copy of the base
with A merged into its weights by peft (``merge_and_unload``), served by a plain engine."""

from __future__ import annotations

import pytest
import torch

from mgrpo_verl.hf_rollout.adapters import base_fingerprint
from mgrpo_verl.hf_rollout.engine import GenerationRequest, HFGenerationEngine, weights_fingerprint
from mgrpo_verl.hf_rollout.sampling import parse_sampling_params

PROMPTS = [[5, 6, 7, 8, 9], [100, 200, 300], [42] * 7]
# two agents with different LoRA settings, as per-agent actor_rollout_ref.model.lora_* would give them
CONFIGS = {
    "planner": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "worker": {"r": 2, "lora_alpha": 16, "target_modules": ["o_proj", "up_proj", "down_proj"]},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from mgrpo_verl.models.tiny import build_tiny_model
    from mgrpo_verl.platform.ray_session import patched_environ

    with patched_environ({"MGRPO_VERL_CACHE": str(tmp_path_factory.mktemp("lora_cache"))}):
        return build_tiny_model(seed=0).model_dir


def _trained_adapter(model_dir, name, seed):
    """(peft config dict as verl's engine sends it, adapter tensors as get_peft_model_state_dict names them,
    the merged plain model): an adapter with random non-zero A and B, as after some training."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **CONFIGS[name]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    state = {k: v.clone() for k, v in get_peft_model_state_dict(peft_model).items()}
    config = peft_model.peft_config["default"].to_dict()
    merged = peft_model.merge_and_unload().eval()
    return config, state, merged


@pytest.fixture(scope="module")
def adapters(model_dir):
    return {name: _trained_adapter(model_dir, name, seed) for seed, name in enumerate(CONFIGS)}


def _req(engine, ids, adapter=None, max_tokens=8):
    sp = parse_sampling_params({"temperature": 0.0, "logprobs": True, "max_tokens": max_tokens, "ignore_eos": True},
                               prompt_len=len(ids), max_model_len=4096, default_max_tokens=max_tokens,
                               vocab_size=engine.vocab_size)
    return GenerationRequest(prompt_ids=list(ids), params=sp, adapter=adapter)


def _engine(model_or_dir):
    torch.set_num_threads(1)
    if isinstance(model_or_dir, str):
        return HFGenerationEngine.from_pretrained(model_or_dir, dtype="float32", seed=0)
    return HFGenerationEngine(model_or_dir, eos_token_ids=[0], pad_token_id=0, seed=0)


@pytest.fixture()
def shared(model_dir, adapters):
    engine = _engine(model_dir)
    for name, (config, state, _) in adapters.items():
        engine.load_adapter(name, config, state.items())
    return engine


def test_each_request_uses_its_own_adapter_only_in_a_mixed_batch(shared, adapters, model_dir):
    plain = _engine(model_dir)
    refs = {name: _engine(merged) for name, (_, _, merged) in adapters.items()}
    # every prompt once per adapter and once on the base, all in one batch
    jobs = [(ids, who) for ids in PROMPTS for who in ("planner", "worker", None)]
    out = shared.generate_batch([_req(shared, ids, who) for ids, who in jobs])
    for (ids, who), got in zip(jobs, out, strict=True):
        ref_engine = plain if who is None else refs[who]
        want = ref_engine.generate_batch([_req(ref_engine, ids)])[0]
        assert got.token_ids == want.token_ids, (ids, who)
        assert got.log_probs == pytest.approx(want.log_probs, abs=2e-4), (ids, who)
    # the two adapters (and the base) really generate differently: the test above could not pass by accident
    by = {who: [r.log_probs for (_, w), r in zip(jobs, out, strict=True) if w == who] for who in ("planner", "worker", None)}
    assert by["planner"] != by["worker"] and by["planner"] != by[None] and by["worker"] != by[None]


def test_base_weights_are_bit_identical_after_adapters_and_generation(shared, model_dir, adapters):
    from transformers import AutoModelForCausalLM

    before = weights_fingerprint(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    shared.generate_batch([_req(shared, PROMPTS[0], "planner"), _req(shared, PROMPTS[1], "worker")])
    config, state, _ = adapters["planner"]
    shared.load_adapter("planner", config, ((k, v * 2) for k, v in state.items()))  # a later sync
    assert base_fingerprint(shared.model) == before
    # and the fingerprint does see a change of the base
    with torch.no_grad():
        next(p for n, p in shared.model.named_parameters() if "lora_" not in n).add_(1e-3)
    assert base_fingerprint(shared.model) != before


def test_reloading_one_adapter_leaves_the_other_unchanged(shared, adapters):
    before = {who: shared.generate_batch([_req(shared, PROMPTS[0], who)])[0].log_probs for who in CONFIGS}
    config, state, _ = adapters["planner"]
    report = shared.load_adapter("planner", config, ((k, torch.zeros_like(v) if "lora_B" in k else v) for k, v in state.items()))
    assert report["loaded"] == len(state)
    after = {who: shared.generate_batch([_req(shared, PROMPTS[0], who)])[0].log_probs for who in CONFIGS}
    base = shared.generate_batch([_req(shared, PROMPTS[0])])[0].log_probs
    assert after["worker"] == before["worker"]
    assert after["planner"] != before["planner"]
    assert after["planner"] == pytest.approx(base, abs=1e-6)  # B = 0: the adapter adds nothing


def test_bad_adapter_requests_and_pushes_are_refused(shared, adapters):
    config, state, _ = adapters["planner"]
    with pytest.raises(ValueError, match="unknown LoRA adapter"):
        shared.generate_batch([_req(shared, PROMPTS[0], "nobody")])
    with pytest.raises(ValueError, match="another LoRA config.*lora_alpha"):
        shared.load_adapter("planner", {**config, "lora_alpha": 99}, state.items())
    with pytest.raises(ValueError, match="match no LoRA parameter"):
        shared.load_adapter("planner", config, [*state.items(), ("base_model.model.model.nope.lora_A.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="received no tensor"):
        shared.load_adapter("planner", config, list(state.items())[1:])
    with pytest.raises(ValueError, match="not allowed"):
        shared.load_adapter("lora_x", config, state.items())
    with pytest.raises(ValueError, match="shared by them"):
        shared.load_weights([("model.norm.weight", torch.ones(64))])


def test_server_serves_each_agent_with_its_adapter(model_dir, adapters):
    """The server actor's code, in process: adapters pushed by update_adapter, requests naming lora_name; before
    any adapter a request without one gets the base, after them it is refused (an agent's request that names no
    adapter is a routing bug; the engine's own mixed batches with base rows are tested above)."""
    import asyncio

    from verl.workers.config import HFModelConfig, RolloutConfig

    from mgrpo_verl.hf_rollout.sampling import InvalidRequestError
    from mgrpo_verl.hf_rollout.server import HFRolloutServer

    rollout = RolloutConfig(name="hf", tensor_model_parallel_size=1, dtype="float32", prompt_length=64, response_length=8,
                            max_model_len=1024, engine_kwargs={"hf": {"num_threads": 1, "fingerprint_weights": True}})
    server = HFRolloutServer(rollout, HFModelConfig(path=model_dir), server_name="lora_test")
    params = {"temperature": 0.0, "logprobs": True, "max_tokens": 6, "ignore_eos": True}

    async def run():
        await server.launch_server()
        base_fp = server.get_base_fingerprint()
        with pytest.raises(InvalidRequestError, match="no LoRA adapter 'planner'"):
            await server.generate(PROMPTS[0], params, lora_name="planner")
        base = await server.generate(PROMPTS[1], params)
        for name, (config, state, _) in adapters.items():
            report = await server.update_adapter(name, config, list(state.items()), global_steps=3)
            assert report["adapter"] == name and report["loaded"] == len(state) and report["base_fingerprint"] == base_fp
        with pytest.raises(InvalidRequestError, match=r"serves the LoRA adapters of agents \['planner', 'worker'\]; a request "
                                                      r"must name one"):
            await server.generate(PROMPTS[1], params)
        outs = await asyncio.gather(*[server.generate(PROMPTS[1], params, lora_name=who) for who in ("planner", "worker")])
        return [*outs, base]

    outs = asyncio.run(run())
    for who, out in zip(("planner", "worker", None), outs, strict=True):
        ref = _engine(model_dir) if who is None else _engine(adapters[who][2])
        assert out.token_ids == ref.generate_batch([_req(ref, PROMPTS[1], max_tokens=6)])[0].token_ids, who
    assert server.get_stats()["adapters"] == ["planner", "worker"]
    assert set(server.get_adapter_weights("worker")) == set(adapters["worker"][1])
