"""Settings of the advantage estimators.

Each field is documented where it is defined, with the reason for its default. The estimators accept
one of these dataclasses, or any mapping (a dict, an OmegaConf ``DictConfig``) with the same keys:
:func:`MGRPOConfig.from_any` / :func:`MAGRPOConfig.from_any` convert and validate. Unknown keys are an
error, so a typo never silently falls back to a default. They are plain (not frozen) dataclasses so that
OmegaConf can build them as sections of ``multi_agent`` (:mod:`mgrpo_verl.config.schema`); treat them as
values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

_C = TypeVar("_C")

NORM_SCOPES = ("group", "agent")
JOINT_MODES = ("aligned", "cross")
BASELINES = ("mean", "max", "rloo", "raw")


def _from_any(cls: type[_C], config: Any) -> _C:
    if config is None:
        return cls()
    if isinstance(config, cls):
        return config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    if not isinstance(config, Mapping):
        # OmegaConf DictConfig is a MutableMapping; anything else is not a config we understand.
        raise TypeError(f"{cls.__name__}: expected a mapping or a {cls.__name__}, got {type(config).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(config.keys()) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown setting(s) {unknown}; known settings are {sorted(known)}")
    return cls(**{k: config[k] for k in config.keys()})


def _check_finite_number(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be a finite number, got {value!r}")


@dataclass
class MGRPOConfig:
    """Settings of :func:`mgrpo_verl.compute_mgrpo_advantage` (hierarchical M-GRPO)."""

    sub_reward_local_weight: float = 0.5
    """Weight of the sub-agent's own (local) score in its effective score
    ``s_S = local_weight * local + main_weight * s_M``. 0.5/0.5 is the paper's balance between doing the
    delegated sub-task well and contributing to the main outcome."""

    sub_reward_main_weight: float = 0.5
    """Weight of the parent main trajectory's score in the sub-agent's effective score (hierarchical
    credit). With 0 the sub-agent optimises only its local reward; with 1 and local 0 only the outcome."""

    norm_adv_by_std: bool = True
    """Divide the centred score by the standard deviation (GRPO). False gives Dr.GRPO-style ``s - mean``,
    which removes the bias towards groups of low reward variance."""

    epsilon: float = 1e-6
    """Added to the standard deviation before dividing; verl's GRPO default, so that M-GRPO on main rows
    alone equals verl's GRPO bit for bit up to float rounding."""

    norm_scope: str = "group"
    """Which standard deviation divides the centred score. ``group``: the std of the row's own group
    (``(agent, uid)``), as in GRPO. ``agent``: the std of that agent's scores over the whole batch
    (Dr. MAS), which keeps an agent whose groups often have tiny variance from getting huge advantages.
    The mean is always the group mean."""

    def __post_init__(self) -> None:
        _check_finite_number("MGRPOConfig", "sub_reward_local_weight", self.sub_reward_local_weight)
        _check_finite_number("MGRPOConfig", "sub_reward_main_weight", self.sub_reward_main_weight)
        _check_finite_number("MGRPOConfig", "epsilon", self.epsilon)
        if self.epsilon <= 0:
            raise ValueError(f"MGRPOConfig: epsilon must be > 0, got {self.epsilon!r}")
        if self.norm_scope not in NORM_SCOPES:
            raise ValueError(f"MGRPOConfig: unknown norm_scope {self.norm_scope!r}; expected one of {NORM_SCOPES}")
        if not isinstance(self.norm_adv_by_std, bool):
            raise ValueError(f"MGRPOConfig: norm_adv_by_std must be a bool, got {self.norm_adv_by_std!r}")

    @classmethod
    def from_any(cls, config: Any) -> "MGRPOConfig":
        """Build from ``None`` (defaults), an instance, a dataclass or a mapping with the same keys."""
        return _from_any(cls, config)


@dataclass
class MAGRPOConfig:
    """Settings of :func:`mgrpo_verl.compute_magrpo_advantage` (cooperative MAGRPO)."""

    gamma: float = 1.0
    """Discount of the children's mean return: ``R = r + gamma * mean(R(children))``. 1.0 is the
    paper's undiscounted sum of joint rewards over turns; lower it to favour solving early."""

    baseline: str = "mean"
    """Baseline subtracted from a node's return, taken over its siblings (same ``uid`` and
    ``parent_node_id``, itself included). ``mean`` (paper), ``max``, ``rloo`` (mean of the others; a
    node without siblings gets advantage 0) or ``raw`` (no baseline)."""

    norm_adv_by_std: bool = False
    """Divide by the siblings' std + epsilon (unbiased, a lone node uses 1). Off by default, as in the
    authors' CoMLRL, because joint rewards are often near-constant within a group early on."""

    epsilon: float = 1e-6
    """Added to the standard deviation before dividing."""

    joint_mode: str = "aligned"
    """How the n agents' G completions form joint actions: ``aligned`` pairs them by index (G children
    per node), ``cross`` takes the Cartesian product (G^n children)."""

    num_generations: Optional[int] = None
    """G, the completions per agent per node. When set, the tree's shape is checked against
    ``joint_mode`` (every expanded node and every root group must have G or G^n members), which catches
    a rollout that lost or duplicated a joint action. ``None`` skips the check."""

    def __post_init__(self) -> None:
        _check_finite_number("MAGRPOConfig", "gamma", self.gamma)
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"MAGRPOConfig: gamma must be in [0, 1], got {self.gamma!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"MAGRPOConfig: unknown baseline {self.baseline!r}; expected one of {BASELINES}")
        if self.joint_mode not in JOINT_MODES:
            raise ValueError(f"MAGRPOConfig: unknown joint_mode {self.joint_mode!r}; expected one of {JOINT_MODES}")
        _check_finite_number("MAGRPOConfig", "epsilon", self.epsilon)
        if self.epsilon <= 0:
            raise ValueError(f"MAGRPOConfig: epsilon must be > 0, got {self.epsilon!r}")
        if not isinstance(self.norm_adv_by_std, bool):
            raise ValueError(f"MAGRPOConfig: norm_adv_by_std must be a bool, got {self.norm_adv_by_std!r}")
        if self.num_generations is not None and (
            isinstance(self.num_generations, bool) or not isinstance(self.num_generations, int)
            or self.num_generations < 1
        ):
            raise ValueError(f"MAGRPOConfig: num_generations must be a positive int or None, "
                             f"got {self.num_generations!r}")

    @classmethod
    def from_any(cls, config: Any) -> "MAGRPOConfig":
        """Build from ``None`` (defaults), an instance, a dataclass or a mapping with the same keys."""
        return _from_any(cls, config)
