"""The statistics store of decoupled M-GRPO: the record type and the interface (backends are opened by
:func:`mgrpo_verl.store.factory.open_store`).

The main side writes one :class:`TrajectoryStat` per main trajectory (its score ``s_M``); a sub side reads the
parents of its pending rows and their queries' main records and computes its advantages as the synchronous
trainer does. verl has no such store: its trainers share one process. Every backend guarantees exactly-once
puts keyed by ``traj_id``, atomic batches, immutable records and consumption marks, one store object per
process: ``docs/decoupled.md``, "The store".
"""

from __future__ import annotations

import abc
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import parse_qsl

#: Largest ``extra`` a record may carry, as compact JSON (bytes): the store is for small statistics,
#: not for tensors or texts.
MAX_EXTRA_BYTES = 4096

SCHEMES = ("sqlite://", "redis://", "rediss://")


class ConflictError(ValueError):
    """A different record was put under a ``traj_id`` that already holds one (or twice in one batch).

    Attributes:
        traj_ids: the conflicting ids (all of them in the batch).
    """

    def __init__(self, traj_ids: Sequence[str]):
        self.traj_ids = list(traj_ids)
        shown = ", ".join(repr(t) for t in self.traj_ids[:5]) + (" ..." if len(self.traj_ids) > 5 else "")
        super().__init__(
            f"traj_id {shown} already stored with a different record ({len(self.traj_ids)} conflict(s)); "
            "records are immutable, nothing of this batch was stored"
        )


class StoreClosedError(RuntimeError):
    """The store was used after :meth:`StatStore.close`."""


def _require_str(name: str, value: Any, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ValueError(f"TrajectoryStat: {name} must be a str, got {type(value).__name__} {value!r}")
    if not value and not allow_empty:
        raise ValueError(f"TrajectoryStat: {name} must not be empty")
    return value


def _require_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"TrajectoryStat: {name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value.__index__())
    if value < 0:
        raise ValueError(f"TrajectoryStat: {name} must be >= 0, got {value}")
    return value


@dataclass(frozen=True)
class TrajectoryStat:
    """What one trajectory tells the other side: who it is and how it scored.

    Attributes:
        traj_id: unique id of the trajectory (the row's ``traj_id``); the store's key.
        uid: the query group (the row's ``uid``).
        agent: the agent that produced it.
        parent_traj_id: ``""`` for a main trajectory, else the ``traj_id`` of the main trajectory that
            invoked this sub-agent call.
        score: the row's own score; for a main row the main score ``s_M``. Finite.
        format_ok: whether the output was well formed (a statistic for logging and filtering).
        step: the trainer step that produced it.
        policy_version: the weights version of the model that produced it (for staleness checks).
        extra: small JSON-serialisable mapping (at most :data:`MAX_EXTRA_BYTES` as JSON). Stored as its
            JSON round trip (tuples become lists), so a record read back equals the one written.

    Numbers are normalised (``numpy.float64`` → ``float``, ``numpy.int64`` → ``int``); invalid values
    raise ``ValueError`` naming the field.
    """

    traj_id: str
    uid: str
    agent: str
    parent_traj_id: str = ""
    score: float = 0.0
    format_ok: bool = True
    step: int = 0
    policy_version: int = 0
    extra: dict = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _require_str("traj_id", self.traj_id)
        _require_str("uid", self.uid)
        _require_str("agent", self.agent)
        _require_str("parent_traj_id", self.parent_traj_id, allow_empty=True)
        if self.parent_traj_id == self.traj_id:
            raise ValueError(f"TrajectoryStat: parent_traj_id equals traj_id {self.traj_id!r}")
        score = self.score
        if isinstance(score, bool) or not isinstance(score, (int, float)) and not hasattr(score, "__float__"):
            raise ValueError(f"TrajectoryStat: score must be a finite number, got {score!r}")
        score = float(score)
        if not math.isfinite(score):
            raise ValueError(f"TrajectoryStat: score must be finite, got {score!r} (traj_id {self.traj_id!r})")
        object.__setattr__(self, "score", score)
        if not isinstance(self.format_ok, bool):
            if getattr(getattr(self.format_ok, "dtype", None), "kind", "") != "b":  # numpy.bool_ is accepted
                raise ValueError(f"TrajectoryStat: format_ok must be a bool, got {self.format_ok!r}")
            object.__setattr__(self, "format_ok", bool(self.format_ok))
        object.__setattr__(self, "step", _require_int("step", self.step))
        object.__setattr__(self, "policy_version", _require_int("policy_version", self.policy_version))
        if type(self.extra) is dict and not self.extra:
            object.__setattr__(self, "extra", {})  # a private copy, the common case made fast
            return
        if not isinstance(self.extra, dict):
            raise ValueError(f"TrajectoryStat: extra must be a dict, got {type(self.extra).__name__}")
        try:
            text = json.dumps(self.extra, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"TrajectoryStat: extra must be JSON-serialisable with finite numbers: {err}") from None
        if len(text.encode()) > MAX_EXTRA_BYTES:
            raise ValueError(f"TrajectoryStat: extra is {len(text.encode())} bytes as JSON, "
                             f"the limit is {MAX_EXTRA_BYTES}")
        object.__setattr__(self, "extra", json.loads(text))

    @property
    def is_main(self) -> bool:
        """A main trajectory (no parent)."""
        return not self.parent_traj_id

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, compact): equal records give equal strings."""
        return json.dumps(
            {
                "traj_id": self.traj_id,
                "uid": self.uid,
                "agent": self.agent,
                "parent_traj_id": self.parent_traj_id,
                "score": self.score,
                "format_ok": self.format_ok,
                "step": self.step,
                "policy_version": self.policy_version,
                "extra": self.extra,
            },
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> "TrajectoryStat":
        """The record of :meth:`to_json`'s text, validated."""
        return cls(**json.loads(text))

    @classmethod
    def _from_stored_json(cls, text: str | bytes) -> "TrajectoryStat":
        """The record of a text the store wrote itself (validated when it was put): skips the
        validation (3.2 instead of 6.0 ms per 1,000 records on the 2-core machine). Falls back to :meth:`from_json`
        for a text that does not carry exactly the record's fields."""
        data = json.loads(text)
        if data.keys() != _FIELD_NAMES or type(data["score"]) is not float:
            return cls(**data)
        obj = object.__new__(cls)
        obj.__dict__.update(data)
        return obj


_FIELD_NAMES = frozenset(f.name for f in fields(TrajectoryStat))


def unique_ids(traj_ids: Iterable[str], what: str = "traj_ids") -> list[str]:
    """The ids in first-seen order without repeats; a bare ``str`` is refused (it would iterate chars)."""
    if isinstance(traj_ids, (str, bytes)):
        raise TypeError(f"{what}: expected a collection of ids, got a single string {traj_ids!r}")
    out = list(dict.fromkeys(traj_ids))
    for t in out:
        if not isinstance(t, str) or not t:
            raise ValueError(f"{what}: ids must be non-empty str, got {t!r}")
    return out


def check_consumer(consumer: str) -> str:
    if not isinstance(consumer, str) or not consumer:
        raise ValueError(f"consumer must be a non-empty str, got {consumer!r}")
    return consumer


def check_step(step: int, name: str = "step") -> int:
    if isinstance(step, bool) or not hasattr(step, "__index__"):
        raise ValueError(f"{name} must be an int, got {step!r}")
    return int(step.__index__())


def dedupe_batch(stats: Sequence[TrajectoryStat]) -> list[TrajectoryStat]:
    """The batch without repeated records; two different records with one ``traj_id`` raise
    :class:`ConflictError`."""
    if isinstance(stats, TrajectoryStat):
        raise TypeError("put: expected a sequence of TrajectoryStat, got a single TrajectoryStat")
    by_id: dict[str, TrajectoryStat] = {}
    conflicts = []
    for s in stats:
        if not isinstance(s, TrajectoryStat):
            raise TypeError(f"put: expected TrajectoryStat records, got {type(s).__name__}")
        seen = by_id.setdefault(s.traj_id, s)
        if seen is not s and seen != s:
            conflicts.append(s.traj_id)
    if conflicts:
        raise ConflictError(list(dict.fromkeys(conflicts)))
    return list(by_id.values())


class StatStore(abc.ABC):
    """Shared store of :class:`TrajectoryStat` records (the guarantees: ``docs/decoupled.md``, "The store").

    Subclasses implement the abstract methods.
    """

    url: str = ""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._closed = False

    # -------------------------------------------------------------------------------- records
    @abc.abstractmethod
    def put(self, stats: Sequence[TrajectoryStat]) -> int:
        """Store the records, atomically, keyed by ``traj_id``.

        Returns:
            How many records were newly inserted (records already stored identically count 0).

        Raises:
            ConflictError: a record differs from the one stored under its ``traj_id`` (or from another
                record of the batch with the same id); nothing of the batch is stored.
        """

    @abc.abstractmethod
    def get(self, traj_ids: Iterable[str]) -> dict[str, TrajectoryStat]:
        """The stored records among ``traj_ids`` (absent ids are left out)."""

    @abc.abstractmethod
    def main_scores(self, uids: Iterable[str]) -> dict[str, dict[str, TrajectoryStat]]:
        """The main records (``parent_traj_id == ""``) of each query: uid -> traj_id -> record. Every uid
        asked for is a key, with ``{}`` when none is stored yet."""

    @abc.abstractmethod
    def count(self) -> int:
        """Number of records stored."""

    # ------------------------------------------------------------------------------ consumers
    @abc.abstractmethod
    def mark_consumed(self, consumer: str, traj_ids: Iterable[str], step: int = 0) -> int:
        """Record that ``consumer`` has used these trajectories (at its step ``step``).

        Idempotent: the first mark of an id wins, a repeated mark is a no-op. Returns the number of
        ids newly marked. Marks are per consumer (e.g. ``"sub:searcher"``).
        """

    @abc.abstractmethod
    def consumed(self, consumer: str, traj_ids: Iterable[str]) -> set[str]:
        """The ids among ``traj_ids`` that ``consumer`` has marked."""

    @abc.abstractmethod
    def release_consumed(self, consumer: str, after_step: int) -> int:
        """Drop ``consumer``'s marks made at a step ``> after_step``; returns how many.

        Call it when a consumer resumes from the checkpoint of step ``after_step``: the updates of
        later steps were lost with the crash, so their trajectories must be usable again. With marks
        made in the same step as the update, this gives exactly-once use across restarts whatever the
        order of "save checkpoint" and "mark" within a step.
        """

    # ---------------------------------------------------------------------------------- lifecycle
    def _check_usable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"{type(self).__name__} {self.url!r} is closed")
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"{type(self).__name__} {self.url!r} was opened in process {self._pid} and used in process "
                f"{os.getpid()}: open the store in each process (open_store(url))"
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the connection; further use raises :class:`StoreClosedError`. Idempotent."""
        self._closed = True

    def __enter__(self) -> "StatStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}{', closed' if self._closed else ''})"


def split_query(url: str, allowed: Sequence[str]) -> tuple[str, dict[str, str]]:
    """``url`` without its ``?query`` and the query's parameters; unknown names raise ``ValueError``."""
    base, _, query = url.partition("?")
    params = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"store url {url!r}: unknown parameter(s) {unknown}; known: {sorted(allowed)}")
    return base, params
