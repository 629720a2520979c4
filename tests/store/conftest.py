"""Fixtures of the statistics-store tests: every backend through one parametrized ``store_url``.

The Redis backend needs the ``redis`` package and a ``redis-server`` binary (each test starts its own
server on 127.0.0.1, with a random password by default: the store requires one, loopback included). Without them the Redis tests are skipped, except under CI (env ``CI`` set),
where they FAIL, so that nobody takes a green run for a tested Redis backend.
"""

from __future__ import annotations

import importlib.util
import itertools
import os

import pytest

from mgrpo_verl.store import open_store
from mgrpo_verl.store.testing import REDIS_INSTALL_HINT, LocalRedis, redis_server_binary

_counter = itertools.count()


def _redis_missing() -> str | None:
    if importlib.util.find_spec("redis") is None:
        return "the `redis` Python package is not installed (pip install 'mgrpo_verl[test]' or pip install redis)"
    if redis_server_binary() is None:
        return f"`redis-server` is not on PATH: {REDIS_INSTALL_HINT}"
    return None


def require_redis() -> None:
    why = _redis_missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"Redis store tests cannot run under CI: {why}", pytrace=False)
    pytest.skip(f"Redis store tests skipped: {why} (under CI, with env CI set, this is a failure)")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One throw-away redis-server (append-only file on) for the session's Redis tests."""
    require_redis()
    server = LocalRedis(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop("kill")


@pytest.fixture
def new_redis(tmp_path):
    """``new_redis(name)``: a stopped LocalRedis with its own directory, stopped again at teardown."""
    require_redis()
    servers = []

    def make(name: str = "redis", **kwargs) -> LocalRedis:
        server = LocalRedis(tmp_path / name, **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop("kill")


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request, tmp_path):
    """A fresh, empty store of each backend (Redis: a new key prefix on the session's server)."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'stats.db'}"
    server = request.getfixturevalue("redis_server")
    return f"{server.url}{'&' if '?' in server.url else '?'}prefix=test{next(_counter)}-{os.getpid()}:"


@pytest.fixture
def store(store_url):
    with open_store(store_url) as s:
        yield s
