"""The row contract: what every multi-agent agent loop writes on each row it emits, and what the trainers, the
decoupled sides and the evaluations read back, through the same two types.

verl carries a row's ``extra_fields`` as plain data (TransferQueue, Ray), so a :class:`RowMeta` travels as the
dict :meth:`RowMeta.write` makes under ``extra_fields["mgrpo"]`` (:data:`ROW_META`), and a MAGRPO row's place in
its joint-action tree as :class:`NodeMeta` under ``extra_fields["magrpo"]`` (:data:`NODE_META`). Readers call
:meth:`RowMeta.read` / :meth:`NodeMeta.read`, which refuse a row without them or with a wrong field, naming the
row. The lowest layer of the package: it imports nothing of ours and nothing of verl.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

#: Key of :class:`RowMeta` in a row's ``extra_fields``.
ROW_META = "mgrpo"

#: Key of :class:`NodeMeta` in a MAGRPO row's ``extra_fields``.
NODE_META = "magrpo"


def main_traj_id(prefix: str) -> str:
    """``traj_id`` of the main row of the rollout ``prefix`` (``{uid}/{session}``)."""
    return f"{prefix}/main"


def sub_traj_id(prefix: str, agent: str, index: int) -> str:
    """``traj_id`` of sub-agent ``agent``'s call number ``index`` (from 0) in the rollout ``prefix``."""
    return f"{prefix}/{agent}/{index}"


@dataclass(frozen=True)
class RowMeta:
    """Who produced a row and its own score (verl's ``reward_score`` of a delegation call is the main score on
    every row of it: verl's TransferQueue loop copies the last output's reward onto the earlier ones)."""

    agent: str
    """The agent that generated the row."""
    traj_id: str
    """:func:`main_traj_id` for a main row, :func:`sub_traj_id` for a sub-agent call's row."""
    parent_traj_id: str
    """``""`` for a main row (a root of the hierarchy), its main row's ``traj_id`` for a sub row."""
    score: float
    """The row's own score, finite."""
    calls: int = 1
    """Sub-agent calls a main row started (1 on a sub row)."""
    failed_calls: int = 0
    """Sub-agent calls of a main row that raised or timed out (they have no row)."""
    observation_truncated: bool = False
    """Whether the main row's observation was shortened to fit (relay loop)."""
    session: Optional[int] = None
    """Decoupled main side: the rollout's session, which the sub side's rows share."""
    sub_calls: Optional[tuple[str, ...]] = None
    """Decoupled main side: ``traj_id`` of every call whose answer the main agent saw (the sub side trains on
    exactly those)."""
    aligned_from: Optional[str] = None
    """An aligned copy (trajectory alignment, D_max): ``traj_id`` of the row it copies."""
    origin: Optional[str] = None
    """The trajectory's identity, the same on every run (``{split}/{index}/{session}`` of its dataset row; the
    ``traj_id`` starts with verl's ``uid``, a uuid4): the trainer orders a step's rows by it."""

    @property
    def is_main(self) -> bool:
        return self.parent_traj_id == ""

    def write(self) -> dict[str, Any]:
        """The plain dict a row carries under :data:`ROW_META` (unset optional fields left out)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["score"] = float(self.score)
        if self.sub_calls is not None:
            out["sub_calls"] = list(self.sub_calls)
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def read(cls, extra_fields: Any, row: str) -> RowMeta:
        """The metadata of the row named ``row`` (its key, for errors) from its ``extra_fields``.

        Raises:
            ValueError: no :data:`ROW_META` entry (the row was not produced by a multi-agent loop), a field
                missing or of the wrong type, or a non-finite score.
        """
        meta = extra_fields.get(ROW_META) if isinstance(extra_fields, dict) else None
        if not isinstance(meta, dict):
            raise ValueError(
                f"row {row!r} has no extra_fields[{ROW_META!r}]: it was not produced by a multi-agent loop "
                "(set actor_rollout_ref.rollout.agent.default_agent_loop or the dataset's agent_name to one, "
                "e.g. mgrpo_relay)"
            )
        missing = [k for k in ("agent", "traj_id", "parent_traj_id", "score") if k not in meta]
        if missing:
            raise ValueError(f"row {row!r}: extra_fields[{ROW_META!r}] lacks {missing}")
        try:
            out = cls(
                agent=str(meta["agent"]),
                traj_id=str(meta["traj_id"]),
                parent_traj_id=str(meta["parent_traj_id"]),
                score=float(meta["score"]),
                calls=int(meta.get("calls", 1)),
                failed_calls=int(meta.get("failed_calls", 0)),
                observation_truncated=bool(meta.get("observation_truncated", False)),
                session=None if meta.get("session") is None else int(meta["session"]),
                sub_calls=None if meta.get("sub_calls") is None else tuple(str(t) for t in meta["sub_calls"]),
                aligned_from=None if meta.get("aligned_from") is None else str(meta["aligned_from"]),
                origin=None if meta.get("origin") is None else str(meta["origin"]),
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"row {row!r}: extra_fields[{ROW_META!r}] has a field of the wrong type: {err}") from None
        if not math.isfinite(out.score):
            raise ValueError(f"row {row!r}: non-finite score {out.score!r} in extra_fields[{ROW_META!r}]")
        return out


@dataclass(frozen=True)
class NodeMeta:
    """A MAGRPO row's node in its joint-action tree."""

    node_id: str
    """The node, dotted from the root (``"0.2.1"``)."""
    parent_node_id: str
    """Its parent node, ``""`` at the first turn."""
    turn: int
    """The turn (0-based) the node's joint action was taken at."""

    def write(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, extra_fields: Any) -> Optional[NodeMeta]:
        """The node of a row's ``extra_fields``, ``None`` when it carries none (not a MAGRPO row)."""
        node = extra_fields.get(NODE_META) if isinstance(extra_fields, dict) else None
        if node is None:
            return None
        if not isinstance(node, dict) or not {"node_id", "parent_node_id", "turn"} <= set(node):
            raise ValueError(f"extra_fields[{NODE_META!r}] must hold node_id, parent_node_id and turn, got {node!r}")
        return cls(str(node["node_id"]), str(node["parent_node_id"]), int(node["turn"]))
