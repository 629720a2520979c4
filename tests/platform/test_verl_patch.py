"""Patch ``verl-0.9.1-cpu-process-group``: upstream-change detectors, guards, and that it works.

If a test in the first block fails, verl changed under us: read patches/README.md before touching the
recorded values.
"""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import pytest

import mgrpo_verl.platform.verl_cpu_process_group as patch

REPO = Path(__file__).resolve().parents[2]
README = REPO / "patches" / "README.md"
DIFF = REPO / "patches" / "verl-0.9.1-cpu-process-group.diff"

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
        import mgrpo_verl.platform.verl_cpu_process_group as patch
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
