"""A worked example of the three algorithms on batches small enough to check by hand.

    python -m mgrpo_verl.demo [--seed 0] [--d-max 2]

Prints, for a hierarchical (M-GRPO) batch, every row's score, effective score and advantage, then the
aligned batch; for a cooperative (MAGRPO) two-turn tree, every node's reward, return and advantage;
and checks that verl's registry resolves ``adv_estimator=mgrpo`` / ``magrpo`` to our estimators.
"""

from __future__ import annotations

import argparse

import numpy as np

from mgrpo_verl import align_trajectories, compute_magrpo_advantage, compute_mgrpo_advantage
from mgrpo_verl.testing import make_batch


def _table(title: str, columns: dict[str, list]) -> None:
    print(f"\n{title}")
    names = list(columns)
    width = {n: max(len(n), *(len(_fmt(v)) for v in columns[n])) for n in names}
    print("  " + "  ".join(n.rjust(width[n]) for n in names))
    for i in range(len(columns[names[0]])):
        print("  " + "  ".join(_fmt(columns[n][i]).rjust(width[n]) for n in names))


def _fmt(value) -> str:
    return f"{value:+.4f}" if isinstance(value, float) else str(value)


def mgrpo_example(d_max: int, seed: int) -> None:
    # One query q, K = 3 main rollouts. m0 called the sub-agent twice, m1 once, m2 never.
    batch = make_batch(
        [1.0, 0.0, 1.0, 1.0, 0.0, 0.5],
        agent=["main", "main", "main", "searcher", "searcher", "searcher"],
        uid=["q"] * 6,
        traj_id=["m0", "m1", "m2", "s0", "s1", "s2"],
        parent_traj_id=["", "", "", "m0", "m0", "m1"],
    )
    config = {"sub_reward_local_weight": 0.5, "sub_reward_main_weight": 0.5}
    compute_mgrpo_advantage(batch, config)
    nt = batch.non_tensor_batch
    scores = batch.batch["token_level_rewards"].sum(-1).tolist()
    parent = {t: i for i, t in enumerate(nt["traj_id"])}
    effective = [
        s if p == "" else 0.5 * s + 0.5 * scores[parent[p]] for s, p in zip(scores, nt["parent_traj_id"], strict=True)
    ]
    _table(
        "M-GRPO: one query, 3 main rollouts, sub-agent 'searcher' called 2, 1 and 0 times",
        {
            "traj_id": list(nt["traj_id"]),
            "agent": list(nt["agent"]),
            "parent": list(nt["parent_traj_id"]),
            "score": scores,
            "effective": effective,
            "advantage": batch.batch["advantages"][:, -1].tolist(),
        },
    )
    aligned = align_trajectories(batch, d_max, seed)
    ant = aligned.non_tensor_batch
    _table(
        f"Aligned to D_max={d_max} (seed {seed}): every main rollout now has exactly {d_max} searcher rows",
        {
            "traj_id": list(ant["traj_id"]),
            "parent": list(ant["parent_traj_id"]),
            "aligned_from": list(ant["aligned_from"]),
            "padding": list(ant["is_padding"]),
            "advantage": aligned.batch["advantages"][:, -1].tolist(),
        },
    )
    print(f"  alignment metrics: {aligned.meta_info['alignment']}")


def magrpo_example() -> None:
    # Two agents, G = 2 aligned joint actions per node, two turns; node b terminated early (leaf).
    nodes = [  # node, parent, turn, joint reward
        ("a", "", 0, 0.2),
        ("b", "", 0, 1.0),
        ("a0", "a", 1, 0.6),
        ("a1", "a", 1, 1.0),
    ]
    rows = [(n, p, t, r, agent) for n, p, t, r in nodes for agent in ("helper", "main")]
    batch = make_batch(
        [r[3] for r in rows],
        agent=[r[4] for r in rows],
        uid=["task"] * len(rows),
        node_id=[r[0] for r in rows],
        parent_node_id=[r[1] for r in rows],
        turn=[r[2] for r in rows],
    )
    compute_magrpo_advantage(batch, {"gamma": 0.9, "baseline": "mean", "joint_mode": "aligned", "num_generations": 2})
    nt = batch.non_tensor_batch
    first = np.unique(nt["node_id"], return_index=True)[1]
    first.sort()
    _table(
        "MAGRPO: R = r + 0.9 * mean(R(children)); A = R - mean over siblings; 'b' ended early",
        {
            "node": list(nt["node_id"][first]),
            "parent": list(nt["parent_node_id"][first]),
            "turn": list(nt["turn"][first]),
            "reward": batch.batch["token_level_rewards"].sum(-1)[first].tolist(),
            "return": batch.batch["returns"][first, -1].tolist(),
            "advantage": batch.batch["advantages"][first, -1].tolist(),
        },
    )


def registry_check() -> None:
    import verl  # noqa: F401  (loads the verl.plugins entry point)
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    for name in ("mgrpo", "magrpo"):
        fn = get_adv_estimator_fn(name)
        print(f"  verl registry: adv_estimator={name} -> {fn.__module__}.{fn.__name__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--d-max", type=int, default=2)
    args = parser.parse_args()
    mgrpo_example(args.d_max, args.seed)
    magrpo_example()
    print()
    registry_check()
    print("\ndemo finished: M-GRPO, alignment and MAGRPO computed on the batches above")


if __name__ == "__main__":
    main()
