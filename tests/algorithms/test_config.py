"""``config`` may be a dict, an OmegaConf DictConfig or a dataclass (docs/algorithms.md, public API), and the
settings it carries take effect whatever the form."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from mgrpo_verl import MAGRPOConfig, MGRPOConfig, compute_magrpo_advantage, compute_mgrpo_advantage

ROWS = [
    ("main", "q", "m0", "", 1.0),
    ("main", "q", "m1", "", 0.0),
    ("sub", "q", "s0", "m0", 0.0),
    ("sub", "q", "s1", "m1", 1.0),
]
# norm off, w_local .8, w_main .2: main 1, 0 -> ±.5 ; s_S = .2, .8 -> mean .5 -> -.3, +.3
MGRPO_SETTINGS = {"norm_adv_by_std": False, "sub_reward_local_weight": 0.8, "sub_reward_main_weight": 0.2}
MGRPO_EXPECTED = [0.5, -0.5, -0.3, 0.3]

NODES = [("q", "n0", "", 0, 1.0), ("q", "n1", "", 0, 3.0), ("q", "n10", "n1", 1, 2.0), ("q", "n11", "n1", 1, 0.0)]
# gamma .5, max baseline: R(n1) = 3 + .5 * mean(2, 0) = 3.5, R(n0) = 1 -> roots max 3.5 -> -2.5, 0
# leaves 2, 0 -> max 2 -> 0, -2
MAGRPO_SETTINGS = {"gamma": 0.5, "baseline": "max", "joint_mode": "aligned", "num_generations": 2}
MAGRPO_EXPECTED = [-2.5, 0.0, 0.0, -2.0]


@dataclasses.dataclass
class UserMGRPOSettings:  # a user's own dataclass with the same field names
    norm_adv_by_std: bool = False
    sub_reward_local_weight: float = 0.8
    sub_reward_main_weight: float = 0.2


@dataclasses.dataclass
class UserMAGRPOSettings:
    gamma: float = 0.5
    baseline: str = "max"
    joint_mode: str = "aligned"
    num_generations: int = 2


YAML_MGRPO = """
norm_adv_by_std: false
sub_reward_local_weight: 0.8
sub_reward_main_weight: 0.2
epsilon: 1e-6
norm_scope: group
"""

YAML_MAGRPO = """
gamma: 0.5
baseline: max
joint_mode: aligned
num_generations: 2
norm_adv_by_std: false
epsilon: 1e-6
"""


@pytest.mark.parametrize(
    "config",
    [
        MGRPO_SETTINGS,
        OmegaConf.create(MGRPO_SETTINGS),
        OmegaConf.create(YAML_MGRPO),
        MGRPOConfig(**MGRPO_SETTINGS),
        UserMGRPOSettings(),
    ],
    ids=["dict", "DictConfig", "DictConfig-yaml", "MGRPOConfig", "user-dataclass"],
)
def test_mgrpo_config_forms(h, config):
    a = h.row_scalar(compute_mgrpo_advantage(h.mgrpo_batch(ROWS), config))
    assert a == pytest.approx(MGRPO_EXPECTED, rel=1e-5)


@pytest.mark.parametrize(
    "config",
    [
        MAGRPO_SETTINGS,
        OmegaConf.create(MAGRPO_SETTINGS),
        OmegaConf.create(YAML_MAGRPO),
        MAGRPOConfig(**MAGRPO_SETTINGS),
        UserMAGRPOSettings(),
    ],
    ids=["dict", "DictConfig", "DictConfig-yaml", "MAGRPOConfig", "user-dataclass"],
)
def test_magrpo_config_forms(h, config):
    a = h.row_scalar(compute_magrpo_advantage(h.magrpo_batch(NODES), config))[::2]
    assert a == pytest.approx(MAGRPO_EXPECTED, rel=1e-5)


def test_defaults_match_the_spec():
    m = MGRPOConfig()
    assert (m.sub_reward_local_weight, m.sub_reward_main_weight, m.norm_adv_by_std, m.epsilon, m.norm_scope) == (
        0.5,
        0.5,
        True,
        1e-6,
        "group",
    )
    g = MAGRPOConfig()
    assert (g.gamma, g.baseline, g.norm_adv_by_std, g.joint_mode) == (1.0, "mean", False, "aligned")


def test_nested_dictconfig_subtree_from_a_larger_config(h):
    # the usual case: the settings live under a key of the run's config
    root = OmegaConf.create({"algorithm": {"mgrpo": MGRPO_SETTINGS, "magrpo": MAGRPO_SETTINGS}})
    a = h.row_scalar(compute_mgrpo_advantage(h.mgrpo_batch(ROWS), root.algorithm.mgrpo))
    assert a == pytest.approx(MGRPO_EXPECTED, rel=1e-5)
    b = h.row_scalar(compute_magrpo_advantage(h.magrpo_batch(NODES), root.algorithm.magrpo))[::2]
    assert b == pytest.approx(MAGRPO_EXPECTED, rel=1e-5)


def test_unknown_key_in_dictconfig_and_dataclass(h):
    with pytest.raises(ValueError, match="sub_reward_weight"):
        compute_mgrpo_advantage(h.mgrpo_batch(ROWS), OmegaConf.create({"sub_reward_weight": 0.3}))

    @dataclasses.dataclass
    class Typo:
        gama: float = 0.9

    with pytest.raises(ValueError, match="gama"):
        compute_magrpo_advantage(h.magrpo_batch(NODES), Typo())


def test_configs_are_not_interchangeable(h):
    # an MGRPO setting handed to MAGRPO is an unknown key, not silently ignored
    with pytest.raises(ValueError, match="sub_reward_local_weight"):
        compute_magrpo_advantage(h.magrpo_batch(NODES), {"sub_reward_local_weight": 0.5})
