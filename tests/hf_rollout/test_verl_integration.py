"""The HF rollout driven by verl's own classes: registry lookup, LLMServerManager (hybrid replicas on a
RayWorkerGroup), LLMServerClient (the agent loop's client) and CheckpointEngineManager with the naive
backend (sleep -> weight sync through the in-worker adapter -> generation with the new weights)."""

from __future__ import annotations

import asyncio

import pytest
import torch


def test_register_is_idempotent_and_resolves_classes():
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from mgrpo_verl.hf_rollout import ADAPTER_FQN, is_registered, register
    from mgrpo_verl.hf_rollout.adapter import HFServerAdapter
    from mgrpo_verl.hf_rollout.replica import HFReplica

    register()
    register()
    assert is_registered()
    assert get_rollout_replica_class("hf") is HFReplica
    assert get_rollout_class("hf", "async") is HFServerAdapter
    assert ADAPTER_FQN == f"{HFServerAdapter.__module__}.{HFServerAdapter.__qualname__}"


def _with_targets(node):
    """Give every structured-config node the ``_target_`` verl's YAML configs carry, so that verl's
    ``omega_conf_to_dataclass`` (hydra ``instantiate``) rebuilds the dataclasses as in a real run."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
        if "_target_" in node and not node._target_:
            cls = OmegaConf.get_type(node)
            node._target_ = f"{cls.__module__}.{cls.__qualname__}"
        for key in node:
            _with_targets(node._get_node(key))
    return node


def _greedy_forward(state_dict, model_dir, prompt, response):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(state_dict)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return logits.argmax(-1).tolist(), logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.slow
def test_llm_server_manager_client_and_naive_weight_sync(ray_local, tiny_paths, tokenizer):
    from omegaconf import OmegaConf
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.config import CheckpointEngineConfig, RolloutConfig
    from verl.workers.rollout.llm_server import LLMServerManager

    from mgrpo_verl.hf_rollout import register
    from mgrpo_verl.agent_loops.testing import ToyHybridWorker

    ray = ray_local
    register()
    rollout = OmegaConf.structured(
        RolloutConfig(
            name="hf",
            tensor_model_parallel_size=1,
            dtype="float32",
            prompt_length=32,
            response_length=12,
            n_gpus_per_node=2,
            nnodes=1,
            calculate_log_probs=True,
            engine_kwargs={"hf": {"num_threads": 1}},
        )
    )
    rollout.checkpoint_engine.update_weights_bucket_megabytes = 1  # force several buckets
    _with_targets(rollout)
    model = OmegaConf.create({"path": tiny_paths.model_dir, "tokenizer_path": tiny_paths.tokenizer_dir})
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout, "model": model}})

    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    wg = RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=RayClassWithInitArgs(
            cls=ray.remote(ToyHybridWorker), rollout_config=rollout, model_config=model
        ),
    )
    manager = None
    try:
        manager = LLMServerManager.create(config=config, worker_group=wg)
        replicas = manager.get_replicas()
        assert len(replicas) == 2  # world size 2, tensor parallel 1
        assert len(set(manager.get_addresses())) == 2
        client = manager.get_client()
        prompts = [tokenizer.encode(f"What is {i} + {2 * i}?") for i in range(6)]
        greedy = dict(temperature=0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)

        async def generate_all(params):
            return await asyncio.gather(
                *[
                    client.generate(request_id=f"q{i}", prompt_ids=p, sampling_params=dict(params))
                    for i, p in enumerate(prompts)
                ]
            )

        original = wg.state_dict()[0]
        before = asyncio.run(generate_all(greedy))
        for p, out in zip(prompts, before, strict=True):
            assert len(out.token_ids) >= 1 and out.stop_reason == "completed"
            argmax, lp = _greedy_forward(original, tiny_paths.model_dir, p, out.token_ids)
            assert out.token_ids == argmax
            assert torch.allclose(torch.tensor(out.log_probs), lp, atol=1e-4)

        # one "training step": sleep replicas, change the actor's weights, sync through the naive path
        ckpt = CheckpointEngineManager(config=CheckpointEngineConfig(backend="naive"), actor_wg=wg, replicas=replicas)
        ckpt.sleep_replicas()
        wg.perturb_weights(seed=1)
        ckpt.update_weights(global_steps=1)
        trained = wg.state_dict()[0]
        for replica in replicas:
            served = ray.get(replica.server_handle.get_weights.remote())
            for k, v in trained.items():
                assert torch.equal(served[k], v), k

        after = asyncio.run(generate_all(greedy))
        assert any(a.token_ids != b.token_ids or a.log_probs != b.log_probs for a, b in zip(after, before, strict=True))
        for p, out in zip(prompts, after, strict=True):
            assert out.extra_fields["global_steps"] == 1 and out.extra_fields["max_global_steps"] == 1
            argmax, lp = _greedy_forward(trained, tiny_paths.model_dir, p, out.token_ids)
            assert out.token_ids == argmax
            assert torch.allclose(torch.tensor(out.log_probs), lp, atol=1e-4)

        # sampling through the client honours max_tokens
        short = asyncio.run(generate_all(dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=False, max_tokens=3)))
        assert all(1 <= len(o.token_ids) <= 3 and o.log_probs is None for o in short)
    finally:
        if manager is not None:
            for replica in manager.get_replicas():
                for server in replica.servers:
                    ray.kill(server)
            ray.kill(manager.global_load_balancer)
        for worker in wg.workers:
            ray.kill(worker)
        for pg in pool.pgs or []:
            ray.util.remove_placement_group(pg)


def test_server_implements_every_method_verl_calls_on_a_server():
    """Contract: every ``server.<method>.remote(...)`` in verl's replica base class and LLM client exists on
    our server actor (fails first when verl 0.9.x grows a new call)."""
    import inspect
    import re

    from verl.workers.rollout import llm_server, replica

    from mgrpo_verl.hf_rollout.replica import HFReplica
    from mgrpo_verl.hf_rollout.server import HFRolloutServer

    called = set()
    for module in (replica, llm_server):
        called |= set(re.findall(r"server\.(\w+)\.remote\(", inspect.getsource(module)))
    assert {"generate", "wake_up", "sleep", "abort_all_requests", "resume_generation"} <= called
    missing = sorted(name for name in called if not callable(getattr(HFRolloutServer, name, None)))
    assert not missing, f"verl calls {missing} on rollout servers; HFRolloutServer lacks them"
    assert not getattr(HFReplica, "__abstractmethods__", None)
    # the keyword arguments LLMServerClient.generate passes
    params = inspect.signature(HFRolloutServer.generate).parameters
    for kw in (
        "request_id",
        "prompt_ids",
        "sampling_params",
        "image_data",
        "video_data",
        "audio_data",
        "mm_processor_kwargs",
        "priority",
    ):
        assert kw in params, kw


def test_register_from_a_plugin_during_import_verl(tmp_path):
    """register() must work when called while ``import verl`` is still running (the plugin entry point)."""
    import os
    import subprocess
    import sys

    (tmp_path / "hf_rollout_plugin_probe.py").write_text("import mgrpo_verl.hf_rollout as r\nr.register()\n")
    code = (
        "import verl\n"
        "from verl.workers.rollout.base import get_rollout_class\n"
        "from verl.workers.rollout.replica import get_rollout_replica_class\n"
        "print(get_rollout_class('hf', 'async').__name__, get_rollout_replica_class('hf').__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "VERL_USE_EXTERNAL_MODULES": "hf_rollout_plugin_probe"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "HFServerAdapter HFReplica"
