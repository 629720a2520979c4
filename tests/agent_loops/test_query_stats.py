"""``common.QueryStats``: the one type of a query's ``reward_extra_info``, written by the delegation loops and read
back by the evaluations (from a loop's row, or from a line of verl's validation dump)."""

from __future__ import annotations

import pytest

from mgrpo_verl.agent_loops.common import REWARD_ERRORS, QueryStats, query_stats


def test_query_stats_writes_the_dict_verl_carries():
    row = {"extra_info": {"source": "gaia", "level": 2, "question": "q"}}
    info = query_stats(row, "x" * 600, acc=0.5, exact=0.0, calls=2, failed_calls=1, main_tokens=7, sub_tokens=9,
                       **{"tool/search": 3, "tool/parse_errors": 0, REWARD_ERRORS: 0})
    assert info == {"acc": 0.5, "exact": 0.0, "calls": 2, "failed_calls": 1, "main_tokens": 7, "sub_tokens": 9,
                    "tool/search": 3, "tool/parse_errors": 0, REWARD_ERRORS: 0, "answer": "x" * 500,
                    "source": "gaia", "level": "2", "id": ""}
    stats = QueryStats.read(info, "row")
    assert stats.write() == info
    assert (stats.acc, stats.calls, stats.failed_calls, stats.level) == (0.5, 2, 1, "2")
    assert stats.averaged() == {"calls": 2.0, "failed_calls": 1.0, "main_tokens": 7.0, "sub_tokens": 9.0,
                                "tool/search": 3.0, "tool/parse_errors": 0.0}
    with pytest.raises(TypeError, match="no QueryStats field"):
        query_stats(row, "a", acc=0.0, calls=0, failed_calls=0, surprise=1)


def test_a_dump_line_is_read_beside_verls_own_keys_and_a_row_without_statistics_is_refused():
    line = {"input": "q", "output": "o", "gts": "[]", "score": 0.0, "step": 3, "reward": 0.0, "uid": "u_0_0",
            "acc": 1.0, "calls": 1.0, "failed_calls": 0, "answer": "Paris", "source": "gaia", "level": "1", "id": ""}
    stats = QueryStats.read(line, "dump")
    assert stats.averaged() == {"calls": 1.0, "failed_calls": 0.0} and stats.exact is None
    assert QueryStats.is_averaged("tool/search") and not QueryStats.is_averaged("score")
    with pytest.raises(ValueError, match=r"dump: no per-query statistics \['acc', 'calls', 'failed_calls'\]"):
        QueryStats.read({"answer": "a"}, "dump")
    with pytest.raises(ValueError, match="not a number"):
        QueryStats.read({**line, "calls": "many"}, "dump")
