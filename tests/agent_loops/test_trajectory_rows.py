"""``common.trajectory_rows``: the one builder of a delegation trajectory's rows, ``[sub rows..., main row]``."""

from __future__ import annotations

import pytest

from mgrpo_verl.agent_loops import common
from mgrpo_verl.rowmeta import ROW_META, RowMeta


def _scored() -> common.ScoredTrajectory:
    main = RowMeta("main", "u/0/main", "", 0.5, calls=3, failed_calls=1)
    subs = (RowMeta("sub", "u/0/sub/0", "u/0/main", 1.0), None, RowMeta("sub", "u/0/sub/2", "u/0/main", 0.0))
    return common.ScoredTrajectory(0.5, main, subs, {"acc": 0.5})


def test_rows_of_answered_calls_in_call_order_then_the_main_row():
    scored = _scored()
    rows = common.trajectory_rows(
        scored, ["c0", "c1", "c2"],
        lambda call, meta, info, score: ("sub", call, meta, info, score),
        lambda meta, info, score: ("main", meta, info, score),
    )
    assert [r[1] for r in rows[:-1]] == ["c0", "c2"]  # the failed call c1 has no row
    assert [RowMeta.read({ROW_META: r[2]}, "r").traj_id for r in rows[:-1]] == ["u/0/sub/0", "u/0/sub/2"]
    assert rows[-1][0] == "main" and RowMeta.read({ROW_META: rows[-1][1]}, "m") == scored.main
    assert all(r[-1] == 0.5 for r in rows)  # every row carries the main score
    infos = [r[3] for r in rows[:-1]] + [rows[-1][2]]
    assert all(i == {"acc": 0.5} for i in infos) and len({id(i) for i in infos}) == 3  # sub rows get copies


def test_a_main_side_without_calls_has_the_main_row_only():
    scored = common.ScoredTrajectory(0.0, RowMeta("main", "u/0/main", "", 0.0), (), {})
    assert common.trajectory_rows(scored, [], None, lambda meta, info, score: "main") == ["main"]
    with pytest.raises(ValueError, match="without a sub_row"):
        common.trajectory_rows(_scored(), ["c0", "c1", "c2"], None, lambda meta, info, score: "main")
