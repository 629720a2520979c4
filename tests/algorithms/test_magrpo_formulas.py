"""Hand-computed MAGRPO returns and advantages (docs/algorithms.md, "MAGRPO").

Nodes are ``(uid, node_id, parent_node_id, turn, joint_reward)``; every node has one row per agent
(agents ``a`` and ``b`` unless a test says otherwise), node-major.
R(node) = r + gamma * mean(R(children)), leaf R = r; A = R - baseline(siblings).
"""

from __future__ import annotations

import math

import pytest
import torch

from mgrpo_verl import MAGRPOConfig, compute_magrpo_advantage

EPS = 1e-6
R = 1e-5


def run(h, nodes, config=None, agents=("a", "b"), **kw):
    data = compute_magrpo_advantage(h.magrpo_batch(nodes, agents=agents, **kw), config)
    n = len(agents)
    adv, ret = h.row_scalar(data, "advantages"), h.row_scalar(data, "returns")
    # every agent's row at a node gets that node's values
    for k in range(len(nodes)):
        assert len(set(adv[k * n : (k + 1) * n].tolist())) == 1
        assert len(set(ret[k * n : (k + 1) * n].tolist())) == 1
    return data, adv[::n], ret[::n]


# Two turns, aligned G = 2, gamma = .5, early termination:
#   roots n0 (r=1), n1 (r=4, terminated at turn 0 -> leaf)
#   n0 -> n00 (r=3), n01 (r=1)
# R(n00) = 3, R(n01) = 1 (leaves); R(n0) = 1 + .5 * mean(3, 1) = 1 + .5 * 2 = 2; R(n1) = 4 (leaf, R = r)
TWO_TURN = [
    ("q", "n0", "", 0, 1.0),
    ("q", "n1", "", 0, 4.0),
    ("q", "n00", "n0", 1, 3.0),
    ("q", "n01", "n0", 1, 1.0),
]
TWO_TURN_RETURNS = [2.0, 4.0, 3.0, 1.0]


@pytest.mark.parametrize(
    "baseline, expected",
    [
        # roots {n0, n1}: R = 2, 4 ; leaves {n00, n01}: R = 3, 1
        # mean: roots mean 3 -> -1, +1 ; leaves mean 2 -> +1, -1
        ("mean", [-1.0, 1.0, 1.0, -1.0]),
        # max: roots max 4 -> -2, 0 ; leaves max 3 -> 0, -2
        ("max", [-2.0, 0.0, 0.0, -2.0]),
        # rloo (mean of the others): n0: 2 - 4 = -2, n1: 4 - 2 = 2 ; n00: 3 - 1 = 2, n01: 1 - 3 = -2
        ("rloo", [-2.0, 2.0, 2.0, -2.0]),
        # raw: A = R
        ("raw", [2.0, 4.0, 3.0, 1.0]),
    ],
)
def test_two_turn_tree_every_baseline(h, baseline, expected):
    _, adv, ret = run(h, TWO_TURN, {"gamma": 0.5, "baseline": baseline, "num_generations": 2})
    assert ret == pytest.approx(TWO_TURN_RETURNS, rel=R)
    assert adv == pytest.approx(expected, rel=R, abs=1e-7)


def test_two_turn_tree_norm_adv_by_std(h):
    # mean baseline, divided by siblings' unbiased std + eps:
    # roots R = 2, 4 -> std sqrt((1 + 1) / 1) = 1.41421 -> A = ∓1 / 1.41421 = ∓.70711
    # leaves R = 3, 1 -> same std -> ±.70711
    s = math.sqrt(2) + EPS
    _, adv, _ = run(h, TWO_TURN, {"gamma": 0.5, "norm_adv_by_std": True})
    assert adv == pytest.approx([-1 / s, 1 / s, 1 / s, -1 / s], rel=R)


def test_norm_adv_by_std_with_max_baseline(h):
    # max baseline then / (std + eps): roots -2/1.41421 = -1.41421, 0 ; leaves 0, -1.41421
    s = math.sqrt(2) + EPS
    _, adv, _ = run(h, TWO_TURN, {"gamma": 0.5, "baseline": "max", "norm_adv_by_std": True})
    assert adv == pytest.approx([-2 / s, 0.0, 0.0, -2 / s], rel=R, abs=1e-7)


def test_gamma_one_is_default(h):
    # gamma = 1 (default): R(n0) = 1 + mean(3, 1) = 3 ; R(n1) = 4 -> roots mean 3.5 -> -.5, +.5
    _, adv, ret = run(h, TWO_TURN)
    assert ret == pytest.approx([3.0, 4.0, 3.0, 1.0], rel=R)
    assert adv == pytest.approx([-0.5, 0.5, 1.0, -1.0], rel=R)


def test_gamma_zero_returns_are_rewards(h):
    # gamma = 0: R = r everywhere -> roots 1, 4 (mean 2.5) -> -1.5, 1.5
    _, adv, ret = run(h, TWO_TURN, {"gamma": 0.0})
    assert ret == pytest.approx([1.0, 4.0, 3.0, 1.0], rel=R)
    assert adv == pytest.approx([-1.5, 1.5, 1.0, -1.0], rel=R)


# Three turns, one root per uid, gamma = .5:
#   a (r=1) -> b1 (r=0), b2 (r=1, leaf: terminated) ; b1 -> c1 (r=1), c2 (r=3)
# R(c1) = 1, R(c2) = 3 ; R(b1) = 0 + .5 * mean(1, 3) = 1 ; R(b2) = 1 ; R(a) = 1 + .5 * mean(1, 1) = 1.5
THREE_TURN = [
    ("q", "a", "", 0, 1.0),
    ("q", "b1", "a", 1, 0.0),
    ("q", "b2", "a", 1, 1.0),
    ("q", "c1", "b1", 2, 1.0),
    ("q", "c2", "b1", 2, 3.0),
]


@pytest.mark.parametrize(
    "baseline, norm, expected",
    [
        # a is alone among its siblings: mean/max baseline = R(a) -> 0 ; {b1, b2}: R = 1, 1 -> 0, 0
        # {c1, c2}: R = 1, 3, mean 2 -> -1, +1
        ("mean", False, [0.0, 0.0, 0.0, -1.0, 1.0]),
        # max: c: max 3 -> -2, 0
        ("max", False, [0.0, 0.0, 0.0, -2.0, 0.0]),
        # rloo: a lone node -> 0 ; b1: 1 - 1 = 0, b2: 0 ; c1: 1 - 3 = -2, c2: 3 - 1 = 2
        ("rloo", False, [0.0, 0.0, 0.0, -2.0, 2.0]),
        # raw: A = R
        ("raw", False, [1.5, 1.0, 1.0, 1.0, 3.0]),
        # mean / (std + eps): lone a: 0 / (1 + eps) = 0 ; b: 0 / (0 + eps) = 0 ;
        # c: std sqrt(2) -> ∓1/1.41421
        ("mean", True, [0.0, 0.0, 0.0, -1 / (math.sqrt(2) + EPS), 1 / (math.sqrt(2) + EPS)]),
        # raw / (std + eps): lone a: 1.5 / (1 + eps) (verl's convention for a group of one: std 1)
        # b: 1 / (0 + eps) = 1e6 (equal returns, no centring) ; c: 1/1.41421, 3/1.41421
        (
            "raw",
            True,
            [1.5 / (1 + EPS), 1 / EPS, 1 / EPS, 1 / (math.sqrt(2) + EPS), 3 / (math.sqrt(2) + EPS)],
        ),
    ],
)
def test_three_turn_chain(h, baseline, norm, expected):
    _, adv, ret = run(h, THREE_TURN, {"gamma": 0.5, "baseline": baseline, "norm_adv_by_std": norm})
    assert ret == pytest.approx([1.5, 1.0, 1.0, 1.0, 3.0], rel=R)
    assert adv == pytest.approx(expected, rel=R, abs=1e-6)


def test_cross_mode_tree(h):
    # cross, n = 2 agents, G = 2 -> G^n = 4 roots per uid and 4 children per expanded node.
    # roots r0 (0), r1 (1), r2 (0), r3 (2); only r0 expands (the others terminated):
    # children c0..c3 rewards 1, 0, 0, 1 -> mean .5 ; gamma .9 -> R(r0) = 0 + .9 * .5 = .45
    # roots R = .45, 1, 0, 2 -> mean 3.45 / 4 = .8625 -> A = -.4125, .1375, -.8625, 1.1375
    # children mean .5 -> A = .5, -.5, -.5, .5
    nodes = [("q", f"r{i}", "", 0, r) for i, r in enumerate([0.0, 1.0, 0.0, 2.0])]
    nodes += [("q", f"c{i}", "r0", 1, r) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    cfg = {"joint_mode": "cross", "num_generations": 2, "gamma": 0.9}
    _, adv, ret = run(h, nodes, cfg)
    assert ret == pytest.approx([0.45, 1.0, 0.0, 2.0, 1.0, 0.0, 0.0, 1.0], rel=R, abs=1e-7)
    assert adv == pytest.approx([-0.4125, 0.1375, -0.8625, 1.1375, 0.5, -0.5, -0.5, 0.5], rel=R)


def test_aligned_mode_rejects_cross_shaped_tree(h):
    # the same tree has 4 children per node: aligned with G = 2 expects 2 -> error naming the count
    nodes = [("q", f"r{i}", "", 0, 0.0) for i in range(4)]
    with pytest.raises(ValueError, match=r"aligned.*num_generations=2"):
        compute_magrpo_advantage(h.magrpo_batch(nodes), {"joint_mode": "aligned", "num_generations": 2})
    # and cross with G = 2 rejects 2 roots (expects 2^2 = 4)
    with pytest.raises(ValueError, match="cross"):
        compute_magrpo_advantage(h.magrpo_batch(nodes[:2]), {"joint_mode": "cross", "num_generations": 2})


def test_siblings_are_per_uid(h):
    # two tasks with identical node ids: q1 roots 1, 0 -> ±.5 ; q2 roots 5, 3 -> ±1 (node ids only
    # need to be unique within a uid)
    nodes = [("q1", "n0", "", 0, 1.0), ("q1", "n1", "", 0, 0.0), ("q2", "n0", "", 0, 5.0), ("q2", "n1", "", 0, 3.0)]
    _, adv, ret = run(h, nodes)
    assert adv == pytest.approx([0.5, -0.5, 1.0, -1.0], rel=R)
    assert ret == pytest.approx([1.0, 0.0, 5.0, 3.0], rel=R)


def test_children_of_different_parents_are_not_siblings(h):
    # roots p (0), s (0) ; p -> x (2), y (0) ; s -> z (4), w (4), gamma = 1
    # R(p) = 0 + 1 = 1, R(s) = 0 + 4 = 4 -> roots ∓1.5 ; {x, y} mean 1 -> ±1 ; {z, w} -> 0, 0
    nodes = [
        ("q", "p", "", 0, 0.0),
        ("q", "s", "", 0, 0.0),
        ("q", "x", "p", 1, 2.0),
        ("q", "y", "p", 1, 0.0),
        ("q", "z", "s", 1, 4.0),
        ("q", "w", "s", 1, 4.0),
    ]
    _, adv, ret = run(h, nodes)
    assert ret == pytest.approx([1.0, 4.0, 2.0, 0.0, 4.0, 4.0], rel=R)
    assert adv == pytest.approx([-1.5, 1.5, 1.0, -1.0, 0.0, 0.0], rel=R, abs=1e-7)


def test_returns_and_advantages_times_response_mask(h):
    # TWO_TURN with gamma .5 (R = 2, 4, 3, 1 ; mean-baseline A = -1, 1, 1, -1), agents a, b,
    # masks (row-major a,b per node) of length 3,1 | 2,2 | 1,3 | 1,1 over L = 3
    data, _, _ = run(h, TWO_TURN, {"gamma": 0.5}, response_length=3, mask_lengths=[3, 1, 2, 2, 1, 3, 1, 1])
    mask = data.batch["response_mask"]
    adv_row = torch.tensor([-1.0, -1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0])
    ret_row = torch.tensor([2.0, 2.0, 4.0, 4.0, 3.0, 3.0, 1.0, 1.0])
    torch.testing.assert_close(data.batch["advantages"], adv_row[:, None] * mask)
    torch.testing.assert_close(data.batch["returns"], ret_row[:, None] * mask)
    assert data.batch["advantages"][1].tolist() == [-1.0, 0.0, 0.0]


def test_single_agent_and_three_agents(h):
    # the number of agents does not change node values: roots 1, 0 -> ±.5 with 1 or 3 agents
    nodes = [("q", "n0", "", 0, 1.0), ("q", "n1", "", 0, 0.0)]
    for agents in (("solo",), ("a", "b", "c")):
        _, adv, _ = run(h, nodes, agents=agents)
        assert adv == pytest.approx([0.5, -0.5], rel=R)


def test_row_order_does_not_matter(h):
    data = h.magrpo_batch(THREE_TURN)
    ref = h.row_scalar(compute_magrpo_advantage(data, {"gamma": 0.5}))
    perm = [9, 0, 5, 3, 8, 1, 7, 2, 6, 4]
    shuffled = h.magrpo_batch(THREE_TURN)
    shuffled.reorder(torch.tensor(perm))
    got = h.row_scalar(compute_magrpo_advantage(shuffled, MAGRPOConfig(gamma=0.5)))
    assert got == pytest.approx(ref[perm], rel=1e-6, abs=1e-7)


def test_turn_as_numpy_int_array(h):
    import numpy as np

    data = h.magrpo_batch(TWO_TURN)
    data.non_tensor_batch["turn"] = data.non_tensor_batch["turn"].astype(np.int64)
    adv = h.row_scalar(compute_magrpo_advantage(data, {"gamma": 0.5}))[::2]
    assert adv == pytest.approx([-1.0, 1.0, 1.0, -1.0], rel=R)
