"""Helpers for testing and benchmarking the statistics store: synthetic records, a throw-away local
``redis-server``, and process entry points (importable, so ``multiprocessing`` with the ``spawn``
start method can run them)."""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from mgrpo_verl.store.base import TrajectoryStat
from mgrpo_verl.store.factory import open_store

REDIS_INSTALL_HINT = "install it with `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`"


# ------------------------------------------------------------------------------- synthetic records
def numbered_stats(start: int, stop: int, prefix: str = "t") -> list[TrajectoryStat]:
    """Main records ``{prefix}{i}`` for ``start <= i < stop`` (uid ``u{i // 8}``), deterministic."""
    return [TrajectoryStat(f"{prefix}{i}", f"u{i // 8}", "main", "", (i % 7) / 7.0, i % 3 != 0, i // 1000, 1)
            for i in range(start, stop)]


# -------------------------------------------------------------------------------- process targets
def put_batches(url: str, batches: Sequence[tuple[int, int]], prefix: str = "t", ready_path: str = "") -> int:
    """Open the store at ``url`` and put :func:`numbered_stats` ``(start, stop)`` for each batch in
    order; returns the total newly inserted. Writes ``ready_path`` (if given) once the store is open."""
    with open_store(url) as store:
        if ready_path:
            Path(ready_path).write_text(str(os.getpid()))
        return sum(store.put(numbered_stats(a, b, prefix)) for a, b in batches)


def put_shuffled(url: str, ids: Sequence[int], batch: int, seed: int, prefix: str = "t", start_at: float = 0.0) -> int:
    """Put :func:`numbered_stats` of ``ids`` in a seeded random order, ``batch`` at a time, starting at
    wall-clock time ``start_at`` (so that several processes write at the same time)."""
    order = list(ids)
    random.Random(seed).shuffle(order)
    inserted = 0
    with open_store(url) as store:
        time.sleep(max(0.0, start_at - time.time()))
        for i in range(0, len(order), batch):
            recs = [numbered_stats(j, j + 1, prefix)[0] for j in order[i:i + batch]]
            inserted += store.put(recs)
    return inserted


def warm_up(seconds: float) -> int:
    """Keeps a pool worker busy for ``seconds`` (so that each worker of a ``map`` gets one call and has
    imported this module); returns its pid."""
    time.sleep(seconds)
    return os.getpid()


# ---------------------------------------------------------------------------------- redis-server
def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRedis:
    """A ``redis-server`` on 127.0.0.1 with its data in ``directory`` (append-only file on by default),
    for tests and benchmarks. ``start()`` again after ``stop()`` reuses the port and the data.

    Args:
        directory: the server's ``--dir`` (AOF, log).
        appendonly: ``--appendonly yes|no``.
        appendfsync: ``always``, ``everysec`` (Redis' default) or ``no``.
        requirepass: the password clients must give (``--requirepass``): ``True`` (default) a random one, a str
            that one, None none (:attr:`url` then opts out with ``?allow_no_password=1``, which the store needs).
    """

    def __init__(self, directory: str | os.PathLike, appendonly: bool = True, appendfsync: str = "everysec",
                 requirepass: str | bool | None = True):
        binary = redis_server_binary()
        if binary is None:
            raise FileNotFoundError(f"redis-server is not installed: {REDIS_INSTALL_HINT}")
        self.binary = binary
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        if requirepass is True:
            requirepass = secrets.token_hex(16)
        elif requirepass is False:
            requirepass = None
        self.requirepass: str | None = requirepass
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    def _auth(self) -> bytes:
        """The AUTH command our raw PING and SHUTDOWN need first when the server requires a password."""
        return b"" if self.requirepass is None else f"AUTH {self.requirepass}\r\n".encode()

    @property
    def bare_url(self) -> str:
        """The server's URL without credentials (a client needs ``$MGRPO_REDIS_PASSWORD`` with it)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        """A URL the store opens: with the password in it, or ``?allow_no_password=1`` for a server without one
        (append further parameters with ``&``)."""
        if self.requirepass is None:
            return f"{self.bare_url}?allow_no_password=1"
        return f"redis://:{self.requirepass}@127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 20.0) -> "LocalRedis":
        fixed = self.port is not None
        for _attempt in range(1 if fixed else 5):
            port = self.port if fixed else free_port()
            self.proc = subprocess.Popen(
                [
                    self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                    "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
                    "--save", "", "--daemonize", "no", "--logfile", "redis.log",
                    *(("--requirepass", self.requirepass) if self.requirepass is not None else ()),
                ],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,  # a ^C in the terminal goes to us, we stop the server
            )
            if self._wait_ready(port, timeout_s):
                self.port = port
                return self
            self.proc.kill()
            self.proc.wait()
        log = self.directory / "redis.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise RuntimeError(f"redis-server did not start on 127.0.0.1 (dir {self.directory}); log:\n{tail}")

    def _wait_ready(self, port: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                    s.sendall(self._auth() + b"PING\r\n")
                    reply = b""
                    while b"+PONG" not in reply and b"-" not in reply and len(reply) < 64:
                        reply += s.recv(64) or b"-"
                    if b"+PONG" in reply:
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def stop(self, how: str = "shutdown", timeout_s: float = 20.0) -> None:
        """``shutdown``: the SHUTDOWN command (flushes the AOF); ``kill``: SIGKILL, a crash."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if how == "kill":
            self.proc.send_signal(signal.SIGKILL)
        elif how == "shutdown":
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5.0) as s:
                    s.sendall(self._auth() + b"SHUTDOWN\r\n")
                    s.recv(64)
            except OSError:
                pass
        else:
            raise ValueError(f"LocalRedis.stop: how must be 'shutdown' or 'kill', got {how!r}")
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "LocalRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop("kill")
