"""M-GRPO trajectory alignment: a variable number of sub-agent calls per rollout → fixed-size batches.

For every main row and every sub-agent name present in the batch, the output holds exactly ``D_max``
rows of that sub-agent, filled from the d real calls that main rollout made (docs/algorithms.md):

- d = D_max: all d, in their original order;
- d < D_max (d > 0): all d, then D_max - d copies of them drawn uniformly with replacement;
- d > D_max: D_max of them drawn uniformly without replacement (the rest are dropped, and counted);
- d = 0: D_max rows drawn with replacement from the other calls of that sub-agent for the same query
  (``uid``), re-parented to this main row; with none, padding rows whose ``response_mask`` is zero.

A copy carries its source's tensors (advantages included), its source's ``traj_id`` and a field
``aligned_from`` naming the source (``""`` for rows that are not copies). Main rows pass through
unchanged. The random draws come from ``numpy.random.default_rng(seed)`` only, so the same inputs and
seed give the same result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch

from mgrpo_verl.algorithms.fields import require_non_tensor, require_tensor
from mgrpo_verl.algorithms.grouping import factorize, gather_rows
from mgrpo_verl.algorithms.hierarchy import resolve_parents

#: Slot kinds in an :class:`AlignmentPlan`.
ORIGINAL, DUPLICATE, BORROWED, PADDING = 0, 1, 2, 3

#: ``d_max="auto"`` uses this quantile of the per-(main row, sub-agent) call counts of the batch.
AUTO_D_MAX_QUANTILE = 0.9

#: Per-response tensors zeroed in padding rows, so they add nothing to any loss or metric: the one rule of both
#: copy paths, this module's DataProto path and the trainer's TransferQueue path
#: (:func:`mgrpo_verl.trainer.rows.write_copies`); each zeroes the ones its rows carry (a DataProto has
#: ``token_level_*``, verl's TransferQueue rows ``loss_mask`` and ``rm_scores``).
PADDING_ZEROED = ("response_mask", "loss_mask", "advantages", "returns", "rm_scores", "token_level_rewards",
                  "token_level_scores")

DMax = Union[int, str]


def resolve_d_max(d_max: DMax, calls: np.ndarray) -> int:
    """The integer D_max to align to.

    Args:
        d_max: a positive int, or ``"auto"``: ``max(1, ceil(q90))`` of ``calls``, the number of calls
            of each sub-agent by each main row in this batch (so about 90% of rollouts lose nothing).
        calls: (M * A,) int call counts.

    Raises:
        ValueError naming the value when it is not a positive int or ``"auto"``.
    """
    if isinstance(d_max, str):
        if d_max != "auto":
            raise ValueError(f"align_trajectories: d_max must be a positive int or 'auto', got {d_max!r}")
        if len(calls) == 0:
            return 1
        return max(1, math.ceil(float(np.quantile(calls, AUTO_D_MAX_QUANTILE))))
    if isinstance(d_max, bool) or not isinstance(d_max, (int, np.integer)) or d_max < 1:
        raise ValueError(f"align_trajectories: d_max must be a positive int (>= 1) or 'auto', got {d_max!r}")
    return int(d_max)


@dataclass(frozen=True)
class AlignmentPlan:
    """Which real sub row fills each aligned slot.

    Attributes:
        source: (M, A, D) int64 position of the source in the list of sub rows, ``-1`` for padding.
        kind: (M, A, D) int8, one of ORIGINAL, DUPLICATE, BORROWED, PADDING.
        calls: (M, A) int64, d: how many times main row m called sub-agent a.
        d_max: D.
    """

    source: np.ndarray
    kind: np.ndarray
    calls: np.ndarray
    d_max: int


def plan_alignment(
    parent: np.ndarray,
    agent: np.ndarray,
    sub_query: np.ndarray,
    main_query: np.ndarray,
    n_agents: int,
    d_max: DMax,
    rng: np.random.Generator,
) -> AlignmentPlan:
    """Vectorised alignment plan (pure numpy; no Python loop over rows).

    Args:
        parent: (S,) int64, the parent's position among the M main rows, for each sub row.
        agent: (S,) int64 sub-agent code in ``[0, A)``.
        sub_query, main_query: (S,) and (M,) int64 query (uid) codes in one shared coding.
        n_agents: A.
        d_max: positive int or ``"auto"`` (see :func:`resolve_d_max`).
        rng: source of every random draw.
    """
    n_main, n_sub = len(main_query), len(parent)
    key = parent * n_agents + agent  # (S,) slot group = (main row, sub-agent)
    calls = np.bincount(key, minlength=n_main * n_agents).astype(np.int64)
    d = resolve_d_max(d_max, calls)

    source = np.full((n_main * n_agents, d), -1, dtype=np.int64)
    kind = np.full((n_main * n_agents, d), PADDING, dtype=np.int8)

    # Rank every call inside its group: original order when d <= D, a random order when d > D.
    # One stable float sort on key + u/2 with u in [0, 1) orders by (key, u): the key is an exact integer
    # in float64 (< 2**53), and rows already grouped by parent make the sort nearly linear.
    over = calls[key] > d
    secondary = np.where(over, rng.random(n_sub), 0.0)
    order = np.argsort(key + 0.5 * secondary, kind="stable")
    starts = np.cumsum(calls) - calls
    rank = np.empty(n_sub, dtype=np.int64)
    rank[order] = np.arange(n_sub) - starts[key[order]]
    keep = rank < d
    source[key[keep], rank[keep]] = np.flatnonzero(keep)
    kind[key[keep], rank[keep]] = ORIGINAL

    # 0 < d < D: fill the remaining slots with copies of the group's own calls.
    slot = np.arange(d)[None, :]
    g, j = np.nonzero((calls[:, None] > 0) & (slot >= calls[:, None]))
    pick = np.minimum((rng.random(len(g)) * calls[g]).astype(np.int64), calls[g] - 1)
    source[g, j] = order[starts[g] + pick]
    kind[g, j] = DUPLICATE

    # d = 0: borrow from the same sub-agent's calls for the same query, else leave padding.
    empty = np.flatnonzero(calls == 0)
    if len(empty) and n_sub:
        n_query = int(max(sub_query.max(), main_query.max())) + 1
        pool_key = agent * n_query + sub_query
        pool_size = np.bincount(pool_key, minlength=n_agents * n_query)
        pool_order = np.argsort(pool_key, kind="stable")
        pool_start = np.cumsum(pool_size) - pool_size
        want = (empty % n_agents) * n_query + main_query[empty // n_agents]
        has = pool_size[want] > 0
        g, want = empty[has], want[has]
        size = pool_size[want][:, None]
        pick = np.minimum((rng.random((len(g), d)) * size).astype(np.int64), size - 1)
        source[g] = pool_order[pool_start[want][:, None] + pick]
        kind[g] = BORROWED

    shape = (n_main, n_agents, d)
    return AlignmentPlan(source.reshape(shape), kind.reshape(shape), calls.reshape(n_main, n_agents), d)


def _take_rows(data: Any, index: np.ndarray) -> Any:
    """Rows ``index`` of ``data`` as a new ``DataProto`` with its own ``meta_info`` dict.

    Like ``DataProto.select_idxs``, but a tensor stored under several names (verl's GRPO stores one
    tensor as both ``advantages`` and ``returns``) is gathered once and stays shared.
    """
    from tensordict import TensorDict

    gathered: dict[int, torch.Tensor] = {}
    tensors = {}
    for name, tensor in data.batch.items():
        if id(tensor) not in gathered:
            gathered[id(tensor)] = gather_rows(tensor, index)
        tensors[name] = gathered[id(tensor)]
    batch = TensorDict(tensors, batch_size=(len(index),), device=data.batch.device)
    non_tensor = {name: value[index] for name, value in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


@dataclass(frozen=True)
class BatchAlignment:
    """An :class:`AlignmentPlan` located in a batch: which batch row fills each aligned slot.

    Attributes:
        main_rows: (M,) batch row of each main row.
        sub_rows: (S,) batch row of each sub row (positions in ``plan.source`` index this).
        sub_agent: (S,) code of each sub row's agent in ``agent_names``.
        agent_names: (A,) sub-agent names, sorted.
        plan: the slots.
    """

    main_rows: np.ndarray
    sub_rows: np.ndarray
    sub_agent: np.ndarray
    agent_names: np.ndarray
    plan: AlignmentPlan


def plan_batch_alignment(data: Any, d_max: DMax, seed: int) -> BatchAlignment:
    """Validate the hierarchy of ``data`` and plan its alignment, without copying any row.

    Same arguments and errors as :func:`align_trajectories`; the trainer can use the result to gather
    each agent's rows directly.
    """
    who = "align_trajectories"
    f = require_non_tensor(data, ("agent", "uid", "traj_id", "parent_traj_id"), who)
    require_tensor(data, ("response_mask",), who)
    parent_row = resolve_parents(f["traj_id"], f["parent_traj_id"], f["uid"], who)
    return plan_resolved_alignment(parent_row, f["agent"], f["uid"], d_max, seed)


def plan_resolved_alignment(parent_row: np.ndarray, agent: np.ndarray, uid: np.ndarray, d_max: DMax,
                            seed: int) -> BatchAlignment:
    """:func:`plan_batch_alignment` of rows whose hierarchy is already resolved.

    Args:
        parent_row: (N,) int64 from :func:`mgrpo_verl.algorithms.hierarchy.resolve_parents` (which also
            checked that every sub row shares its parent's ``uid``), ``-1`` for main rows.
        agent, uid: (N,) labels of the rows.
    """
    main_rows, sub_rows = np.flatnonzero(parent_row < 0), np.flatnonzero(parent_row >= 0)
    position = np.empty(len(parent_row), dtype=np.int64)
    position[main_rows] = np.arange(len(main_rows))
    agent_code, agent_names = factorize(agent[sub_rows], sort=True)
    # a sub row's uid is its parent's, so main rows' codes suffice.
    main_query, _ = factorize(uid[main_rows])
    parent = position[parent_row[sub_rows]]
    plan = plan_alignment(
        parent, agent_code, main_query[parent], main_query, len(agent_names), d_max, np.random.default_rng(seed)
    )
    return BatchAlignment(main_rows, sub_rows, agent_code, agent_names, plan)


def align_trajectories(data: Any, d_max: DMax, seed: int) -> Any:
    """Align a ``DataProto`` of main and sub-agent rows to ``D_max`` sub rows per main row and sub-agent.

    Run it after :func:`mgrpo_verl.compute_mgrpo_advantage`, which needs the real rows.

    Args:
        data: verl ``DataProto`` with ``non_tensor_batch`` fields ``agent``, ``uid``, ``traj_id``,
            ``parent_traj_id`` and ``batch["response_mask"]``.
        d_max: positive int, or ``"auto"`` (``max(1, ceil(90th percentile of the calls per main row and
            sub-agent))`` of this batch).
        seed: seeds every random choice.

    Returns:
        A new ``DataProto``: the M main rows (original order), then for each main row, each sub-agent
        name (sorted) and each slot 0..D-1 one sub row, M * (1 + A * D) rows in all. Added fields:
        ``aligned_from`` (source ``traj_id`` of copies, else ``""``) and ``is_padding`` (bool).
        Every sub row's ``parent_traj_id`` names the main row whose slot it fills. ``meta_info
        ["alignment"]`` holds ``d_max`` and the counts of calls, dropped, duplicated, borrowed and
        padding rows, for logging.

    Raises:
        ValueError: a missing field, a bad ``d_max``, or a broken hierarchy (see ``resolve_parents``).
    """
    alignment = plan_batch_alignment(data, d_max, seed)
    plan, main_rows, sub_rows, agent_names = (alignment.plan, alignment.main_rows, alignment.sub_rows,
                                              alignment.agent_names)
    nt_in = data.non_tensor_batch
    traj_id, uid = nt_in["traj_id"], nt_in["uid"]
    n_main, n_agents = len(main_rows), len(agent_names)
    d = plan.d_max
    source, kind = plan.source.reshape(-1), plan.kind.reshape(-1)
    padding = kind == PADDING
    slot_agent = np.tile(np.repeat(np.arange(n_agents), d), n_main)
    slot_main = np.repeat(main_rows, n_agents * d)
    if padding.any():
        # A padding row borrows the tensors of any row of its sub-agent, then is masked out below.
        first_of_agent = np.unique(alignment.sub_agent, return_index=True)[1]
        source = np.where(padding, first_of_agent[slot_agent], source)
    out = _take_rows(data, np.concatenate([main_rows, sub_rows[source]]))
    nt = out.non_tensor_batch
    copied = (kind == DUPLICATE) | (kind == BORROWED)
    nt["parent_traj_id"] = np.concatenate([nt_in["parent_traj_id"][main_rows], traj_id[slot_main]]).astype(object)
    nt["uid"] = np.concatenate([uid[main_rows], uid[slot_main]])
    nt["aligned_from"] = np.concatenate([np.full(n_main, "", dtype=object),
                                         np.where(copied, nt["traj_id"][n_main:], "")])
    nt["is_padding"] = np.concatenate([np.zeros(n_main, dtype=bool), padding])
    if padding.any():
        suffix = np.array([f"#pad/{a}/{j}" for a in agent_names for j in range(d)], dtype=str)
        slot_suffix = np.tile(np.arange(n_agents * d), n_main)[padding]
        pad_rows = n_main + np.flatnonzero(padding)
        nt["traj_id"] = nt["traj_id"].astype(object)
        nt["traj_id"][pad_rows] = np.char.add(traj_id[slot_main[padding]].astype(str), suffix[slot_suffix])
        for name in PADDING_ZEROED:
            if name in out.batch.keys():
                out.batch[name][pad_rows] = 0

    out.meta_info["alignment"] = {
        "d_max": d,
        "sub_agents": [str(a) for a in agent_names],
        "calls_mean": float(plan.calls.mean()) if plan.calls.size else 0.0,
        "calls_max": int(plan.calls.max()) if plan.calls.size else 0,
        "dropped": int(np.maximum(plan.calls - d, 0).sum()),
        "duplicated": int((kind == DUPLICATE).sum()),
        "borrowed": int((kind == BORROWED).sum()),
        "padding": int(padding.sum()),
    }
    return out
