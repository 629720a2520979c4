"""The rows of one multi-agent training step: who produced them, their advantages, and which rows each
model trains on after trajectory alignment.

verl's v1 trainer keeps a step's rows in TransferQueue under keys ``{uid}_{session}_{index}``; the
trainer only holds keys and tags. The pure part of this module works on a :class:`RowTable` (numpy
arrays read once from TransferQueue) and is tested without Ray; the functions at the end are the thin
TransferQueue reads and writes.

Row metadata is the row contract the agent loops write (:mod:`mgrpo_verl.rowmeta`). The row's own score is
taken from there, not from ``rm_scores``: verl's TransferQueue agent loop copies the final output's
reward onto every earlier output of the same call (``agent_loop_tq.py``), so ``rm_scores`` of a sub row
holds its parent's score until :func:`write_row_values` rewrites it.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mgrpo_verl.algorithms.alignment import BORROWED, DUPLICATE, ORIGINAL, PADDING, PADDING_ZEROED, BatchAlignment
from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.algorithms.hierarchy import resolve_parents
from mgrpo_verl.algorithms.magrpo import magrpo_row_advantage
from mgrpo_verl.algorithms.mgrpo import mgrpo_scalar_advantage
from mgrpo_verl.rowmeta import NODE_META, ROW_META, NodeMeta, RowMeta

#: Index of the first aligned copy in a key ``{uid}_{session}_{index}``; agent-loop outputs use 0.. so
#: copies never collide with real rows, and verl's ``rsplit("_", 2)`` + ``int`` parsing still works.
COPY_INDEX_BASE = 100_000


@dataclass(frozen=True)
class RowTable:
    """The real rows of a step, one entry per TransferQueue key.

    Attributes (all (N,)):
        keys, agent, uid, traj_id, parent_traj_id: str arrays (object dtype).
        score: float64, each row's own score.
        parent_row: int64 index of the parent main row, ``-1`` for main rows.
    """

    keys: np.ndarray
    agent: np.ndarray
    uid: np.ndarray
    traj_id: np.ndarray
    parent_traj_id: np.ndarray
    score: np.ndarray
    parent_row: np.ndarray
    nodes: dict[str, np.ndarray] | None = None
    """MAGRPO rows (``extra_fields["magrpo"]`` on every row): ``node_id``, ``parent_node_id``, ``turn``
    arrays; ``None`` otherwise."""

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def is_main(self) -> np.ndarray:
        return self.parent_row < 0


def build_row_table(keys: list[str], uids: list[str], extra_fields: list[Any],
                    metas: list[RowMeta] | None = None) -> RowTable:  # fmt: skip
    """Read the rows' metadata (:meth:`~mgrpo_verl.rowmeta.RowMeta.read`; ``metas``: already read from
    ``extra_fields``) and resolve the hierarchy.

    Raises:
        ValueError: a row without the row contract (its agent loop is not a multi-agent loop), a missing or
            mistyped field, a non-finite score, some rows with a MAGRPO node and others without, or a broken
            hierarchy (``resolve_parents``).
    """
    if not (len(keys) == len(uids) == len(extra_fields)):
        raise ValueError(f"row table: {len(keys)} keys, {len(uids)} uids, {len(extra_fields)} extra_fields")
    if metas is None:
        metas = [RowMeta.read(extra, key) for key, extra in zip(keys, extra_fields)]
    elif len(metas) != len(keys):
        raise ValueError(f"row table: {len(keys)} keys, {len(metas)} metas")
    table = dict(
        keys=np.array(keys, dtype=object),
        agent=np.array([m.agent for m in metas], dtype=object),
        uid=np.array([str(u) for u in uids], dtype=object),
        traj_id=np.array([m.traj_id for m in metas], dtype=object),
        parent_traj_id=np.array([m.parent_traj_id for m in metas], dtype=object),
    )
    parent_row = resolve_parents(table["traj_id"], table["parent_traj_id"], table["uid"], "multi-agent step")
    nodes = None
    trees = [NodeMeta.read(extra) for extra in extra_fields]
    if any(t is not None for t in trees):
        if not all(t is not None for t in trees):
            bad = [k for k, t in zip(keys, trees) if t is None][:5]
            raise ValueError(f"row table: some rows carry extra_fields[{NODE_META!r}] and others do not (e.g. {bad})")
        nodes = {name: np.array([getattr(t, name) for t in trees], dtype=object)
                 for name in ("node_id", "parent_node_id", "turn")}
    score = np.array([m.score for m in metas], dtype=np.float64)
    return RowTable(**table, score=score, parent_row=parent_row, nodes=nodes)


def trajectory_order(keys: list[str], metas: list[RowMeta]) -> np.ndarray:
    """(N,) int64 permutation putting a step's rows (their keys and metadata) in trajectory order: by their trajectory's
    :attr:`~mgrpo_verl.rowmeta.RowMeta.origin` (the same on every run), then by their place among its outputs (the
    last field of the key ``{uid}_{session}_{index}``). Rows without an origin come last, in the order given.

    Why: verl's replay buffer hands a step's rows over in the order their rollouts finished, which depends on
    timing and machine load; which rows share an update's mini-batch (and the alignment's draws) follow row order,
    so two runs of one seed, with the same samples, would still train on different mini-batches."""
    def place(i: int) -> tuple:
        origin = metas[i].origin
        index = keys[i].rsplit("_", 1)[-1]
        if origin is None or not index.isdigit():
            return (1, "", i)
        return (0, origin, int(index))

    return np.array(sorted(range(len(keys)), key=place), dtype=np.int64)


def decoupled_sub_table(sub_rows: list[Any], mains: Mapping[str, Mapping[str, Any]]) -> RowTable:
    """The :class:`RowTable` a sub side of decoupled M-GRPO trains from: the synchronous table of the same
    rollouts, rebuilt from what crossed the store.

    Args:
        sub_rows: the sub side's own rows, objects with ``key``, ``traj_id``, ``parent_traj_id``, ``uid``,
            ``agent`` and ``score`` (e.g. :class:`mgrpo_verl.agent_loops.sub_service.PendingRow`).
        mains: uid -> traj_id -> main record (:class:`mgrpo_verl.store.TrajectoryStat`, ``extra["session"]``
            = the main trajectory's session) for every uid of ``sub_rows``: all main trajectories of
            the query, those that made no call included, as ``StatStore.main_scores`` returns them.

    Rows: the main trajectories (uid by uid, by session; keys ``{uid}_{session}_0``, which name no
    TransferQueue row here: they only anchor the hierarchy and the aligned copies' keys), then the sub
    rows sorted by (uid, parent, traj_id), so that the result does not depend on arrival order.
    With these rows, :func:`scalar_advantages`, ``plan_resolved_alignment`` and :func:`plan_update_sets`
    give the sub rows what the synchronous trainer gives them.

    Raises:
        ValueError: a main record without an int ``extra["session"]``, a sub row whose parent is not
            among ``mains[uid]``, or a broken hierarchy (``resolve_parents``).
    """
    uids = sorted({str(r.uid) for r in sub_rows})
    keys, agent, uid_col, traj, parent, score = [], [], [], [], [], []
    for uid in uids:
        group = mains.get(uid) or {}
        for record in sorted(group.values(), key=lambda m: (_session_of(m), m.traj_id)):
            keys.append(f"{uid}_{_session_of(record)}_0")
            agent.append(record.agent)
            uid_col.append(uid)
            traj.append(record.traj_id)
            parent.append("")
            score.append(record.score)
    known = set(traj)
    orphans = [r.traj_id for r in sub_rows if r.parent_traj_id not in known]
    if orphans:
        raise ValueError(f"decoupled sub table: sub rows {orphans[:5]} have no main record among their uid's")
    for r in sorted(sub_rows, key=lambda r: (str(r.uid), r.parent_traj_id, r.traj_id)):
        keys.append(r.key)
        agent.append(r.agent)
        uid_col.append(str(r.uid))
        traj.append(r.traj_id)
        parent.append(r.parent_traj_id)
        score.append(float(r.score))
    table = dict(
        keys=np.array(keys, dtype=object),
        agent=np.array(agent, dtype=object),
        uid=np.array(uid_col, dtype=object),
        traj_id=np.array(traj, dtype=object),
        parent_traj_id=np.array(parent, dtype=object),
    )
    score_arr = np.array(score, dtype=np.float64)
    if not np.isfinite(score_arr).all():
        raise ValueError("decoupled sub table: non-finite score")
    parent_row = resolve_parents(table["traj_id"], table["parent_traj_id"], table["uid"], "decoupled sub step")
    return RowTable(**table, score=score_arr, parent_row=parent_row)


def _session_of(record: Any) -> int:
    session = (record.extra or {}).get("session")
    if isinstance(session, bool) or not isinstance(session, int):
        raise ValueError(f"main record {record.traj_id!r} has no int extra['session'] (got {session!r})")
    return session


def scalar_advantages(table: RowTable, algorithm: str, config: MGRPOConfig) -> np.ndarray:
    """(N,) float64 advantage of every row.

    - ``mgrpo``: M-GRPO (``mgrpo_scalar_advantage``): main rows grouped by ``uid``, sub rows by
      (agent, ``uid``) with the hierarchical score ``w_local·own + w_main·parent``.
    - ``grpo`` (single-agent baseline): verl's GRPO over the main rows' scores grouped by ``uid``; every
      sub row takes its parent's advantage, i.e. the whole rollout is one episode with one outcome.
    - ``magrpo``: MAGRPO (``magrpo_row_advantage``, ``config`` a ``MAGRPOConfig``): each row gets its
      joint-action node's return minus the siblings' baseline.
    """
    if algorithm == "mgrpo":
        adv, _ = mgrpo_scalar_advantage(torch.from_numpy(table.score), table.agent, table.uid, table.parent_row, config)
        return adv.numpy()
    if algorithm == "magrpo":
        if table.nodes is None:
            raise ValueError(
                f"multi_agent.algorithm is magrpo but the rows carry no extra_fields[{NODE_META!r}]: they were not "
                f"produced by the cooperative loop (set the dataset's agent_name or default_agent_loop to magrpo_coop)"
            )
        fields = {"agent": table.agent, "uid": table.uid, **table.nodes}
        adv, _ = magrpo_row_advantage(torch.from_numpy(table.score), fields, config, "magrpo step")
        return adv.numpy()
    if algorithm != "grpo":
        raise ValueError(f"multi_agent.algorithm must be 'mgrpo', 'grpo' or 'magrpo', got {algorithm!r}")
    main = np.flatnonzero(table.is_main)
    # M-GRPO over main rows alone is GRPO over uid (docs/algorithms.md, M-GRPO 6), normalised per group
    main_adv, _ = mgrpo_scalar_advantage(
        torch.from_numpy(table.score[main]), table.agent[main], table.uid[main], np.full(len(main), -1),
        dataclasses.replace(config, norm_scope="group"),
    )
    adv = np.empty(len(table), dtype=np.float64)
    adv[main] = main_adv.numpy()
    sub = np.flatnonzero(~table.is_main)
    adv[sub] = adv[table.parent_row[sub]]
    return adv


@dataclass(frozen=True)
class UpdateSet:
    """The rows one model trains on in this step, in order.

    Attributes (all (R,)):
        source: int64 row of the :class:`RowTable` whose data the entry carries.
        copy: bool, the entry is a new row (a duplicate, a borrowed row or a zero-mask row) that must be
            written to TransferQueue under a new key; ``False``: the real row itself.
        zero: bool, a zero-mask row (no call of that sub-agent anywhere for the query): it adds nothing to
            any loss.
        parent: int64 row of the main row whose slot the entry fills (itself for main rows).
        advantage: float64, the entry's advantage (its source's; 0 for zero-mask rows).
    """

    source: np.ndarray
    copy: np.ndarray
    zero: np.ndarray
    parent: np.ndarray
    advantage: np.ndarray

    def __len__(self) -> int:
        return len(self.source)


def plan_update_sets(
    table: RowTable, alignment: BatchAlignment | None, advantage: np.ndarray, owner_of: dict[str, str]
) -> dict[str, UpdateSet]:
    """Which rows every model trains on: the main rows, then the aligned sub rows (``D_max`` per main
    row and sub-agent, main row by main row), split by the model that plays each agent.

    Args:
        table: the step's real rows.
        alignment: ``plan_resolved_alignment`` of the same rows in the same order (``None``: no sub rows).
        advantage: (N,) per-row advantages (:func:`scalar_advantages`).
        owner_of: agent name -> name of the model that plays it.

    Rows dropped by the alignment (more than ``D_max`` calls) are in no set.
    """
    parts: dict[str, list[tuple[np.ndarray, ...]]] = defaultdict(list)
    main = np.flatnonzero(table.is_main)
    for name in np.unique(table.agent[main]):
        rows = main[table.agent[main] == name]
        parts[_owner(owner_of, name)].append((rows, np.zeros(len(rows), bool), np.zeros(len(rows), bool), rows))
    if alignment is not None and len(alignment.sub_rows):
        plan = alignment.plan
        n_main, n_agents, d = plan.source.shape
        slot_main = np.repeat(alignment.main_rows, d)
        for a, name in enumerate(alignment.agent_names):
            src, kind = plan.source[:, a, :].reshape(-1), plan.kind[:, a, :].reshape(-1)
            zero = kind == PADDING
            first = alignment.sub_rows[np.flatnonzero(alignment.sub_agent == a)[0]]
            rows = np.where(zero, first, alignment.sub_rows[np.where(zero, 0, src)])
            parts[_owner(owner_of, str(name))].append((rows, kind != ORIGINAL, zero, slot_main))
    out = {}
    for owner, chunks in parts.items():
        source, copy, zero, parent = (np.concatenate(c) for c in zip(*chunks))
        out[owner] = UpdateSet(source, copy, zero, parent, np.where(zero, 0.0, advantage[source]))
    return out


def _owner(owner_of: dict[str, str], agent: str) -> str:
    if agent not in owner_of:
        raise ValueError(f"rows of agent {agent!r}, which is not in multi_agent.agents ({sorted(owner_of)})")
    return owner_of[agent]


def copy_keys(table: RowTable, update: UpdateSet, taken: set[str]) -> list[str]:
    """New keys for the copies of ``update``: ``{uid}_{session}_{index}`` of the parent main row's
    ``uid`` and session, with indices from :data:`COPY_INDEX_BASE` not yet in ``taken`` (updated)."""
    keys = []
    counters: dict[str, int] = defaultdict(int)
    for parent in update.parent[update.copy]:
        prefix = table.keys[parent].rsplit("_", 1)[0]
        while True:
            key = f"{prefix}_{COPY_INDEX_BASE + counters[prefix]}"
            counters[prefix] += 1
            if key not in taken:
                break
        taken.add(key)
        keys.append(key)
    return keys


def row_metrics(table: RowTable, advantage: np.ndarray, tags: list[dict], alignment) -> dict[str, float]:
    """Per-agent statistics of the real rows (``tags``: TransferQueue tag of each table row), and the
    alignment counts per sub-agent."""
    response_len = np.array([tag.get("response_len", 0) for tag in tags], dtype=np.float64)
    out: dict[str, float] = {}
    main = np.flatnonzero(table.is_main)
    for name in np.unique(table.agent):
        rows = np.flatnonzero(table.agent == name)
        p = f"agent/{name}/"
        out[p + "rows"] = float(len(rows))
        for label, values in (("score", table.score[rows]), ("advantages", advantage[rows]),
                              ("response_length", response_len[rows])):
            out[p + f"{label}/mean"] = float(values.mean())
            out[p + f"{label}/max"] = float(values.max())
            out[p + f"{label}/min"] = float(values.min())
        out[p + "advantages/std"] = float(advantage[rows].std())
        if not table.is_main[rows].any():
            calls = np.bincount(table.parent_row[rows], minlength=len(table))[main]
            out[p + "calls_per_rollout/mean"] = float(calls.mean())
            out[p + "calls_per_rollout/max"] = float(calls.max())
            out[p + "calls_per_rollout/zero_frac"] = float((calls == 0).mean())
    if alignment is not None:
        plan = alignment.plan
        for a, name in enumerate(alignment.agent_names):
            kind, calls = plan.kind[:, a, :], plan.calls[:, a]
            p = f"mgrpo/align/{name}/"
            out[p + "d_max"] = float(plan.d_max)
            out[p + "dropped"] = float(np.maximum(calls - plan.d_max, 0).sum())
            out[p + "duplicated"] = float((kind == DUPLICATE).sum())
            out[p + "borrowed"] = float((kind == BORROWED).sum())
            out[p + "padding"] = float((kind == PADDING).sum())
    return out


# ----------------------------------------------------------------------------------- TransferQueue I/O


def read_row_table(batch):
    """A sampled ``KVBatchMeta`` in trajectory order (:func:`trajectory_order`: its keys and tags reordered) and
    the :class:`RowTable` of its rows in that order (one TransferQueue read)."""
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "extra_fields"])
    uids, extra_fields = as_list(data["uid"]), as_list(data["extra_fields"])
    metas = [RowMeta.read(extra, key) for key, extra in zip(batch.keys, extra_fields)]
    order = trajectory_order(list(batch.keys), metas).tolist()
    batch = dataclasses.replace(batch, keys=[batch.keys[i] for i in order], tags=[batch.tags[i] for i in order])
    return batch, build_row_table(list(batch.keys), [uids[i] for i in order], [extra_fields[i] for i in order],
                                  metas=[metas[i] for i in order])


def as_list(values) -> list:
    """A non-tensor TransferQueue field as a list (a ``NonTensorStack``, or a plain list subclass when the
    selection holds no tensor)."""
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    return [getattr(v, "data", v) for v in values]


def _per_token(mask: torch.Tensor, value: float, last_only: bool) -> torch.Tensor:
    if last_only:
        out = torch.zeros(mask.shape[0], dtype=torch.float32)
        if len(out):
            out[-1] = value
        return out
    return mask.to(torch.float32) * value


def write_row_values(keys: list[str], partition_id: str, values: dict[str, np.ndarray]) -> None:
    """Write per-token fields built from per-row scalars: ``rm_scores`` (the scalar on the last response
    token, verl's convention) and any other name (the scalar times the row's ``response_mask``, verl's
    convention for ``advantages`` / ``returns``)."""
    import transfer_queue as tq
    from tensordict import TensorDict

    if not keys:
        return
    mask = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["response_mask"])["response_mask"]
    rows = list(mask.unbind(0))
    fields = {
        name: torch.nested.as_nested_tensor(
            [_per_token(m, float(v), name == "rm_scores") for m, v in zip(rows, per_row)], layout=torch.jagged
        )
        for name, per_row in values.items()
    }
    tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=TensorDict(fields, batch_size=len(keys)))


def write_copies(batch, table: RowTable, update: UpdateSet, new_keys: list[str]) -> list[dict]:
    """Write the copies of ``update`` to TransferQueue under ``new_keys``; returns their tags.

    A copy carries every field of its source, its ``extra_fields["mgrpo"]`` re-parented to the main row
    whose slot it fills with ``aligned_from`` naming the source, and the tag ``is_padding`` so that
    verl's metrics and sample counts skip it. Zero-mask copies have the fields of
    :data:`~mgrpo_verl.algorithms.alignment.PADDING_ZEROED` they carry zeroed (the rule of both copy paths).
    """
    import copy as copy_module

    import transfer_queue as tq
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    idx = np.flatnonzero(update.copy)
    if not len(idx):
        return []
    sources = update.source[idx]
    unique_src, inverse = np.unique(sources, return_inverse=True)
    src_keys = [table.keys[s] for s in unique_src]
    data = tq.kv_batch_get(keys=src_keys, partition_id=batch.partition_id)
    tag_of = dict(zip(batch.keys, batch.tags))
    fields, tags = [], []
    for j, i in enumerate(idx):
        row = data[int(inverse[j])]
        field = {}
        for name in row.keys():  # verl's padding helper reads a row the same way
            value = row[name]
            field[name] = value.clone() if isinstance(value, torch.Tensor) else copy_module.deepcopy(value)
        meta = dataclasses.replace(RowMeta.read(field["extra_fields"], new_keys[j]),
                                   parent_traj_id=str(table.traj_id[update.parent[i]]),
                                   aligned_from=str(table.traj_id[update.source[i]]))
        field["extra_fields"] = {**field["extra_fields"], ROW_META: meta.write()}
        if update.zero[i]:
            for name in PADDING_ZEROED:
                if name in field and isinstance(field[name], torch.Tensor):
                    field[name] = torch.zeros_like(field[name])
        fields.append(field)
        tags.append({**tag_of[table.keys[update.source[i]]], "is_padding": True})
    tq.kv_batch_put(keys=new_keys, partition_id=batch.partition_id, fields=list_of_dict_to_tensordict(fields),
                    tags=tags)
    return tags
