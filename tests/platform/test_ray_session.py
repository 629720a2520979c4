"""``ray_cpu_session``: private temp dir, nothing in $HOME, clean shutdown on success, error and Ctrl-C; closed to
the network (token authentication, loopback only)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mgrpo_verl.platform.ray_session import (
    TOKEN_ENV_KEYS,
    patched_environ,
    private_temp_dir,
    ray_auth_env,
    ray_cpu_env,
)

# Runs in a fresh interpreter with HOME pointing at an empty directory. MODE: ok | error | sigint.
SESSION = """
import json, os, signal, sys
import ray
from mgrpo_verl.platform import ray_cpu_session
mode = sys.argv[1] if len(sys.argv) > 1 else "{mode}"
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: a shell's background job ignores SIGINT
KEYS = ("RAY_TMPDIR", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "TMPDIR")
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
    assert out["env"] == {"RAY_TMPDIR": tmp, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": f"{tmp}/auth_token", "TMPDIR": tmp}
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
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    for key in TOKEN_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    with private_temp_dir() as tmp:
        env = ray_cpu_env(tmp)
        assert env["RAY_TMPDIR"] == tmp and env["RAY_AUTH_MODE"] == "token"
        token = Path(env["RAY_AUTH_TOKEN_PATH"])
        assert token == Path(tmp, "auth_token") and token.stat().st_mode & 0o777 == 0o600
        assert len(token.read_text()) == 64  # 32 random bytes, hex
        assert ray_cpu_env(tmp) == env and len(token.read_text()) == 64  # the same token again, not a new one
        with patched_environ(env):
            assert os.environ["RAY_AUTH_MODE"] == "token"
        assert os.environ["RAY_AUTH_MODE"] == "disabled" and "RAY_TMPDIR" not in os.environ
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


def test_an_exported_token_is_kept(tmp_path):
    """A driver that joins a cluster must present that cluster's token (docs/multinode.md): an exported one wins,
    and no token file is written then."""
    assert ray_auth_env(str(tmp_path), {"RAY_AUTH_TOKEN_PATH": "/cluster/token"}) == {"RAY_AUTH_MODE": "token"}
    assert ray_auth_env(str(tmp_path), {"RAY_AUTH_TOKEN": "abc"}) == {"RAY_AUTH_MODE": "token"}
    assert list(tmp_path.iterdir()) == []
    assert ray_auth_env(str(tmp_path), {"RAY_AUTH_TOKEN": ""}) == {
        "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "auth_token")}


# The session the project's way, TransferQueue started in it as verl does (controller and storage units), then:
# every listening socket of the session's processes, and two outsiders joining it from other processes: one with
# no token (as anyone who can reach the port), one with the session's token (the control: the address is right).
DOORS = """
import json, os, runpy, subprocess, sys, time
import psutil, ray
import transfer_queue as tq
from mgrpo_verl.platform import ray_cpu_session
doors = runpy.run_path(os.environ["MGRPO_DOORS_PY"])

JOIN = "import os, ray; ray.init(address=os.environ['TARGET']); print('JOINED', ray.get(ray.remote(lambda: os.getuid()).remote()))"
info = {}
with ray_cpu_session(num_cpus=4) as s:
    tq.init()
    tree = psutil.Process()
    pids = {tree.pid} | {p.pid for p in tree.children(recursive=True)}
    def who(pid):  # e.g. "gcs_server", "raylet", "ray::TransferQueueController"
        p = psutil.Process(pid)
        return p.cmdline()[0] if p.cmdline()[0].startswith("ray::") else p.name()
    sockets = doors["listening"](pids)
    info["listening"] = sorted({(ip, name) for ip, _, name in sockets})
    # every listening port knocked on at this machine's routable addresses, as another machine would
    info["knocks"] = doors["knock_all"]([port for _, port, _ in sockets], json.loads(os.environ["ROUTABLE"]))
    # an outsider's environment: nothing of the session's (no RAY_AUTH_*), its own HOME; it gives up after 3 tries;
    # it runs on this machine, so it may reach loopback (Ray's client would otherwise rewrite 127.0.0.1 into the
    # routable address, where nothing listens)
    outside = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    outside.update(TARGET=s.address, HOME=os.path.join(s.temp_dir, "outsider"), RAY_NUM_REDIS_GET_RETRIES="3",
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    for who, extra in (("no_token", {}), ("wrong_token", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}),
                       ("token", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": s.env.get("RAY_AUTH_TOKEN_PATH", "")})):
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-c", JOIN], env={**outside, **extra}, capture_output=True, text=True, timeout=240)
        info[who] = {"rc": r.returncode, "joined": "JOINED" in r.stdout, "seconds": time.monotonic() - start,
                     "refused_for_token": "InvalidAuthToken" in r.stderr, "tail": r.stderr[-1500:]}
    info["address"] = s.address
    tq.close()
print(json.dumps(info))
"""


def _doors():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mgrpo_test_doors", Path(__file__).parents[1] / "security" / "doors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_session_is_closed_to_the_network(python_runner, tmp_path):
    """Issue 29, item 1 and 3. On the old settings (``RAY_AUTH_MODE=disabled``, Ray's routable node address) the
    token-less outsider joined and ran a task, and the GCS, raylet, workers and TransferQueue's sockets listened on
    all interfaces or the node's routable address. Every listening port of the session, TransferQueue's included, is
    also knocked on at this machine's routable address (tests/security/doors.py): each knock is refused."""
    import json

    doors = _doors()
    routable = doors.routable_addresses()
    home = tmp_path / "home"
    home.mkdir()
    out = python_runner(DOORS, env={"HOME": str(home), doors.PATH_ENV: doors.PATH, "ROUTABLE": json.dumps(routable)},
                        timeout=600)
    assert out["address"].startswith("127.0.0.1:")
    exposed = [(ip, proc) for ip, proc in out["listening"] if ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert exposed == [], f"listening beyond loopback: {exposed}"
    names = {proc for _, proc in out["listening"]}
    # Ray's own servers and TransferQueue's were among those checked
    assert {"gcs_server", "raylet", "ray::TransferQueueController", "ray::SimpleStorageUnit"} <= names, names
    for who in ("no_token", "wrong_token"):
        assert out[who]["rc"] != 0 and not out[who]["joined"], (who, out[who]["tail"])
        assert out[who]["refused_for_token"], (who, out[who]["tail"])  # refused by authentication, not unreachable
    assert out["token"]["rc"] == 0 and out["token"]["joined"], out["token"]["tail"]
    assert _home_files(home) == [], "files written to $HOME"
    if not routable:
        pytest.skip(f"sockets checked, no knock: {doors.NO_ADDRESS}")
    assert len(out["knocks"]) >= 4 * len(routable), out["knocks"]  # GCS, raylet, TransferQueue's two at least
    assert doors.opened(out["knocks"]) == [], f"let in from {routable}: {out['knocks']}"
    assert set(out["knocks"].values()) == {"refused"}, out["knocks"]  # refused at once: nothing listens there


# --------------------------------------------------------------------- Ray's import-time settings (patches/README.md)
#: sha256 of ``inspect.getsource(ray._private.services.get_node_ip_address)`` in Ray 2.60.0
NODE_IP_SOURCE_SHA256 = "68e6d6e67ed45d5640ae9880ae581dd3303da145d08f7044bd212cffa2c0213d"

REREAD = """
import json
import ray
from ray._private import services
from ray._raylet import AuthenticationMode, get_authentication_mode
from mgrpo_verl.platform.ray_session import ray_environ

def now():
    return {"ip": services.get_node_ip_address(), "token": get_authentication_mode() == AuthenticationMode.TOKEN}

out = {"before": now()}
with ray_environ({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}):
    out["inside"] = now()
out["after"] = now()
print(json.dumps(out))
"""


def test_ray_environ_makes_an_imported_ray_read_its_settings_again(python_runner):
    """Ray reads the authentication mode and whether it uses a routable node address when it is imported
    (``main_ppo`` and verl import it long before the session starts): set afterwards, they were ignored (a driver
    in mode 'disabled' against a token cluster, a routable node address)."""
    out = python_runner(REREAD, env={"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"})
    assert out["inside"] == {"ip": "127.0.0.1", "token": True}
    assert out["before"] == out["after"] and out["after"]["token"] is False
    assert out["after"]["ip"] != "127.0.0.1"  # this machine's routable address, as before


def test_ray_reads_the_settings_where_ray_environ_rereads_them():
    """Contract with Ray 2.60 (patch ``ray-2.60-reread-settings``): when one of these fails, re-check
    :func:`mgrpo_verl.platform.ray_session._reread_ray_settings` and the patch's entry in patches/README.md."""
    import inspect

    import ray
    from ray._private import ray_constants, services, worker
    from ray._private.authentication import authentication_token_setup as auth

    from mgrpo_verl.platform.patching import source_sha256

    # the node address: loopback exactly when the constant, computed from the variable at import, is False...
    assert "ENABLE_RAY_CLUSTER = env_bool(\n    ENABLE_RAY_CLUSTERS_ENV_VAR,\n    not IS_WINDOWS_OR_OSX," in inspect.getsource(
        ray_constants)
    assert source_sha256(services.get_node_ip_address) == NODE_IP_SOURCE_SHA256, ray.__version__
    # ... and ray.init(_node_ip_address="127.0.0.1") is no way round it: Ray turns loopback into the routable address
    assert "_node_ip_address = services.resolve_ip_for_localhost(_node_ip_address)" in inspect.getsource(worker.init)
    # the authentication mode and the token: Ray refreshes both this way itself
    assert 'Config.initialize("")' in inspect.getsource(auth._enable_token_auth)
    assert "token_loader.reset_cache()" in inspect.getsource(auth.ensure_token_if_auth_enabled)


def test_an_exported_transport_setting_wins_and_the_rest_go_on_loopback():
    """A user who exports ``NCCL_SOCKET_IFNAME`` (say a machine whose loopback NCCL cannot use) keeps it; the other
    two settings still go on loopback, the interface that holds 127.0.0.1."""
    from mgrpo_verl.platform.ray_session import loopback_interface, loopback_transport_env

    assert loopback_interface() == "lo"  # Linux
    assert loopback_transport_env({"NCCL_SOCKET_IFNAME": "eth0"}) == {"GLOO_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1"}
    assert loopback_transport_env({}) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1"}


def test_the_one_loopback_check():
    """What every door's check (Redis's password rule, the process-group and vLLM store patches, the GPU kit's socket
    sampler) takes for loopback: 127.0.0.0/8 (127.0.1.1 is Debian's host-name address), ::1, 127.x written
    IPv4-mapped as a dual-stack socket reports it, a zone suffix ignored, ``localhost`` in any case. Every interface
    (``0.0.0.0``, ``::``), a routable or mapped routable address, a host name, an empty or missing one: not."""
    from mgrpo_verl.platform.ray_session import is_loopback

    yes = ["127.0.0.1", "127.1.2.3", "127.0.1.1", "::1", "::ffff:127.0.0.1", "::1%lo", "localhost", "LOCALHOST"]
    no = ["0.0.0.0", "::", "10.0.0.1", "192.0.2.2", "fd00::2", "::ffff:10.0.0.1", "redis-host", "garbage", "", None]
    assert [is_loopback(a) for a in yes + no] == [True] * len(yes) + [False] * len(no)
