"""Device selection of the HF rollout (CPU or CUDA), checked on CPU with fake inputs.

Nothing here touches a GPU: the rules that decide where a replica's model goes are pure functions, and
the sampling state is checked for following the device it is given (``meta`` tensors stand in for CUDA).
"""

from __future__ import annotations

import pytest
import torch

from mgrpo_verl.hf_rollout.replica import server_launch_options
from mgrpo_verl.hf_rollout.server import cuda_index, resolve_rollout_device
from mgrpo_verl.hf_rollout.sampling import BatchSampler, SamplingParams


@pytest.mark.parametrize(
    ("requested", "worker", "expected"),
    [
        (None, "cpu", "cpu"),
        ("auto", "cpu", "cpu"),
        (None, "cuda", "cuda"),
        ("AUTO", "cuda", "cuda"),
        ("cuda", "cuda", "cuda"),
        ("cpu", "cuda", "cpu"),  # generate on the host next to a CUDA actor
        ("cpu", "npu", "cpu"),
    ],
)
def test_resolve_rollout_device(requested, worker, expected):
    assert resolve_rollout_device(requested, worker) == expected


@pytest.mark.parametrize(
    ("requested", "worker", "message"),
    [
        ("gpu", "cuda", "expected one of"),
        ("cuda:1", "cuda", "expected one of"),
        ("cuda", "cpu", "trains on 'cpu'"),
        (None, "npu", "supports the cpu and cuda"),
    ],
)
def test_resolve_rollout_device_refuses(requested, worker, message):
    with pytest.raises(ValueError, match=message):
        resolve_rollout_device(requested, worker)


@pytest.mark.parametrize(
    ("gpu_id", "visible", "expected"),
    [
        (None, None, 0),
        ("", "3", 0),
        ("2", None, 2),  # every device visible: Ray's id is the index
        ("2", "2,3", 0),
        ("3", "2, 3", 1),
        ("GPU-abc", "GPU-xyz,GPU-abc", 1),
    ],
)
def test_cuda_index(gpu_id, visible, expected):
    assert cuda_index(gpu_id, visible) == expected


def test_cuda_index_refuses_invisible_gpu():
    with pytest.raises(RuntimeError, match="not visible"):
        cuda_index("1", "0,2")
    with pytest.raises(RuntimeError, match="empty"):
        cuda_index("0", "")


def test_server_launch_options():
    assert server_launch_options("cpu", ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]) == {}
    assert server_launch_options("cuda", ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]) == {
        "runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    }


def _params(**kw) -> SamplingParams:
    base = dict(
        max_tokens=4, temperature=0.7, top_p=0.9, top_k=5, min_p=0.0, repetition_penalty=1.2,
        presence_penalty=0.1, frequency_penalty=0.1, min_tokens=0, stop_token_ids=(), ignore_eos=False,
        logprobs=True, prompt_logprobs=None, seed=None,
    )
    base.update(kw)
    return SamplingParams(**base)


def test_sampler_state_lives_on_the_given_device():
    """Every per-row tensor follows ``device`` (on CUDA, a CPU tensor here fails in torch.where)."""
    sampler = BatchSampler([_params(), _params(temperature=0.0)], [[1, 2], [3]], 16, [None, None],
                           torch.Generator(), device="meta")
    for name in ("temperature", "greedy", "top_k", "top_p", "min_p", "rep", "presence", "frequency", "seen", "counts"):
        assert getattr(sampler, name).device.type == "meta", name
    sampler.select(torch.tensor([1]))
    assert sampler.temperature.device.type == "meta" and sampler.temperature.shape == (1,)


def test_sampler_on_cpu_by_default():
    sampler = BatchSampler([_params()], [[1]], 16, [None], torch.Generator())
    assert sampler.device == torch.device("cpu") and sampler.seen.device.type == "cpu"


@pytest.mark.parametrize(
    ("engine_kwargs", "expected"),
    [({}, None), ({"vllm": {}}, None), ({"hf": None}, None), ({"hf": {"device": "cpu"}}, "cpu"), (None, None)],
)
def test_replica_reads_the_requested_device(engine_kwargs, expected):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from mgrpo_verl.hf_rollout.replica import HFReplica

    replica = object.__new__(HFReplica)  # only the config is read
    replica.config = SimpleNamespace(engine_kwargs=engine_kwargs)
    assert replica._requested_device() == expected
    if engine_kwargs:  # verl may hand over an OmegaConf mapping
        replica.config = SimpleNamespace(engine_kwargs=OmegaConf.create(engine_kwargs))
        assert replica._requested_device() == expected
