"""The CPU platform: registration, selection rules, device/backend values, no interference with GPUs."""

from __future__ import annotations

import pytest
import torch

from mgrpo_verl.platform import cpu as cpu_mod
from mgrpo_verl.platform import cpu_device
from mgrpo_verl.platform.cpu import CpuPlatform, cpu_platform_wanted, device_choice

no_accelerator = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without GPU")

# Printed by the subprocesses below: what verl resolved and what we installed.
PROBE = """
import json, sys
import verl
from verl.plugin.platform import PlatformRegistry, get_platform
from verl.utils import device as d
import mgrpo_verl.platform.verl_process_group as patch
from mgrpo_verl.platform import _import_hooks
from mgrpo_verl.platform.engines import FSDP_ENGINE_MODULE
platform = get_platform()
print(json.dumps({
    "registered": list(PlatformRegistry.registered_names()),
    "platform_class": type(platform).__name__,
    "device_name": d.get_device_name(),
    "backend": d.get_nccl_backend(),
    "device_id": str(d.get_device_id()) if type(platform).__name__ == "CpuPlatform" else None,
    "resource": d.get_resource_name(),
    "verl_platform_env": __import__("os").environ.get("VERL_PLATFORM"),
    "patch_applied": patch.is_applied(),
    # the CPU engines' post-import hook is pending (verl's FSDP engine module is not imported yet)
    "engine_hook": FSDP_ENGINE_MODULE in _import_hooks._pending,
}))
"""


@no_accelerator
def test_selected_automatically_without_accelerator(python_runner):
    out = python_runner(PROBE)
    assert out["registered"][-1] == "cpu"
    assert out["platform_class"] == "CpuPlatform"
    assert (out["device_name"], out["backend"], out["device_id"], out["resource"]) == ("cpu", "gloo", "cpu", "GPU")
    assert out["verl_platform_env"] is None  # auto mode does not touch the environment
    assert out["patch_applied"] and out["engine_hook"]


# our package imported before verl: verl then runs our entry point while mgrpo_verl.platform is half-initialised
PLATFORM_FIRST = """
import json, sys
import mgrpo_verl.platform.ray_session
from verl.plugin.platform import get_platform
print(json.dumps({"platform_class": type(get_platform()).__name__, "plugin": "mgrpo_verl.plugin" in sys.modules}))
"""


@no_accelerator
@pytest.mark.parametrize("policy, expected", [("auto", ("CpuPlatform", True)), ("none", (None, False))])
def test_platform_package_imported_before_verl(python_runner, policy, expected):
    out = python_runner(PLATFORM_FIRST, env={"VERL_USE_EXTERNAL_PLUGINS": policy})
    platform, plugin = expected
    assert out["plugin"] is plugin  # loaded again once the package is complete, unless verl's policy excludes it
    if platform:
        assert out["platform_class"] == platform
    else:
        assert out["platform_class"] != "CpuPlatform"


def test_selected_explicitly_with_mgrpo_verl_device(python_runner):
    out = python_runner(PROBE, env={"MGRPO_VERL_DEVICE": "cpu"})
    assert out["platform_class"] == "CpuPlatform"
    assert out["verl_platform_env"] == "cpu"  # inherited by Ray workers
    assert out["patch_applied"] and out["engine_hook"]


def test_selected_explicitly_with_verl_platform(python_runner):
    out = python_runner(PROBE, env={"VERL_PLATFORM": "cpu"})
    assert out["platform_class"] == "CpuPlatform"
    assert out["patch_applied"]


def test_accelerator_choice_leaves_verl_alone(python_runner):
    """``MGRPO_VERL_DEVICE=accelerator``: verl's stock detection (falls back to nvidia here)."""
    out = python_runner(PROBE, env={"MGRPO_VERL_DEVICE": "accelerator"})
    assert out["platform_class"] != "CpuPlatform"
    # the process-group patch is applied on every platform (its store part acts on any device), the CPU engines not
    assert out["patch_applied"] and not out["engine_hook"]


def test_no_interference_when_cuda_is_available(python_runner):
    """On a (simulated) CUDA machine verl resolves nvidia and we install nothing but the registration and the
    process-group patch, whose only change off CPU is a loopback worker-group store (test_verl_patch.py)."""
    code = "import torch; torch.cuda.is_available = lambda: True\n" + PROBE
    out = python_runner(code)
    assert out["platform_class"] == "PlatformCUDA"
    assert "cpu" in out["registered"]
    assert out["patch_applied"] and not out["engine_hook"]
    assert out["verl_platform_env"] is None


def test_conflicting_settings_raise(python_runner):
    code = """
    import json, verl  # verl swallows (and logs at debug level) the plugin's error
    try:
        from mgrpo_verl.plugin import ensure_registered  # re-runs the failed plugin module

        ensure_registered()
        print(json.dumps({"error": None}))
    except ValueError as e:
        print(json.dumps({"error": str(e)}))
    """
    out = python_runner(code, env={"MGRPO_VERL_DEVICE": "cpu", "VERL_PLATFORM": "nvidia"})
    assert "contradicts VERL_PLATFORM" in out["error"]
    out = python_runner(code, env={"MGRPO_VERL_DEVICE": "tpu"})
    assert "expected one of auto, cpu, accelerator" in out["error"]


# -- in-process unit tests (no platform resolution) ------------------------------------------------


def test_selection_rules(monkeypatch):
    for var in ("VERL_PLATFORM", "MGRPO_VERL_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cpu_mod, "accelerator_present", lambda use_smi_check=True: False)
    assert device_choice() == "auto" and cpu_platform_wanted()
    monkeypatch.setattr(cpu_mod, "accelerator_present", lambda use_smi_check=True: True)
    assert not cpu_platform_wanted() and not CpuPlatform().is_platform_available(use_smi_check=True)
    monkeypatch.setenv("MGRPO_VERL_DEVICE", "CPU")
    assert cpu_platform_wanted()  # explicit request wins over a present accelerator
    monkeypatch.setenv("VERL_PLATFORM", "nvidia")
    assert not cpu_platform_wanted()  # verl's own switch decides when set
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    monkeypatch.setenv("MGRPO_VERL_DEVICE", "accelerator")
    assert cpu_platform_wanted()


def test_accelerator_present_follows_torch_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cpu_mod.accelerator_present()


def test_platform_values():
    p = CpuPlatform()
    assert (p.device_name, p.vendor_name, p.communication_backend_name()) == ("cpu", "cpu", "gloo")
    assert p.current_device() == torch.device("cpu")
    assert torch.ones(1).to(p.current_device()).device.type == "cpu"
    assert p.is_available() and p.device_count() == 1
    assert p.ray_resource_name() == "GPU" and p.ray_resource_options(0.5) == {"num_gpus": 0.5}
    assert p.visible_devices_envvar() == "CUDA_VISIBLE_DEVICES"
    assert p.get_device_capability() == (None, None) and not p.is_ipc_supported() and p.cudart() is None
    assert p.ray_noset_envvars() == []
    for call in (p.empty_cache, p.profiler_start, p.profiler_stop, p.synchronize):
        assert call() is None
    p.set_device(3)
    p.set_allocator_settings("expandable_segments:True")
    with p.nvtx_range("x"):
        pass
    p.manual_seed(7)
    a = torch.rand(3)
    p.manual_seed(7)
    assert torch.equal(a, torch.rand(3))


def test_device_module_covers_what_verl_calls():
    m = CpuPlatform().device_module
    assert m is cpu_device
    # every attribute verl 0.9.1 calls on get_torch_device() (grep "get_torch_device()." in verl)
    for name in (
        "empty_cache synchronize is_available current_stream set_device mem_get_info stream Stream "
        "set_rng_state set_per_process_memory_fraction ipc_collect get_rng_state device_count memory_reserved "
        "memory_allocated max_memory_reserved max_memory_allocated get_device_name Event reset_peak_memory_stats "
        "reset_accumulated_memory_stats get_device_properties current_device manual_seed manual_seed_all"
    ).split():
        assert callable(getattr(m, name)), name
    free, total = m.mem_get_info()
    assert 0 < free <= total
    assert m.memory_allocated() == m.max_memory_reserved() == 0
    assert m.get_device_properties(m.current_device()).total_memory == total
    state = m.get_rng_state()
    x = torch.rand(2)
    m.set_rng_state(state)
    assert torch.equal(x, torch.rand(2))
    with pytest.raises(AttributeError, match="no attribute"):
        m.not_a_device_function  # noqa: B018
