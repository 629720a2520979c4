"""Sub-side advantages of decoupled M-GRPO (``mgrpo_verl.store.grouping.sub_advantages``).

The central property: for the same rollouts, decoupled mode (main scores through the store, the sub
side computing its own advantages from its rows and the parents' records) gives the advantages the
synchronous mode gives (``mgrpo_scalar_advantage`` over main and sub rows together), whatever order
the sub rows arrive in.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.algorithms.hierarchy import resolve_parents
from mgrpo_verl.algorithms.mgrpo import mgrpo_scalar_advantage
from mgrpo_verl.store import SubRows, TrajectoryStat, open_store, sub_advantages
from mgrpo_verl.store.testing import synthetic_stats

SCORES = st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 0.123, 2.5, 1e-3])


@st.composite
def rollouts(draw):
    """Records of one step: main rollouts of a few queries and their sub-agent calls (main first)."""
    n_uids = draw(st.integers(1, 4))
    k = draw(st.integers(1, 5))
    agents = draw(st.sampled_from([("sub",), ("sub", "coder"), ("main",)]))  # "main": one model plays both roles
    recs = []
    for q in range(n_uids):
        for j in range(k):
            mid = f"q{q}k{j}"
            recs.append(TrajectoryStat(mid, f"q{q}", "main", "", draw(SCORES)))
            for a in agents:
                for c in range(draw(st.integers(0, 3))):
                    recs.append(TrajectoryStat(f"{mid}:{a}{c}", f"q{q}", a, mid, draw(SCORES)))
    return recs


CONFIGS = st.builds(
    MGRPOConfig,
    sub_reward_local_weight=st.sampled_from([0.5, 0.0, 1.0, 0.3]),
    sub_reward_main_weight=st.sampled_from([0.5, 1.0, 0.0, 0.7]),
    norm_adv_by_std=st.booleans(),
    norm_scope=st.sampled_from(["group", "agent"]),
)


def synchronous(recs: list[TrajectoryStat], cfg: MGRPOConfig) -> dict[str, float]:
    """The synchronous trainer's computation: every row in one batch."""
    tid = np.array([r.traj_id for r in recs], dtype=object)
    ptid = np.array([r.parent_traj_id for r in recs], dtype=object)
    uid = np.array([r.uid for r in recs], dtype=object)
    agent = np.array([r.agent for r in recs], dtype=object)
    parent_row = resolve_parents(tid, ptid, uid, "test")
    adv, _ = mgrpo_scalar_advantage(torch.tensor([r.score for r in recs], dtype=torch.float64), agent, uid, parent_row, cfg)
    return dict(zip(tid, adv.numpy()))


def split(recs):
    mains = {r.traj_id: r for r in recs if r.is_main}
    subs = [r for r in recs if not r.is_main]
    return mains, subs


@settings(max_examples=80, deadline=None)
@given(recs=rollouts(), cfg=CONFIGS, seed=st.integers(0, 2**16))
def test_decoupled_equals_synchronous_with_zero_lag(recs, cfg, seed):
    mains, subs = split(recs)
    sync = synchronous(recs, cfg)
    arrived = subs[:]
    random.Random(seed).shuffle(arrived)  # arrival order must not matter
    for rows in (subs, arrived):
        out = sub_advantages(rows, mains, cfg, "skip")
        expected = np.array([sync[r.traj_id] for r in rows])
        np.testing.assert_allclose(out.advantage, expected, rtol=1e-12, atol=1e-12)
        assert out.valid.all() and out.missing == [] and out.n_missing == 0
        parent_score = np.array([mains[r.parent_traj_id].score for r in rows])
        own = np.array([r.score for r in rows])
        np.testing.assert_allclose(
            out.effective_score, cfg.sub_reward_local_weight * own + cfg.sub_reward_main_weight * parent_score, rtol=1e-15
        )
    # rows in the synchronous batch's order: the same arithmetic in the same order, bit for bit
    out = sub_advantages(subs, mains, cfg)
    assert out.advantage.tolist() == [sync[r.traj_id] for r in subs]


@settings(max_examples=60, deadline=None)
@given(recs=rollouts(), cfg=CONFIGS, data=st.data())
def test_skip_policy_equals_synchronous_without_the_orphans(recs, cfg, data):
    mains, subs = split(recs)
    lost = set(data.draw(st.lists(st.sampled_from(sorted(mains)), unique=True)))
    arrived = {t: m for t, m in mains.items() if t not in lost}
    out = sub_advantages(subs, arrived, cfg, "skip")
    orphan = np.array([r.parent_traj_id in lost for r in subs], dtype=bool)
    assert out.valid.tolist() == (~orphan).tolist()
    assert out.missing == [r.traj_id for r in subs if r.parent_traj_id in lost]
    assert set(out.missing_parents) == {r.parent_traj_id for r in subs} & lost
    assert (out.advantage[orphan] == 0).all() and np.isnan(out.effective_score[orphan]).all()
    # the others: as if the lost rollouts' sub-agent calls had never been made
    kept = [r for r in recs if r.traj_id not in lost and r.parent_traj_id not in lost]
    sync = synchronous(kept, cfg) if kept else {}
    expected = [sync[r.traj_id] for r, o in zip(subs, orphan) if not o]
    np.testing.assert_allclose(out.advantage[~orphan], expected, rtol=1e-12, atol=1e-12)

    zero = sub_advantages(subs, arrived, cfg, "zero")
    assert zero.valid.all() and zero.missing == out.missing
    np.testing.assert_array_equal(zero.advantage, out.advantage)


def test_error_policy_names_the_rows():
    mains, subs = split(synthetic_stats(3, k=2, max_calls=2, seed=1))
    lost = subs[0].parent_traj_id
    with pytest.raises(ValueError, match=f"{subs[0].traj_id}.*{lost}"):
        sub_advantages(subs, {t: m for t, m in mains.items() if t != lost}, None, "error")
    assert sub_advantages(subs, mains, None, "error").valid.all()


def test_through_a_store_with_a_stale_parent(tmp_path):
    """The whole sub-side path: mains put by the main side, parents awaited, advantages computed;
    a parent from too old a main policy counts as missing."""
    recs = synthetic_stats(4, k=3, max_calls=2, seed=3, policy_version=7)
    mains, subs = split(recs)
    old = next(iter(mains))
    stale = TrajectoryStat(old, mains[old].uid, "main", "", mains[old].score, True, 0, policy_version=2)
    with open_store(f"sqlite://{tmp_path / 's.db'}") as store:
        store.put([stale if t == old else m for t, m in mains.items()])
        wait = store.wait_for_parents({r.parent_traj_id for r in subs} | {old}, min_policy_version=5, timeout_s=0.05, poll_s=0.01)
    assert wait.stale == [old] and not wait.missing
    out = sub_advantages(subs, wait.found, MGRPOConfig(), "skip")
    assert out.missing == [r.traj_id for r in subs if r.parent_traj_id == old]
    kept = [r for r in recs if old not in (r.traj_id, r.parent_traj_id)]
    sync = synchronous(kept, MGRPOConfig())
    np.testing.assert_allclose(out.advantage[out.valid], [sync[r.traj_id] for r in subs if r.parent_traj_id != old], atol=1e-12)


def test_columns_input_matches_records_input():
    mains, subs = split(synthetic_stats(3, k=4, max_calls=3, sub_agents=("a", "b"), seed=5))
    cols = SubRows.from_stats(subs)
    as_map = {k: getattr(cols, k) for k in ("traj_id", "uid", "agent", "parent_traj_id", "score")}
    ref = sub_advantages(subs, mains)
    for rows in (cols, as_map):
        np.testing.assert_array_equal(sub_advantages(rows, mains).advantage, ref.advantage)
    empty = sub_advantages([], mains)
    assert empty.advantage.shape == (0,) and empty.missing == []


@pytest.mark.parametrize(
    "rows, parents, match",
    [
        ([("s", "u", "sub", "m", 0.5)], {"m": TrajectoryStat("m", "u", "main", "x", 1.0)}, "itself a sub-agent"),
        ([("s", "u", "sub", "m", 0.5)], {"m": TrajectoryStat("m", "v", "main", "", 1.0)}, "uid 'u' but its parent"),
        ([("s", "u", "sub", "m", 0.5)], {"m": TrajectoryStat("other", "u", "main", "", 1.0)}, "holds the record"),
        ([("s", "u", "sub", "m", 0.5), ("s", "u", "sub", "m", 0.1)], {}, "duplicated"),
        ([("s", "u", "sub", "", 0.5)], {}, "main rows"),
        ([("s", "u", "sub", "m", float("nan"))], {}, "non-finite"),
        ([("", "u", "sub", "m", 0.5)], {}, "traj_id"),
    ],
)
def test_bad_input_is_named(rows, parents, match):
    cols = dict(zip(("traj_id", "uid", "agent", "parent_traj_id", "score"), (list(c) for c in zip(*rows))))
    with pytest.raises(ValueError, match=match):
        sub_advantages(cols, parents)


def test_unknown_policy():
    with pytest.raises(ValueError, match="missing_policy"):
        sub_advantages([], {}, None, "drop")
