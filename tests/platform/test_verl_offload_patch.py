"""Patch verl-0.9.1-fsdp2-pinned-offload: detectors that fail when upstream changes, and its behaviour."""

from __future__ import annotations

import inspect

import pytest
from torch.distributed.fsdp import CPUOffloadPolicy

import mgrpo_verl.platform.verl_cpu_offload_pinning as patch
from mgrpo_verl.platform.patching import VerlPatchError


@pytest.fixture
def module():
    import importlib

    mod = importlib.import_module(patch.TARGET_MODULE)
    was_applied = patch.is_applied()
    patch.revert()
    yield mod
    patch.revert()
    if was_applied:
        patch.apply(mod)


def test_upstream_still_pins_forward_only_offload(module):
    # Fails when verl changes FSDPEngine._build_fsdp_module: re-check whether the patch is still needed.
    assert patch.upstream_drift(module) is None
    src = inspect.getsource(module.FSDPEngine._build_fsdp_module)
    assert "offload_policy = CPUOffloadPolicy(pin_memory=True)" in src
    assert "self.engine_config.forward_only" in src


def test_apply_swaps_in_an_unpinned_policy_and_revert_restores(module):
    assert patch.apply(module, strict=True)
    policy = module.CPUOffloadPolicy(pin_memory=True)
    assert isinstance(policy, CPUOffloadPolicy)  # torch's isinstance checks still hold
    assert policy.pin_memory is False
    patch.revert()
    assert module.CPUOffloadPolicy is CPUOffloadPolicy


def test_refuses_another_verl_version(module, monkeypatch):
    monkeypatch.setattr(patch, "installed_verl_version", lambda: "0.9.2")
    with pytest.raises(VerlPatchError, match="written for verl==0.9.1, found verl==0.9.2"):
        patch.apply(module, strict=True)
    with pytest.warns(RuntimeWarning, match="not applied"):
        assert patch.apply(module) is False
    assert module.CPUOffloadPolicy is CPUOffloadPolicy


def test_refuses_changed_source(module, monkeypatch):
    monkeypatch.setattr(patch, "RECORDED_SOURCE_SHA256", "0" * 64)
    with pytest.raises(VerlPatchError, match="differs from verl 0.9.1"):
        patch.apply(module, strict=True)
