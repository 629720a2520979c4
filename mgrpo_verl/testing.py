"""Builders of small and large synthetic batches in the row layout of docs/algorithms.md.

Used by the tests, the benchmarks and the docs' examples; handy for anyone checking their own rollout
output against the estimators.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def make_batch(
    scores: Sequence[float],
    response_length: int = 4,
    mask_lengths: Sequence[int] | None = None,
    **fields: Sequence[Any],
) -> Any:
    """A ``DataProto`` with one row per score.

    Each row's reward sits on its last response token (verl's outcome-reward layout), so the row's
    score is the sum of ``token_level_rewards``. ``fields`` become ``non_tensor_batch`` columns.

    Args:
        scores: (N,) row scores.
        response_length: L.
        mask_lengths: (N,) response length of each row (default L).
        fields: e.g. ``agent=[...], uid=[...], traj_id=[...], parent_traj_id=[...]``.
    """
    from verl import DataProto

    n = len(scores)
    lengths = torch.as_tensor(list(mask_lengths) if mask_lengths is not None else [response_length] * n,
                              dtype=torch.long)
    mask = (torch.arange(response_length)[None, :] < lengths[:, None]).to(torch.float32)
    rewards = torch.zeros(n, response_length, dtype=torch.float32)
    last = (lengths - 1).clamp_min(0)
    rewards[torch.arange(n), last] = torch.as_tensor(list(scores), dtype=torch.float32)
    non_tensor = {k: np.asarray(list(v), dtype=object) for k, v in fields.items()}
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors=non_tensor
    )


def random_mgrpo_batch(
    n_queries: int,
    k_rollouts: int,
    max_calls: int,
    sub_agents: Sequence[str] = ("sub",),
    response_length: int = 8,
    seed: int = 0,
) -> Any:
    """A random hierarchical batch: K main rollouts per query, each calling every sub-agent a random
    number of times in ``[0, max_calls]``; scores are random in {0, 0.5, 1} plus noise.

    Rows are vectorised (no Python loop over rows), so a million-row batch builds in about a second.
    """
    from verl import DataProto

    rng = np.random.default_rng(seed)
    n_main = n_queries * k_rollouts
    main_uid = np.repeat(np.arange(n_queries), k_rollouts)
    calls = rng.integers(0, max_calls + 1, size=(n_main, len(sub_agents)))
    sub_parent = np.repeat(np.repeat(np.arange(n_main), len(sub_agents)), calls.reshape(-1))
    sub_agent = np.repeat(np.tile(np.arange(len(sub_agents)), n_main), calls.reshape(-1))
    n_sub = len(sub_parent)
    n = n_main + n_sub

    main_tid = np.char.add("m", np.arange(n_main).astype(str)).astype(object)
    sub_tid = np.char.add("s", np.arange(n_sub).astype(str)).astype(object)
    uid_names = np.char.add("q", np.arange(n_queries).astype(str)).astype(object)
    names = np.asarray(list(sub_agents), dtype=object)
    non_tensor = {
        "agent": np.concatenate([np.full(n_main, "main", dtype=object), names[sub_agent]]),
        "uid": uid_names[np.concatenate([main_uid, main_uid[sub_parent]])],
        "traj_id": np.concatenate([main_tid, sub_tid]),
        "parent_traj_id": np.concatenate([np.full(n_main, "", dtype=object), main_tid[sub_parent]]),
    }
    scores = torch.from_numpy(rng.choice([0.0, 0.5, 1.0], size=n) + 0.01 * rng.standard_normal(n)).float()
    rewards = torch.zeros(n, response_length)
    rewards[:, -1] = scores
    mask = torch.ones(n, response_length)
    return DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors=non_tensor)
