"""The StatStore contract, run on every backend (``store`` / ``store_url`` are parametrized over SQLite
and Redis in conftest.py), plus the record type and ``open_store``'s url handling."""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings

import numpy as np
import pytest

from mgrpo_verl.store import (
    MAX_EXTRA_BYTES,
    ConflictError,
    StoreClosedError,
    TrajectoryStat,
    open_store,
)


def main(tid: str, uid: str = "u0", score: float = 1.0, version: int = 1, **kw) -> TrajectoryStat:
    return TrajectoryStat(tid, uid, "main", "", score, True, 0, version, **kw)


def sub(tid: str, parent: str, uid: str = "u0", score: float = 0.5, agent: str = "sub") -> TrajectoryStat:
    return TrajectoryStat(tid, uid, agent, parent, score, False, 0, 1)


# ------------------------------------------------------------------------------------ the record
@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(traj_id=""), "traj_id"),
        (dict(uid=""), "uid"),
        (dict(agent=""), "agent"),
        (dict(traj_id=3), "traj_id"),
        (dict(parent_traj_id=None), "parent_traj_id"),
        (dict(parent_traj_id="t"), "parent_traj_id"),
        (dict(score=float("nan")), "score"),
        (dict(score=float("inf")), "score"),
        (dict(score="1.0"), "score"),
        (dict(score=True), "score"),
        (dict(format_ok=1), "format_ok"),
        (dict(step=-1), "step"),
        (dict(step=1.5), "step"),
        (dict(policy_version=-2), "policy_version"),
        (dict(extra=[1]), "extra"),
        (dict(extra={"x": object()}), "extra"),
        (dict(extra={"x": float("nan")}), "extra"),
        (dict(extra={"x": "y" * MAX_EXTRA_BYTES}), "extra"),
    ],
)
def test_record_validation_names_the_field(kwargs, field):
    args = dict(traj_id="t", uid="u", agent="main", score=0.0) | kwargs
    with pytest.raises(ValueError, match=field):
        TrajectoryStat(**args)


def test_record_normalises_numbers_and_round_trips_through_json():
    s = TrajectoryStat("t", "u", "main", "", np.float32(0.25), np.bool_(True), np.int64(3), np.int32(2), {"k": (1, 2)})
    assert type(s.score) is float and s.score == 0.25
    assert type(s.format_ok) is bool and type(s.step) is int and type(s.policy_version) is int
    assert s.extra == {"k": [1, 2]}  # stored as its JSON round trip
    assert TrajectoryStat.from_json(s.to_json()) == s
    assert s.is_main and not sub("x", "t").is_main
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.score = 1.0  # frozen


# ------------------------------------------------------------------------------------- open_store
def test_open_store_rejects_unknown_schemes():
    for url in ("postgres://h/db", "memory://", "/tmp/x.db", ""):
        with pytest.raises(ValueError, match=r"sqlite:///abs/path\.db.*redis://host:port/db"):
            open_store(url)


def test_open_store_sqlite_relative_absolute_and_parameters(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite://rel.db") as s:
        assert s.path == str(tmp_path / "rel.db") and s.synchronous == "full"
        s.put([main("a")])
    with open_store(f"sqlite://{tmp_path / 'rel.db'}?synchronous=normal&busy_timeout_ms=500") as s:
        assert s.synchronous == "normal" and s.count() == 1
    with pytest.raises(ValueError, match="unknown parameter"):
        open_store("sqlite://rel.db?journal=delete")
    with pytest.raises(ValueError, match="synchronous"):
        open_store("sqlite://rel.db?synchronous=off")
    with pytest.raises(ValueError, match="names no file"):
        open_store("sqlite://")


# ----------------------------------------------------------------------------- records, any backend
def test_put_get_round_trip(store):
    recs = [main("m0", extra={"turns": 3, "tool": "search"}), main("m1", score=-0.5), sub("s0", "m0")]
    assert store.put(recs) == 3
    assert store.count() == 3
    got = store.get(["s0", "m0", "nope", "m1"])
    assert list(got) == ["s0", "m0", "m1"]  # the order asked for, absent ids left out
    assert got["m0"] == recs[0] and got["m1"] == recs[1] and got["s0"] == recs[2]
    assert store.get([]) == {}
    assert store.put([]) == 0
    with pytest.raises(TypeError):
        store.get("m0")  # a bare string is not a list of ids


def test_put_is_idempotent(store):
    recs = [main("m0"), sub("s0", "m0")]
    assert store.put(recs) == 2
    assert store.put(recs) == 0  # re-putting the same records is a no-op
    assert store.put([recs[0], main("m1"), recs[0]]) == 1  # only the new one; repeats in a batch count once
    assert store.count() == 3


def test_conflict_names_the_id_and_stores_nothing_of_the_batch(store):
    store.put([main("m0", score=1.0)])
    with pytest.raises(ConflictError, match="'m0'") as err:
        store.put([main("new1"), main("m0", score=0.0), main("new2")])
    assert err.value.traj_ids == ["m0"]
    assert store.count() == 1 and store.get(["new1", "new2"]) == {}  # atomic: nothing of the batch
    with pytest.raises(ConflictError, match="'dup'"):
        store.put([main("dup", score=1.0), main("dup", score=2.0)])  # two versions in one batch
    assert store.get(["dup"]) == {}
    with pytest.raises(ConflictError):
        store.put([main("m0", version=2)])  # any field counts
    assert store.get(["m0"])["m0"].score == 1.0


def test_main_scores_groups_main_records_by_uid(store):
    store.put([main("a0", "qa", 1.0), main("a1", "qa", 0.0), sub("a0s", "a0", "qa"), main("b0", "qb", 0.5)])
    scores = store.main_scores(["qa", "qb", "qc"])
    assert set(scores) == {"qa", "qb", "qc"}
    assert {t: s.score for t, s in scores["qa"].items()} == {"a0": 1.0, "a1": 0.0}  # sub records excluded
    assert list(scores["qb"]) == ["b0"] and scores["qc"] == {}


def test_get_sees_a_later_put_from_another_connection(store_url, store):
    """The sub-side trainer polls ``get`` on one long-lived connection for parents that another process puts
    later: a put committed elsewhere must become visible to it (no stale read snapshot, no cache of absence)."""
    assert store.get(["late"]) == {}  # looked once before the put, as a poll does

    def late():
        time.sleep(0.2)
        with open_store(store_url) as other:
            other.put([main("late")])

    t = threading.Thread(target=late)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not (got := store.get(["late"])) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        t.join()
    assert got == {"late": main("late")}


def test_consumed_marks(store):
    assert store.mark_consumed("sub:searcher", ["a", "b", "a"], step=1) == 2
    assert store.mark_consumed("sub:searcher", ["b", "c"], step=2) == 1  # first mark wins
    assert store.mark_consumed("sub:coder", ["a"], step=1) == 1  # marks are per consumer
    assert store.consumed("sub:searcher", ["a", "b", "c", "d"]) == {"a", "b", "c"}
    assert store.consumed("sub:coder", ["a", "b"]) == {"a"}
    assert store.consumed("nobody", ["a"]) == set()
    # resuming from the checkpoint of step 1: the marks of step 2 are dropped, step 1's stay
    assert store.release_consumed("sub:searcher", after_step=1) == 1
    assert store.consumed("sub:searcher", ["a", "b", "c"]) == {"a", "b"}
    assert store.mark_consumed("sub:searcher", ["c"], step=2) == 1
    with pytest.raises(ValueError, match="consumer"):
        store.mark_consumed("", ["a"])


def test_close_and_context_manager(store_url):
    with open_store(store_url) as s:
        s.put([main("x")])
    assert s.closed
    with pytest.raises(StoreClosedError):
        s.get(["x"])
    s.close()  # idempotent
    with open_store(store_url) as again:  # the data outlives the connection
        assert again.get(["x"])["x"] == main("x")


def test_sqlite_reopen_keeps_everything(tmp_path):
    url = f"sqlite://{tmp_path / 'stats.db'}"
    with open_store(url) as s:
        s.put([main("m0"), sub("s0", "m0")])
        s.mark_consumed("c", ["m0"], step=4)
    with open_store(url) as s:
        assert s.count() == 2 and s.get(["s0"])["s0"] == sub("s0", "m0")
        assert s.consumed("c", ["m0", "s0"]) == {"m0"}
        assert s.put([main("m0")]) == 0


def test_redis_warns_without_append_only_file(new_redis):
    server = new_redis(appendonly=False).start()
    from mgrpo_verl.store.redis import StoreDurabilityWarning

    with pytest.warns(StoreDurabilityWarning, match="appendonly"):
        open_store(server.url).close()
    persistent = new_redis("aof").start()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreDurabilityWarning)
        with open_store(persistent.url) as s:
            assert s.appendonly is True


def test_redis_unreachable_server_is_a_clear_error(new_redis):
    from mgrpo_verl.store.testing import free_port

    with pytest.raises(ConnectionError, match="cannot reach"):
        open_store(f"redis://:password@127.0.0.1:{free_port()}/0?socket_connect_timeout=1")
