"""Patch ``verl-0.9.1-process-group``: upstream-change detectors, guards, and that it works.

If a test in the first block fails, verl changed under us: read patches/README.md before touching the
recorded values.
"""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import pytest

import mgrpo_verl.platform.verl_process_group as patch

REPO = Path(__file__).resolve().parents[2]
README = REPO / "patches" / "README.md"
DIFF = REPO / "patches" / "verl-0.9.1-process-group.diff"

# -- upstream-change detectors ----------------------------------------------------------------------


def test_installed_verl_is_the_patched_version():
    import verl

    assert verl.__version__ == patch.VERL_VERSION


def test_patched_functions_unchanged_upstream():
    assert patch.upstream_drift() == {}, "verl.utils.distributed changed: review patches/README.md"


def test_diff_still_matches_installed_source():
    """Every line the documented diff removes is still in verl/utils/distributed.py."""
    import verl.utils.distributed

    installed = inspect.getsource(verl.utils.distributed).splitlines()
    removed = [
        line[1:] for line in DIFF.read_text().splitlines() if line.startswith("-") and not line.startswith("---")
    ]
    assert removed, "diff has no removed lines"
    for line in removed:
        assert line in installed, f"no longer in verl/utils/distributed.py: {line!r}"


def test_readme_records_the_same_hashes():
    text = README.read_text()
    for name, digest in patch.RECORDED_SOURCE_SHA256.items():
        assert re.search(rf"`verl\.utils\.distributed\.{name}` \| `{digest}`", text), name
    assert patch.PATCH_ID in text


def test_unpatched_verl_still_fails_on_cpu(python_runner, port):
    """The bug is still there. When this fails, upstream fixed it: delete the patch (patches/README.md)."""
    out = python_runner(
        """
        import json, verl
        import mgrpo_verl.platform.verl_process_group as patch
        original = patch.upstream_functions()["initialize_global_process_group_ray"]
        try:
            original(timeout_second=None)
            print(json.dumps({"error": None}))
        except ValueError as e:
            print(json.dumps({"error": str(e)}))
        """,
        env={
            "MGRPO_VERL_DEVICE": "cpu",
            "RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        },
    )
    assert out["error"] and "Duplicate device type cpu" in out["error"]


# -- behaviour --------------------------------------------------------------------------------------


def test_backend_string():
    assert patch.backend_string("cpu", "gloo") == "cpu:gloo"
    assert patch.backend_string("cuda", "nccl") == "cpu:gloo,cuda:nccl"  # verl's string, unchanged
    assert patch.backend_string("npu", "hccl") == "cpu:gloo,npu:hccl"


def test_patched_functions_create_a_gloo_group(python_runner, port):
    """Both verl entry points, as a Ray worker and as torchrun call them, in a world of one."""
    out = python_runner(
        """
        import json, torch, torch.distributed as dist, verl
        from verl.utils.distributed import initialize_global_process_group, initialize_global_process_group_ray
        import verl.workers.engine_workers as workers  # binds the function by name at import
        patched = initialize_global_process_group_ray
        result = {"bound_in_workers": workers.initialize_global_process_group_ray is patched,
                  "marked": getattr(patched, "__mgrpo_patch__", None)}
        initialize_global_process_group_ray(timeout_second=None)
        t = torch.ones(3)
        dist.all_reduce(t)
        result["ray"] = [dist.get_backend(), dist.get_world_size(), t.tolist()]
        dist.destroy_process_group()
        local_rank, rank, world = initialize_global_process_group(timeout_second=60)
        t = torch.full((2,), 2.0)
        dist.broadcast(t, src=0)
        result["torchrun"] = [dist.get_backend(), [local_rank, rank, world], t.tolist()]
        dist.destroy_process_group()
        print(json.dumps(result))
        """,
        env={
            "MGRPO_VERL_DEVICE": "cpu",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        },
    )
    assert out["bound_in_workers"] and out["marked"] == patch.PATCH_ID
    assert out["ray"] == ["cpu:gloo", 1, [1.0, 1.0, 1.0]]
    assert out["torchrun"] == ["cpu:gloo", [0, 0, 1], [2.0, 2.0]]


#: one rank of a gloo group through verl's Ray-worker entry point (patched, or verl's own with the backend fixed), then
#: the rank's listening sockets on MASTER_PORT, an all-reduce over the group, and (rank 0) a knock on MASTER_PORT at
#: each of this machine's routable addresses (tests/security/doors.py), as another machine would
GROUP_RANK = """
import json, os, psutil, runpy, torch, torch.distributed as dist, verl
import mgrpo_verl.platform.verl_process_group as patch
from verl.utils.distributed import initialize_global_process_group_ray
from verl.utils.device import get_device_name
if os.environ["WHICH"] == "patched":
    initialize_global_process_group_ray(timeout_second=60)
elif os.environ["WHICH"] == "patched_gloo":  # an explicit backend, as verl's naive checkpoint engine passes
    initialize_global_process_group_ray(timeout_second=60, backend="cpu:gloo")
else:
    patch.upstream_functions()["initialize_global_process_group_ray"](timeout_second=60, backend="cpu:gloo")
port = int(os.environ["MASTER_PORT"])
listening = sorted({c.laddr.ip for c in psutil.net_connections("inet")
                    if c.status == "LISTEN" and c.pid == os.getpid() and c.laddr.port == port})
t = torch.full((2,), float(dist.get_rank() + 1))
dist.all_reduce(t)
knocks = {}
if dist.get_rank() == 0:
    knocks = runpy.run_path(os.environ["MGRPO_DOORS_PY"])["knock_all"]([port], json.loads(os.environ["ROUTABLE"]))
dist.barrier()
print(json.dumps({"listening": listening, "sum": t.tolist(), "world": dist.get_world_size(), "knocks": knocks,
                  "device": get_device_name(), "applied": patch.is_applied()}))
dist.destroy_process_group()
"""


def _doors():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mgrpo_test_doors", REPO / "tests" / "security" / "doors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _group(which: str, port: int, world_size: int, routable: list[str] = (), device: str = "cpu") -> list[dict]:
    import json
    import os
    import subprocess
    import sys

    procs = []
    for rank in range(world_size):
        env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RAY_ADDRESS")}
        env.update(MGRPO_VERL_DEVICE=device, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world_size), WHICH=which,
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONWARNINGS="ignore",
                   MGRPO_DOORS_PY=str(REPO / "tests" / "security" / "doors.py"), ROUTABLE=json.dumps(list(routable)))
        procs.append(subprocess.Popen([sys.executable, "-c", GROUP_RANK], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-4000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_group_store_listens_on_master_addr_only(port, world_size):
    """Issue 29: verl's Ray workers create their process group through torch's env:// store, whose server (rank 0)
    listens on every interface whatever MASTER_ADDR says; the patched entry point serves it on MASTER_ADDR (the CPU
    run's Ray session makes it 127.0.0.1). verl's own function, run the same way, is the control: it listens beyond
    loopback, so this test sees the difference. The group works either way (an all-reduce over both ranks). Both
    are knocked on at this machine's routable address while the group is up: the patched store refuses, verl's own
    lets the knock in (the control: the knock sees an open door)."""
    doors = _doors()
    routable = doors.routable_addresses()
    expected_sum = [float(world_size * (world_size + 1) // 2)] * 2
    patched = _group("patched", port, world_size, routable)
    assert patched[0]["listening"] == ["127.0.0.1"], patched
    assert all(o["sum"] == expected_sum and o["world"] == world_size for o in patched), patched
    assert all(o["listening"] == [] for o in patched[1:]), patched  # only rank 0 serves
    original = _group("original", port, world_size, routable)
    assert original[0]["listening"] and not set(original[0]["listening"]) <= {"127.0.0.1", "::1"}, original
    assert all(o["sum"] == expected_sum for o in original), original
    if not routable:
        pytest.skip(f"sockets checked, no knock: {doors.NO_ADDRESS}")
    assert set(patched[0]["knocks"].values()) == {"refused"} and len(patched[0]["knocks"]) == len(routable), patched
    assert doors.opened(original[0]["knocks"]), original  # verl's own lets the knock in


def test_the_group_store_listens_on_master_addr_only_on_an_accelerator_platform_too(port):
    """The same door on a GPU machine's platform: ``MGRPO_VERL_DEVICE=accelerator`` makes verl resolve its accelerator
    platform here (nvidia, ``get_device_name() == "cuda"``), so the patch's CPU backend fix stands aside, but the
    store is still served on the loopback MASTER_ADDR a Ray the run starts gives every worker group (before: the patch
    deferred to verl's function off CPU, and the store listened on every interface). The group is gloo, passed
    explicitly as verl's checkpoint engine does (this machine has no NCCL); the store does not depend on the backend."""
    doors = _doors()
    routable = doors.routable_addresses()
    patched = _group("patched_gloo", port, 2, routable, device="accelerator")
    assert [o["device"] for o in patched] == ["cuda", "cuda"] and all(o["applied"] for o in patched), patched
    assert patched[0]["listening"] == ["127.0.0.1"], patched
    assert all(o["sum"] == [3.0, 3.0] for o in patched), patched
    if not routable:
        pytest.skip(f"sockets checked, no knock: {doors.NO_ADDRESS}")
    assert set(patched[0]["knocks"].values()) == {"refused"}, patched


@pytest.fixture
def unpatched():
    """Revert the patch for the test (the plugin applied it in this process on a CPU machine)."""
    was_applied = patch.is_applied()
    patch.revert()
    yield
    patch.revert()
    if was_applied:
        assert patch.apply(strict=True)


def test_apply_revert_rebinds_names(unpatched):
    import verl.utils.distributed as dist_utils
    import verl.workers.engine_workers as workers

    original = dist_utils.initialize_global_process_group_ray
    assert workers.initialize_global_process_group_ray is original
    assert patch.apply(strict=True) and patch.apply(strict=True)  # idempotent
    assert dist_utils.initialize_global_process_group_ray is not original
    assert workers.initialize_global_process_group_ray is dist_utils.initialize_global_process_group_ray
    assert patch.upstream_functions()["initialize_global_process_group_ray"] is original
    patch.revert()
    assert workers.initialize_global_process_group_ray is original and not patch.is_applied()


def test_version_guard(unpatched, monkeypatch):
    import verl

    monkeypatch.setattr(verl, "__version__", "0.9.2")
    with pytest.raises(patch.VerlPatchError, match="written for verl==0.9.1, found verl==0.9.2"):
        patch.apply(strict=True)
    with pytest.warns(RuntimeWarning, match="not applied"):
        assert patch.apply() is False
    assert not patch.is_applied()


def test_source_guard(unpatched, monkeypatch):
    monkeypatch.setitem(patch.RECORDED_SOURCE_SHA256, "initialize_global_process_group", "0" * 64)
    with pytest.raises(patch.VerlPatchError, match="differs from verl 0.9.1"):
        patch.apply(strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert patch.apply() is False
    assert not patch.is_applied()
