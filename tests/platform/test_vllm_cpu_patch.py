"""Patch ``vllm-cpu-linear-weights`` (patches/README.md): vLLM's CPU build drops every linear layer's weight
after packing it, so verl cannot reload weights; the patch keeps them. Needs vLLM's CPU build (CI runs this file
in ``.venv-vllm``, made by ``recipes/vllm_cpu_env.sh``); skipped where vLLM is not installed."""

import pytest

pytest.importorskip("vllm", reason="needs vLLM's CPU build: bash recipes/vllm_cpu_env.sh; .venv-vllm/bin/python -m pytest ...")

import torch  # noqa: E402
from vllm.model_executor.layers.linear import UnquantizedLinearMethod  # noqa: E402

from mgrpo_verl.launcher.preflight import VLLM_CPU_HEAD_SIZES  # noqa: E402
from mgrpo_verl.platform import vllm_cpu_weights as patch  # noqa: E402


@pytest.fixture(autouse=True)
def _reverted():
    patch.revert()
    yield
    patch.revert()


def _layer(out_features: int = 64, in_features: int = 64) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(out_features, in_features), requires_grad=False)
    layer.bias = None
    return layer


def test_the_installed_vllm_is_the_one_the_patch_was_written_for():
    """Fails when vLLM changes the patched method (then: check whether the CPU build still drops weights)."""
    assert patch.vllm_version() in patch.VLLM_VERSIONS
    assert patch.upstream_drift() is None


def test_unpatched_vllm_still_drops_the_weight_on_cpu():
    """The day this fails, vLLM keeps its CPU weights reloadable: delete the patch."""
    layer = _layer()
    UnquantizedLinearMethod().process_weights_after_loading(layer)
    assert layer.weight.numel() == 0


def test_patched_layer_keeps_its_weight_and_computes_the_same_linear():
    layer = _layer()
    weight = layer.weight.detach().clone()
    assert patch.apply(strict=True) and patch.is_applied()
    UnquantizedLinearMethod().process_weights_after_loading(layer)
    assert torch.equal(layer.weight, weight)
    x = torch.randn(3, 64)
    assert torch.allclose(layer.cpu_linear(x, layer.weight, None), x @ weight.T, atol=1e-5)
    patch.revert()
    assert not patch.is_applied()
    fresh = _layer()
    UnquantizedLinearMethod().process_weights_after_loading(fresh)
    assert fresh.weight.numel() == 0  # reverted: vLLM's own behaviour again


def test_register_applies_only_when_asked(monkeypatch):
    monkeypatch.delenv(patch.ENV, raising=False)
    patch.register()
    assert not patch.is_applied()
    monkeypatch.setenv(patch.ENV, "1")
    patch.register()
    assert patch.is_applied()


def test_refused_on_another_vllm(monkeypatch):
    monkeypatch.setattr(patch, "vllm_version", lambda: "0.99.0")
    with pytest.warns(RuntimeWarning, match=r"written for vllm 0\.28\.0, 0\.31\.0, found vllm 0\.99\.0; not applied"):
        assert not patch.apply()
    with pytest.raises(RuntimeError, match="not applied"):
        patch.apply(strict=True)


def test_head_sizes_of_the_preflight_are_vllms():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == VLLM_CPU_HEAD_SIZES
