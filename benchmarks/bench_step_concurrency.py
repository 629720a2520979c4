"""Update phase of one M-GRPO step: the models one after the other against one thread per model.

Runs the real ``MultiAgentTrainer._train_models`` (verl's balance / old-log-prob / reference / update
methods, verl's padding, our aligned copies; ``benchmarks/fake_step.py``) with an in-process
TransferQueue and, per model, a worker group whose every call (old log-prob, reference, update) costs
``--cost`` seconds of waiting: with ``--backend ray`` a ``ray.get`` on a Ray actor of that model that
sleeps (as the driver waits on verl's worker groups), with ``--backend sleep`` a plain ``time.sleep``.
For 2 and 4 models (a main agent and 1 or 3 sub-agents, each its own model and resource pool),
``multi_agent.concurrent_updates: false`` (the reference) and ``auto`` (concurrent) are measured in the
same run, interleaved, best of ``--repeats``; ratio = sequential / concurrent (ideal: the number of
models, as each model's chain is the same number of calls).

    flock /tmp/mgrpo_heavy.lock python benchmarks/bench_step_concurrency.py [--agents 2 4] [--cost 0.2]
        [--repeats 3] [--queries 8] [--backend ray|sleep]
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack

from fake_step import FakeTransferQueue, FakeWorkerGroup, make_trainer, ray_work, sleeping_work, write_step
from timing import fmt_s


def phase(n_agents: int, mode, work_of, queries: int) -> float:
    """Seconds of one step's update phase (``_train_models``) of ``n_agents`` models, on fresh rows; the
    rows and the fakes are built before the clock starts."""
    names = ["main"] + [f"sub{i}" for i in range(1, n_agents)]
    store = FakeTransferQueue()
    with store.installed():
        groups = {n: FakeWorkerGroup(n, store, scale=1.0 + i, work=work_of(i)) for i, n in enumerate(names)}
        trainer = make_trainer(groups, concurrent_updates=mode)
        batch, table, updates = write_step(store, names, queries=queries, seed=0)
        metrics = {}
        start = time.perf_counter()
        trainer._train_models(batch, table, updates, metrics, {})
        seconds = time.perf_counter() - start
    assert metrics["mgrpo/concurrent_updates"] == (1.0 if mode == "auto" else 0.0), metrics
    assert all(metrics[f"agent/{n}/update_rows"] > 0 for n in names)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--cost", type=float, default=0.2, help="seconds of every worker-group call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--backend", choices=("ray", "sleep"), default="ray")
    args = parser.parse_args()

    with ExitStack() as stack:
        if args.backend == "ray":  # a Ray closed to the network (token, loopback), as the trainer's
            from mgrpo_verl.platform.ray_session import ray_cpu_session

            stack.enter_context(ray_cpu_session(num_cpus=2, log_to_driver=False))
            work_of, _actors = ray_work(args.cost, max(args.agents))
        else:
            work_of = lambda i: sleeping_work(args.cost)  # noqa: E731
        print(f"backend {args.backend}, {args.cost:g} s per worker-group call (3 per model), "
              f"{args.queries} queries x 2 rollouts, best of {args.repeats}")
        print(f"{'models':>6}  {'sequential':>11}  {'concurrent':>11}  {'ratio':>6}  {'ideal':>5}")
        for n in args.agents:
            best = {"sequential": float("inf"), "concurrent": float("inf")}
            for _ in range(args.repeats):  # interleaved, so that load from other processes affects both alike
                best["sequential"] = min(best["sequential"], phase(n, False, work_of, args.queries))
                best["concurrent"] = min(best["concurrent"], phase(n, "auto", work_of, args.queries))
            ratio = best["sequential"] / best["concurrent"]
            print(f"{n:>6}  {fmt_s(best['sequential']):>11}  {fmt_s(best['concurrent']):>11}  {ratio:>5.2f}x  {n:>4}x")


if __name__ == "__main__":
    main()
