"""Patch verl-0.9.1-cpu-logprobs: detectors that fail when upstream changes, the values it computes, where it is on."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import subprocess
import sys

import pytest
import torch

import mgrpo_verl.platform.verl_cpu_logprobs as patch
from mgrpo_verl.platform.patching import VerlPatchError


@pytest.fixture
def module():
    mod = importlib.import_module(patch.TARGET_MODULE)
    was_applied = patch.is_applied()
    patch.revert()
    yield mod
    patch.revert()
    if was_applied:
        patch.apply(mod)


def test_upstream_still_loops_over_rows(module):
    # Fails when verl changes either function: re-check whether the patch is still needed.
    assert patch.upstream_drift(module) == {}
    src = inspect.getsource(module.logprobs_from_logits_v2)
    assert "torch.stack([torch.logsumexp(logit, dim=-1) for logit in logits])" in src
    dispatch = inspect.getsource(module.logprobs_from_logits)
    assert "output = logprobs_from_logits_v2(logits, labels)" in dispatch  # a global lookup: the attribute swap reaches it
    assert not module.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE  # this machine takes the fallback


def test_hand_computed_values():
    # row 0: logits (0, 0): each label has probability 1/2 -> log 1/2
    # row 1: logits (ln 3, 0): label 0 has e^ln3 / (e^ln3 + 1) = 3/4, label 1 has 1/4
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [math.log(3.0), 0.0]])
    labels = torch.tensor([1, 0, 1])
    expected = torch.tensor([math.log(0.5), math.log(0.75), math.log(0.25)])
    assert torch.allclose(patch.chunked_logprobs(logits, labels), expected, atol=1e-6)


@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 11), (1, 1030)])
@pytest.mark.parametrize("chunk", [1 << 24, 12, 1])
def test_same_bits_and_gradients_as_verl(module, monkeypatch, shape, chunk):
    monkeypatch.setattr(patch, "CHUNK_ELEMENTS", chunk)  # 12 and 1: several chunks, a chunk per row
    torch.manual_seed(sum(shape) + chunk)
    base = torch.randn(*shape) * 4
    labels = torch.randint(0, shape[-1], shape[:-1])
    ours_in, verl_in = base.clone().requires_grad_(), base.clone().requires_grad_()
    ours, verl = patch.chunked_logprobs(ours_in, labels), module.logprobs_from_logits_v2(verl_in, labels)
    assert ours.shape == verl.shape == labels.shape
    assert torch.equal(ours, verl)
    weights = torch.randn(labels.shape)
    (ours * weights).sum().backward()
    (verl * weights).sum().backward()
    assert torch.allclose(ours_in.grad, verl_in.grad, rtol=0, atol=1e-6)


def test_large_vocabulary_within_rounding(module):
    # a 49,152-token vocabulary (SmolLM2's) spans several chunks of 21 rows; the sums may round differently
    torch.manual_seed(0)
    logits, labels = torch.randn(64, 49152) * 4, torch.randint(0, 49152, (64,))
    assert torch.allclose(patch.chunked_logprobs(logits, labels), module.logprobs_from_logits_v2(logits, labels),
                          rtol=0, atol=1e-5)


def test_no_rows():
    # verl's row loop raises on an empty batch ("stack expects a non-empty TensorList"); ours returns no values
    assert patch.chunked_logprobs(torch.empty(0, 4), torch.empty(0, dtype=torch.long)).shape == (0,)


def test_other_dtypes_go_to_verl(module):
    assert patch.apply(module, strict=True)
    logits = torch.randn(4, 9).to(torch.bfloat16)
    labels = torch.randint(0, 9, (4,))
    assert torch.equal(patch.chunked_logprobs(logits, labels), patch._original["logprobs_from_logits_v2"](logits, labels))


def test_apply_routes_verls_dispatcher_and_revert_restores(module):
    original = module.logprobs_from_logits_v2
    assert patch.apply(module, strict=True)
    assert module.logprobs_from_logits_v2 is patch.chunked_logprobs
    logits, labels = torch.randn(6, 8), torch.randint(0, 8, (6,))
    assert torch.equal(module.logprobs_from_logits(logits, labels), original(logits, labels))
    assert patch.upstream_drift(module) == {}  # checks verl's function, not ours
    patch.revert()
    assert module.logprobs_from_logits_v2 is original


def test_refuses_another_verl_version(module, monkeypatch):
    monkeypatch.setattr(patch, "installed_verl_version", lambda: "0.9.2")
    with pytest.raises(VerlPatchError, match="written for verl==0.9.1, found verl==0.9.2"):
        patch.apply(module, strict=True)
    with pytest.warns(RuntimeWarning, match="not applied"):
        assert patch.apply(module) is False
    assert not patch.is_applied()


def test_refuses_changed_source(module, monkeypatch):
    monkeypatch.setitem(patch.RECORDED_SOURCE_SHA256, "logprobs_from_logits", "0" * 64)
    with pytest.raises(VerlPatchError, match="logprobs_from_logits differs from verl 0.9.1"):
        patch.apply(module, strict=True)
    assert not patch.is_applied()


CHECK = ("import verl, verl.utils.torch_functional as f, mgrpo_verl.platform.verl_cpu_logprobs as p; "
         "print(f.logprobs_from_logits_v2 is p.chunked_logprobs)")


@pytest.mark.parametrize(("device", "expected"), [("cpu", "True"), ("accelerator", "False")])
def test_on_only_where_the_cpu_platform_is(device, expected):
    # our plugin runs on `import verl`; the patch follows the platform the process uses
    env = {**os.environ, "MGRPO_VERL_DEVICE": device}
    env.pop("VERL_PLATFORM", None)
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == expected
