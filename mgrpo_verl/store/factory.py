"""Opening a store by URL (``sqlite://`` / ``redis://``) and probing that it answers.

Apart from :mod:`mgrpo_verl.store.base` so that the backends, which build on the base classes, are not
imported by the module they import.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from mgrpo_verl.store.base import StatStore
from mgrpo_verl.store.redis import RedisStatStore, redacted
from mgrpo_verl.store.sqlite import SQLiteStatStore


def open_store(url: str) -> StatStore:
    """Open (creating if needed) the store at ``url``.

    - ``sqlite:///abs/path.db`` (absolute) or ``sqlite://relative/path.db`` (relative to the current
      directory): :class:`mgrpo_verl.store.sqlite.SQLiteStatStore`, a file shared by the processes of
      one machine (or of a file system with working POSIX locks). Parameters:
      ``?synchronous=full|normal`` (default ``full``), ``busy_timeout_ms=30000``.
    - ``redis://host:port/db`` (``rediss://`` with TLS):
      :class:`mgrpo_verl.store.redis.RedisStatStore`. Parameter ``?prefix=mgrpo:`` (key namespace);
      other query parameters go to ``redis.Redis.from_url``. The server needs a password
      (``$MGRPO_REDIS_PASSWORD`` or in the URL), loopback included; ``?allow_no_password=1`` lets a loopback
      server without one be used on purpose.
    """
    if not isinstance(url, str):
        raise ValueError(f"open_store: url must be a str, got {type(url).__name__}")
    if url.startswith("sqlite://"):
        return SQLiteStatStore.from_url(url)
    if url.startswith(("redis://", "rediss://")):
        return RedisStatStore.from_url(url)
    scheme = urlsplit(url).scheme or "(none)"
    raise ValueError(
        f"open_store: unsupported url {url!r} (scheme {scheme}); expected one of "
        "sqlite:///abs/path.db, sqlite://relative/path.db, redis://host:port/db, rediss://host:port/db"
    )


def check_store_reachable(url: str, key: str, timeout_s: float = 2.0) -> None:
    """Open the store at ``url`` and close it again, before a trainer starts Ray: ``ValueError`` naming ``key`` and
    the url when it cannot be opened (an SQLite file in a missing directory or not a database, a Redis server that
    refuses or does not answer). A Redis url without ``socket_connect_timeout`` / ``socket_timeout`` gets
    ``timeout_s`` for this probe only (redis-py waits for ever by default), and the probe gives up after
    ``2 * timeout_s + 1`` s whatever redis-py's retries do. The durability warning is left to the trainer's own open."""
    probe, deadline = url, None
    if isinstance(url, str) and url.startswith(("redis://", "rediss://")):
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        names = {name for name, _ in query}
        query += [(name, str(timeout_s)) for name in ("socket_connect_timeout", "socket_timeout") if name not in names]
        probe, deadline = parts._replace(query=urlencode(query)).geturl(), 2 * timeout_s + 1
    outcome: dict[str, Any] = {}

    def attempt() -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                store = open_store(probe)
        except Exception as err:  # noqa: BLE001 - every reason the store cannot open is a config error here
            outcome["error"] = err
            return
        store.close()
        outcome["ok"] = True

    thread = threading.Thread(target=attempt, name="mgrpo-store-probe", daemon=True)
    thread.start()
    thread.join(deadline)
    shown = redacted(url) if isinstance(url, str) else url
    if thread.is_alive():
        raise ValueError(f"{key}={shown!r}: the store did not answer within {deadline:g} s")
    if "error" in outcome:
        err = outcome["error"]
        raise ValueError(f"{key}={shown!r}: cannot open the statistics store: {err}") from err
