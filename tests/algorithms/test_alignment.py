"""Trajectory alignment (docs/algorithms.md, "Trajectory alignment"): hand-built hierarchies, one per rule.

Advantages are computed on the real rows first (rule 5), then aligned; a copy must carry its source's
advantage. Output layout (``align_trajectories`` docstring): the M main rows in their original order,
then for each main row, each sub-agent name (sorted) and each slot 0..D-1 one sub row.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from mgrpo_verl import align_trajectories, compute_mgrpo_advantage


def aligned(h, rows, d_max, seed=0, **kw):
    data = compute_mgrpo_advantage(h.mgrpo_batch(rows, **kw), {"norm_adv_by_std": False})
    source = {tid: i for i, tid in enumerate(h.column(data, "traj_id"))}
    return data, align_trajectories(data, d_max, seed), source


def sub_slots(h, out, parent, agent=None):
    """Indices of the aligned sub rows filling ``parent``'s slots (of ``agent`` if given)."""
    p, a = h.column(out, "parent_traj_id"), h.column(out, "agent")
    return [i for i in range(len(out)) if p[i] == parent and (agent is None or a[i] == agent)]


def assert_row_copies(data, i_src, out, i_out, keys=("advantages", "returns", "token_level_rewards", "response_mask")):
    for k in keys:
        assert torch.equal(out.batch[k][i_out], data.batch[k][i_src]), k


def test_d_equals_d_max_keeps_all_in_order(h):
    rows = [("main", "q", "m0", "", 1.0), ("sub", "q", "s0", "m0", 0.2), ("sub", "q", "s1", "m0", 0.8)]
    data, out, src = aligned(h, rows, d_max=2)
    # 1 main * (1 + 1 agent * 2 slots) = 3 rows: m0, s0, s1 exactly (no copy, no padding)
    assert len(out) == 3
    assert h.column(out, "traj_id") == ["m0", "s0", "s1"]
    assert h.column(out, "aligned_from") == ["", "", ""]
    assert h.column(out, "is_padding") == [False, False, False]
    assert h.column(out, "parent_traj_id") == ["", "m0", "m0"]
    for i, tid in enumerate(["m0", "s0", "s1"]):
        assert_row_copies(data, src[tid], out, i)
    meta = out.meta_info["alignment"]
    assert (meta["d_max"], meta["dropped"], meta["duplicated"], meta["borrowed"], meta["padding"]) == (2, 0, 0, 0, 0)


def test_d_greater_than_d_max_keeps_a_random_subset_without_replacement(h):
    rows = [("main", "q", "m0", "", 1.0)] + [("sub", "q", f"s{j}", "m0", j / 10) for j in range(3)]
    seen = collections.Counter()
    for seed in range(300):
        data, out, src = aligned(h, rows, d_max=2, seed=seed)
        # 1 * (1 + 2) = 3 rows; 3 calls > D = 2 -> 1 dropped; the 2 kept are distinct originals
        assert len(out) == 3
        kept = h.column(out, "traj_id")[1:]
        assert len(set(kept)) == 2 and set(kept) <= {"s0", "s1", "s2"}
        assert h.column(out, "aligned_from")[1:] == ["", ""]
        for i in (1, 2):
            assert_row_copies(data, src[kept[i - 1]], out, i)
        assert out.meta_info["alignment"]["dropped"] == 1
        assert out.meta_info["alignment"]["duplicated"] == 0
        seen[frozenset(kept)] += 1
    # uniform over the 3 subsets of size 2: each ~100 of 300 (binomial sd ~8)
    assert len(seen) == 3 and min(seen.values()) > 60, seen


def test_d_less_than_d_max_duplicates_own_rows(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),
        ("sub", "q", "s0", "m0", 0.2),
        ("sub", "q", "s1", "m0", 0.8),
        ("sub", "q", "t0", "m1", 0.5),
    ]
    picked = collections.Counter()
    for seed in range(200):
        data, out, src = aligned(h, rows, d_max=4, seed=seed)
        # 2 mains * (1 + 4) = 10 rows
        assert len(out) == 10
        tids, frm = h.column(out, "traj_id"), h.column(out, "aligned_from")
        # m0 (d=2 < 4): s0, s1 originals first, then 2 copies drawn from {s0, s1}
        m0 = sub_slots(h, out, "m0")
        assert m0 == [2, 3, 4, 5]
        assert [tids[i] for i in m0[:2]] == ["s0", "s1"] and [frm[i] for i in m0[:2]] == ["", ""]
        for i in m0[2:]:
            assert tids[i] in {"s0", "s1"} and frm[i] == tids[i]
            picked[tids[i]] += 1
        # m1 (d=1 < 4): t0, then 3 copies of t0
        m1 = sub_slots(h, out, "m1")
        assert [tids[i] for i in m1] == ["t0"] * 4 and [frm[i] for i in m1] == ["", "t0", "t0", "t0"]
        for i in m0 + m1:
            assert_row_copies(data, src[tids[i]], out, i)
        # 2 + 3 copies, nothing dropped/borrowed/padded
        meta = out.meta_info["alignment"]
        assert (meta["dropped"], meta["duplicated"], meta["borrowed"], meta["padding"]) == (0, 5, 0, 0)
    # with replacement, uniform: each of s0, s1 drawn ~200 times of 400
    assert min(picked.values()) > 150, picked


def test_d_zero_borrows_from_siblings_and_reparents(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),  # m1 never called the sub-agent
        ("sub", "q", "s0", "m0", 0.2),
        ("sub", "q", "s1", "m0", 0.8),
    ]
    for seed in range(50):
        data, out, src = aligned(h, rows, d_max=2, seed=seed)
        # 2 * (1 + 2) = 6 rows: m0 m1 | s0 s1 (m0's slots) | 2 borrowed (m1's slots)
        assert len(out) == 6
        assert h.column(out, "traj_id")[:4] == ["m0", "m1", "s0", "s1"]
        m1 = sub_slots(h, out, "m1")
        assert m1 == [4, 5]
        for i in m1:
            tid = h.column(out, "traj_id")[i]
            assert tid in {"s0", "s1"}
            assert h.column(out, "aligned_from")[i] == tid  # a copy, naming its source
            assert h.column(out, "parent_traj_id")[i] == "m1"  # re-parented to the slot's main row
            assert h.column(out, "uid")[i] == "q"
            assert h.column(out, "agent")[i] == "sub"
            assert h.column(out, "is_padding")[i] is False
            # the copy keeps its source's advantage (s_S of s0 = .6, s1 = .9 -> mean .75 -> -.15, +.15)
            assert_row_copies(data, src[tid], out, i)
        meta = out.meta_info["alignment"]
        assert (meta["borrowed"], meta["duplicated"], meta["padding"], meta["dropped"]) == (2, 0, 0, 0)


def test_d_zero_never_borrows_from_another_query_pads_instead(h):
    rows = [
        ("main", "q1", "m0", "", 1.0),
        ("sub", "q1", "s0", "m0", 0.5),
        ("main", "q2", "m1", "", 1.0),  # q2: the sub-agent is never called
    ]
    data, out, src = aligned(h, rows, d_max=3, response_length=5)
    # 2 mains * (1 + 3) = 8 rows: m0 m1 | s0 + 2 copies | 3 padding rows for m1
    assert len(out) == 8
    pad = sub_slots(h, out, "m1")
    assert pad == [5, 6, 7]
    for i in pad:
        assert h.column(out, "is_padding")[i] is True
        assert h.column(out, "agent")[i] == "sub"  # carries the sub-agent's name
        assert h.column(out, "uid")[i] == "q2"
        assert h.column(out, "aligned_from")[i] == ""
        for k in ("response_mask", "advantages", "returns", "token_level_rewards"):
            assert torch.count_nonzero(out.batch[k][i]) == 0, k
    # padding ids are fresh and unique, never a real traj_id
    pad_ids = [h.column(out, "traj_id")[i] for i in pad]
    assert len(set(pad_ids)) == 3 and not set(pad_ids) & {"m0", "m1", "s0"}
    # the real rows were not touched by the zeroing
    assert torch.count_nonzero(out.batch["response_mask"][2]) == 5
    assert torch.equal(out.batch["advantages"][2], data.batch["advantages"][src["s0"]])
    assert out.meta_info["alignment"]["padding"] == 3
    assert out.meta_info["alignment"]["borrowed"] == 0


def test_multiple_sub_agent_names(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),
        ("search", "q", "s0", "m0", 0.1),
        ("search", "q", "s1", "m0", 0.2),
        ("search", "q", "s2", "m0", 0.3),
        ("coder", "q", "c0", "m1", 0.4),
    ]
    data, out, src = aligned(h, rows, d_max=2, seed=3)
    # 2 mains * (1 + 2 agents * 2) = 10 rows; per main: coder slots then search slots (sorted names)
    assert len(out) == 10
    assert h.column(out, "agent") == ["main", "main"] + ["coder", "coder", "search", "search"] * 2
    assert h.column(out, "parent_traj_id") == ["", ""] + ["m0"] * 4 + ["m1"] * 4
    tids, frm = h.column(out, "traj_id"), h.column(out, "aligned_from")
    # m0/coder: d = 0, borrowed from c0 (same agent, same uid) twice
    assert tids[2:4] == ["c0", "c0"] and frm[2:4] == ["c0", "c0"]
    # m0/search: d = 3 > 2 -> 2 distinct originals
    assert len({tids[4], tids[5]}) == 2 and {tids[4], tids[5]} <= {"s0", "s1", "s2"} and frm[4:6] == ["", ""]
    # m1/coder: d = 1 < 2 -> c0 then a copy of c0
    assert tids[6:8] == ["c0", "c0"] and frm[6:8] == ["", "c0"]
    # m1/search: d = 0 -> 2 borrowed from s0..s2
    assert set(tids[8:10]) <= {"s0", "s1", "s2"} and frm[8:10] == tids[8:10]
    for i in range(10):
        assert_row_copies(data, src[tids[i]], out, i)
    meta = out.meta_info["alignment"]
    assert meta["sub_agents"] == ["coder", "search"]
    # dropped 1 (search at m0), duplicated 1 (coder at m1), borrowed 2 + 2
    assert (meta["dropped"], meta["duplicated"], meta["borrowed"], meta["padding"]) == (1, 1, 4, 0)


def test_main_rows_pass_through_unchanged_and_first(h):
    rows = [
        ("sub", "q", "s0", "m1", 0.2),
        ("main", "q", "m1", "", 1.0),
        ("sub", "q", "s1", "m0", 0.3),
        ("main", "q", "m0", "", 0.0),
    ]
    data, out, src = aligned(h, rows, d_max=1)
    assert h.column(out, "traj_id")[:2] == ["m1", "m0"]  # original order of the main rows
    for i, tid in enumerate(["m1", "m0"]):
        for k in data.batch.keys():
            assert torch.equal(out.batch[k][i], data.batch[k][src[tid]]), k
        for k in ("agent", "uid", "traj_id", "parent_traj_id"):
            assert h.column(out, k)[i] == h.column(data, k)[src[tid]]
        assert h.column(out, "aligned_from")[i] == "" and h.column(out, "is_padding")[i] is False


def test_input_is_not_modified(h):
    rows = [("main", "q1", "m0", "", 1.0), ("sub", "q1", "s0", "m0", 0.5), ("main", "q2", "m1", "", 1.0)]
    data = compute_mgrpo_advantage(h.mgrpo_batch(rows), None)
    before = {k: v.clone() for k, v in data.batch.items()}
    nt_before = {k: list(v) for k, v in data.non_tensor_batch.items()}
    align_trajectories(data, 3, 0)  # pads m1 and duplicates s0
    for k, v in before.items():
        assert torch.equal(data.batch[k], v), k
    assert {k: list(v) for k, v in data.non_tensor_batch.items()} == nt_before


def test_same_seed_same_result(h):
    rows = [("main", "q", f"m{i}", "", float(i % 2)) for i in range(4)]
    rows += [("sub", "q", f"s{j}", f"m{j % 3}", j / 10) for j in range(9)]
    data = compute_mgrpo_advantage(h.mgrpo_batch(rows), None)
    a, b = align_trajectories(data, 2, 123), align_trajectories(data, 2, 123)
    h.assert_same_dataproto(a, b)
    assert a.meta_info["alignment"] == b.meta_info["alignment"]
    # and the seed matters: some seed among a few gives another choice
    others = [h.column(align_trajectories(data, 2, s), "traj_id") for s in range(10)]
    assert any(o != h.column(a, "traj_id") for o in others)


def test_d_max_auto_rule(h):
    # calls per main row: 1, 2, 3 -> 90th percentile (linear) = 2 + .8 * (3 - 2) = 2.8 -> ceil 3
    rows = [("main", "q", f"m{i}", "", 0.0) for i in range(3)]
    rows += [("sub", "q", f"s{i}{j}", f"m{i}", 0.0) for i in range(3) for j in range(i + 1)]
    _, out, _ = aligned(h, rows, d_max="auto")
    assert out.meta_info["alignment"]["d_max"] == 3
    assert len(out) == 3 * (1 + 3)
    assert out.meta_info["alignment"]["dropped"] == 0


def test_d_max_numpy_int_is_accepted(h):
    rows = [("main", "q", "m0", "", 1.0), ("sub", "q", "s0", "m0", 0.5)]
    _, out, _ = aligned(h, rows, d_max=np.int64(2))
    assert len(out) == 3 and out.meta_info["alignment"]["d_max"] == 2


def test_no_sub_rows_returns_the_main_rows(h):
    rows = [("main", "q", "m0", "", 1.0), ("main", "q", "m1", "", 0.0)]
    data, out, _ = aligned(h, rows, d_max=3)
    # no sub-agent name present in the batch -> A = 0 -> M * (1 + 0) rows
    assert h.column(out, "traj_id") == ["m0", "m1"]
    assert torch.equal(out.batch["advantages"], data.batch["advantages"])


def test_empty_batch(h):
    out = align_trajectories(h.empty_batch(h.MGRPO_FIELDS), 2, 0)
    assert len(out) == 0
    assert out.meta_info["alignment"]["d_max"] == 2


@pytest.mark.parametrize(
    "mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_padding_rows_contribute_nothing_to_verl_losses(h, mode):
    from verl.trainer.ppo.core_algos import agg_loss

    rows = [
        ("main", "q1", "m0", "", 1.0),
        ("main", "q1", "m1", "", 0.0),
        ("sub", "q1", "s0", "m0", 0.5),
        ("main", "q2", "m2", "", 1.0),  # q2 never calls the sub-agent -> 2 padding rows
    ]
    _, out, _ = aligned(h, rows, d_max=2, response_length=6)
    pad = torch.tensor(h.column(out, "is_padding"))
    assert int(pad.sum()) == 2
    loss_mat = torch.randn(len(out), 6, generator=torch.Generator().manual_seed(0))
    mask = out.batch["response_mask"]
    with_pad = agg_loss(loss_mat, mask, mode)
    without = agg_loss(loss_mat[~pad], mask[~pad], mode)
    torch.testing.assert_close(with_pad, without)
