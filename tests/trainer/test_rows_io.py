"""``read_row_table``, ``write_row_values`` and ``write_copies`` (mgrpo_verl/trainer/rows.py) against a
dict-backed TransferQueue (``tests/trainer/fake_tq.py``), on a 5-row step worked out by hand.

The step (keys ``{uid}_{session}_{index}`` as verl's TransferQueue agent loop writes them):

    row key     uid agent traj parent score response_mask  rm_scores as verl leaves them
    0   q0_0_0  q0  main  m0   -      1.0   [1, 1, 1]      [0, 0, 1.0]
    1   q0_0_1  q0  sub   s0   m0     0.5   [1, 1]         [0, 1.0]  <- the final output's (m0's) reward
    2   q0_1_0  q0  main  m1   -      0.0   [1, 1, 0]      [0, 0, 0]
    3   q1_0_0  q1  main  n0   -      0.75  [1]            [0.75]
    4   q1_1_0  q1  main  n1   -      0.25  [1, 1]         [0, 0.25]

M-GRPO without std normalisation (advantage = effective score - its group's mean):
    main group q0: m0, m1 scores 1, 0, mean 0.5          -> +0.5, -0.5
    main group q1: n0, n1 scores 0.75, 0.25, mean 0.5    -> +0.25, -0.25
    sub group (sub, q0): s0 alone; effective 0.5*0.5 + 0.5*1.0 = 0.75; a group of one has mean 0 (verl's
        GRPO convention)                                 -> +0.75
Alignment of the sub-agent with D_max = 1 (deterministic here):
    m0 made one call: s0 itself (no copy); m1 made none, q0 has one other call: s0 BORROWED (a copy);
    n0 and n1 made none and q1 has no call at all: PADDING (zero-mask copies of the first sub row, s0).
Copy keys: the parent main row's ``{uid}_{session}`` + ``_100000`` (COPY_INDEX_BASE), one per parent:
    q0_1_100000 (m1's borrowed s0), q1_0_100000 (n0's padding), q1_1_100000 (n1's padding).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transfer_queue
from transfer_queue import KVBatchMeta

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_tq  # noqa: E402

from mgrpo_verl.algorithms.alignment import plan_resolved_alignment  # noqa: E402
from mgrpo_verl.algorithms.config import MGRPOConfig  # noqa: E402
from mgrpo_verl.rowmeta import ROW_META, RowMeta  # noqa: E402
from mgrpo_verl.trainer.rows import (  # noqa: E402
    COPY_INDEX_BASE,
    copy_keys,
    plan_update_sets,
    read_row_table,
    trajectory_order,
    scalar_advantages,
    write_copies,
    write_row_values,
)

PARTITION = "train"
KEYS = ["q0_0_0", "q0_0_1", "q0_1_0", "q1_0_0", "q1_1_0"]
ROWS = [  # uid, agent, traj, parent, score, response_mask, rm_scores from verl's agent loop
    ("q0", "main", "m0", "", 1.0, [1, 1, 1], [0, 0, 1.0]),
    ("q0", "sub", "s0", "m0", 0.5, [1, 1], [0, 1.0]),
    ("q0", "main", "m1", "", 0.0, [1, 1, 0], [0, 0, 0]),
    ("q1", "main", "n0", "", 0.75, [1], [0.75]),
    ("q1", "main", "n1", "", 0.25, [1, 1], [0, 0.25]),
]


def _jagged(rows):
    return torch.nested.as_nested_tensor([torch.as_tensor(r) for r in rows], layout=torch.jagged)


def _field(store, key, name):
    return store.rows[(PARTITION, key)][name]


@pytest.fixture
def step(monkeypatch):
    """The fake TransferQueue holding the 5 rows as verl's agent loop writes them, and their KVBatchMeta."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    store = fake_tq.install(monkeypatch)
    fields, tags = [], []
    for i, (uid, agent, traj, parent, score, mask, rm) in enumerate(ROWS):
        n = len(mask)
        ids = torch.arange(10 * i, 10 * i + 3 + n)  # 3 prompt tokens, distinct per row
        fields.append({
            "prompts": ids[:3], "responses": ids[3:], "input_ids": ids, "attention_mask": torch.ones_like(ids),
            "response_mask": torch.tensor(mask), "loss_mask": torch.tensor(mask),
            "rm_scores": torch.tensor(rm, dtype=torch.float32), "uid": uid,
            "extra_fields": {ROW_META: {"agent": agent, "traj_id": traj, "parent_traj_id": parent, "score": score}},
        })
        tags.append({"status": "success", "response_len": n, "seq_len": 3 + n})
    store.kv_batch_put(keys=KEYS, partition_id=PARTITION, fields=list_of_dict_to_tensordict(fields), tags=tags)
    return store, KVBatchMeta(partition_id=PARTITION, keys=list(KEYS), tags=tags)


def test_fake_has_the_real_clients_signatures():
    """The fake's methods take the real client's parameters (names, kinds, defaults; annotations aside)."""

    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    store = fake_tq.CheckedFakeTransferQueue()
    for name in fake_tq.FAKED_CALLS:
        assert params(getattr(store, name)) == params(getattr(transfer_queue, name)), name


def test_fake_refuses_what_the_real_client_refuses(step):
    store, _ = step
    with pytest.raises(ValueError, match="not found"):
        store.kv_batch_get(keys=["q9_0_0"], partition_id=PARTITION)
    with pytest.raises(ValueError, match="not ready"):
        store.kv_batch_get(keys=KEYS, partition_id=PARTITION, select_fields=["advantages"])
    with pytest.raises(ValueError, match="at least one"):
        store.kv_batch_put(keys=KEYS, partition_id=PARTITION)


def test_read_row_table(step):
    _, batch = step
    batch, table = read_row_table(batch)
    assert list(table.keys) == KEYS and list(table.agent) == ["main", "sub", "main", "main", "main"]
    assert list(table.uid) == ["q0", "q0", "q0", "q1", "q1"]
    np.testing.assert_array_equal(table.parent_row, [-1, 0, -1, -1, -1])  # s0's parent m0 is row 0
    # each row's own score from extra_fields, not rm_scores (s0's holds m0's 1.0)
    assert np.allclose(table.score, [1.0, 0.5, 0.0, 0.75, 0.25])


def test_write_row_values_and_copies(step):
    store, batch = step
    batch, table = read_row_table(batch)
    advantage = scalar_advantages(table, "mgrpo", MGRPOConfig(norm_adv_by_std=False))
    assert np.allclose(advantage, [0.5, 0.75, -0.5, 0.25, -0.25])  # module docstring

    write_row_values(KEYS, PARTITION, {"rm_scores": table.score, "advantages": advantage, "returns": advantage})
    # rm_scores: the row's own score on its last response token; s0 now holds 0.5, not m0's 1.0
    got = torch.cat([_field(store, k, "rm_scores") for k in KEYS])
    assert torch.allclose(got, torch.tensor([0, 0, 1.0, 0, 0.5, 0, 0, 0.0, 0.75, 0, 0.25]))
    # advantages / returns: the scalar times the response mask (m1's masked last token stays 0)
    want = torch.tensor([0.5, 0.5, 0.5, 0.75, 0.75, -0.5, -0.5, 0, 0.25, -0.25, -0.25])
    assert torch.allclose(torch.cat([_field(store, k, "advantages") for k in KEYS]), want)
    assert torch.allclose(torch.cat([_field(store, k, "returns") for k in KEYS]), want)

    alignment = plan_resolved_alignment(table.parent_row, table.agent, table.uid, 1, seed=0)
    updates = plan_update_sets(table, alignment, advantage, {"main": "main", "sub": "sub"})
    sub = updates["sub"]
    np.testing.assert_array_equal(sub.copy, [False, True, True, True])  # s0 itself, borrowed, 2 paddings
    np.testing.assert_array_equal(sub.zero, [False, False, True, True])
    np.testing.assert_array_equal(sub.source, [1, 1, 1, 1])  # all from s0
    assert np.allclose(sub.advantage, [0.75, 0.75, 0.0, 0.0])
    assert not updates["main"].copy.any()

    new_keys = copy_keys(table, sub, set(KEYS))
    assert new_keys == [f"q0_1_{COPY_INDEX_BASE}", f"q1_0_{COPY_INDEX_BASE}", f"q1_1_{COPY_INDEX_BASE}"]
    tags = write_copies(batch, table, sub, new_keys)

    # tags: the source's (s0's) plus is_padding, so verl's metrics and sample counts skip every copy
    assert tags == [{**batch.tags[1], "is_padding": True}] * 3
    # extra_fields: re-parented to the main row whose slot the copy fills, aligned_from = the source
    metas = [_field(store, k, "extra_fields")[ROW_META] for k in new_keys]
    assert [(m["traj_id"], m["parent_traj_id"], m["aligned_from"]) for m in metas] == [
        ("s0", "m1", "s0"), ("s0", "n0", "s0"), ("s0", "n1", "s0")]
    assert _field(store, "q0_0_1", "extra_fields")[ROW_META]["parent_traj_id"] == "m0"  # source untouched
    # the borrowed copy carries s0's tensors as written above; the paddings have every loss input zeroed
    # (response_mask, loss_mask, rm_scores, advantages, returns) and keep the tokens
    for name, borrowed in [("response_mask", [1, 1]), ("loss_mask", [1, 1]), ("rm_scores", [0, 0.5]),
                           ("advantages", [0.75, 0.75]), ("returns", [0.75, 0.75])]:
        got = torch.cat([_field(store, k, name).to(torch.float32) for k in new_keys])
        assert torch.allclose(got, torch.tensor(borrowed + [0.0, 0.0] * 2)), name
    got = torch.stack([_field(store, k, "input_ids") for k in new_keys])
    assert torch.equal(got, _field(store, "q0_0_1", "input_ids").expand(3, -1))
    # the source row itself is unchanged by its copies
    assert torch.allclose(_field(store, "q0_0_1", "response_mask").to(torch.float32), torch.ones(2))


def test_write_copies_without_copies_touches_nothing(step):
    store, batch = step
    batch, table = read_row_table(batch)
    advantage = np.zeros(len(table))
    updates = plan_update_sets(table, None, advantage, {"main": "main", "sub": "sub"})
    before = set(store.rows)
    assert write_copies(batch, table, updates["main"], []) == []
    write_row_values([], PARTITION, {"advantages": np.zeros(0)})
    assert set(store.rows) == before


def test_both_copy_paths_zero_the_same_fields_of_a_padding_row(step):
    """One alignment-copy rule (``PADDING_ZEROED``) for both paths: the trainer's TransferQueue copies
    (``write_copies``) and the DataProto wrapper (``align_trajectories``). On the same 5 rows with D_max = 1,
    q1's two main rows get a padding copy of s0 in both (module docstring); each path zeroes exactly the
    PADDING_ZEROED fields its rows carry and keeps the others (the tokens) as the source's."""
    from mgrpo_verl import align_trajectories
    from mgrpo_verl.algorithms.alignment import PADDING_ZEROED
    from mgrpo_verl.testing import make_batch

    store, batch = step
    batch, table = read_row_table(batch)
    advantage = scalar_advantages(table, "mgrpo", MGRPOConfig(norm_adv_by_std=False))
    write_row_values(KEYS, PARTITION, {"rm_scores": table.score, "advantages": advantage, "returns": advantage})
    alignment = plan_resolved_alignment(table.parent_row, table.agent, table.uid, 1, seed=0)
    sub = plan_update_sets(table, alignment, advantage, {"main": "main", "sub": "sub"})["sub"]
    new_keys = copy_keys(table, sub, set(KEYS))
    write_copies(batch, table, sub, new_keys)
    pads = [k for k, z in zip(new_keys, sub.zero[sub.copy]) if z]
    tq_fields = set(store.rows[(PARTITION, pads[0])])
    tq_zeroed = {n for n in tq_fields if isinstance(_field(store, pads[0], n), torch.Tensor)
                 and all(not _field(store, k, n).any() for k in pads)}

    # the DataProto path on the same rows, carrying verl's DataProto fields plus the TransferQueue ones
    uid, agent, traj, parent, score, mask, _ = (list(c) for c in zip(*ROWS))
    data = make_batch(score, response_length=3, mask_lengths=[len(m) for m in mask],
                      agent=agent, uid=uid, traj_id=traj, parent_traj_id=parent)
    response = data.batch["response_mask"]
    data.batch["token_level_scores"] = data.batch["token_level_rewards"].clone()
    for name in ("loss_mask", "rm_scores", "advantages", "returns"):
        data.batch[name] = response.to(torch.float32) + 1.0  # nonzero everywhere
    data.batch["responses"] = torch.arange(response.numel()).reshape(response.shape) + 1
    out = align_trajectories(data, 1, 0)
    pad_rows = np.flatnonzero(out.non_tensor_batch["is_padding"])
    assert len(pad_rows) == len(pads) == 2  # n0's and n1's slots
    dp_zeroed = {n for n in out.batch.keys() if not out.batch[n][pad_rows].any()}

    # each path zeroes exactly the rule's fields it carries, and nothing else
    assert tq_zeroed == set(PADDING_ZEROED) & tq_fields == {"response_mask", "loss_mask", "rm_scores", "advantages", "returns"}
    assert dp_zeroed == set(PADDING_ZEROED) & set(out.batch.keys())
    assert dp_zeroed == tq_zeroed | {"token_level_rewards", "token_level_scores"}
    assert out.batch["responses"][pad_rows].all()  # the tokens are kept


ORIGINS = {"q0_0_0": "train/1/0", "q0_0_1": "train/1/0", "q0_1_0": "train/1/1", "q1_0_0": "train/0/0",
           "q1_1_0": "train/0/1"}  # q1 is dataset row 0, q0 row 1; the second field of a key is the session


def test_read_row_table_puts_rows_in_trajectory_order_whatever_order_they_finished_in(monkeypatch):
    """The replay buffer hands rows over as rollouts finish; ``read_row_table`` orders them by origin (dataset row,
    session), then by place in the trajectory: q1's two sessions (row 0), then q0's session 0 (m0 before its
    sub row s0: outputs 0 and 1), then q0's session 1."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    store = fake_tq.install(monkeypatch)
    finished = ["q1_1_0", "q0_0_1", "q1_0_0", "q0_1_0", "q0_0_0"]
    fields, tags = [], []
    for key in finished:
        uid, agent, traj, parent, score, mask, rm = ROWS[KEYS.index(key)]
        ids = torch.arange(3 + len(mask))
        fields.append({"input_ids": ids, "response_mask": torch.tensor(mask), "uid": uid, "extra_fields": {
            ROW_META: {"agent": agent, "traj_id": traj, "parent_traj_id": parent, "score": score,
                       "origin": ORIGINS[key]}}})
        tags.append({"key": key})
    store.kv_batch_put(keys=finished, partition_id=PARTITION, fields=list_of_dict_to_tensordict(fields), tags=tags)

    batch, table = read_row_table(KVBatchMeta(partition_id=PARTITION, keys=list(finished), tags=tags))
    assert batch.keys == ["q1_0_0", "q1_1_0", "q0_0_0", "q0_0_1", "q0_1_0"]
    assert [t["key"] for t in batch.tags] == batch.keys
    assert list(table.keys) == batch.keys and list(table.traj_id) == ["n0", "n1", "m0", "s0", "m1"]
    np.testing.assert_array_equal(table.parent_row, [-1, -1, -1, 2, -1])  # s0 -> m0, now row 2
    assert np.allclose(table.score, [0.75, 0.25, 1.0, 0.5, 0.0])


def test_trajectory_order_keeps_rows_without_an_origin_last_in_their_order():
    def extra(origin=None):
        meta = {"agent": "main", "traj_id": "t", "parent_traj_id": "", "score": 0.0}
        return {ROW_META: meta if origin is None else {**meta, "origin": origin}}

    keys = ["a_0_0", "b_0_0", "c_0_1", "d_0_0", "c_0_0"]
    extras = [extra(), extra("val/3/0"), extra("train/10/0"), extra(), extra("train/10/0")]
    # "train/10/0" < "val/3/0" as strings; within train/10/0 output 0 before output 1; then a, d as given
    metas = [RowMeta.read(e, k) for k, e in zip(keys, extras)]
    np.testing.assert_array_equal(trajectory_order(keys, metas), [4, 2, 1, 0, 3])
