"""The store across processes: concurrent writers, a writer killed with SIGKILL mid-way and resumed by
a new process, and restarts of the store itself (SQLite file reopened; redis-server shut down or
killed and started again on the same append-only file).

Worker processes use the ``spawn`` start method (a fresh interpreter, as a separate trainer would be)
and run the importable targets of ``mgrpo_verl.store.testing``. One pool of spawned workers serves
the whole module because each fresh interpreter pays for importing torch (through ``mgrpo_verl``);
on the shared 2-core machine that start-up is most of these tests' time, hence the ``slow`` mark.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from mgrpo_verl.store import TrajectoryStat, open_store
from mgrpo_verl.store.testing import numbered_stats, put_batches, put_shuffled, warm_up

SPAWN = mp.get_context("spawn")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool():
    with SPAWN.Pool(2) as p:
        p.map(warm_up, [0.5, 0.5], chunksize=1)  # both workers started and past their imports
        yield p


def _stored_ids(store, n: int, prefix: str = "t") -> dict[str, TrajectoryStat]:
    return store.get([f"{prefix}{i}" for i in range(n)])


def _raw_record_keys(store_url: str, store) -> int | None:
    """For Redis, the number of record keys under the store's prefix, counted by the server itself
    (not through the store's counter); ``None`` for SQLite (its primary key already forbids doubles)."""
    if not store_url.startswith("redis"):
        return None
    return sum(1 for _ in store._r.scan_iter(match=f"{store.prefix}s:*", count=5000))


def test_concurrent_writers_insert_every_record_exactly_once(pool, store_url, store):
    n, writers = 3000, 3
    # Overlapping shares: writer w puts ids [w*n/4, w*n/4 + n/2), in its own random order, 100 at a time,
    # and all of them together put every id (the first and last quarter once, the middle twice).
    shares = [range(0, n // 2), range(n // 4, 3 * n // 4), range(n // 2, n)]
    # two spawned processes and this one write at the same time
    start_at = time.time() + 1.0
    jobs = [pool.apply_async(put_shuffled, (store_url, list(ids), 100, seed, "t", start_at)) for seed, ids in enumerate(shares[1:], 1)]
    inserted = [put_shuffled(store_url, list(shares[0]), 100, 0, "t", start_at)] + [j.get(timeout=300) for j in jobs]
    assert len(inserted) == writers
    assert sum(inserted) == n  # every record inserted once across all processes
    assert store.count() == n
    got = _stored_ids(store, n)
    assert len(got) == n and all(got[s.traj_id] == s for s in numbered_stats(0, n))
    assert _raw_record_keys(store_url, store) in (None, n)


def test_writer_killed_mid_batch_then_resumed_by_a_new_process(pool, store_url, store, tmp_path):
    batch, n_batches = 200, 200
    batches = [(i * batch, (i + 1) * batch) for i in range(n_batches)]
    total = batch * n_batches
    ready = tmp_path / "ready"
    victim = SPAWN.Process(target=put_batches, args=(store_url, batches, "t", str(ready)))
    victim.start()
    try:
        deadline = time.monotonic() + 300
        while store.count() < 3 * batch:  # let a few batches through, then kill it while it writes
            assert victim.is_alive() or store.count() >= 3 * batch, f"writer died early (exit {victim.exitcode})"
            assert time.monotonic() < deadline, "the writer did not write in time"
            time.sleep(0.002)
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(30)
    finally:
        if victim.is_alive():
            victim.kill()
            victim.join()
    assert victim.exitcode == -signal.SIGKILL
    with open_store(store_url) as fresh:  # a new connection sees what the dead process committed
        after_kill = fresh.count()
    assert 3 * batch <= after_kill < total, "the writer finished before it was killed: nothing was interrupted"
    assert after_kill % batch == 0, f"{after_kill} records: a batch was stored in part"
    done = after_kill // batch
    assert len(_stored_ids(store, total)) == after_kill
    assert len(store.get([f"t{i}" for i in range(done * batch)])) == after_kill  # exactly the first batches

    # A new process replays everything, as a restarted trainer would: only the rest is inserted.
    assert pool.apply(put_batches, (store_url, batches)) == total - after_kill
    assert store.count() == total
    got = _stored_ids(store, total)
    assert len(got) == total and all(got[s.traj_id] == s for s in numbered_stats(0, total))
    assert _raw_record_keys(store_url, store) in (None, total)


@pytest.mark.parametrize("how", ["shutdown", "kill"])
def test_redis_restart_keeps_the_store(new_redis, how):
    # SIGKILL loses nothing only with appendfsync always: under everysec Redis may postpone the AOF write
    # (up to 2 s) while an earlier fsync is still running on a busy disk, and it replies meanwhile (seen in CI)
    server = new_redis(f"redis-{how}", appendfsync="always" if how == "kill" else "everysec").start()
    url = f"{server.url}{'&' if '?' in server.url else '?'}prefix=r:"
    recs = numbered_stats(0, 500)
    with open_store(url) as s:
        assert s.put(recs) == 500
        s.mark_consumed("sub", ["t1", "t2"], step=3)
    server.stop(how)  # SHUTDOWN (flushes the AOF), or SIGKILL (a crash)
    with pytest.raises(ConnectionError):
        open_store(url)
    server.start()  # same port, same --dir
    with open_store(url) as s:
        assert s.count() == 500
        got = s.get([r.traj_id for r in recs])
        assert all(got[r.traj_id] == r for r in recs)
        assert set(s.main_scores(["u0"])["u0"]) == {f"t{i}" for i in range(8)}
        assert s.consumed("sub", ["t0", "t1", "t2"]) == {"t1", "t2"}
        assert s.put(recs) == 0 and s.put(numbered_stats(500, 510)) == 10


def test_sqlite_survives_a_killed_process_and_a_reopen(pool, tmp_path):
    url = f"sqlite://{tmp_path / 'stats.db'}"
    # written by another process, then reopened here
    assert pool.apply(put_batches, (url, [(0, 100), (100, 300)])) == 300
    with open_store(url) as s:
        assert s.count() == 300 and s.put(numbered_stats(0, 300)) == 0
