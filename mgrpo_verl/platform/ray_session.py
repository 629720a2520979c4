"""Start and stop Ray for CPU runs of verl, leaving nothing behind.

With Ray's defaults verl's long-lived actors starve on a few cores, files stay behind in the system temp dir
and Ray listens beyond loopback; here Ray gets logical CPUs and GPUs sized to verl's actors, a private
temporary directory (removed on exit), token authentication and loopback only, for the session's duration
(the environment restored afterwards); a driver joining an existing cluster gets what that needs instead. Why
each setting, measured: ``docs/cpu.md``, "The Ray session".
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

DEFAULT_NUM_CPUS = 16


@dataclass(frozen=True)
class RayCpuSession:
    """What :func:`ray_cpu_session` started."""

    temp_dir: str
    num_cpus: int
    num_gpus: int
    env: Mapping[str, str] = field(default_factory=dict)
    address: str | None = None


#: The file in a session's private temporary directory that holds its Ray authentication token.
AUTH_TOKEN_FILE = "auth_token"
#: Exported by a user whose driver joins a cluster: that cluster's token, which :func:`ray_auth_env` keeps.
TOKEN_ENV_KEYS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def ray_cpu_env(temp_dir: str) -> dict[str, str]:
    """Environment variables for a Ray (or ``python -m verl.trainer.main_ppo``) run on CPU; writes the
    session's token into ``temp_dir`` when :func:`ray_auth_env` needs one.

    The platform choice is not among them: the CPU platform selects itself when no accelerator is
    present; on a machine with one, export ``MGRPO_VERL_DEVICE=cpu`` before ``import verl``.
    """
    return {
        "RAY_TMPDIR": temp_dir,
        **ray_closed_env(temp_dir),
        "RAY_USAGE_STATS_ENABLED": "0",
        "TMPDIR": temp_dir,
        # vLLM's CPU build keeps its linear weights reloadable (patch vllm-cpu-linear-weights)
        "MGRPO_VLLM_CPU_RELOADABLE": "1",
        **cpu_sizing_env(),
    }


def ray_closed_env(temp_dir: str) -> dict[str, str]:
    """What closes a Ray session this process starts to the network, on any platform: token authentication
    (:func:`ray_auth_env`, the token in ``temp_dir``), loopback only (Ray then takes 127.0.0.1 as the node's
    address and listens there; the setting's name is Ray's, which uses loopback on Windows and macOS), and the
    process groups' own sockets on loopback too (:func:`loopback_transport_env`)."""
    return {**ray_auth_env(temp_dir), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **loopback_transport_env()}


def is_loopback(address: str | None) -> bool:
    """``localhost`` (any case) or a loopback address: 127.0.0.0/8, ``::1``, or 127.x written IPv4-mapped
    (``::ffff:127.0.0.1``, as a dual-stack socket reports it); a zone suffix (``%lo``) is ignored. Anything else, an
    empty or unreadable address included, is not: a check that lets a door stay open must never say yes by mistake."""
    import ipaddress

    if not address:
        return False
    if address.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback


def loopback_interface() -> str:
    """The name of the network interface that holds 127.0.0.1 (``lo`` on Linux), ``lo`` when it cannot be read."""
    try:
        import psutil

        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == "127.0.0.1" for a in addrs):
                return name
    except ImportError:
        pass
    return "lo"


def loopback_transport_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The sockets of a one-machine run's process groups on loopback, each setting only when ``environ`` (default:
    ``os.environ``) does not export it: gloo (``GLOO_SOCKET_IFNAME``: FSDP's CPU groups, vLLM's CPU group) and NCCL's
    bootstrap (``NCCL_SOCKET_IFNAME``) pick the host name's or the first non-loopback interface by default, and vLLM
    (``VLLM_HOST_IP``) the routable address. A Ray the run starts has one node, so loopback is all they need."""
    environ = os.environ if environ is None else environ
    interface = loopback_interface()
    defaults = {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface, "VLLM_HOST_IP": "127.0.0.1"}
    return {key: value for key, value in defaults.items() if key not in environ}


def ray_auth_env(temp_dir: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Ray's token authentication: ``RAY_AUTH_MODE=token``, and the token in ``<temp_dir>/auth_token``
    (created now, mode 0600, when missing) unless ``environ`` (default: ``os.environ``) exports one
    (:data:`TOKEN_ENV_KEYS`: a cluster's token, which a driver joining that cluster must present)."""
    environ = os.environ if environ is None else environ
    env = {"RAY_AUTH_MODE": "token"}
    if not any(environ.get(key) for key in TOKEN_ENV_KEYS):
        path = os.path.join(temp_dir, AUTH_TOKEN_FILE)
        if not os.path.exists(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        env["RAY_AUTH_TOKEN_PATH"] = path
    return env


def physical_cores() -> int:
    """The machine's physical cores, as TransferQueue counts them (psutil, which it imports), else the
    logical count."""
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def cpu_sizing_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Settings sized to a CPU run, each only when ``environ`` (default: ``os.environ``) does not set it
    already, so that an exported value wins. Measured with ``benchmarks/bench_footprint.py`` on the default
    run, 2-core machine (docs/benchmarks.md):

    - ``TQ_NUM_THREADS``: the torch threads TransferQueue uses to pack and unpack batches, default 8.
      TransferQueue caps it at the physical cores anyway, but logs a warning every time it does so, on
      every put and get of every process: about 350 lines a step on 2 cores, each shipped by Ray's log
      monitor to the driver. Set to the physical cores: the same thread count, no warnings.
    - ``RAY_prestart_worker_first_driver=0``: Ray starts one idle Python worker per logical CPU when the
      driver connects (16 here: the logical CPUs are oversized on purpose, see ``DEFAULT_NUM_CPUS``); the
      ones no actor takes stay idle. Off: 85 MiB less at the peak (two idle workers fewer), start-up CPU
      time unchanged (75-81 against 72-78 CPU seconds to the first step, two runs each).
    - ``RAY_num_workers_soft_limit=0``: the workers that ran Ray tasks during start-up (no actor in them)
      stay as idle workers up to this many, default the logical CPUs (16). 0: Ray stops them after a second
      idle. Default run, 8 steps, 2 idle cores, 2026-12-05: two processes (122 MiB) fewer at the peak, start-up
      and step times unchanged within noise (43.0 against 43.5 s to the first step, median step 1.57 against
      1.49 s): no task runs per step.
    """
    environ = os.environ if environ is None else environ
    defaults = {"TQ_NUM_THREADS": str(physical_cores()), "RAY_prestart_worker_first_driver": "0",
                "RAY_num_workers_soft_limit": "0"}
    return {key: value for key, value in defaults.items() if key not in environ}


@contextmanager
def patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ``, restoring the previous values (or absence) on exit."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextmanager
def ray_environ(values: Mapping[str, str]) -> Iterator[None]:
    """:func:`patched_environ` for Ray's settings: on entry and on exit, an already imported Ray of this
    process (one that is not running) reads again what it reads from the environment at import time: its
    configuration (the authentication mode), its cached token, and whether it uses a routable node address
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``). Processes that Ray starts import it afresh and need nothing."""
    try:
        with patched_environ(values):
            _reread_ray_settings()
            yield
    finally:
        _reread_ray_settings()


def _reread_ray_settings() -> None:
    """What a fresh ``import ray`` would read from the environment now (patch ``ray-2.60-reread-settings``)."""
    if "ray" not in sys.modules:
        return  # the import, when it comes, reads the environment itself
    import ray

    if ray.is_initialized():
        return  # not ours to reconfigure while it runs
    try:
        from ray._private import ray_constants
        from ray._raylet import AuthenticationTokenLoader, Config

        ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(
            ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX
        )
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError) as err:  # a Ray other than 2.60: refuse rather than run open
        raise RuntimeError(
            f"Ray {ray.__version__}: cannot make the imported Ray read its authentication and node-address settings "
            f"again ({err}); see patches/README.md, ray-2.60-reread-settings"
        ) from err


#: Ray puts sockets at ``<temp dir>/session_<date>_<time>_<pid>/sockets/plasma_store`` and Unix socket
#: paths are limited to 107 bytes, which leaves about this many characters for the temp dir itself.
MAX_RAY_TEMP_DIR_CHARS = 45


@contextmanager
def private_temp_dir(prefix: str = "mgrpo-ray-", base: str | None = None, keep: bool = False) -> Iterator[str]:
    """A fresh directory under ``base`` (default: the system temp dir), removed on exit unless ``keep``.

    Raises ``ValueError`` when the path would be too long for Ray's Unix sockets (a deep ``$TMPDIR``),
    instead of letting Ray fail later with "AF_UNIX path length cannot exceed 107 bytes".
    """
    root = base or tempfile.gettempdir()
    if len(os.path.join(root, prefix)) + 8 > MAX_RAY_TEMP_DIR_CHARS:
        raise ValueError(
            f"the temporary directory {root!r} is too deep for Ray's Unix sockets (at most "
            f"{MAX_RAY_TEMP_DIR_CHARS} characters for Ray's temp dir); set TMPDIR to a shorter directory"
        )
    path = tempfile.mkdtemp(prefix=prefix, dir=base)
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def ray_cpu_session(
    num_cpus: int = DEFAULT_NUM_CPUS,
    num_gpus: int = 0,
    *,
    temp_dir: str | None = None,
    keep_temp_dir: bool = False,
    env: Mapping[str, str] | None = None,
    **init_kwargs: Any,
) -> Iterator[RayCpuSession]:
    """Start a local Ray for a CPU run; shut it down on normal exit, on error and on Ctrl-C.

    Args:
        num_cpus: logical CPUs (not cores; ``docs/cpu.md``, "The Ray session").
        num_gpus: logical GPUs, one per verl training worker on the CPU platform.
        temp_dir: Ray's temporary directory; by default a new private one, removed afterwards.
        keep_temp_dir: keep the directory we created (e.g. to read Ray's logs after a failure).
        env: extra environment variables for the session (inherited by Ray's workers).
        init_kwargs: passed to ``ray.init`` (e.g. ``runtime_env``).

    Raises ``RuntimeError`` if Ray is already initialized in this process (it would not be ours to stop).
    """
    import ray

    if ray.is_initialized():
        raise RuntimeError("ray_cpu_session: Ray is already initialized in this process")
    with private_temp_dir(base=None, keep=keep_temp_dir) if temp_dir is None else _existing(temp_dir) as tmp:
        session_env = {**ray_cpu_env(tmp), **(env or {})}
        with ray_environ(session_env):
            init_kwargs.setdefault("include_dashboard", False)
            init_kwargs.setdefault("log_to_driver", True)
            try:
                context = ray.init(num_cpus=num_cpus, num_gpus=num_gpus, _temp_dir=tmp, **init_kwargs)
                address = getattr(context, "address_info", {}).get("address")
                yield RayCpuSession(tmp, num_cpus, num_gpus, dict(session_env), address)
            finally:
                # Also reached on KeyboardInterrupt (Ctrl-C) and SystemExit.
                if ray.is_initialized():
                    ray.shutdown()


@contextmanager
def _existing(path: str) -> Iterator[str]:
    os.makedirs(path, exist_ok=True)
    yield path


#: ``ray_kwargs.ray_init`` keys Ray refuses from a driver that joins an existing cluster.
NODE_RESOURCE_KEYS = ("num_cpus", "num_gpus")


def existing_cluster_address(ray_init: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> str | None:
    """The address of the existing Ray cluster that ``ray.init(**ray_init)`` joins, or None when it starts one.

    ``ray_init["address"]`` first, then ``$RAY_ADDRESS`` (Ray's order); ``"local"`` means a new local cluster.
    ``None`` everywhere also means a new cluster here: Ray would still join the last ``ray start`` of this
    machine when that is recorded in its temp dir, but on CPU our driver points ``RAY_TMPDIR`` at a private,
    empty directory, so a CPU run joins a cluster only when given its address.
    """
    environ = os.environ if environ is None else environ
    address = ray_init.get("address") or environ.get("RAY_ADDRESS") or None
    return None if address == "local" else address


def ray_init_for_existing_cluster(ray_init: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``ray_init`` (verl's ``ray_kwargs.ray_init``, as a plain dict) for a driver that joins an existing cluster.

    - ``num_cpus`` / ``num_gpus`` are removed: Ray raises ``ValueError`` when a joining driver passes them
      (the nodes declared their logical CPUs and GPUs at ``ray start``), and on CPU our config fills them in;
    - ``env`` is added to ``runtime_env.env_vars`` (the job's environment on every node), an entry already
      there winning: the driver's environment does not reach workers that a ``ray start`` elsewhere spawned.

    Pure: returns a new dict, ``ray_init`` is not modified.
    """
    joined = {k: v for k, v in ray_init.items() if k not in NODE_RESOURCE_KEYS}
    runtime_env = dict(joined.get("runtime_env") or {})
    runtime_env["env_vars"] = {**env, **(runtime_env.get("env_vars") or {})}
    joined["runtime_env"] = runtime_env
    return joined
