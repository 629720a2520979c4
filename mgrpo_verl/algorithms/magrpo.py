"""MAGRPO advantages: cooperative agents, joint rewards, Monte-Carlo returns over a tree of joint actions.

A task (``uid``) expands a tree of joint-action nodes. At a node each of the n agents produces G
completions; the joint actions become the node's children (``aligned``: G, ``cross``: G^n). Every
node has one joint reward r, carried as the score of each of its n agent rows (docs/algorithms.md):

- return ``R(node) = r(node) + gamma * mean(R(child) for child in children(node))``; a leaf has R = r
  (a node is a leaf at the last turn or when it terminated early);
- advantage ``A(node) = R(node) - baseline(siblings)``, siblings = nodes with the same ``uid`` and
  ``parent_node_id`` (the node included); optionally divided by the siblings' std + eps;
- every agent's row at a node gets that node's advantage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from mgrpo_verl.algorithms.config import MAGRPOConfig
from mgrpo_verl.algorithms.fields import check_lengths, list_some, require_non_tensor, require_tensor, row_scores
from mgrpo_verl.algorithms.grouping import broadcast_to_tokens, combine_codes, factorize, group_mean_std

MAGRPO_FIELDS = ("agent", "uid", "node_id", "parent_node_id", "turn")


def magrpo_node_returns(reward: torch.Tensor, parent: torch.Tensor, turn: torch.Tensor, gamma: float) -> torch.Tensor:
    """Monte-Carlo returns of every node, deepest turn first (a loop over turns, not rows).

    Args:
        reward: (K,) joint reward r of each node.
        parent: (K,) int64 index of the parent node, ``-1`` for roots.
        turn: (K,) int64 turn of each node; a child's turn is its parent's + 1.
        gamma: discount of the children's mean return.

    Returns:
        (K,) float64 ``R = r + gamma * mean(R(children))``, ``R = r`` for leaves.
    """
    r = reward.to(torch.float64)
    ret = r.clone()
    n = len(r)
    last = int(turn.max()) if n else -1
    for t in range(last, 0, -1):
        child = torch.nonzero(turn == t).reshape(-1)
        total = torch.zeros(n, dtype=torch.float64).index_add_(0, parent[child], ret[child])
        count = torch.zeros(n, dtype=torch.float64).index_add_(0, parent[child],
                                                               torch.ones(len(child), dtype=torch.float64))
        expanded = count > 0
        ret = torch.where(expanded, r + gamma * total / count.clamp_min(1.0), ret)
    return ret


def magrpo_node_advantage(
    returns: torch.Tensor, siblings: torch.Tensor, n_groups: int, config: MAGRPOConfig
) -> torch.Tensor:
    """Advantage of every node against its siblings.

    Args:
        returns: (K,) node returns R.
        siblings: (K,) int64 sibling-group code in ``[0, n_groups)`` (same ``uid`` and parent).
        n_groups: number of sibling groups.
        config: ``baseline`` (mean | max | rloo | raw), ``norm_adv_by_std``, ``epsilon``.

    Returns:
        (K,) float64 advantages. ``rloo`` gives a node without siblings advantage 0. With
        ``norm_adv_by_std`` the divisor is the siblings' unbiased std + eps (1 + eps for a lone node).
    """
    ret = returns.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, siblings, torch.ones_like(ret))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, siblings, ret)
    n = count[siblings]
    if config.baseline == "mean":
        baseline = total[siblings] / n
    elif config.baseline == "max":
        top = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, siblings, ret, "amax")
        baseline = top[siblings]
    elif config.baseline == "rloo":
        baseline = torch.where(n > 1, (total[siblings] - ret) / (n - 1).clamp_min(1.0), ret)
    else:  # raw
        baseline = torch.zeros_like(ret)
    adv = ret - baseline
    if config.norm_adv_by_std:
        _, std, _ = group_mean_std(ret, siblings, n_groups)
        adv = adv / (std[siblings] + config.epsilon)
    return adv


def _per_node_constant(values: torch.Tensor, node: torch.Tensor, n_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-node min and max of a row value: (K,), (K,)."""
    v = values.to(torch.float64)
    lo = torch.full((n_nodes,), torch.inf, dtype=torch.float64).scatter_reduce_(0, node, v, "amin")
    hi = torch.full((n_nodes,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, node, v, "amax")
    return lo, hi


def compute_magrpo_advantage(data: Any, config: Any = None) -> Any:
    """MAGRPO advantages for a verl ``DataProto`` whose rows are (node, agent) pairs of a joint-action tree.

    Reads ``non_tensor_batch`` fields ``agent``, ``uid``, ``node_id``, ``parent_node_id`` (``""`` at
    the first turn) and ``turn``, and ``batch`` tensors ``token_level_rewards`` (N, L) (each row's
    sum is its node's joint reward) and ``response_mask`` (N, L). Writes ``batch["advantages"]`` (the
    node's advantage times the row's mask) and ``batch["returns"]`` (the node's Monte-Carlo return
    times the mask), and returns ``data`` (updated in place).

    Node ids need only be unique within a ``uid``.

    Raises:
        ValueError naming the offending value: a missing field, NaN/inf rewards, rows of one node with
        different rewards or turns, two rows of one agent at one node, a parent node not in the batch,
        a turn that is not its parent's + 1, nodes with different numbers of agents, a tree whose shape
        does not match ``joint_mode`` and ``num_generations``, or a bad setting (e.g. unknown joint mode).
    """
    who = "compute_magrpo_advantage"
    cfg = MAGRPOConfig.from_any(config)
    f = require_non_tensor(data, MAGRPO_FIELDS, who)
    t = require_tensor(data, ("token_level_rewards", "response_mask"), who)
    rewards, mask = t["token_level_rewards"], t["response_mask"]
    check_lengths(who, rewards.shape[0], **f)
    scores = row_scores(rewards, f["node_id"], who, id_name="node_id")
    advantages, returns = magrpo_row_advantage(scores, f, cfg, who)
    data.batch["advantages"] = broadcast_to_tokens(advantages.to(rewards.dtype), mask)
    data.batch["returns"] = broadcast_to_tokens(returns.to(rewards.dtype), mask)
    return data


def magrpo_row_advantage(
    scores: torch.Tensor, fields: dict[str, np.ndarray], config: Any = None, who: str = "magrpo_row_advantage"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row MAGRPO advantage and return: the pure core of :func:`compute_magrpo_advantage`.

    Args:
        scores: (N,) each row's joint reward (the rows of one node carry the same value).
        fields: ``agent``, ``uid``, ``node_id``, ``parent_node_id`` (``""`` at the first turn), ``turn``;
            (N,) arrays each.
        config: :class:`MAGRPOConfig` or a mapping.

    Returns:
        (N,) float64 advantages and (N,) float64 returns (the row's node's).

    Raises:
        ValueError: as :func:`compute_magrpo_advantage` (broken tree, rewards differing within a node, ...).
    """
    cfg = MAGRPOConfig.from_any(config)
    f = {k: np.asarray(fields[k], dtype=object) for k in MAGRPO_FIELDS}
    n = len(scores)
    check_lengths(who, n, **f)

    # Nodes are (uid, node_id) pairs; parents are looked up in the same coding.
    parent_ids = np.asarray(f["parent_node_id"], dtype=object)
    root = pd.isna(parent_ids) | (parent_ids == "")
    labels, names = factorize(np.concatenate([np.asarray(f["node_id"], dtype=object), parent_ids]))
    uid_code, _ = factorize(f["uid"])
    width = np.int64(max(len(names), 1))
    node_pair = uid_code * width + labels[:n]
    row_node, node_key = pd.factorize(node_pair)
    row_node = row_node.astype(np.int64)
    n_nodes = len(node_key)
    first_row = np.unique(row_node, return_index=True)[1]
    node_ids, node_uid = f["node_id"][first_row], f["uid"][first_row]

    agent_code, agents = factorize(f["agent"])
    _, n_pairs = combine_codes(row_node, agent_code, len(agents))
    if n_pairs != n:
        dup = pd.Series(row_node * len(agents) + agent_code).duplicated().to_numpy()
        raise ValueError(
            f"{who}: an agent has more than one row at a node: node_id {list_some(f['node_id'][dup])} "
            f"agent {list_some(f['agent'][dup])}"
        )
    rows_per_node = np.bincount(row_node, minlength=n_nodes)
    if n_nodes and rows_per_node.min() != rows_per_node.max():
        short = rows_per_node < rows_per_node.max()
        raise ValueError(
            f"{who}: every node needs one row per agent ({int(rows_per_node.max())}), but node(s) "
            f"{list_some(node_ids[short])} have {list_some(rows_per_node[short])}"
        )

    node_t = torch.from_numpy(row_node)
    lo, hi = _per_node_constant(scores, node_t, n_nodes)
    differ = (hi - lo) > 1e-6 * torch.clamp(hi.abs(), min=1.0)
    if bool(differ.any()):
        bad = differ.numpy()
        raise ValueError(
            f"{who}: the rows of a node must carry the same joint reward; node(s) {list_some(node_ids[bad])} "
            f"have rewards from {list_some(lo[differ].numpy())} to {list_some(hi[differ].numpy())}"
        )
    try:
        row_turn = torch.from_numpy(np.asarray(f["turn"]).astype(np.int64))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{who}: field 'turn' must hold integers, got {list_some(f['turn'])}") from err
    tlo, thi = _per_node_constant(row_turn, node_t, n_nodes)
    if bool((tlo != thi).any()):
        bad = (tlo != thi).numpy()
        raise ValueError(f"{who}: the rows of node(s) {list_some(node_ids[bad])} disagree on 'turn'")
    turn = tlo.to(torch.int64)

    parent = np.full(n_nodes, -1, dtype=np.int64)
    node_root = root[first_row]
    wanted = (uid_code * width + labels[n:])[first_row][~node_root]
    found = pd.Index(node_key).get_indexer(wanted)
    if (found < 0).any():
        bad = np.flatnonzero(~node_root)[found < 0]
        raise ValueError(
            f"{who}: parent node(s) {list_some(parent_ids[first_row][bad])} of node(s) {list_some(node_ids[bad])} "
            f"are not in the batch"
        )
    parent[~node_root] = found
    parent_t = torch.from_numpy(parent)
    expected_turn = torch.where(parent_t >= 0, turn[parent_t.clamp_min(0)] + 1, torch.zeros_like(turn))
    if bool((turn != expected_turn).any()):
        bad = (turn != expected_turn).numpy()
        raise ValueError(
            f"{who}: node(s) {list_some(node_ids[bad])} have turn {list_some(turn[bad].numpy())}, expected "
            f"{list_some(expected_turn[bad].numpy())} (0 at the root, parent's turn + 1 below)"
        )

    siblings, n_groups = combine_codes(uid_code[first_row], parent + 1, n_nodes + 1)
    if cfg.num_generations is not None and n_nodes:
        n_agents = int(rows_per_node.max())
        expected = cfg.num_generations if cfg.joint_mode == "aligned" else cfg.num_generations**n_agents
        size = np.bincount(siblings, minlength=n_groups)[siblings]
        wrong = size != expected
        if wrong.any():
            raise ValueError(
                f"{who}: joint_mode={cfg.joint_mode!r} with num_generations={cfg.num_generations} and {n_agents} "
                f"agents needs {expected} children per expanded node (and roots per uid), but the siblings of "
                f"node(s) {list_some(node_ids[wrong])} (uid {list_some(node_uid[wrong])}) "
                f"number {list_some(size[wrong])}"
            )

    reward = scores.to(torch.float64)[torch.from_numpy(first_row)]
    returns = magrpo_node_returns(reward, parent_t, turn, cfg.gamma)
    advantages = magrpo_node_advantage(returns, torch.from_numpy(siblings), n_groups, cfg)
    return advantages[node_t], returns[node_t]
