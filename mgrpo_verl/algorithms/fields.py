"""Reading and validating the row fields of docs/algorithms.md from a verl ``DataProto``.

Every problem is a ``ValueError`` that names the offending field, row id or value, never a silent
default.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: How many offending ids an error message lists before it says "and N more".
_MAX_LISTED = 5


def list_some(values: Any) -> str:
    """``['a', 'b', 'c']`` for short lists, ``['a', 'b', ... and 7 more]`` for long ones."""
    values = [str(v) for v in np.asarray(values).reshape(-1).tolist()]
    shown = values[:_MAX_LISTED]
    more = len(values) - len(shown)
    return repr(shown) if more == 0 else f"{shown!r} and {more} more"


def require_non_tensor(data: Any, names: tuple[str, ...], who: str) -> dict[str, np.ndarray]:
    """The named ``non_tensor_batch`` fields as 1-D numpy arrays, or an error naming what is missing."""
    have = dict(getattr(data, "non_tensor_batch", None) or {})
    missing = [n for n in names if n not in have]
    if missing:
        raise ValueError(f"{who}: non_tensor_batch is missing required field(s) {missing}; it has {sorted(have)}")
    return {n: np.asarray(have[n]).reshape(-1) for n in names}


def require_tensor(data: Any, names: tuple[str, ...], who: str) -> dict[str, torch.Tensor]:
    """The named ``batch`` tensors, or an error naming what is missing."""
    batch = getattr(data, "batch", None)
    have = set(batch.keys()) if batch is not None else set()
    missing = [n for n in names if n not in have]
    if missing:
        raise ValueError(f"{who}: batch is missing required tensor(s) {missing}; it has {sorted(have)}")
    return {n: batch[n] for n in names}


def row_scores(token_level_rewards: torch.Tensor, row_ids: np.ndarray, who: str,
               id_name: str = "traj_id") -> torch.Tensor:
    """Each row's own score, the sum of its token rewards; NaN or ±inf is an error naming the rows.

    Args:
        token_level_rewards: (N, L).
        row_ids: (N,) ids used in the error message, whose field name is ``id_name``.

    Returns:
        (N,) scores, same dtype as the rewards.
    """
    scores = token_level_rewards.sum(dim=-1)
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        idx = torch.nonzero(bad).reshape(-1).numpy()
        raise ValueError(
            f"{who}: non-finite reward (NaN or inf) in {len(idx)} row(s): traj_id {list_some(row_ids[idx])} "
            f"with score(s) {list_some(scores[bad].numpy())}"
        )
    return scores


def check_lengths(who: str, n: int, **arrays: Any) -> None:
    """Every array must have one entry per row."""
    for name, arr in arrays.items():
        if len(arr) != n:
            raise ValueError(f"{who}: field {name!r} has {len(arr)} entries for {n} rows")
