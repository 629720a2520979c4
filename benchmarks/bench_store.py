"""Statistics store of decoupled M-GRPO: hand-off latency and throughput, SQLite and Redis.

Hand-off latency: a writer process (the main trainer) puts main-trajectory records as they finish,
``--trajectories`` per step spread over ``--step-seconds`` in chunks of ``--chunk``; a poller process
(a sub-side trainer) polls the store for the ids of the step every ``--poll-s`` seconds
(``StatStore.get`` of the ids not seen yet, as the sub-side trainer polls ``get`` for the parents of its
pending rows, ``DecoupledSubTrainer._take_ready_rows``). Latency of a record =
the moment the poller holds it − the moment just before the writer's ``put``. Median and p95 over all
records of ``--steps`` steps. The reference is measured in the same run between the same two
processes: a plain ``multiprocessing.Queue`` hand-off (push, no store, no durability, no polling).

Throughput, in this process, ``--trajectories`` records per call, ``--steps`` calls: ``put`` (new
records), ``put`` again (a replay: every record already there), ``get`` by id and ``main_scores``
of the step's queries (8 main rollouts per query).

Goal (issue 5): median hand-off < 100 ms at 1,000 trajectories per step.

    python benchmarks/bench_store.py [--backends sqlite sqlite-normal redis] [--redis-url redis://host:port/0]

Without ``--redis-url`` a throw-away ``redis-server`` (append-only file, ``appendfsync everysec``) is
started in a temporary directory if the binary is installed; otherwise Redis is skipped with a note.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

from mgrpo_verl.store import TrajectoryStat, open_store

BACKENDS = ("sqlite", "sqlite-normal", "redis")
LABELS = {
    "queue": "mp.Queue (reference)",
    "sqlite": "sqlite (synchronous=full)",
    "sqlite-normal": "sqlite (synchronous=normal)",
    "redis": "redis (AOF everysec)",
}


def step_ids(step: int, n: int) -> list[str]:
    return [f"b{step}-{i}" for i in range(n)]


def record(step: int, i: int, t_write: float | None = None) -> TrajectoryStat:
    return TrajectoryStat(
        f"b{step}-{i}", f"b{step}q{i // 8}", "main", "", (i % 5) / 4, True, step, step,
        {} if t_write is None else {"t": t_write},
    )


# ------------------------------------------------------------------------------------- processes
def writer(ctrl: mp.Queue, results: mp.Queue, data: mp.Queue) -> None:
    """Main-side process: for each task, write the steps' records paced in time."""
    while (task := ctrl.get()) is not None:
        mode, url, n, steps, chunk, step_s = task
        store = None if mode == "queue" else open_store(url)
        interval = step_s * chunk / n
        t0 = time.time() + 0.05
        for s in range(steps):
            for c, i in enumerate(range(0, n, chunk)):
                time.sleep(max(0.0, t0 + s * step_s + c * interval - time.time()))
                t_write = time.time()
                if store is None:
                    data.put([(f"b{s}-{j}", t_write) for j in range(i, min(i + chunk, n))])
                else:
                    store.put([record(s, j, t_write) for j in range(i, min(i + chunk, n))])
        if store is not None:
            store.close()
        results.put(("writer", mode))


def poller(ctrl: mp.Queue, results: mp.Queue, data: mp.Queue) -> None:
    """Sub-side process: for each task, collect every record of every step, noting when it arrived."""
    while (task := ctrl.get()) is not None:
        mode, url, n, steps, poll_s = task
        latencies = []
        if mode == "queue":
            results.put(("ready", mode))
            while len(latencies) < n * steps:
                items = data.get(timeout=120)
                now = time.time()
                latencies += [now - t for _, t in items]
        else:
            with open_store(url) as store:
                results.put(("ready", mode))
                deadline = time.time() + 120 + steps * 10
                for s in range(steps):
                    pending = step_ids(s, n)
                    while pending:
                        got = store.get(pending)
                        now = time.time()
                        latencies += [now - r.extra["t"] for r in got.values()]
                        pending = [t for t in pending if t not in got]
                        if pending:
                            if time.time() > deadline:
                                raise TimeoutError(f"poller: {len(pending)} records of step {s} never arrived")
                            time.sleep(poll_s)
        results.put(("poller", mode, latencies))


def hand_off(mode: str, url: str, args, procs) -> list[float]:
    (w_ctrl, p_ctrl, results) = procs
    p_ctrl.put((mode, url, args.trajectories, args.steps, args.poll_s))
    msg = results.get(timeout=600)
    assert msg == ("ready", mode), msg
    w_ctrl.put((mode, url, args.trajectories, args.steps, args.chunk, args.step_seconds))
    latencies = None
    for _ in range(2):
        msg = results.get(timeout=600)
        if msg[0] == "poller":
            latencies = msg[2]
    return latencies


# ------------------------------------------------------------------------------------ throughput
def throughput(url: str, n: int, steps: int) -> dict[str, float]:
    """Records per second of each operation, best call of ``steps`` (fresh steps for ``put``)."""
    best = {"put": 0.0, "replay": 0.0, "get": 0.0, "main_scores": 0.0}
    with open_store(url) as store:
        for s in range(1000, 1000 + steps):
            recs = [record(s, i) for i in range(n)]
            ids = [r.traj_id for r in recs]
            uids = list(dict.fromkeys(r.uid for r in recs))
            for name, fn in (
                ("put", lambda: store.put(recs)),
                ("replay", lambda: store.put(recs)),
                ("get", lambda: store.get(ids)),
                ("main_scores", lambda: store.main_scores(uids)),
            ):
                t = time.perf_counter()
                out = fn()
                dt = time.perf_counter() - t
                if name == "put":
                    assert out == n, out
                best[name] = max(best[name], n / dt)
    return best


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--trajectories", type=int, default=1000, help="main trajectories per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=10, help="records per put in the hand-off test")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="a step's records are written over this long")
    parser.add_argument("--poll-s", type=float, default=0.01, help="the poller's interval")
    parser.add_argument("--redis-url", default="", help="use this server instead of starting one")
    args = parser.parse_args()

    from mgrpo_verl.store.testing import LocalRedis, redis_server_binary

    tmp = tempfile.TemporaryDirectory(prefix="bench_store_")
    urls, notes, server = {}, [], None
    for b in args.backends:
        if b == "sqlite":
            urls[b] = f"sqlite://{Path(tmp.name) / 'full.db'}"
        elif b == "sqlite-normal":
            urls[b] = f"sqlite://{Path(tmp.name) / 'normal.db'}?synchronous=normal"
        elif args.redis_url:
            urls[b] = args.redis_url + ("&" if "?" in args.redis_url else "?") + f"prefix=bench{time.time_ns()}:"
        elif redis_server_binary():
            server = LocalRedis(Path(tmp.name) / "redis").start()
            urls[b] = server.url
        else:
            notes.append("redis: skipped, redis-server is not installed (apt-get install -y redis-server) "
                         "and no --redis-url")

    ctx = mp.get_context("spawn")
    w_ctrl, p_ctrl, results, data = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=writer, args=(w_ctrl, results, data)),
             ctx.Process(target=poller, args=(p_ctrl, results, data))]
    for p in procs:
        p.start()
    rows = {}
    try:
        for mode in ["queue", *urls]:
            lat = hand_off(mode, urls.get(mode, ""), args, (w_ctrl, p_ctrl, results))
            rows[mode] = {"median": statistics.median(lat) * 1e3, "p95": pct(lat, 0.95) * 1e3, "n": len(lat)}
            if mode != "queue":
                rows[mode].update(throughput(urls[mode], args.trajectories, args.steps))
    finally:
        for q in (w_ctrl, p_ctrl):
            q.put(None)
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        if server is not None:
            server.stop("kill")
        tmp.cleanup()

    print(f"trajectories/step={args.trajectories} steps={args.steps} chunk={args.chunk} "
          f"step_seconds={args.step_seconds} poll_s={args.poll_s}")
    header = (f"{'backend':<28} {'put rec/s':>10} {'replay rec/s':>12} {'get rec/s':>10} {'main_scores rec/s':>17} "
              f"{'hand-off median ms':>18} {'p95 ms':>8} {'vs queue':>9}")
    print(header)
    print("-" * len(header))
    ref = rows["queue"]["median"]
    for mode, r in rows.items():
        tp = [f"{r[k]:>{w},.0f}" if k in r else f"{'-':>{w}}"
              for k, w in (("put", 10), ("replay", 12), ("get", 10), ("main_scores", 17))]
        print(f"{LABELS[mode]:<28} {' '.join(tp)} {r['median']:>18.2f} {r['p95']:>8.2f} {r['median'] / ref:>8.1f}x")
    for note in notes:
        print(note)
    stores = {m: r for m, r in rows.items() if m != "queue"}
    verdict = "met" if stores and all(r["median"] < 100 for r in stores.values()) else "missed"
    detail = ", ".join(f"{m} {r['median']:.1f} ms" for m, r in stores.items())
    print(f"goal median hand-off < 100 ms at {args.trajectories} trajectories/step: {verdict} ({detail})")


if __name__ == "__main__":
    main()
