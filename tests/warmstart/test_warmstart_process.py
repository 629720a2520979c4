"""The warm start's SFT child and its temporary folder (issue 29, items 2 and 8): no elastic agent and no store
reachable from outside, a child that dies with the build, no folder left behind, and a published warm start
trusted only when its files are the ones its manifest records.

The kill tests start ``python -m mgrpo_verl.warmstart`` in a process group of its own (so that the test can kill
the group as a terminal or a job scheduler kills ``main_ppo``'s), wait until verl's SFT trainer has taken its
first steps, then kill the group. About 30 s each on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mgrpo_verl.models.tiny import build_once
from mgrpo_verl.warmstart import build, sft

LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")


def _doors():
    """tests/security/doors.py, by path (pytest's importlib mode; verl ships a top-level ``tests`` package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mgrpo_test_doors", Path(__file__).parents[1] / "security" / "doors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: a build that is still in its first SFT run when it is killed
ARGS = ["--n-train", "16", "--n-val", "4", "--steps", "400", "--main-restart-steps", "0", "--sub-steps", "2",
        "--batch-size", "4", "--n-eval", "0"]


def sft_processes(root: Path) -> list[psutil.Process]:
    """Running processes of verl's SFT trainer (or torchrun) working under ``root``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(root) in cmdline and ("mgrpo_verl.warmstart.sft" in cmdline or "torch.distributed.run" in cmdline):
            found.append(proc)
    return found


def start_build(root: Path, cache_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "MGRPO_VERL_CACHE": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    return subprocess.Popen([sys.executable, "-m", "mgrpo_verl.warmstart", "--task", "relay_tools", "--out", str(root), *ARGS],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait_until_training(root: Path, build_proc: subprocess.Popen, timeout: float = 600) -> Path:
    """The build's temporary folder, once verl's SFT trainer has logged a step (its process group is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert build_proc.poll() is None, "the build ended before it was killed"
        for metrics in root.glob("relay_tools-*.tmp-*/sft/main/metrics.jsonl"):
            if metrics.read_text().strip():
                return metrics.parents[2]
        time.sleep(0.5)
    raise TimeoutError("verl's SFT trainer logged no step")


def listening(pids: set[int]) -> list[tuple[str, str]]:
    out = []
    for conn in psutil.net_connections("inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out.append((conn.laddr.ip, psutil.Process(conn.pid).name()))
    return out


def wait_gone(root: Path, timeout: float = 30) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := sft_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_build_leaves_no_sft_process_and_no_folder(sig, tmp_path, cache_dir, tiny_paths):
    """Before the fix the SFT worker ran under torchrun in a session of its own: a kill of the build's process group
    left it running (orphaned, training on into a folder nobody would publish), torchrun's rendezvous store listened
    on every interface, and the temporary folder stayed. SIGTERM now removes the folder at once; after a SIGKILL
    nothing of ours can run, and the next build of the same warm start removes it. While the SFT trains, every port
    the build and its child listen on is knocked on at this machine's routable addresses: each knock is refused."""
    doors = _doors()
    routable = doors.routable_addresses()
    root = tmp_path / "warmstart"
    proc = start_build(root, cache_dir)
    try:
        tmp = wait_until_training(root, proc)
        children = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        assert children, "no SFT child"
        exposed = [(ip, name) for ip, name in listening({proc.pid, *children}) if ip not in LOOPBACK]
        assert exposed == [], f"the build listens beyond loopback: {exposed}"
        knocks = doors.knock_all([port for _, port, _ in doors.listening({proc.pid, *children})], routable)
        assert set(knocks.values()) <= {"refused"}, f"knocks at {routable} not refused: {knocks}"
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
        left = wait_gone(root)
        assert left == [], f"SFT processes survived the kill: {[p.cmdline()[:4] for p in left]}"
    finally:
        for p in sft_processes(root):
            p.kill()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM
        assert not tmp.exists(), "the temporary folder of a terminated build was left behind"
        return
    assert tmp.exists()  # a SIGKILL leaves no chance; the next build of this warm start removes it
    target = tmp.with_name(tmp.name.split(".tmp-")[0])
    build_once(target, lambda new: (new / "built").write_text("1"))
    assert not tmp.exists() and (target / "built").is_file()
    assert sorted(p.name for p in root.iterdir()) == [target.name, target.name + ".lock"]


def test_sft_child_environment_has_no_tcp_store(tmp_path):
    """What verl's trainer gets instead of torchrun's: rank 0 of 1 and a file rendezvous (no TCP store, which
    listens on every interface whatever MASTER_ADDR says); gloo on loopback unless the user chose an interface."""
    env = sft.single_process_env(tmp_path / "store", {})
    assert env["RANK"] == env["LOCAL_RANK"] == "0" and env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "1"
    assert env["DIST_INIT_METHOD"] == f"file://{tmp_path}/store?rank=0&world_size=1"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert sft.single_process_env(tmp_path / "store", {"GLOO_SOCKET_IFNAME": "eth1"})["GLOO_SOCKET_IFNAME"] == "eth1"
    assert env[sft.PARENT_ENV] == str(os.getpid())


# ------------------------------------------------------------------------------------------- integrity


def publish_by_hand(target: Path, files: dict[str, bytes]) -> dict:
    """A published warm start as ``_build`` leaves it: the files, and a manifest recording them."""
    for rel, data in files.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)
    manifest = {"version": build.VERSION, "files": build.file_records(target)}
    (target / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def test_the_manifest_records_every_published_file(tmp_path):
    manifest = publish_by_hand(tmp_path, {"main/model.safetensors": b"w" * 1000, "sub/config.json": b"{}"})
    # sha256 of 1000 bytes "w" and of "{}", computed by hashlib here as the records' own definition
    import hashlib

    assert manifest["files"] == {
        "main/model.safetensors": {"size": 1000, "sha256": hashlib.sha256(b"w" * 1000).hexdigest()},
        "sub/config.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
    }
    assert build._published(tmp_path).manifest == manifest


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.write_bytes(p.read_bytes()[:400]), "has 400 bytes, the manifest records 1000 (truncated?)"),
    (lambda p: p.write_bytes(b"x" * 1000), "differs from the manifest's sha256"),
    (lambda p: p.unlink(), "is missing"),
])
def test_a_damaged_weights_file_is_refused_naming_it(tmp_path, damage, problem):
    """Before the fix a truncated weights file was returned as the published warm start, and RL failed later in a
    Ray worker that could not load it (or trained from garbage)."""
    publish_by_hand(tmp_path, {"main/model.safetensors": b"w" * 1000, "sub/model.safetensors": b"v" * 10})
    weights = tmp_path / "main" / "model.safetensors"
    damage(weights)
    with pytest.raises(build.WarmStartCorrupt) as err:
        build._published(tmp_path)
    assert f"{weights} {problem}" in str(err.value) and f"delete {tmp_path}" in str(err.value)


@pytest.mark.parametrize("records", [{}, {"files": {}}, {"files": None}], ids=["no_key", "empty", "null"])
def test_a_manifest_from_before_the_records_is_refused_naming_the_folder(tmp_path, records):
    """A warm start cached before the records existed (its manifest has none) was trusted unchecked, an empty
    weights file included; now it is refused like a damaged one, naming the folder to delete."""
    target = tmp_path / "relay_tools-0123abcd"
    (target / "main").mkdir(parents=True)
    (target / "main" / "model.safetensors").write_bytes(b"")  # truncated to nothing: nothing could tell
    (target / "manifest.json").write_text(json.dumps({"version": "3", **records}))
    with pytest.raises(build.WarmStartCorrupt) as err:
        build._published(target)
    message = str(err.value)
    assert f"warm start {target}: its manifest records no files" in message
    assert f"It is not used; delete {target} to build it again" in message
