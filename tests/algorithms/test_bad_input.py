"""Bad input is a ValueError whose message names the offending field, id or value; an empty batch is
well defined (empty outputs of shape (0, L))."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mgrpo_verl import (
    MAGRPOConfig,
    MGRPOConfig,
    align_trajectories,
    compute_magrpo_advantage,
    compute_mgrpo_advantage,
)

MGRPO_ROWS = [
    ("main", "q", "m0", "", 1.0),
    ("main", "q", "m1", "", 0.0),
    ("sub", "q", "s0", "m0", 0.5),
]
MAGRPO_NODES = [("q", "n0", "", 0, 1.0), ("q", "n1", "", 0, 0.0), ("q", "n00", "n0", 1, 1.0)]


# ------------------------------------------------------------------------------------- missing fields


@pytest.mark.parametrize("field", ["agent", "uid", "traj_id", "parent_traj_id"])
def test_mgrpo_missing_field(h, field):
    data = h.drop_field(h.mgrpo_batch(MGRPO_ROWS), field)
    with pytest.raises(ValueError, match=f"missing.*'{field}'"):
        compute_mgrpo_advantage(data, None)


@pytest.mark.parametrize("field", ["agent", "uid", "traj_id", "parent_traj_id"])
def test_align_missing_field(h, field):
    data = h.drop_field(compute_mgrpo_advantage(h.mgrpo_batch(MGRPO_ROWS), None), field)
    with pytest.raises(ValueError, match=f"missing.*'{field}'"):
        align_trajectories(data, 2, 0)


@pytest.mark.parametrize("field", ["agent", "uid", "node_id", "parent_node_id", "turn"])
def test_magrpo_missing_field(h, field):
    data = h.drop_field(h.magrpo_batch(MAGRPO_NODES), field)
    with pytest.raises(ValueError, match=f"missing.*'{field}'"):
        compute_magrpo_advantage(data, None)


@pytest.mark.parametrize("tensor", ["token_level_rewards", "response_mask"])
@pytest.mark.parametrize("which", ["mgrpo", "magrpo"])
def test_missing_tensor(h, tensor, which):
    if which == "mgrpo":
        data, fn = h.mgrpo_batch(MGRPO_ROWS), compute_mgrpo_advantage
    else:
        data, fn = h.magrpo_batch(MAGRPO_NODES), compute_magrpo_advantage
    data.batch = data.batch.exclude(tensor)
    with pytest.raises(ValueError, match=f"missing.*'{tensor}'"):
        fn(data, None)


# ------------------------------------------------------------------------------------ broken hierarchy


def test_sub_row_with_absent_parent(h):
    rows = MGRPO_ROWS + [("sub", "q", "orphan7", "m_gone", 0.5)]
    with pytest.raises(ValueError, match=r"orphan7") as err:
        compute_mgrpo_advantage(h.mgrpo_batch(rows), None)
    assert "m_gone" in str(err.value)
    with pytest.raises(ValueError, match=r"orphan7"):
        align_trajectories(h.mgrpo_batch(rows), 2, 0)


def test_duplicated_traj_id(h):
    rows = MGRPO_ROWS + [("sub", "q", "s0", "m1", 0.5)]
    with pytest.raises(ValueError, match=r"duplicated.*'s0'"):
        compute_mgrpo_advantage(h.mgrpo_batch(rows), None)
    with pytest.raises(ValueError, match=r"duplicated.*'s0'"):
        align_trajectories(h.mgrpo_batch(rows), 2, 0)


def test_empty_traj_id(h):
    rows = MGRPO_ROWS + [("sub", "q", "", "m1", 0.5)]
    with pytest.raises(ValueError, match="empty traj_id"):
        compute_mgrpo_advantage(h.mgrpo_batch(rows), None)


def test_sub_row_of_another_query(h):
    rows = MGRPO_ROWS + [("sub", "other_q", "s9", "m1", 0.5)]
    with pytest.raises(ValueError, match=r"s9.*other_q"):
        compute_mgrpo_advantage(h.mgrpo_batch(rows), None)


def test_nested_sub_row(h):
    rows = MGRPO_ROWS + [("sub", "q", "s_nested", "s0", 0.5)]
    with pytest.raises(ValueError, match="s_nested"):
        compute_mgrpo_advantage(h.mgrpo_batch(rows), None)


# --------------------------------------------------------------------------------------- bad rewards


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_mgrpo_non_finite_reward_names_traj_id(h, bad):
    rows = MGRPO_ROWS + [("sub", "q", "s_bad", "m1", bad)]
    with pytest.raises(ValueError, match=r"non-finite.*s_bad"):
        compute_mgrpo_advantage(h.mgrpo_batch(rows), None)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_mgrpo_non_finite_main_reward(h, bad):
    rows = [("main", "q", "m_bad", "", bad), ("main", "q", "m1", "", 0.0)]
    with pytest.raises(ValueError, match=r"m_bad"):
        compute_mgrpo_advantage(h.mgrpo_batch(rows), None)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_magrpo_non_finite_reward_names_node(h, bad):
    nodes = MAGRPO_NODES + [("q", "n_bad", "n0", 1, bad)]
    with pytest.raises(ValueError, match=r"non-finite.*n_bad"):
        compute_magrpo_advantage(h.magrpo_batch(nodes), None)


def test_nan_hidden_in_a_token_that_is_masked_out(h):
    # the score is the sum over all tokens, so a NaN outside the mask still poisons the row
    data = h.mgrpo_batch(MGRPO_ROWS, mask_lengths=[4, 4, 1])
    data.batch["token_level_rewards"][2, 3] = math.nan
    with pytest.raises(ValueError, match="s0"):
        compute_mgrpo_advantage(data, None)


# -------------------------------------------------------------------------------------------- d_max


@pytest.mark.parametrize("bad", [0, -1, "big", True, False, 2.5, None])
def test_bad_d_max(h, bad):
    data = compute_mgrpo_advantage(h.mgrpo_batch(MGRPO_ROWS), None)
    with pytest.raises(ValueError, match="d_max") as err:
        align_trajectories(data, bad, 0)
    assert repr(bad) in str(err.value)


# ------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "fn, rows_or_nodes, config, needle",
    [
        (compute_magrpo_advantage, "magrpo", {"joint_mode": "diagonal"}, "'diagonal'"),
        (compute_magrpo_advantage, "magrpo", {"baseline": "median"}, "'median'"),
        (compute_mgrpo_advantage, "mgrpo", {"norm_scope": "batch"}, "'batch'"),
        (compute_mgrpo_advantage, "mgrpo", {"norm_adv_by_stdd": True}, "norm_adv_by_stdd"),
        (compute_magrpo_advantage, "magrpo", {"gama": 0.9}, "gama"),
        (compute_mgrpo_advantage, "mgrpo", {"epsilon": 0.0}, "epsilon"),
        (compute_mgrpo_advantage, "mgrpo", {"sub_reward_main_weight": math.nan}, "sub_reward_main_weight"),
        (compute_mgrpo_advantage, "mgrpo", {"norm_adv_by_std": "yes"}, "'yes'"),
        (compute_magrpo_advantage, "magrpo", {"gamma": 1.5}, "1.5"),
        (compute_magrpo_advantage, "magrpo", {"num_generations": 0}, "num_generations"),
    ],
)
def test_bad_setting(h, fn, rows_or_nodes, config, needle):
    data = h.mgrpo_batch(MGRPO_ROWS) if rows_or_nodes == "mgrpo" else h.magrpo_batch(MAGRPO_NODES)
    with pytest.raises(ValueError) as err:
        fn(data, config)
    assert needle in str(err.value)


def test_bad_setting_in_dataclass_constructor():
    with pytest.raises(ValueError, match="'diagonal'"):
        MAGRPOConfig(joint_mode="diagonal")
    with pytest.raises(ValueError, match="'agents'"):
        MGRPOConfig(norm_scope="agents")


# ------------------------------------------------------------------------------------ MAGRPO trees


def test_magrpo_rows_of_a_node_with_different_rewards(h):
    data = h.magrpo_batch(MAGRPO_NODES)
    # rows 4, 5 are agents a, b of node n00; give agent b another reward
    data.batch["token_level_rewards"][5] = 0.0
    data.batch["token_level_rewards"][5, -1] = 0.25
    with pytest.raises(ValueError, match=r"same joint reward.*n00"):
        compute_magrpo_advantage(data, None)


def test_magrpo_parent_node_missing(h):
    nodes = MAGRPO_NODES + [("q", "n_child", "n_ghost", 1, 1.0)]
    with pytest.raises(ValueError, match=r"n_ghost.*n_child.*not in the batch"):
        compute_magrpo_advantage(h.magrpo_batch(nodes), None)


def test_magrpo_parent_in_another_uid_is_missing(h):
    # node ids are per uid: n0 exists in q but not in r
    nodes = MAGRPO_NODES + [("r", "x", "n0", 1, 1.0)]
    with pytest.raises(ValueError, match=r"'n0'.*'x'"):
        compute_magrpo_advantage(h.magrpo_batch(nodes), None)


def test_magrpo_wrong_turn(h):
    nodes = MAGRPO_NODES + [("q", "n_late", "n0", 2, 1.0)]
    with pytest.raises(ValueError, match=r"n_late.*turn"):
        compute_magrpo_advantage(h.magrpo_batch(nodes), None)


def test_magrpo_two_rows_of_one_agent_at_a_node(h):
    data = h.magrpo_batch(MAGRPO_NODES)
    data.non_tensor_batch["agent"][5] = "a"  # n00 now has two rows of agent a
    with pytest.raises(ValueError, match="n00"):
        compute_magrpo_advantage(data, None)


def test_magrpo_node_missing_an_agent(h):
    data = h.magrpo_batch(MAGRPO_NODES)
    data = data.select_idxs(np.array([0, 1, 2, 3, 4]))  # drop agent b's row of n00
    with pytest.raises(ValueError, match="n00"):
        compute_magrpo_advantage(data, None)


def test_magrpo_non_integer_turn(h):
    data = h.magrpo_batch(MAGRPO_NODES)
    data.non_tensor_batch["turn"] = np.array(["zero"] * len(data), dtype=object)
    with pytest.raises(ValueError, match="'turn'"):
        compute_magrpo_advantage(data, None)


# ----------------------------------------------------------------------------------------- empty batch


@pytest.mark.parametrize("which", ["mgrpo", "magrpo"])
def test_empty_batch(h, which):
    if which == "mgrpo":
        data = compute_mgrpo_advantage(h.empty_batch(h.MGRPO_FIELDS, response_length=7), None)
    else:
        data = compute_magrpo_advantage(h.empty_batch(h.MAGRPO_FIELDS, response_length=7), None)
    for k in ("advantages", "returns"):
        assert isinstance(data.batch[k], torch.Tensor)
        assert tuple(data.batch[k].shape) == (0, 7)
