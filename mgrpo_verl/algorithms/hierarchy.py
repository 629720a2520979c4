"""Resolving M-GRPO's main/sub hierarchy: which row is each sub-agent row's parent main row."""

from __future__ import annotations

import numpy as np

from mgrpo_verl.algorithms.fields import list_some
from mgrpo_verl.algorithms.grouping import factorize


def is_sub_row(parent_traj_id: np.ndarray) -> np.ndarray:
    """(N,) bool: True for sub-agent rows (``parent_traj_id`` not empty), False for main rows.

    ``""`` and ``None`` both mean "no parent" (the test is the value's truthiness, one C-level pass).
    """
    return np.asarray(parent_traj_id, dtype=object).astype(bool)


def resolve_parents(traj_id: np.ndarray, parent_traj_id: np.ndarray, uid: np.ndarray, who: str) -> np.ndarray:
    """Row index of every row's parent main row.

    Args:
        traj_id: (N,) unique, non-empty trajectory ids.
        parent_traj_id: (N,) ``""`` for main rows, else the ``traj_id`` of the main row that invoked it.
        uid: (N,) query of each row; a sub row must belong to its parent's query.

    Returns:
        parent_row: (N,) int64, ``-1`` for main rows.

    Raises:
        ValueError naming the offending ids: empty or duplicated ``traj_id``, a sub row whose parent is
        not in the batch, a sub row whose parent is itself a sub row (nested delegation is not part of
        M-GRPO's two-level hierarchy), a sub row whose ``uid`` differs from its parent's.
    """
    traj_id = np.asarray(traj_id, dtype=object)
    n = len(traj_id)
    sub = is_sub_row(parent_traj_id)
    empty = ~traj_id.astype(bool)  # "" or None
    if empty.any():
        raise ValueError(f"{who}: {int(empty.sum())} row(s) have an empty traj_id "
                         f"(rows {list_some(np.flatnonzero(empty))})")
    sub_rows = np.flatnonzero(sub)
    codes, labels = factorize(np.concatenate([traj_id, np.asarray(parent_traj_id, dtype=object)[sub_rows]]))
    own, parent_code = codes[:n], codes[n:]
    # factorize numbers labels by first appearance, so the n traj ids are distinct iff own == 0..n-1.
    if not np.array_equal(own, np.arange(n)):
        dup = np.flatnonzero(np.bincount(own) > 1)
        raise ValueError(f"{who}: traj_id must be unique, duplicated: {list_some(labels[dup])}")
    missing = parent_code >= n
    if missing.any():
        rows = sub_rows[missing]
        raise ValueError(
            f"{who}: {len(rows)} sub-agent row(s) name a parent that is not in the batch: traj_id "
            f"{list_some(traj_id[rows])} with parent_traj_id "
            f"{list_some(np.asarray(parent_traj_id, dtype=object)[rows])}"
        )
    parent_row = np.full(n, -1, dtype=np.int64)
    parent_row[sub_rows] = parent_code
    nested = sub[parent_code]
    if nested.any():
        rows = sub_rows[nested]
        raise ValueError(
            f"{who}: sub-agent row(s) {list_some(traj_id[rows])} have a parent that is itself a sub-agent row "
            f"({list_some(traj_id[parent_code[nested]])}); M-GRPO's hierarchy has two levels: main -> sub"
        )
    uid = np.asarray(uid, dtype=object)
    other_query = uid[sub_rows] != uid[parent_code]
    if other_query.any():
        rows = sub_rows[other_query]
        raise ValueError(
            f"{who}: sub-agent row(s) {list_some(traj_id[rows])} have uid {list_some(uid[rows])} but their parent's "
            f"uid is {list_some(uid[parent_code[other_query]])}; a sub-agent call belongs to its parent's query"
        )
    return parent_row
