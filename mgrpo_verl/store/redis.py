"""Redis backend of the statistics store: one server shared by processes on several machines.

Atomic, exactly-once puts as one Lua script (a single server, not Redis Cluster); durable only as far as the
server persists (``appendonly yes``; a warning otherwise); a password always, loopback included. The keys,
the durability of each ``appendfsync`` setting and the password rules: ``docs/decoupled.md``, "Backends".
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from mgrpo_verl.platform.ray_session import is_loopback
from mgrpo_verl.store.base import (
    ConflictError,
    StatStore,
    TrajectoryStat,
    check_consumer,
    check_step,
    dedupe_batch,
    unique_ids,
)

DEFAULT_PREFIX = "mgrpo:"
#: The password of a Redis URL that carries none.
PASSWORD_ENV = "MGRPO_REDIS_PASSWORD"
#: The URL parameter (``?allow_no_password=1``) that lets a store use a loopback server without a password.
NO_PASSWORD_PARAM = "allow_no_password"
_TRUE = ("1", "true", "yes")

#: ids per MGET / HMGET round trip (each a few hundred bytes of reply).
_CHUNK = 2000

# ARGV: prefix, then per record: traj_id, record json, uid, "1" if main else "0".
_PUT = """
local p = ARGV[1]
local n = (#ARGV - 1) / 4
local conflicts = {}
for i = 0, n - 1 do
  local b = 2 + 4 * i
  local cur = redis.call('GET', p .. 's:' .. ARGV[b])
  if cur and cur ~= ARGV[b + 1] then conflicts[#conflicts + 1] = ARGV[b] end
end
if #conflicts > 0 then return {-1, conflicts} end
local inserted = 0
for i = 0, n - 1 do
  local b = 2 + 4 * i
  if redis.call('SET', p .. 's:' .. ARGV[b], ARGV[b + 1], 'NX') then
    inserted = inserted + 1
    if ARGV[b + 3] == '1' then redis.call('SADD', p .. 'm:' .. ARGV[b + 2], ARGV[b]) end
  end
end
if inserted > 0 then redis.call('INCRBY', p .. 'n', inserted) end
return {inserted, conflicts}
"""

# KEYS[1]: the consumer's hash; ARGV: step, then the ids.
_MARK = """
local added = 0
for i = 2, #ARGV do
  added = added + redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[1])
end
return added
"""

# KEYS[1]: the consumer's hash; ARGV[1]: after_step.
_RELEASE = """
local limit = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local dropped = 0
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) > limit then
    redis.call('HDEL', KEYS[1], all[i])
    dropped = dropped + 1
  end
end
return dropped
"""


def redacted(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def allows_no_password(url: str) -> bool:
    """Whether ``url`` opts out of the password with ``?allow_no_password=1`` (``true``, ``yes``)."""
    return any(name == NO_PASSWORD_PARAM and value.lower() in _TRUE
               for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True))


def url_password(url: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The password to send: the URL's, else ``$MGRPO_REDIS_PASSWORD``. ``ValueError`` when there is none, unless the
    host is loopback and the URL says ``?allow_no_password=1`` (then None): other users of this machine reach its
    loopback, and other machines reach any other address."""
    environ = os.environ if environ is None else environ
    parts = urlsplit(url)
    password = parts.password or environ.get(PASSWORD_ENV) or None
    if password is not None:
        return password
    how = (f"run redis-server with --requirepass and export {PASSWORD_ENV} (or put it in the URL, "
           "redis://:PASSWORD@host:port/db, where the printed config shows it)")
    if not is_loopback(parts.hostname):
        raise ValueError(
            f"Redis store {redacted(url)}: the server on {parts.hostname!r} is not on this machine's loopback, and no "
            f"password is given; {how}" + (f" ({NO_PASSWORD_PARAM} applies to loopback only)"
                                           if allows_no_password(url) else "")
        )
    if not allows_no_password(url):
        raise ValueError(
            f"Redis store {redacted(url)}: no password is given, and a Redis without one is open to every user of this "
            f"machine (loopback is reachable by all of them); {how}. To use a loopback server without a password on "
            f"purpose (a machine nobody else uses), add ?{NO_PASSWORD_PARAM}=1 to the URL"
        )
    return None


class StoreDurabilityWarning(UserWarning):
    """The Redis server does not persist with an append-only file: a server restart loses the store."""


def _import_redis():
    try:
        import redis
    except ImportError:
        raise ImportError(
            "the Redis statistics store needs the `redis` package: pip install 'mgrpo_verl[redis]' "
            "(or pip install redis)"
        ) from None
    return redis


class RedisStatStore(StatStore):
    """:class:`StatStore` on a Redis server (``docs/decoupled.md``, "Backends").

    Args:
        client: a ``redis.Redis`` client created with ``decode_responses=True``.
        prefix: namespace of every key (several stores can share one database).
        url: for messages only.
    """

    def __init__(self, client, prefix: str = DEFAULT_PREFIX, url: str = ""):
        super().__init__()
        if not isinstance(prefix, str):
            raise ValueError(f"RedisStatStore: prefix must be a str, got {prefix!r}")
        self.url = url
        self.prefix = prefix
        self._r = client
        redis = _import_redis()
        try:
            client.ping()
        except redis.RedisError as err:
            raise ConnectionError(f"RedisStatStore: cannot reach the Redis server at {url or client!r}: {err}") from err
        self._put = client.register_script(_PUT)
        self._mark = client.register_script(_MARK)
        self._release = client.register_script(_RELEASE)
        self.appendonly = self._appendonly()
        if self.appendonly is False:
            warnings.warn(
                f"Redis at {url or client!r} runs without an append-only file (appendonly no): the statistics "
                "store will not survive a server restart; start redis-server with --appendonly yes",
                StoreDurabilityWarning,
                stacklevel=3,
            )

    @classmethod
    def from_url(cls, url: str) -> "RedisStatStore":
        """``redis://[user:password@]host:port/db[?prefix=NAME&...]``; other parameters go to
        ``redis.Redis.from_url``. The password: the URL's, else ``$MGRPO_REDIS_PASSWORD``, required unless the URL is
        to loopback and says ``?allow_no_password=1`` (:func:`url_password`)."""
        redis = _import_redis()
        password = url_password(url)
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        prefix = DEFAULT_PREFIX
        rest = []
        for name, value in query:
            if name == "prefix":
                prefix = value
            elif name != NO_PASSWORD_PARAM:
                rest.append((name, value))
        client_url = urlunsplit(parts._replace(query=urlencode(rest)))
        client = redis.Redis.from_url(client_url, decode_responses=True, **({"password": password} if password else {}))
        try:
            return cls(client, prefix=prefix, url=redacted(url))
        except BaseException:
            client.close()
            raise

    def _appendonly(self) -> bool | None:
        """The server's ``appendonly`` setting, or ``None`` where ``CONFIG`` is not allowed."""
        try:
            value = self._r.config_get("appendonly").get("appendonly")
        except Exception:  # CONFIG disabled or renamed on managed servers
            return None
        return None if value is None else value == "yes"

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    # -------------------------------------------------------------------------------- records
    def put(self, stats: Sequence[TrajectoryStat]) -> int:
        self._check_usable()
        batch = dedupe_batch(stats)
        if not batch:
            return 0
        args = [self.prefix]
        for s in batch:
            args += (s.traj_id, s.to_json(), s.uid, "1" if s.is_main else "0")
        inserted, conflicts = self._put(keys=[], args=args)
        if int(inserted) < 0:
            raise ConflictError(list(conflicts))
        return int(inserted)

    def get(self, traj_ids: Iterable[str]) -> dict[str, TrajectoryStat]:
        self._check_usable()
        ids = unique_ids(traj_ids)
        return self._get(ids)

    def _get(self, ids: list[str]) -> dict[str, TrajectoryStat]:
        if not ids:
            return {}
        pipe = self._r.pipeline(transaction=False)
        for i in range(0, len(ids), _CHUNK):
            pipe.mget([self._key("s", t) for t in ids[i:i + _CHUNK]])
        texts = [t for chunk in pipe.execute() for t in chunk]
        return {tid: TrajectoryStat._from_stored_json(text) for tid, text in zip(ids, texts) if text is not None}

    def main_scores(self, uids: Iterable[str]) -> dict[str, dict[str, TrajectoryStat]]:
        self._check_usable()
        wanted = unique_ids(uids, "uids")
        if not wanted:
            return {}
        pipe = self._r.pipeline(transaction=False)
        for u in wanted:
            pipe.smembers(self._key("m", u))
        members = [sorted(m) for m in pipe.execute()]
        # A main id is added to its set by the same script that stores its record: every member exists.
        stats = self._get([t for m in members for t in m])
        return {u: {t: stats[t] for t in m} for u, m in zip(wanted, members)}

    def count(self) -> int:
        self._check_usable()
        return int(self._r.get(f"{self.prefix}n") or 0)

    # ------------------------------------------------------------------------------ consumers
    def mark_consumed(self, consumer: str, traj_ids: Iterable[str], step: int = 0) -> int:
        self._check_usable()
        consumer, step = check_consumer(consumer), check_step(step)
        ids = unique_ids(traj_ids)
        if not ids:
            return 0
        return int(self._mark(keys=[self._key("c", consumer)], args=[step, *ids]))

    def consumed(self, consumer: str, traj_ids: Iterable[str]) -> set[str]:
        self._check_usable()
        consumer = check_consumer(consumer)
        ids = unique_ids(traj_ids)
        if not ids:
            return set()
        key = self._key("c", consumer)
        pipe = self._r.pipeline(transaction=False)
        for i in range(0, len(ids), _CHUNK):
            pipe.hmget(key, ids[i:i + _CHUNK])
        marks = [m for chunk in pipe.execute() for m in chunk]
        return {t for t, m in zip(ids, marks) if m is not None}

    def release_consumed(self, consumer: str, after_step: int) -> int:
        self._check_usable()
        consumer, after_step = check_consumer(consumer), check_step(after_step, "after_step")
        return int(self._release(keys=[self._key("c", consumer)], args=[after_step]))

    # ------------------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if not self._closed:
            self._r.close()
        super().close()


__all__ = [
    "DEFAULT_PREFIX", "NO_PASSWORD_PARAM", "PASSWORD_ENV", "RedisStatStore", "StoreDurabilityWarning",
    "allows_no_password", "redacted", "url_password",
]
