"""SQLite backend of the statistics store: one file shared by the processes of a machine.

WAL journal and a busy timeout for several processes at once, each batch one ``BEGIN IMMEDIATE`` transaction
(atomic, exactly once), ``synchronous=FULL`` by default (a returned ``put`` survives an OS crash). Needs a local
disk, not NFS. Each choice and its cost: ``docs/decoupled.md``, "Backends".
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from typing import Iterator

from mgrpo_verl.store.base import (
    ConflictError,
    StatStore,
    TrajectoryStat,
    check_consumer,
    check_step,
    dedupe_batch,
    split_query,
    unique_ids,
)

SCHEMA_VERSION = 1
SYNCHRONOUS = ("full", "normal")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stats (
    traj_id        TEXT PRIMARY KEY,
    uid            TEXT NOT NULL,
    agent          TEXT NOT NULL,
    parent_traj_id TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    record         TEXT NOT NULL          -- TrajectoryStat.to_json(), canonical
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS stats_main_by_uid ON stats(uid) WHERE parent_traj_id = '';
CREATE TABLE IF NOT EXISTS consumed (
    consumer TEXT NOT NULL,
    traj_id  TEXT NOT NULL,
    step     INTEGER NOT NULL,
    PRIMARY KEY (consumer, traj_id)
) WITHOUT ROWID;
"""

_IDS = "(SELECT value FROM json_each(?))"


class SQLiteStatStore(StatStore):
    """:class:`StatStore` in an SQLite file (``docs/decoupled.md``, "Backends").

    Args:
        path: the database file (created with its tables if absent).
        synchronous: ``"full"`` (default) or ``"normal"``.
        busy_timeout_ms: how long a writer waits for another process's write lock before failing.
    """

    def __init__(self, path: str | os.PathLike, synchronous: str = "full", busy_timeout_ms: int = 30_000):
        super().__init__()
        synchronous = str(synchronous).lower()
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"SQLiteStatStore: synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}")
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int) or busy_timeout_ms < 0:
            raise ValueError(f"SQLiteStatStore: busy_timeout_ms must be an int >= 0, got {busy_timeout_ms!r}")
        path = os.fspath(path)
        if not path or path == ":memory:" or path.startswith("file:"):
            raise ValueError(f"SQLiteStatStore: a file path is required (the store is shared between processes), "
                             f"got {path!r}")
        self.path = os.path.abspath(path)
        self.synchronous = synchronous
        self.url = f"sqlite://{self.path}"  # the path is absolute: sqlite:///abs/path.db
        parent = os.path.dirname(self.path)
        if parent and not os.path.isdir(parent):
            raise ValueError(f"SQLiteStatStore: directory {parent!r} does not exist")
        self._lock = threading.Lock()
        # isolation_level=None: no implicit transactions, we BEGIN/COMMIT ourselves.
        with self._named_errors():
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_ms / 1000.0, isolation_level=None, check_same_thread=False
            )
        try:
            with self._named_errors():
                self._init_schema(synchronous, busy_timeout_ms)
        except BaseException:
            self._conn.close()
            raise

    def _init_schema(self, synchronous: str, busy_timeout_ms: int) -> None:
        """Pragmas, WAL mode and the tables (created if absent), on the new connection."""
        self._conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"SQLiteStatStore: {self.path!r} cannot use WAL journal mode (got {mode!r})")
        self._conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        with self._write() as cur:
            version = cur.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"SQLiteStatStore: {self.path!r} has schema version {version}, newer than this code's "
                    f"{SCHEMA_VERSION}; upgrade mgrpo_verl"
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    cur.execute(statement)
            if version < SCHEMA_VERSION:
                cur.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @classmethod
    def from_url(cls, url: str) -> "SQLiteStatStore":
        """``sqlite:///abs/path.db`` or ``sqlite://relative/path.db``, with optional
        ``?synchronous=full|normal&busy_timeout_ms=N``."""
        base, params = split_query(url, ("synchronous", "busy_timeout_ms"))
        path = base[len("sqlite://"):]
        if not path:
            raise ValueError(f"open_store: {url!r} names no file; use sqlite:///abs/path.db or sqlite://relative.db")
        kwargs: dict = {}
        if "synchronous" in params:
            kwargs["synchronous"] = params["synchronous"]
        if "busy_timeout_ms" in params:
            try:
                kwargs["busy_timeout_ms"] = int(params["busy_timeout_ms"])
            except ValueError:
                raise ValueError(f"open_store: busy_timeout_ms must be an int, "
                                 f"got {params['busy_timeout_ms']!r}") from None
        return cls(path, **kwargs)

    # ------------------------------------------------------------------------------- plumbing
    @contextmanager
    def _named_errors(self) -> Iterator[None]:
        """SQLite's own errors ("file is not a database", "database disk image is malformed") do not say
        which file: re-raised as the same class with the path in front, the original chained."""
        try:
            yield
        except sqlite3.Error as err:
            if str(err).startswith(f"SQLiteStatStore {self.path}:"):
                raise
            named = type(err)(f"SQLiteStatStore {self.path}: {err}")
            for attr in ("sqlite_errorcode", "sqlite_errorname"):
                if hasattr(err, attr):
                    setattr(named, attr, getattr(err, attr))
            raise named from err

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        """One write transaction, holding SQLite's write lock from the start (``BEGIN IMMEDIATE``), so
        what it reads cannot change before it commits."""
        with self._named_errors(), self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def _read(self, sql: str, params: Sequence) -> list[tuple]:
        self._check_usable()
        with self._named_errors(), self._lock:
            return self._conn.execute(sql, params).fetchall()

    # -------------------------------------------------------------------------------- records
    def put(self, stats: Sequence[TrajectoryStat]) -> int:
        self._check_usable()
        batch = dedupe_batch(stats)
        if not batch:
            return 0
        texts = {s.traj_id: s.to_json() for s in batch}
        with self._write() as cur:
            existing = cur.execute(f"SELECT traj_id, record FROM stats WHERE traj_id IN {_IDS}",
                                   (json.dumps(list(texts)),))
            conflicts = [
                tid for tid, text in existing
                if text != texts[tid] and TrajectoryStat._from_stored_json(text) != TrajectoryStat.from_json(texts[tid])
            ]
            if conflicts:
                raise ConflictError([t for t in texts if t in set(conflicts)])
            cur.executemany(
                "INSERT INTO stats (traj_id, uid, agent, parent_traj_id, policy_version, record) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(traj_id) DO NOTHING",
                [(s.traj_id, s.uid, s.agent, s.parent_traj_id, s.policy_version, texts[s.traj_id]) for s in batch],
            )
            return cur.rowcount

    def get(self, traj_ids: Iterable[str]) -> dict[str, TrajectoryStat]:
        ids = unique_ids(traj_ids)
        if not ids:
            self._check_usable()
            return {}
        rows = self._read(f"SELECT traj_id, record FROM stats WHERE traj_id IN {_IDS}", (json.dumps(ids),))
        got = {tid: TrajectoryStat._from_stored_json(text) for tid, text in rows}
        return {t: got[t] for t in ids if t in got}

    def main_scores(self, uids: Iterable[str]) -> dict[str, dict[str, TrajectoryStat]]:
        wanted = unique_ids(uids, "uids")
        out: dict[str, dict[str, TrajectoryStat]] = {u: {} for u in wanted}
        if not wanted:
            self._check_usable()
            return out
        rows = self._read(
            f"SELECT uid, traj_id, record FROM stats WHERE parent_traj_id = '' AND uid IN {_IDS} ORDER BY uid, traj_id",
            (json.dumps(wanted),),
        )
        for uid, tid, text in rows:
            out[uid][tid] = TrajectoryStat._from_stored_json(text)
        return out

    def count(self) -> int:
        return self._read("SELECT count(*) FROM stats", ())[0][0]

    # ------------------------------------------------------------------------------ consumers
    def mark_consumed(self, consumer: str, traj_ids: Iterable[str], step: int = 0) -> int:
        self._check_usable()
        consumer, step = check_consumer(consumer), check_step(step)
        ids = unique_ids(traj_ids)
        if not ids:
            return 0
        with self._write() as cur:
            cur.executemany(
                "INSERT INTO consumed (consumer, traj_id, step) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                [(consumer, t, step) for t in ids],
            )
            return cur.rowcount

    def consumed(self, consumer: str, traj_ids: Iterable[str]) -> set[str]:
        consumer = check_consumer(consumer)
        ids = unique_ids(traj_ids)
        if not ids:
            self._check_usable()
            return set()
        rows = self._read(f"SELECT traj_id FROM consumed WHERE consumer = ? AND traj_id IN {_IDS}",
                          (consumer, json.dumps(ids)))
        return {r[0] for r in rows}

    def release_consumed(self, consumer: str, after_step: int) -> int:
        self._check_usable()
        consumer, after_step = check_consumer(consumer), check_step(after_step, "after_step")
        with self._write() as cur:
            cur.execute("DELETE FROM consumed WHERE consumer = ? AND step > ?", (consumer, after_step))
            return cur.rowcount

    # ------------------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if not self._closed:
            with self._lock:
                if os.getpid() == self._pid:
                    self._conn.close()
        super().close()

