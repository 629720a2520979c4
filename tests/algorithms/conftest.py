"""Shared builders and readers for the algorithm tests.

pytest runs with ``--import-mode=importlib`` (verl's wheel owns the top-level name ``tests``), so test
modules cannot import each other or this file by name: the helpers are handed out through the
session-scoped fixture ``h`` (session scope keeps hypothesis' function-scoped-fixture health check
quiet; the helpers are stateless).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from mgrpo_verl.testing import make_batch

MGRPO_FIELDS = ("agent", "uid", "traj_id", "parent_traj_id")
MAGRPO_FIELDS = ("agent", "uid", "node_id", "parent_node_id", "turn")


def mgrpo_batch(rows: Sequence[tuple], response_length: int = 4, mask_lengths: Sequence[int] | None = None) -> Any:
    """A DataProto from rows ``(agent, uid, traj_id, parent_traj_id, score)``."""
    agent, uid, tid, ptid, score = (list(c) for c in zip(*rows))
    return make_batch(
        score,
        response_length=response_length,
        mask_lengths=mask_lengths,
        agent=agent,
        uid=uid,
        traj_id=tid,
        parent_traj_id=ptid,
    )


def magrpo_batch(
    nodes: Sequence[tuple],
    agents: Sequence[str] = ("a", "b"),
    response_length: int = 4,
    mask_lengths: Sequence[int] | None = None,
) -> Any:
    """A DataProto from nodes ``(uid, node_id, parent_node_id, turn, joint_reward)``: one row per agent
    per node, node-major (node 0 agent 0, node 0 agent 1, node 1 agent 0, ...)."""
    cols: dict[str, list] = {k: [] for k in MAGRPO_FIELDS}
    scores = []
    for uid, node, parent, turn, reward in nodes:
        for a in agents:
            cols["agent"].append(a)
            cols["uid"].append(uid)
            cols["node_id"].append(node)
            cols["parent_node_id"].append(parent)
            cols["turn"].append(turn)
            scores.append(reward)
    return make_batch(scores, response_length=response_length, mask_lengths=mask_lengths, **cols)


def empty_batch(fields: Sequence[str], response_length: int = 4) -> Any:
    """A DataProto with zero rows (``make_batch([])`` cannot build one, see the test report)."""
    from verl import DataProto

    return DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.zeros(0, response_length),
            "response_mask": torch.zeros(0, response_length),
        },
        non_tensors={k: np.array([], dtype=object) for k in fields},
    )


def row_scalar(data: Any, key: str = "advantages") -> np.ndarray:
    """Each row's scalar: the value on its first response token (every builder here gives each row at
    least one response token unless a test says otherwise)."""
    return data.batch[key][:, 0].double().numpy()


def column(data: Any, name: str) -> list:
    return list(np.asarray(data.non_tensor_batch[name]).tolist())


def drop_field(data: Any, name: str) -> Any:
    del data.non_tensor_batch[name]
    return data


def assert_same_dataproto(a: Any, b: Any) -> None:
    """Bit-identical tensors and non-tensor columns, same row count."""
    assert len(a) == len(b)
    assert sorted(a.batch.keys()) == sorted(b.batch.keys())
    for k in a.batch.keys():
        assert torch.equal(a.batch[k], b.batch[k]), k
    assert sorted(a.non_tensor_batch) == sorted(b.non_tensor_batch)
    for k in a.non_tensor_batch:
        assert np.asarray(a.non_tensor_batch[k]).tolist() == np.asarray(b.non_tensor_batch[k]).tolist(), k


@pytest.fixture(scope="session")
def h() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        mgrpo_batch=mgrpo_batch,
        magrpo_batch=magrpo_batch,
        empty_batch=empty_batch,
        row_scalar=row_scalar,
        column=column,
        drop_field=drop_field,
        assert_same_dataproto=assert_same_dataproto,
        MGRPO_FIELDS=MGRPO_FIELDS,
        MAGRPO_FIELDS=MAGRPO_FIELDS,
        EPS=1e-6,
    )
