"""The sub side's row table (decoupled M-GRPO): rebuilt from the store's main records and the sub side's own
rows, it gives the sub rows exactly what the synchronous step gives them (advantages, alignment, update set).

Hand example (the batch of test_rows.py, as it looks on each side):

    synchronous batch                     main side publishes            sub side holds
    q_0_0  sub   q/0/sub/0  own 1.0       q/0/main  s_M=1.0 session 0     q_1000000_0  q/0/sub/0  own 1.0
    q_0_1  sub   q/0/sub/1  own 0.0       q/1/main  s_M=0.0 session 1     q_1000001_0  q/0/sub/1  own 0.0
    q_0_2  main  q/0/main   1.0
    q_1_0  main  q/1/main   0.0  (no call)
"""

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl.algorithms.alignment import plan_resolved_alignment
from mgrpo_verl.algorithms.config import NORM_SCOPES, MGRPOConfig
from mgrpo_verl.store import TrajectoryStat
from mgrpo_verl.trainer.rows import build_row_table, decoupled_sub_table, plan_update_sets, scalar_advantages


@dataclass(frozen=True)
class Row:
    key: str
    traj_id: str
    parent_traj_id: str
    uid: str
    agent: str
    score: float


def main_record(uid, session, score, calls=()):
    return TrajectoryStat(traj_id=f"{uid}/{session}/main", uid=uid, agent="main", score=score,
                          extra={"session": session, "sub_calls": list(calls)})


MAINS = {"q": {"q/0/main": main_record("q", 0, 1.0, ["q/0/sub/0", "q/0/sub/1"]), "q/1/main": main_record("q", 1, 0.0)}}
SUBS = [
    Row("q_1000001_0", "q/0/sub/1", "q/0/main", "q", "sub", 0.0),  # arrival order: the second call first
    Row("q_1000000_0", "q/0/sub/0", "q/0/main", "q", "sub", 1.0),
]


def test_hand_example_rows_keys_and_advantages():
    t = decoupled_sub_table(SUBS, MAINS)
    # main rows first (by session), then sub rows sorted by (uid, parent, traj_id): not arrival order
    assert t.keys.tolist() == ["q_0_0", "q_1_0", "q_1000000_0", "q_1000001_0"]
    assert t.traj_id.tolist() == ["q/0/main", "q/1/main", "q/0/sub/0", "q/0/sub/1"]
    assert t.parent_row.tolist() == [-1, -1, 0, 0]
    # sub effective scores 0.5*own + 0.5*s_M(1.0) = {1.0, 0.5} -> +-1/sqrt(2) (test_rows.py works it out)
    adv = scalar_advantages(t, "mgrpo", MGRPOConfig())
    h = 1 / math.sqrt(2)
    np.testing.assert_allclose(adv[2:], [h, -h], atol=1e-5)


def test_hand_example_update_set_with_alignment():
    # D_max = 2: rollout q/0 has its two calls; q/1 made none and borrows both of q/0's (copies), so the sub
    # model trains on 2 rows per main rollout = 4 rows, two of them copies re-parented to q/1/main
    t = decoupled_sub_table(SUBS, MAINS)
    adv = scalar_advantages(t, "mgrpo", MGRPOConfig())
    alignment = plan_resolved_alignment(t.parent_row, t.agent, t.uid, 2, seed=0)
    update = plan_update_sets(t, alignment, adv, {"main": "main", "sub": "sub"})["sub"]
    assert len(update) == 4
    assert update.copy.tolist() == [False, False, True, True]
    assert [t.traj_id[p] for p in update.parent] == ["q/0/main", "q/0/main", "q/1/main", "q/1/main"]


@pytest.mark.parametrize(
    "subs, mains, match",
    [
        ([Row("q_1000000_0", "q/0/sub/0", "q/9/main", "q", "sub", 1.0)], MAINS, "no main record"),
        (SUBS, {"q": {"q/0/main": TrajectoryStat("q/0/main", "q", "main", score=1.0)}}, "session"),
        (SUBS, {}, "no main record"),
    ],
)
def test_bad_inputs_are_errors(subs, mains, match):
    with pytest.raises(ValueError, match=match):
        decoupled_sub_table(subs, mains)


@st.composite
def batches(draw):
    """A synchronous batch: queries with K rollouts each, 0..3 calls per rollout, random scores."""
    n_q, k = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    score = st.sampled_from([0.0, 0.25, 0.5, 1.0])
    rows = []  # (key, uid, extra, session)
    for q in range(n_q):
        uid = f"u{q}"
        for s in range(k):
            calls = draw(st.integers(0, 3))
            for j in range(calls):
                meta = {"agent": "sub", "traj_id": f"{uid}/{s}/sub/{j}", "parent_traj_id": f"{uid}/{s}/main", "score": draw(score)}
                rows.append((f"{uid}_{s}_{j}", uid, {"mgrpo": meta}))
            main = {"agent": "main", "traj_id": f"{uid}/{s}/main", "parent_traj_id": "", "score": draw(score)}
            rows.append((f"{uid}_{s}_{calls}", uid, {"mgrpo": main}))
    order = draw(st.permutations(range(len(rows))))
    return [rows[i] for i in order], draw(st.sampled_from(list(NORM_SCOPES))), draw(st.integers(1, 3))


@settings(max_examples=60, deadline=None)
@given(batches())
def test_same_advantages_and_update_set_as_the_synchronous_step(batch):
    rows, scope, d_max = batch
    config = MGRPOConfig(norm_scope=scope)
    sync = build_row_table([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    sync_adv = scalar_advantages(sync, "mgrpo", config)

    # what crosses the store: one record per main trajectory; what the sub side holds: its rows
    mains: dict = {}
    subs = []
    for i in range(len(sync)):
        if sync.is_main[i]:
            session = int(sync.traj_id[i].split("/")[1])
            calls = [sync.traj_id[j] for j in np.flatnonzero(sync.parent_row == i)]
            mains.setdefault(sync.uid[i], {})[sync.traj_id[i]] = main_record(sync.uid[i], session, sync.score[i], calls)
        else:
            subs.append(Row(f"k{i}", sync.traj_id[i], sync.parent_traj_id[i], sync.uid[i], "sub", sync.score[i]))
    uids_with_calls = {r.uid for r in subs}
    mains = {u: g for u, g in mains.items() if u in uids_with_calls}  # the sub side asks for its rows' uids only
    dec = decoupled_sub_table(subs, mains)
    dec_adv = scalar_advantages(dec, "mgrpo", config)

    sync_sub = {sync.traj_id[i]: sync_adv[i] for i in np.flatnonzero(~sync.is_main)}
    dec_sub = {dec.traj_id[i]: dec_adv[i] for i in np.flatnonzero(~dec.is_main)}
    assert dec_sub.keys() == sync_sub.keys()
    for traj, value in sync_sub.items():
        assert dec_sub[traj] == pytest.approx(value, abs=1e-12), traj  # the same function on the same groups

    if not subs:
        return
    # alignment + update set: identical once the synchronous rows are in the same (canonical) order; the
    # alignment's choices (which calls are dropped or duplicated) follow row order, and verl's batch order
    # is itself arbitrary, so the sub side fixes one: mains by (uid, session), subs by (uid, parent, traj_id)
    def canonical(row):
        meta = row[2]["mgrpo"]
        if meta["parent_traj_id"] == "":
            return (0, row[1], int(meta["traj_id"].split("/")[1]), "")
        return (1, row[1], meta["parent_traj_id"], meta["traj_id"])

    ordered = sorted(rows, key=canonical)
    sync = build_row_table([r[0] for r in ordered], [r[1] for r in ordered], [r[2] for r in ordered])
    sync = sync if uids_with_calls == set(sync.uid) else _only(sync, uids_with_calls)
    sync_adv = scalar_advantages(sync, "mgrpo", config)

    def update_of(table, adv):
        alignment = plan_resolved_alignment(table.parent_row, table.agent, table.uid, d_max, seed=7)
        u = plan_update_sets(table, alignment, adv, {"main": "main", "sub": "sub"})["sub"]
        return [
            (table.traj_id[s], table.traj_id[p], bool(c), bool(z), round(float(a), 9))
            for s, p, c, z, a in zip(u.source, u.parent, u.copy, u.zero, u.advantage)
        ]

    assert update_of(dec, dec_adv) == update_of(sync, sync_adv)


def _only(table, uids):
    """The rows of ``table`` whose uid is in ``uids``. A query in which no rollout called the sub-agent never
    reaches the sub side; the synchronous step gives it zero-mask padding rows (``zero``), which add nothing to
    any loss, so leaving them out changes the batch size only."""
    keep = [i for i in range(len(table)) if table.uid[i] in uids]
    rows = [(table.keys[i], table.uid[i], {"mgrpo": {"agent": table.agent[i], "traj_id": table.traj_id[i],
             "parent_traj_id": table.parent_traj_id[i], "score": table.score[i]}}) for i in keep]
    return build_row_table([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
