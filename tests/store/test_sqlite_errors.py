"""SQLite's errors name the database file (SQLite's own messages do not), and the pre-Ray store probe
(:func:`mgrpo_verl.store.factory.check_store_reachable`) names the config key and the url."""

from __future__ import annotations

import sqlite3

import pytest

from mgrpo_verl.store import TrajectoryStat, open_store
from mgrpo_verl.store.factory import check_store_reachable

PAGE = 4096


def _records(n: int) -> list[TrajectoryStat]:
    return [TrajectoryStat(f"t{i:05d}", f"u{i % 50}", "main", "", 1.0, True, 0, 1) for i in range(n)]


def test_a_file_that_is_not_a_database_is_named(tmp_path):
    path = tmp_path / "not_a.db"
    path.write_bytes(b"this is not an SQLite database " * 200)
    with pytest.raises(sqlite3.DatabaseError, match="file is not a database") as info:
        open_store(f"sqlite://{path}")
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError) and str(path) not in str(info.value.__cause__)
    assert getattr(info.value, "sqlite_errorname", None) == "SQLITE_NOTADB"


def test_a_corrupted_page_is_named_when_read(tmp_path):
    """A store that opened fine, whose file was damaged afterwards: the error of the first query names it."""
    path = tmp_path / "stats.db"
    with open_store(f"sqlite://{path}?synchronous=normal") as store:
        assert store.put(_records(3000)) == 3000
    assert path.stat().st_size > 20 * PAGE  # the damage below lands inside the tables
    with open(path, "r+b") as f:
        f.seek(3 * PAGE)
        f.write(b"\xff" * 5 * PAGE)
    with open_store(f"sqlite://{path}") as store:
        with pytest.raises(sqlite3.DatabaseError, match="malformed") as info:
            store.get([r.traj_id for r in _records(3000)])
    assert str(path) in str(info.value)


def test_store_probe_names_key_and_url(tmp_path):
    key = "multi_agent.decoupled.store"
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"x" * 10_000)
    for url in (f"sqlite://{bad}", f"sqlite://{tmp_path}/missing/dir/x.db"):
        with pytest.raises(ValueError) as info:
            check_store_reachable(url, key)
        assert f"{key}={url!r}" in str(info.value)
    good = f"sqlite://{tmp_path}/ok.db"
    check_store_reachable(good, key)  # opens (creating the file) and closes
    with open_store(good) as store:
        assert store.count() == 0


def test_store_probe_gives_up_on_a_silent_redis_whatever_the_url_timeouts(tmp_path):
    """A server that accepts connections and never replies, with the url's own (long) socket time-outs, which the
    probe keeps: it still gives up after 2 * timeout_s + 1 s instead of waiting out redis-py's retries."""
    import socket
    import time

    pytest.importorskip("redis")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0?socket_timeout=30&socket_connect_timeout=30&allow_no_password=1"
        start = time.monotonic()
        with pytest.raises(ValueError, match=r"did not answer within 2 s") as info:
            check_store_reachable(url, "multi_agent.decoupled.store", timeout_s=0.5)
        assert time.monotonic() - start < 10
    assert f"multi_agent.decoupled.store={url!r}" in str(info.value)
