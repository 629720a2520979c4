"""Hand-computed M-GRPO advantages (docs/algorithms.md, "M-GRPO" 1-7).

Every expected value is derived in the comment beside it. std is the unbiased (n-1) one, eps = 1e-6.
Rows are ``(agent, uid, traj_id, parent_traj_id, score)``.
"""

from __future__ import annotations

import math

import pytest
import torch

from mgrpo_verl import MGRPOConfig, compute_mgrpo_advantage

EPS = 1e-6
R = 1e-5  # relative tolerance: outputs are float32


def adv(h, rows, config=None, **kw):
    data = compute_mgrpo_advantage(h.mgrpo_batch(rows, **kw), config)
    return data, h.row_scalar(data)


# --------------------------------------------------------------------------------------------- main rows


def test_two_main_rows(h):
    # main scores 1, 0 -> mean .5, std (unbiased) sqrt(((.5)^2 + (.5)^2) / 1) = .70711
    # -> A = ±.5 / (.70711 + 1e-6) = ±.70711
    _, a = adv(h, [("main", "q", "m0", "", 1.0), ("main", "q", "m1", "", 0.0)])
    assert a == pytest.approx([0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS)], rel=R)
    assert a[0] == pytest.approx(0.70711, abs=1e-5)


def test_three_main_rows_norm_on_and_off(h):
    rows = [("main", "q", "m0", "", 1.0), ("main", "q", "m1", "", 0.0), ("main", "q", "m2", "", 0.0)]
    # scores 1, 0, 0 -> mean 1/3; deviations 2/3, -1/3, -1/3
    # var = (4/9 + 1/9 + 1/9) / 2 = 1/3 -> std = .57735
    # -> A = 2/3 / .57735 = 1.1547, -1/3 / .57735 = -.57735 (twice)
    std = math.sqrt(1 / 3)
    _, a = adv(h, rows)
    assert a == pytest.approx([(2 / 3) / (std + EPS), (-1 / 3) / (std + EPS), (-1 / 3) / (std + EPS)], rel=R)
    assert a[0] == pytest.approx(1.1547, abs=1e-4)
    # norm_adv_by_std=False (Dr.GRPO): A = s - mean = 2/3, -1/3, -1/3
    _, a = adv(h, rows, {"norm_adv_by_std": False})
    assert a == pytest.approx([2 / 3, -1 / 3, -1 / 3], rel=R)


def test_group_of_one_uses_verl_convention(h):
    # one main row in its group: verl uses mean 0, std 1 -> A = s / (1 + eps) = .8 / 1.000001
    _, a = adv(h, [("main", "q", "m0", "", 0.8)])
    assert a == pytest.approx([0.8 / (1 + EPS)], rel=1e-6)
    assert a[0] != 0.0  # it is NOT centred on itself
    # norm off: mean 0 -> A = s - 0 = .8
    _, a = adv(h, [("main", "q", "m0", "", 0.8)], {"norm_adv_by_std": False})
    assert a == pytest.approx([0.8], rel=1e-6)


def test_group_of_one_custom_epsilon(h):
    # eps = .25: A = 1 / (1 + .25) = .8
    _, a = adv(h, [("main", "q", "m0", "", 1.0)], {"epsilon": 0.25})
    assert a == pytest.approx([0.8], rel=R)


def test_all_equal_rewards_give_zero(h):
    # scores .5, .5, .5 -> mean .5, std 0 -> A = 0 / (0 + eps) = 0
    rows = [("main", "q", f"m{i}", "", 0.5) for i in range(3)]
    data, a = adv(h, rows)
    assert a.tolist() == [0.0, 0.0, 0.0]
    assert torch.count_nonzero(data.batch["advantages"]) == 0


def test_groups_are_per_uid(h):
    # q1: 1, 0 -> ±.70711 ; q2: 3, 1, 2 -> mean 2, std sqrt((1+1+0)/2) = 1 -> A = 1, -1, 0 (/(1+eps))
    rows = [
        ("main", "q1", "a", "", 1.0),
        ("main", "q2", "b", "", 3.0),
        ("main", "q1", "c", "", 0.0),
        ("main", "q2", "d", "", 1.0),
        ("main", "q2", "e", "", 2.0),
    ]
    s = 0.5 / (math.sqrt(0.5) + EPS)
    _, a = adv(h, rows)
    assert a == pytest.approx([s, 1 / (1 + EPS), -s, -1 / (1 + EPS), 0.0], rel=R, abs=1e-7)


# ------------------------------------------------------------------------------ hierarchical credit (sub)


def test_sub_rows_default_weights(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),
        ("sub", "q", "s0", "m0", 0.3),
        ("sub", "q", "s1", "m0", 0.7),
        ("sub", "q", "s2", "m1", 0.2),
    ]
    # main: 1, 0 -> ±.70711 (sub rows do not enter the main group)
    # s_S = .5*local + .5*s_M: s0 = .15 + .5 = .65, s1 = .35 + .5 = .85, s2 = .1 + 0 = .1
    # mean = 1.6/3 = .53333; dev = .11667, .31667, -.43333
    # var = (.013611 + .100278 + .187778) / 2 = .150833 -> std = .38837
    # -> A = .30041, .81538, -1.11579
    s = [0.65, 0.85, 0.1]
    m = sum(s) / 3
    std = math.sqrt(sum((x - m) ** 2 for x in s) / 2)
    _, a = adv(h, rows)
    assert a[:2] == pytest.approx([0.70711, -0.70711], abs=1e-5)
    assert a[2:] == pytest.approx([(x - m) / (std + EPS) for x in s], rel=R)
    assert a[2:] == pytest.approx([0.30041, 0.81538, -1.11579], abs=1e-4)


def test_sub_rows_custom_weights(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),
        ("sub", "q", "s0", "m0", 0.5),
        ("sub", "q", "s1", "m1", 0.5),
    ]
    cfg = {"sub_reward_local_weight": 0.2, "sub_reward_main_weight": 0.8}
    # s_S = .2*.5 + .8*1 = .9 and .2*.5 + .8*0 = .1 -> mean .5, dev ±.4, std sqrt(.32/1) = .56569
    # -> A = ±.4/.56569 = ±.70711 ; norm off -> ±.4
    _, a = adv(h, rows, cfg)
    assert a[2:] == pytest.approx([0.4 / (math.sqrt(0.32) + EPS), -0.4 / (math.sqrt(0.32) + EPS)], rel=R)
    _, a = adv(h, rows, {**cfg, "norm_adv_by_std": False})
    assert a == pytest.approx([0.5, -0.5, 0.4, -0.4], rel=R)


@pytest.mark.parametrize(
    "w_local, w_main, expected",
    [
        # local only: s_S = local = .9, .1 -> s - mean = ±.4 (norm off)
        (1.0, 0.0, [0.4, -0.4]),
        # outcome only: s_S = s_M of the parent = 1 (m0), 0 (m1) -> ±.5
        (0.0, 1.0, [0.5, -0.5]),
        # 2*local + 3*s_M: 1.8 + 3 = 4.8, .2 + 0 = .2 -> mean 2.5 -> ±2.3
        (2.0, 3.0, [2.3, -2.3]),
    ],
)
def test_sub_weight_extremes(h, w_local, w_main, expected):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),
        ("sub", "q", "s0", "m0", 0.9),
        ("sub", "q", "s1", "m1", 0.1),
    ]
    cfg = {"sub_reward_local_weight": w_local, "sub_reward_main_weight": w_main, "norm_adv_by_std": False}
    _, a = adv(h, rows, cfg)
    assert a[2:] == pytest.approx(expected, rel=R)


def test_sub_parent_score_is_own_parents(h):
    # Three mains with scores 0, 1, 2 (q); one sub call per main, local 0 (w_local .5, w_main .5):
    # s_S = .5*s_M = 0, .5, 1, but the sub rows are listed in reverse order of their parents.
    # mean .5 -> s - mean = 1 - .5 = .5 (parent m2), 0 (m1), -.5 (m0) ; norm off
    rows = [
        ("sub", "q", "s2", "m2", 0.0),
        ("main", "q", "m0", "", 0.0),
        ("sub", "q", "s1", "m1", 0.0),
        ("main", "q", "m1", "", 1.0),
        ("main", "q", "m2", "", 2.0),
        ("sub", "q", "s0", "m0", 0.0),
    ]
    _, a = adv(h, rows, {"norm_adv_by_std": False})
    # mains 0,1,2: mean 1 -> -1, 0, 1
    assert a == pytest.approx([0.5, -1.0, 0.0, 0.0, 1.0, -0.5], abs=1e-6)


def test_zero_sub_calls_in_a_rollout(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),  # m1 never calls the sub-agent
        ("sub", "q", "s0", "m0", 1.0),
        ("sub", "q", "s1", "m0", 0.0),
    ]
    # main: ±.70711 (m1 still counts in the main group)
    # s_S: .5*1 + .5*1 = 1, .5*0 + .5*1 = .5 -> mean .75, std sqrt((.0625+.0625)/1) = .35355
    # -> A = ±.25/.35355 = ±.70711
    _, a = adv(h, rows)
    assert a == pytest.approx([0.70711, -0.70711, 0.70711, -0.70711], abs=1e-5)


def test_zero_sub_calls_in_the_whole_batch_is_grpo(h):
    rows = [("main", "q", "m0", "", 1.0), ("main", "q", "m1", "", 0.0), ("main", "r", "m2", "", 0.25)]
    # q: ±.70711 ; r alone: .25/(1+eps)
    _, a = adv(h, rows, {"sub_reward_local_weight": 0.9, "sub_reward_main_weight": 0.1})
    assert a == pytest.approx([0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS), 0.25 / (1 + EPS)], rel=R)


def test_single_sub_call_group_of_one(h):
    rows = [("main", "q", "m0", "", 1.0), ("main", "q", "m1", "", 0.0), ("sub", "q", "s0", "m0", 0.4)]
    # sub group (sub, q) has one row: s_S = .5*.4 + .5*1 = .7 -> verl convention mean 0, std 1
    # -> A = .7 / (1 + eps)
    _, a = adv(h, rows)
    assert a[2] == pytest.approx(0.7 / (1 + EPS), rel=R)


def test_multiple_sub_agent_names_are_separate_groups(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),
        ("search", "q", "s0", "m0", 1.0),
        ("search", "q", "s1", "m1", 1.0),
        ("coder", "q", "c0", "m0", 0.0),
        ("coder", "q", "c1", "m1", 1.0),
        ("coder", "q", "c2", "m1", 0.0),
    ]
    # norm off. search: s_S = .5 + .5 = 1, .5 + 0 = .5 -> mean .75 -> +.25, -.25
    # coder: s_S = 0 + .5 = .5, .5 + 0 = .5, 0 + 0 = 0 -> mean 1/3 -> 1/6, 1/6, -1/3
    # (if search and coder were one group: mean of 1, .5, .5, .5, 0 = .5 -> different values)
    _, a = adv(h, rows, {"norm_adv_by_std": False})
    assert a == pytest.approx([0.5, -0.5, 0.25, -0.25, 1 / 6, 1 / 6, -1 / 3], rel=R)


def test_sub_groups_are_per_uid(h):
    rows = [
        ("main", "q1", "m0", "", 1.0),
        ("main", "q2", "m1", "", 1.0),
        ("sub", "q1", "s0", "m0", 1.0),
        ("sub", "q1", "s1", "m0", 0.0),
        ("sub", "q2", "s2", "m1", 0.0),
    ]
    # norm off. mains are groups of one -> A = s - 0 = 1, 1
    # (sub, q1): 1, .5 -> ±.25 ; (sub, q2) alone: s_S = .5 -> .5 - 0 = .5
    _, a = adv(h, rows, {"norm_adv_by_std": False})
    assert a == pytest.approx([1.0, 1.0, 0.25, -0.25, 0.5], rel=R)


# ------------------------------------------------------------------------------------------ norm_scope


def _two_query_rows():
    return [
        ("main", "q1", "m0", "", 1.0),
        ("main", "q1", "m1", "", 0.0),
        ("main", "q2", "m2", "", 3.0),
        ("main", "q2", "m3", "", 1.0),
        ("sub", "q1", "s0", "m0", 0.0),
        ("sub", "q1", "s1", "m1", 0.0),
        ("sub", "q2", "s2", "m2", 1.0),
        ("sub", "q2", "s3", "m3", 1.0),
    ]


def test_norm_scope_agent(h):
    # main scores [1, 0 | 3, 1]: group means .5 and 2.
    #   agent-wide: mean 1.25, dev -.25 -1.25 1.75 -.25, sq sum 4.75, var 4.75/3 = 1.58333, std 1.25831
    #   -> A = .5/1.25831 = .39736, -.39736, 1/1.25831 = .79472, -.79472
    # sub s_S = .5*local + .5*s_M = [0 + .5, 0 + 0 | .5 + 1.5, .5 + .5] = [.5, 0 | 2, 1]: means .25 and 1.5
    #   agent-wide: mean .875, dev -.375 -.875 1.125 .125, sq sum 2.1875, var .72917, std .85391
    #   -> A = .25/.85391 = .29277, -.29277, .5/.85391 = .58554, -.58554
    main_std = math.sqrt(4.75 / 3)
    sub_std = math.sqrt(2.1875 / 3)
    _, a = adv(h, _two_query_rows(), {"norm_scope": "agent"})
    d = [0.5, -0.5, 1.0, -1.0, 0.25, -0.25, 0.5, -0.5]
    scale = [main_std] * 4 + [sub_std] * 4
    assert a == pytest.approx([x / (s + EPS) for x, s in zip(d, scale)], rel=R)
    assert a == pytest.approx([0.39736, -0.39736, 0.79472, -0.79472, 0.29277, -0.29277, 0.58554, -0.58554], abs=1e-4)


def test_norm_scope_group_differs_from_agent(h):
    # group scope on the same batch: each group of two is ±d/(|d|*sqrt2) = ±.70711
    _, a = adv(h, _two_query_rows(), {"norm_scope": "group"})
    assert a == pytest.approx([0.70711, -0.70711] * 4, abs=1e-5)


def test_norm_scope_agent_without_std_is_plain_centring(h):
    # norm off ignores the scope: A = s - group mean = .5 -.5 1 -1 | .25 -.25 .5 -.5
    _, a = adv(h, _two_query_rows(), {"norm_scope": "agent", "norm_adv_by_std": False})
    assert a == pytest.approx([0.5, -0.5, 1.0, -1.0, 0.25, -0.25, 0.5, -0.5], rel=R)


# ------------------------------------------------------------------------------- token layout, outputs


def test_advantages_and_returns_times_response_mask(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),
        ("sub", "q", "s0", "m0", 1.0),
        ("sub", "q", "s1", "m1", 1.0),
    ]
    # masks of length 4, 2, 1, 3 over L = 5
    data, _ = adv(h, rows, {"norm_adv_by_std": False}, response_length=5, mask_lengths=[4, 2, 1, 3])
    # main ±.5 ; sub s_S = 1, .5 -> ±.25
    expected = torch.tensor(
        [
            [0.5, 0.5, 0.5, 0.5, 0.0],
            [-0.5, -0.5, 0.0, 0.0, 0.0],
            [0.25, 0.0, 0.0, 0.0, 0.0],
            [-0.25, -0.25, -0.25, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(data.batch["advantages"], expected)
    # as verl's GRPO, returns equal the advantages
    torch.testing.assert_close(data.batch["returns"], expected)
    assert data.batch["advantages"].shape == data.batch["token_level_rewards"].shape


def test_row_with_empty_mask_still_counts_in_statistics(h):
    rows = [("main", "q", "m0", "", 1.0), ("main", "q", "m1", "", 0.0)]
    # m1 has no response token: its advantage row is all zero, but its score 0 is in the group
    # (mean .5) -> m0: 1 - .5 = .5
    data, _ = adv(h, rows, {"norm_adv_by_std": False}, mask_lengths=[4, 0])
    assert data.batch["advantages"][0].tolist() == pytest.approx([0.5] * 4)
    assert data.batch["advantages"][1].tolist() == [0.0] * 4


def test_score_is_sum_of_token_rewards(h):
    data = h.mgrpo_batch([("main", "q", "m0", "", 0.0), ("main", "q", "m1", "", 0.0)])
    # spread m0's reward over tokens: .25 + .25 + .5 = 1 -> scores 1, 0 -> ±.5 (norm off)
    data.batch["token_level_rewards"][0] = torch.tensor([0.25, 0.25, 0.0, 0.5])
    a = h.row_scalar(compute_mgrpo_advantage(data, {"norm_adv_by_std": False}))
    assert a == pytest.approx([0.5, -0.5])


def test_returns_data_updated_in_place(h):
    data = h.mgrpo_batch([("main", "q", "m0", "", 1.0), ("main", "q", "m1", "", 0.0)])
    out = compute_mgrpo_advantage(data, None)
    assert out is data
    assert "advantages" in data.batch.keys() and "returns" in data.batch.keys()


def test_row_order_does_not_matter(h):
    rows = _two_query_rows()
    _, a = adv(h, rows, MGRPOConfig())
    perm = [5, 2, 7, 0, 3, 6, 1, 4]
    _, b = adv(h, [rows[i] for i in perm], MGRPOConfig())
    assert b == pytest.approx(a[perm], rel=1e-6, abs=1e-7)


def test_default_config_is_none_or_empty(h):
    rows = _two_query_rows()
    _, a = adv(h, rows, None)
    _, b = adv(h, rows, {})
    _, c = adv(h, rows, MGRPOConfig(0.5, 0.5, True, 1e-6, "group"))
    assert a.tolist() == b.tolist() == c.tolist()


def test_sub_row_named_like_main_stays_out_of_main_group(h):
    rows = [
        ("main", "q", "m0", "", 1.0),
        ("main", "q", "m1", "", 0.0),
        ("main", "q", "s0", "m0", 1.0),  # a sub-agent call whose agent name is also "main"
    ]
    # spec: main group = m0, m1 -> ±.5 (norm off); the sub row is alone in its sub group:
    # s_S = .5*1 + .5*1 = 1 -> 1 - 0 = 1
    _, a = adv(h, rows, {"norm_adv_by_std": False})
    assert a == pytest.approx([0.5, -0.5, 1.0])
