"""M-GRPO with only main rows equals verl's GRPO (docs/algorithms.md, M-GRPO rule 6), and the ``mgrpo`` /
``magrpo`` registry estimators equal verl GRPO / the full MAGRPO on what the registry can see."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.config.algorithm import AlgoConfig
from verl.trainer.ppo import core_algos

from mgrpo_verl import MAGRPOConfig, MGRPOConfig, compute_magrpo_advantage, compute_mgrpo_advantage

TOL = dict(rtol=1e-5, atol=1e-5)
SEEDS = range(60)


def random_main_batch(seed: int) -> DataProto:
    """Main rows only: 1-8 uids, group sizes 1-6 (a third of the groups of size 1), random masks
    (prefix or scattered, some all-zero), scores either discrete (one token) or spread over tokens."""
    rng = np.random.default_rng(seed)
    n_groups = int(rng.integers(1, 9))
    sizes = np.where(rng.random(n_groups) < 0.33, 1, rng.integers(2, 7, size=n_groups))
    uid = np.repeat(np.array([f"u{seed}-{g}" for g in range(n_groups)], dtype=object), sizes)
    n, length = len(uid), int(rng.integers(1, 11))
    perm = rng.permutation(n)
    uid = uid[perm]
    rewards = torch.zeros(n, length)
    if rng.random() < 0.5:  # discrete outcome reward on one token: ties and all-equal groups happen
        rewards[torch.arange(n), torch.from_numpy(rng.integers(0, length, size=n))] = torch.from_numpy(
            rng.choice([0.0, 0.5, 1.0], size=n)
        ).float()
    else:  # dense rewards
        rewards = torch.from_numpy(rng.normal(size=(n, length))).float()
    if rng.random() < 0.5:
        lengths = torch.from_numpy(rng.integers(0, length + 1, size=n))
        mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    else:
        mask = torch.from_numpy(rng.random((n, length)) < 0.7).float()
    if rng.random() < 0.3:
        mask = mask.long()  # verl's masks are often int64
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={
            "uid": uid,
            "agent": np.full(n, "main", dtype=object),
            "traj_id": np.array([f"t{i}" for i in range(n)], dtype=object),
            "parent_traj_id": np.full(n, "", dtype=object),
        },
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm", [True, False])
def test_main_only_equals_verl_grpo(seed, norm):
    data = random_main_batch(seed)
    rewards, mask = data.batch["token_level_rewards"].clone(), data.batch["response_mask"].clone()
    uid = data.non_tensor_batch["uid"]
    ref_adv, ref_ret = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid, 1e-6, norm)
    vec_adv, _ = core_algos.compute_grpo_vectorized_outcome_advantage(rewards, mask, uid, 1e-6, norm)
    out = compute_mgrpo_advantage(data, {"norm_adv_by_std": norm})
    torch.testing.assert_close(out.batch["advantages"], ref_adv, **TOL)
    torch.testing.assert_close(out.batch["returns"], ref_ret, **TOL)
    torch.testing.assert_close(out.batch["advantages"], vec_adv, **TOL)


@pytest.mark.parametrize("seed", range(10))
def test_main_only_equals_verl_grpo_with_custom_epsilon(seed):
    data = random_main_batch(1000 + seed)
    rewards, mask, uid = data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    ref, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, uid, 0.1, True)
    out = compute_mgrpo_advantage(data, MGRPOConfig(epsilon=0.1))
    torch.testing.assert_close(out.batch["advantages"], ref, **TOL)


def test_sub_weights_do_not_matter_without_sub_rows():
    data = random_main_batch(7)
    a = compute_mgrpo_advantage(data, {"sub_reward_local_weight": 0.0, "sub_reward_main_weight": 3.0})
    a = a.batch["advantages"].clone()
    b = compute_mgrpo_advantage(data, None).batch["advantages"]
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------- registry


def test_import_verl_registers_both_estimators_through_the_entry_point():
    # a fresh interpreter that never imports mgrpo_verl itself: the verl.plugins entry point must do it
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as R\n"
        "print(R['mgrpo'].__module__, R['magrpo'].__module__)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["mgrpo_verl.algorithms.verl_registry"] * 2


def test_registry_lookup_in_process():
    for name in ("mgrpo", "magrpo"):
        fn = core_algos.get_adv_estimator_fn(name)
        assert callable(fn) and fn.__module__ == "mgrpo_verl.algorithms.verl_registry"


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("norm", [True, False])
def test_registry_mgrpo_equals_verl_grpo(seed, norm):
    data = random_main_batch(2000 + seed)
    rewards, mask, uid = data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    ref_adv, ref_ret = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, uid, 1e-6, norm)
    fn = core_algos.get_adv_estimator_fn("mgrpo")
    # as verl's compute_advantage calls it: the setting comes from the AlgoConfig
    adv, ret = fn(token_level_rewards=rewards, response_mask=mask, index=uid, config=AlgoConfig(norm_adv_by_std_in_grpo=norm))
    torch.testing.assert_close(adv, ref_adv, **TOL)
    torch.testing.assert_close(ret, ref_ret, **TOL)
    # and with keyword arguments only, no config
    adv, _ = fn(token_level_rewards=rewards, response_mask=mask, index=uid, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(adv, ref_adv, **TOL)


@pytest.mark.parametrize("norm", [True, False])
def test_compute_advantage_through_verl_trainer(norm):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    for seed in range(5):
        data = random_main_batch(3000 + seed)
        ours = compute_advantage(data, "mgrpo", config=AlgoConfig(norm_adv_by_std_in_grpo=norm))
        ours_adv = ours.batch["advantages"].clone()
        ref = compute_advantage(data, core_algos.AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=norm)
        torch.testing.assert_close(ours_adv, ref.batch["advantages"], **TOL)


def random_single_turn_tree(seed: int) -> DataProto:
    """Single-turn MAGRPO batch: 1-5 uids, G = 1-4 root nodes each, 1-3 agents, one joint reward per node
    carried by every agent's row, rows shuffled, random prefix masks."""
    rng = np.random.default_rng(seed)
    n_agents, length = int(rng.integers(1, 4)), int(rng.integers(1, 7))
    rows = []
    for u in range(int(rng.integers(1, 6))):
        for g in range(int(rng.integers(1, 5))):
            r = float(rng.choice([0.0, 1.0, 2.5])) if rng.random() < 0.5 else float(rng.normal())
            rows += [(f"q{u}", f"n{g}", "", 0, f"agent{a}", r) for a in range(n_agents)]
    rows = [rows[i] for i in rng.permutation(len(rows))]
    n = len(rows)
    uid, node, parent, turn, agent, reward = (np.array(c, dtype=object) for c in zip(*rows))
    rewards = torch.zeros(n, length)
    rewards[:, -1] = torch.tensor(reward.astype(float)).float()
    lengths = torch.from_numpy(rng.integers(1, length + 1, size=n))
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": uid, "node_id": node, "parent_node_id": parent, "turn": turn, "agent": agent},
    )


@pytest.mark.parametrize("seed", range(40))
def test_registry_magrpo_equals_full_single_turn_mean_baseline(seed):
    data = random_single_turn_tree(seed)
    rewards, mask, uid = data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    fn = core_algos.get_adv_estimator_fn("magrpo")
    adv, ret = fn(token_level_rewards=rewards, response_mask=mask, index=uid, config=AlgoConfig())
    full = compute_magrpo_advantage(data, MAGRPOConfig(baseline="mean"))
    torch.testing.assert_close(adv, full.batch["advantages"], **TOL)
    torch.testing.assert_close(ret, full.batch["returns"], **TOL)
    # the values are non-trivial: returns are the rewards times the mask
    torch.testing.assert_close(ret, rewards.sum(-1, keepdim=True) * mask, **TOL)
