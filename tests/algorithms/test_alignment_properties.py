"""Property tests of trajectory alignment over random hierarchies (hypothesis).

A hierarchy: 1-4 queries, K = 1-4 main rollouts each, 1-3 sub-agent names, each rollout calling each
sub-agent 0-6 times, some (query, sub-agent) pairs never called at all; rows shuffled; random mask
lengths. Advantages are computed first on the real rows, then the batch is aligned to d_max = 1-5.
"""

from __future__ import annotations

import collections

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl import align_trajectories, compute_mgrpo_advantage
from mgrpo_verl.testing import make_batch

SUB_NAMES = ("coder", "search", "zeta")
TENSORS = ("advantages", "returns", "token_level_rewards", "response_mask")


@st.composite
def hierarchies(draw):
    n_queries = draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    names = draw(st.lists(st.sampled_from(SUB_NAMES), min_size=1, max_size=3, unique=True))
    never = {(q, a): draw(st.booleans()) and draw(st.booleans()) for q in range(n_queries) for a in names}
    calls = {
        (q, i, a): 0 if never[(q, a)] else draw(st.integers(0, 6)) for q in range(n_queries) for i in range(k) for a in names
    }
    return dict(
        n_queries=n_queries,
        k=k,
        calls=calls,
        d_max=draw(st.integers(1, 5)),
        seed=draw(st.integers(0, 2**32 - 1)),
        layout_seed=draw(st.integers(0, 2**16)),
    )


def build(spec):
    rng = np.random.default_rng(spec["layout_seed"])
    rows = []
    for q in range(spec["n_queries"]):
        for i in range(spec["k"]):
            m = f"m{q}.{i}"
            rows.append(("main", f"q{q}", m, ""))
            for (qq, ii, a), d in spec["calls"].items():
                if (qq, ii) == (q, i):
                    rows += [(a, f"q{q}", f"{a}{q}.{i}.{j}", m) for j in range(d)]
    rows = [rows[j] for j in rng.permutation(len(rows))]
    n, length = len(rows), 6
    agent, uid, tid, ptid = (list(c) for c in zip(*rows))
    data = make_batch(
        rng.choice([0.0, 0.25, 0.5, 1.0], size=n).tolist(),
        response_length=length,
        mask_lengths=rng.integers(1, length + 1, size=n).tolist(),
        agent=agent,
        uid=uid,
        traj_id=tid,
        parent_traj_id=ptid,
    )
    return compute_mgrpo_advantage(data, None)


@settings(max_examples=80, deadline=None)
@given(hierarchies())
def test_alignment_properties(spec):
    data = build(spec)
    d_max, seed = spec["d_max"], spec["seed"]
    snapshot = {k: v.clone() for k, v in data.batch.items()}
    out = align_trajectories(data, d_max, seed)

    # ---- the input is not modified
    for k, v in snapshot.items():
        assert torch.equal(data.batch[k], v)

    col = lambda d, name: np.asarray(d.non_tensor_batch[name]).tolist()  # noqa: E731
    agent, uid, tid, ptid = (col(data, f) for f in ("agent", "uid", "traj_id", "parent_traj_id"))
    index = {t: i for i, t in enumerate(tid)}
    mains = [i for i in range(len(data)) if ptid[i] == ""]
    present = sorted({agent[i] for i in range(len(data)) if ptid[i] != ""})
    n_main, n_agents = len(mains), len(present)
    # calls[(main traj_id, agent)] -> original sub traj_ids, in order
    calls = collections.defaultdict(list)
    for i in range(len(data)):
        if ptid[i] != "":
            calls[(ptid[i], agent[i])].append(tid[i])
    # pool[(uid, agent)] -> every call of that agent for that query
    pool = collections.defaultdict(set)
    for i in range(len(data)):
        if ptid[i] != "":
            pool[(uid[i], agent[i])].add(tid[i])

    # ---- exact size
    assert len(out) == n_main * (1 + n_agents * d_max)
    o_agent, o_uid, o_tid, o_ptid = (col(out, f) for f in ("agent", "uid", "traj_id", "parent_traj_id"))
    o_from, o_pad = col(out, "aligned_from"), col(out, "is_padding")

    # ---- main rows first, unchanged, in their original order
    assert o_tid[:n_main] == [tid[i] for i in mains]
    for j, i in enumerate(mains):
        for k in data.batch.keys():
            assert torch.equal(out.batch[k][j], data.batch[k][i]), k
        assert (o_agent[j], o_uid[j], o_ptid[j], o_from[j], o_pad[j]) == (agent[i], uid[i], "", "", False)

    # ---- every sub row: D per (main, agent), and a legal source
    per_slot = collections.defaultdict(list)
    counts = collections.Counter()
    for r in range(n_main, len(out)):
        parent, a = o_ptid[r], o_agent[r]
        per_slot[(parent, a)].append(r)
        assert parent in index and ptid[index[parent]] == "", "parent_traj_id names a main row"
        assert o_uid[r] == uid[index[parent]], "a slot row belongs to its main row's query"
        assert a in present
        own = calls[(parent, a)]
        if o_pad[r]:
            # padding only when the query never called that agent; zero mask, zero advantage
            assert not pool[(o_uid[r], a)]
            assert o_from[r] == ""
            assert o_tid[r] not in index
            for k in TENSORS:
                assert torch.count_nonzero(out.batch[k][r]) == 0, k
            counts["padding"] += 1
            continue
        assert o_tid[r] in index, "a non-padding row is a real row or a copy of one"
        src = index[o_tid[r]]
        assert agent[src] == a and uid[src] == o_uid[r] and ptid[src] != ""
        for k in data.batch.keys():
            assert torch.equal(out.batch[k][r], data.batch[k][src]), k  # copies carry the source's advantage
        if o_from[r] == "":
            assert ptid[src] == parent, "an original stays under its own parent"
            counts["original"] += 1
        else:
            assert o_from[r] == o_tid[r]
            if own:
                # d > 0: copies only of the rollout's own calls, and only when d < D
                assert ptid[src] == parent and len(own) < d_max
                counts["duplicated"] += 1
            else:
                # d = 0: borrowed from the same (agent, uid), re-parented
                assert ptid[src] != parent and o_tid[r] in pool[(o_uid[r], a)]
                counts["borrowed"] += 1

    assert set(per_slot) == {(tid[i], a) for i in mains for a in present}
    for (parent, a), rs in per_slot.items():
        assert len(rs) == d_max
        own = calls[(parent, a)]
        originals = [o_tid[r] for r in rs if o_from[r] == "" and not o_pad[r]]
        assert len(originals) == len(set(originals)), "an original appears once"
        if len(own) <= d_max:
            assert sorted(originals) == sorted(own), "no call is dropped when d <= D_max"
        else:
            assert len(originals) == d_max and set(originals) <= set(own)
        if len(own) == 0 and pool[(uid[index[parent]], a)]:
            assert not any(o_pad[r] for r in rs), "borrow before padding"

    # ---- logged counts agree with the data
    meta = out.meta_info["alignment"]
    assert meta["d_max"] == d_max
    assert meta["sub_agents"] == present
    assert meta["dropped"] == sum(max(len(v) - d_max, 0) for v in calls.values())
    assert meta["duplicated"] == counts["duplicated"]
    assert meta["borrowed"] == counts["borrowed"]
    assert meta["padding"] == counts["padding"]
    assert counts["original"] == sum(min(len(v), d_max) for v in calls.values())

    # ---- the same seed gives the identical result
    again = align_trajectories(data, d_max, seed)
    assert len(again) == len(out)
    for k in out.batch.keys():
        assert torch.equal(again.batch[k], out.batch[k]), k
    for k in out.non_tensor_batch:
        assert col(again, k) == col(out, k), k
    assert again.meta_info["alignment"] == meta


@settings(max_examples=50, deadline=None)
@given(hierarchies())
def test_alignment_auto_d_max_is_logged_and_used(spec):
    data = build(spec)
    out = align_trajectories(data, "auto", spec["seed"])
    d = out.meta_info["alignment"]["d_max"]
    ptid = np.asarray(data.non_tensor_batch["parent_traj_id"]).tolist()
    agents = np.asarray(data.non_tensor_batch["agent"]).tolist()
    mains = [t for t, p in zip(np.asarray(data.non_tensor_batch["traj_id"]).tolist(), ptid) if p == ""]
    present = sorted({a for a, p in zip(agents, ptid) if p != ""})
    # documented rule: max(1, ceil(90th percentile of the calls per (main row, sub-agent)))
    counts = collections.Counter((p, a) for a, p in zip(agents, ptid) if p != "")
    per = [counts[(m, a)] for m in mains for a in present]
    expected = max(1, int(np.ceil(np.quantile(per, 0.9)))) if per else 1
    assert d == expected
    assert len(out) == len(mains) * (1 + len(present) * d)
