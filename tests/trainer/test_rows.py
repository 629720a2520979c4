"""The pure part of the multi-agent step (mgrpo_verl/trainer/rows.py): row table, advantages, update sets.

The batch used throughout (one query ``q``, K = 2 main rollouts; a second query ``r`` in some tests):

    key      agent  traj_id        parent        own score
    q_0_0    sub    q/0/sub/0      q/0/main      1.0
    q_0_1    sub    q/0/sub/1      q/0/main      0.0
    q_0_2    main   q/0/main       ""            1.0      (main last, as the agent loop emits it)
    q_1_0    main   q/1/main       ""            0.0      (this rollout made no call)
"""

import math

import numpy as np
import pytest

from mgrpo_verl.algorithms.alignment import plan_resolved_alignment
from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.rowmeta import RowMeta
from mgrpo_verl.trainer.rows import COPY_INDEX_BASE, RowTable, build_row_table, copy_keys, plan_update_sets, scalar_advantages


def _meta(agent, traj, parent, score):
    return {"mgrpo": {"agent": agent, "traj_id": traj, "parent_traj_id": parent, "score": score, "calls": 1}}


ROWS = [
    ("q_0_0", "q", _meta("sub", "q/0/sub/0", "q/0/main", 1.0)),
    ("q_0_1", "q", _meta("sub", "q/0/sub/1", "q/0/main", 0.0)),
    ("q_0_2", "q", _meta("main", "q/0/main", "", 1.0)),
    ("q_1_0", "q", _meta("main", "q/1/main", "", 0.0)),
]
# query r: one rollout, no sub-agent call anywhere for r
ROWS_R = [("r_0_0", "r", _meta("main", "r/0/main", "", 0.5))]


def table_of(rows) -> RowTable:
    keys, uids, extra = zip(*rows)
    return build_row_table(list(keys), list(uids), list(extra))


def plan(table: RowTable, d_max: int):
    return plan_resolved_alignment(table.parent_row, table.agent, table.uid, d_max, seed=0)


def test_row_table_resolves_parents_and_scores():
    t = table_of(ROWS)
    assert t.parent_row.tolist() == [2, 2, -1, -1]
    assert t.score.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert t.is_main.tolist() == [False, False, True, True]


def test_mgrpo_advantages_by_hand():
    # main group (uid q): scores {1, 0}: mean 0.5, unbiased std sqrt(0.25 + 0.25) = 0.7071 -> +-0.7071
    # sub effective scores: 0.5*own + 0.5*parent(1.0) = {1.0, 0.5}: mean 0.75, std sqrt(2 * 0.25**2) = 0.35355
    #   -> (1.0 - 0.75) / 0.35355 = +0.7071, (0.5 - 0.75) / 0.35355 = -0.7071
    adv = scalar_advantages(table_of(ROWS), "mgrpo", MGRPOConfig())
    h = 1 / math.sqrt(2)
    np.testing.assert_allclose(adv, [h, -h, h, -h], atol=1e-5)


def test_grpo_baseline_gives_sub_rows_their_parents_advantage():
    # main as above (+-0.7071); both sub rows belong to q/0/main -> +0.7071, whatever their own score
    adv = scalar_advantages(table_of(ROWS), "grpo", MGRPOConfig())
    h = 1 / math.sqrt(2)
    np.testing.assert_allclose(adv, [h, h, h, -h], atol=1e-5)


def test_unknown_algorithm_is_an_error():
    with pytest.raises(ValueError, match="multi_agent.algorithm"):
        scalar_advantages(table_of(ROWS), "ppo", MGRPOConfig())


@pytest.mark.parametrize(
    "extra, match",
    [
        ({}, "no extra_fields"),
        ({"mgrpo": {"agent": "main", "traj_id": "t", "parent_traj_id": ""}}, "lacks"),
        (_meta("main", "t", "", float("nan")), "non-finite"),
    ],
)
def test_bad_row_metadata(extra, match):
    with pytest.raises(ValueError, match=match):
        build_row_table(["q_0_0"], ["q"], [extra])


def test_row_table_from_metadata_read_before_is_the_same_table():
    keys, uids, extra = (list(c) for c in zip(*ROWS))
    metas = [RowMeta.read(e, k) for k, e in zip(keys, extra)]
    a, b = build_row_table(keys, uids, extra), build_row_table(keys, uids, extra, metas=metas)
    for name in ("keys", "agent", "uid", "traj_id", "parent_traj_id", "score", "parent_row"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    with pytest.raises(ValueError, match="4 keys, 3 metas"):
        build_row_table(keys, uids, extra, metas=metas[:3])


def test_orphan_sub_row_is_an_error():
    with pytest.raises(ValueError, match="q/9/main"):
        table_of([("q_0_0", "q", _meta("sub", "q/0/sub/0", "q/9/main", 1.0)), ROWS[2]])


def test_update_sets_separate_models():
    t = table_of(ROWS)
    adv = scalar_advantages(t, "mgrpo", MGRPOConfig())
    sets = plan_update_sets(t, plan(t, 2), adv, {"main": "main", "sub": "sub"})
    main, sub = sets["main"], sets["sub"]
    assert main.source.tolist() == [2, 3] and not main.copy.any() and not main.zero.any()
    # main row 2 made both calls (kept as they are); main row 3 made none: two rows borrowed from
    # q's other calls, re-parented to row 3
    assert sub.source[:2].tolist() == [0, 1] and not sub.copy[:2].any()
    assert set(sub.source[2:].tolist()) <= {0, 1} and sub.copy[2:].all()
    assert sub.parent.tolist() == [2, 2, 3, 3]
    np.testing.assert_allclose(sub.advantage, adv[sub.source])


def test_update_set_of_a_model_playing_two_agents_and_zero_rows():
    t = table_of(ROWS + ROWS_R)
    adv = scalar_advantages(t, "grpo", MGRPOConfig())
    sets = plan_update_sets(t, plan(t, 1), adv, {"main": "main", "sub": "main"})
    assert list(sets) == ["main"]
    s = sets["main"]
    # 3 main rows, then one sub slot per main row (D_max = 1): row 2 keeps one of its two calls (the
    # other is dropped), row 3 borrows from q, row 4 (query r, no call anywhere) gets a zero row
    assert s.source[:3].tolist() == [2, 3, 4]
    assert s.parent[3:].tolist() == [2, 3, 4]
    assert s.zero.tolist() == [False] * 5 + [True]
    assert s.copy.tolist() == [False, False, False, False, True, True]
    assert s.advantage[5] == 0.0


def test_unknown_agent_rows_are_an_error():
    t = table_of(ROWS)
    with pytest.raises(ValueError, match="not in multi_agent.agents"):
        plan_update_sets(t, plan(t, 2), np.zeros(4), {"main": "main"})


def test_copy_keys_keep_uid_and_session_and_never_collide():
    t = table_of(ROWS)
    adv = np.zeros(len(t))
    sub = plan_update_sets(t, plan(t, 2), adv, {"main": "main", "sub": "sub"})["sub"]
    taken = set(t.keys) | {f"q_1_{COPY_INDEX_BASE}"}  # pretend the first copy index is already used
    keys = copy_keys(t, sub, taken)
    assert keys == [f"q_1_{COPY_INDEX_BASE + 1}", f"q_1_{COPY_INDEX_BASE + 2}"]
    assert all(k.split("_")[0] == "q" for k in keys)  # verl's replay buffer groups rows by this prefix
    assert set(keys) <= taken
