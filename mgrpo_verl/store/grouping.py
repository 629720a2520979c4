"""Sub-agent advantages on the sub side of decoupled M-GRPO, from the parents' main scores in the store.

The sub side holds its own rows (``traj_id``, ``uid``, ``agent``, ``parent_traj_id``, own score) and
reads the main score ``s_M`` of each row's parent from the store
(:meth:`mgrpo_verl.store.StatStore.wait_for_parents`). :func:`sub_advantages` then computes exactly
what the synchronous trainer computes for these rows: it rebuilds the inputs of
:func:`mgrpo_verl.algorithms.mgrpo.mgrpo_scalar_advantage` (the parents as main rows, the sub rows
pointing at them) and calls it, so

- the effective score is ``s_S = w_local * own + w_main * s_M(parent)``;
- groups are the sub rows of one ``(agent, uid)``: all calls of that sub-agent across the K rollouts
  of the query, **whatever order the rows or the parents' scores arrived in** (the keys decide, never
  the arrival order);
- with every parent present the result equals the synchronous computation on the same rollouts
  (``tests/store/test_grouping.py`` checks it on random batches).

Parents that did not arrive in time (absent from ``parents``; pass ``WaitResult.found``, so stale ones
count as absent) are handled by ``missing_policy``:

- ``"skip"``: those rows get no advantage (``valid`` False, ``advantage`` 0) and take no part in their
  group's statistics; the trainer leaves them out of the update. They are listed in ``missing``.
- ``"zero"``: those rows stay in the batch with advantage 0 (``valid`` True): no policy gradient,
  but the batch keeps its shape (trajectory alignment, fixed micro-batches). They take no part in
  the group statistics either (their ``s_S`` is unknown). Also listed in ``missing``.
- ``"error"``: ``ValueError`` naming them, the synchronous mode's behaviour.

With either tolerant policy the remaining rows of a group are normalised among themselves, as if the
missing rows had not been sampled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.algorithms.fields import list_some
from mgrpo_verl.algorithms.grouping import factorize
from mgrpo_verl.algorithms.mgrpo import mgrpo_scalar_advantage
from mgrpo_verl.store.base import MISSING_POLICIES, TrajectoryStat


@dataclass(frozen=True)
class SubRows:
    """The sub side's own rows, as columns (all (N,)).

    Attributes:
        traj_id, uid, agent, parent_traj_id: object arrays of str.
        score: float64, each row's own (local) score.
    """

    traj_id: np.ndarray
    uid: np.ndarray
    agent: np.ndarray
    parent_traj_id: np.ndarray
    score: np.ndarray

    def __post_init__(self) -> None:
        cols = {name: np.asarray(getattr(self, name), dtype=object) for name in ("traj_id", "uid", "agent", "parent_traj_id")}
        score = np.asarray(self.score, dtype=np.float64)
        n = len(cols["traj_id"])
        lengths = {name: len(c) for name, c in cols.items()} | {"score": len(score)}
        if any(length != n for length in lengths.values()) or score.ndim != 1:
            raise ValueError(f"SubRows: columns must be 1-D of one length, got {lengths}")
        for name, c in cols.items():
            object.__setattr__(self, name, c)
        object.__setattr__(self, "score", score)

    def __len__(self) -> int:
        return len(self.traj_id)

    @classmethod
    def from_stats(cls, stats: Sequence[TrajectoryStat]) -> "SubRows":
        """Columns of the sub side's own :class:`TrajectoryStat` records."""
        stats = list(stats)
        return cls(
            traj_id=np.array([s.traj_id for s in stats], dtype=object),
            uid=np.array([s.uid for s in stats], dtype=object),
            agent=np.array([s.agent for s in stats], dtype=object),
            parent_traj_id=np.array([s.parent_traj_id for s in stats], dtype=object),
            score=np.array([s.score for s in stats], dtype=np.float64),
        )

    @classmethod
    def coerce(cls, rows: Any) -> "SubRows":
        if isinstance(rows, cls):
            return rows
        if isinstance(rows, Mapping):
            return cls(**{k: rows[k] for k in ("traj_id", "uid", "agent", "parent_traj_id", "score")})
        return cls.from_stats(rows)


@dataclass(frozen=True)
class SubAdvantages:
    """Result of :func:`sub_advantages`, aligned with the input rows.

    Attributes:
        advantage: (N,) float64; 0 where the parent was missing.
        effective_score: (N,) float64 ``s_S``; NaN where the parent was missing.
        valid: (N,) bool; False only for rows skipped by ``missing_policy="skip"``.
        missing: ``traj_id`` of the rows whose parent was missing (any policy), in row order.
        missing_parents: the absent parent ids, in order of first appearance.
    """

    advantage: np.ndarray
    effective_score: np.ndarray
    valid: np.ndarray
    missing: list[str]
    missing_parents: list[str]

    @property
    def n_missing(self) -> int:
        return len(self.missing)


def sub_advantages(
    sub_rows: SubRows | Sequence[TrajectoryStat] | Mapping[str, Any],
    parents: Mapping[str, TrajectoryStat],
    config: MGRPOConfig | Mapping | None = None,
    missing_policy: str = "skip",
) -> SubAdvantages:
    """M-GRPO advantages of the sub side's rows (see the module docstring).

    Args:
        sub_rows: :class:`SubRows`, the rows' :class:`TrajectoryStat` records, or a mapping of the
            columns ``traj_id, uid, agent, parent_traj_id, score``.
        parents: parent ``traj_id`` -> the parent's main record (e.g. ``WaitResult.found`` or a merge
            of :meth:`StatStore.main_scores`); extra entries are ignored.
        config: M-GRPO settings (weights, normalisation, epsilon, ``norm_scope``).
        missing_policy: ``"skip"``, ``"zero"`` or ``"error"``.

    Raises:
        ValueError: an unknown policy; an empty or duplicated ``traj_id``, a row without
            ``parent_traj_id`` (a main row), a non-finite score; a parent record that is itself a
            sub-agent record, belongs to another ``uid`` or is filed under another id; with
            ``"error"``, any missing parent. Messages name the ids.
    """
    who = "sub_advantages"
    if missing_policy not in MISSING_POLICIES:
        raise ValueError(f"{who}: unknown missing_policy {missing_policy!r}; expected one of {MISSING_POLICIES}")
    cfg = MGRPOConfig.from_any(config)
    rows = SubRows.coerce(sub_rows)
    n = len(rows)
    _check_rows(rows, who)

    parent_of = [parents.get(p) for p in rows.parent_traj_id]
    present = np.fromiter((p is not None for p in parent_of), dtype=bool, count=n)
    _check_parents(rows, parent_of, present, who)
    missing_rows = np.flatnonzero(~present)
    missing = [str(t) for t in rows.traj_id[missing_rows]]
    missing_parents = list(dict.fromkeys(str(p) for p in rows.parent_traj_id[missing_rows]))
    if missing and missing_policy == "error":
        raise ValueError(
            f"{who}: {len(missing)} sub-agent row(s) name a parent whose main score is not available: traj_id "
            f"{list_some(np.array(missing, dtype=object))} with parent_traj_id {list_some(np.array(missing_parents, dtype=object))}"
        )

    advantage = np.zeros(n, dtype=np.float64)
    effective = np.full(n, np.nan, dtype=np.float64)
    rows_in = np.flatnonzero(present)
    if len(rows_in):
        # The synchronous inputs: the distinct parents as main rows, then the sub rows pointing at them.
        parent_code, parent_ids = factorize(rows.parent_traj_id[rows_in])
        main = [parents[p] for p in parent_ids]
        n_main = len(main)
        scores = np.concatenate([np.array([m.score for m in main], dtype=np.float64), rows.score[rows_in]])
        agent = np.concatenate([np.array([m.agent for m in main], dtype=object), rows.agent[rows_in]])
        uid = np.concatenate([np.array([m.uid for m in main], dtype=object), rows.uid[rows_in]])
        parent_row = np.concatenate([np.full(n_main, -1, dtype=np.int64), parent_code])
        adv, eff = mgrpo_scalar_advantage(torch.from_numpy(scores), agent, uid, parent_row, cfg)
        advantage[rows_in] = adv.numpy()[n_main:]
        effective[rows_in] = eff.numpy()[n_main:]
    valid = present.copy() if missing_policy == "skip" else np.ones(n, dtype=bool)
    return SubAdvantages(advantage, effective, valid, missing, missing_parents)


def _check_rows(rows: SubRows, who: str) -> None:
    for name in ("traj_id", "uid", "agent"):
        col = getattr(rows, name)
        bad = np.flatnonzero(~np.fromiter((isinstance(v, str) and bool(v) for v in col), dtype=bool, count=len(col)))
        if len(bad):
            raise ValueError(f"{who}: {len(bad)} row(s) have an empty or non-str {name} (rows {list_some(bad)})")
    codes, labels = factorize(rows.traj_id)
    if not np.array_equal(codes, np.arange(len(rows))):
        dup = np.flatnonzero(np.bincount(codes) > 1)
        raise ValueError(f"{who}: traj_id must be unique, duplicated: {list_some(labels[dup])}")
    is_main = ~np.fromiter((isinstance(p, str) and bool(p) for p in rows.parent_traj_id), dtype=bool, count=len(rows))
    if is_main.any():
        raise ValueError(
            f"{who}: row(s) {list_some(rows.traj_id[is_main])} have no parent_traj_id: they are main rows, "
            "not sub-agent rows"
        )
    bad = ~np.isfinite(rows.score)
    if bad.any():
        raise ValueError(f"{who}: non-finite score in rows {list_some(rows.traj_id[bad])}")


def _check_parents(rows: SubRows, parent_of: list, present: np.ndarray, who: str) -> None:
    for i in np.flatnonzero(present):
        p = parent_of[i]
        tid, ptid = rows.traj_id[i], rows.parent_traj_id[i]
        if not isinstance(p, TrajectoryStat):
            raise ValueError(f"{who}: parents[{ptid!r}] is a {type(p).__name__}, not a TrajectoryStat")
        if p.traj_id != ptid:
            raise ValueError(f"{who}: parents[{ptid!r}] holds the record of traj_id {p.traj_id!r}")
        if not p.is_main:
            raise ValueError(
                f"{who}: sub-agent row {tid!r} has parent {ptid!r}, which is itself a sub-agent record (its parent "
                f"is {p.parent_traj_id!r}); M-GRPO's hierarchy has two levels: main -> sub"
            )
        if p.uid != rows.uid[i]:
            raise ValueError(
                f"{who}: sub-agent row {tid!r} has uid {rows.uid[i]!r} but its parent {ptid!r} has uid {p.uid!r}; "
                "a sub-agent call belongs to its parent's query"
            )
