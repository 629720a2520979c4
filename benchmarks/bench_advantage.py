"""Advantage step: M-GRPO advantages + trajectory alignment vs verl's vectorised GRPO, same rows, same run.

For each size the batch is a random hierarchy (8 main rollouts per query, 0-4 calls of one sub-agent
per rollout, response length 32 by default). Timed, best of ``--repeats``:

- reference: ``verl.trainer.ppo.core_algos.compute_grpo_vectorized_outcome_advantage`` over ``uid``;
- ``compute_mgrpo_advantage`` (hierarchical credit, (agent, uid) groups);
- ``align_trajectories`` (D_max = 2), which also materialises the aligned batch (a new
  (M * (1 + D), L) copy of every tensor), work GRPO does not do; the column "plan" is the part of it
  that decides which row fills which slot (``plan_batch_alignment``), without the copy.

Goals (issue 2): (advantage + alignment) <= 1.5x the reference, and 1M rows in under 1 s.

    python benchmarks/bench_advantage.py [--sizes 10000 100000 1000000] [--response-length 32]
"""

from __future__ import annotations

import argparse

from timing import best_times

from mgrpo_verl import align_trajectories, compute_mgrpo_advantage
from mgrpo_verl.algorithms.alignment import plan_batch_alignment
from mgrpo_verl.testing import random_mgrpo_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--d-max", type=int, default=2)
    args = parser.parse_args()

    from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

    k, max_calls = 8, 4
    rows_per_query = k * (1 + max_calls / 2)
    print(f"response_length={args.response_length} K={k} calls/rollout~U[0,{max_calls}] D_max={args.d_max}")
    header = (f"{'rows':>9} {'verl GRPO':>10} {'M-GRPO adv':>11} {'align':>8} {'(plan)':>8} {'adv+align':>10} "
              f"{'ratio':>6} {'adv+plan':>9}  goals")
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        data = random_mgrpo_batch(max(1, round(size / rows_per_query)), k, max_calls,
                                  response_length=args.response_length)
        rewards, mask = data.batch["token_level_rewards"], data.batch["response_mask"]
        uid = data.non_tensor_batch["uid"]
        repeats = args.repeats if size < 1_000_000 else max(2, args.repeats // 2)
        best = best_times(repeats, {
            "ref": lambda: compute_grpo_vectorized_outcome_advantage(rewards, mask, uid),
            "adv": lambda: compute_mgrpo_advantage(data),
            "align": lambda: align_trajectories(data, args.d_max, seed=0),
            "plan": lambda: plan_batch_alignment(data, args.d_max, seed=0),
        })
        t_ref, t_adv, t_align, t_plan = best["ref"], best["adv"], best["align"], best["plan"]
        total = t_adv + t_align
        ratio = total / t_ref
        goals = f"ratio<=1.5:{'yes' if ratio <= 1.5 else 'NO'}"
        if len(data) >= 1_000_000:
            goals += f" 1M<1s:{'yes' if total < 1.0 else 'NO'}"
        print(f"{len(data):>9} {t_ref:>9.3f}s {t_adv:>10.3f}s {t_align:>7.3f}s {t_plan:>7.3f}s {total:>9.3f}s "
              f"{ratio:>5.2f}x {(t_adv + t_plan) / t_ref:>8.2f}x  {goals}")


if __name__ == "__main__":
    main()
