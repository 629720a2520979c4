"""``ray_cpu_session``: private temp dir, nothing in $HOME, clean shutdown on success, error and Ctrl-C."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mgrpo_verl.platform.ray_session import patched_environ, private_temp_dir, ray_cpu_env

# Runs in a fresh interpreter with HOME pointing at an empty directory. MODE: ok | error | sigint.
SESSION = """
import json, os, signal, sys
import ray
from mgrpo_verl.platform import ray_cpu_session
mode = sys.argv[1] if len(sys.argv) > 1 else "{mode}"
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: a shell's background job ignores SIGINT
KEYS = ("RAY_TMPDIR", "RAY_AUTH_MODE", "TMPDIR")
info = {{"env_before": {{k: os.environ.get(k) for k in KEYS}}}}
try:
    with ray_cpu_session(num_cpus=2, num_gpus=1) as s:
        info["temp_dir"] = s.temp_dir
        info["env"] = {{k: os.environ.get(k) for k in KEYS}}
        info["resources"] = {{k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}}

        @ray.remote(num_gpus=1)
        def where():
            import tempfile
            return tempfile.gettempdir(), ray.get_runtime_context().get_accelerator_ids()["GPU"]

        info["task"] = ray.get(where.remote())
        info["temp_dir_existed"] = os.path.isdir(s.temp_dir)
        if mode == "error":
            raise RuntimeError("failure inside the session")
        if mode == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
            import time; time.sleep(30)
except RuntimeError as e:
    info["raised"] = str(e)
except KeyboardInterrupt:
    info["raised"] = "KeyboardInterrupt"
info["initialized_after"] = ray.is_initialized()
info["temp_dir_after"] = os.path.exists(info["temp_dir"])
info["env_after"] = {{k: os.environ.get(k) for k in KEYS}}
# any process still running from this session (raylet, gcs_server, workers) has the temp dir on its command line
leftover = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                if info["temp_dir"].encode() in f.read():
                    leftover.append(int(pid))
        except OSError:
            pass
info["leftover_pids"] = leftover
print(json.dumps(info))
"""


def _home_files(home: Path) -> list[str]:
    return [str(p.relative_to(home)) for p in home.rglob("*")]


@pytest.mark.parametrize(
    "mode",
    # ~15 s each on 2 cores (import verl + Ray start/stop); the failure paths are marked slow
    ["ok", pytest.param("error", marks=pytest.mark.slow), pytest.param("sigint", marks=pytest.mark.slow)],
)
def test_session_cleans_up(mode, python_runner, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    out = python_runner(SESSION.format(mode=mode), env={"HOME": str(home)}, timeout=180)
    tmp = out["temp_dir"]
    assert out["env"] == {"RAY_TMPDIR": tmp, "RAY_AUTH_MODE": "disabled", "TMPDIR": tmp}
    assert out["resources"] == {"CPU": 2.0, "GPU": 1.0}  # logical CPUs and GPUs
    assert out["task"][0] == tmp  # workers inherit the session environment (their temp files go there)
    assert out["task"][1] == ["0"]
    assert out["temp_dir_existed"]
    assert out.get("raised") == {"ok": None, "error": "failure inside the session", "sigint": "KeyboardInterrupt"}[mode]
    assert out["initialized_after"] is False
    assert out["temp_dir_after"] is False, "private temp dir left behind"
    assert out["env_after"] == out["env_before"]
    assert out["leftover_pids"] == [], "Ray processes survived the session"
    assert _home_files(home) == [], "files written to $HOME"


def test_refuses_when_ray_already_running(monkeypatch):
    import ray

    from mgrpo_verl.platform import ray_cpu_session

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="already initialized"):
        with ray_cpu_session():
            pass


def test_env_helpers(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    with private_temp_dir() as tmp:
        env = ray_cpu_env(tmp)
        assert env["RAY_TMPDIR"] == tmp and env["RAY_AUTH_MODE"] == "disabled"
        with patched_environ(env):
            assert os.environ["RAY_AUTH_MODE"] == "disabled"
        assert os.environ["RAY_AUTH_MODE"] == "token" and "RAY_TMPDIR" not in os.environ
        assert os.path.isdir(tmp)
    assert not os.path.exists(tmp)
    with private_temp_dir(keep=True) as kept:
        pass
    assert os.path.isdir(kept)
    os.rmdir(kept)


def test_too_deep_temp_dir_is_a_clear_error(tmp_path):
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    with pytest.raises(ValueError, match="too deep for Ray's Unix sockets"):
        with private_temp_dir(base=str(deep)):
            pass
    with private_temp_dir() as ok:  # the system temp dir is short enough
        assert os.path.isdir(ok)
