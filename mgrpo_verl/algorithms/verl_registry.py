"""``mgrpo`` and ``magrpo`` in verl's advantage-estimator registry (``algorithm.adv_estimator=...``).

verl's ``compute_advantage`` hands a registered estimator only the token rewards, the response mask, the
config and ``uid``: no agent or tree field. So here ``mgrpo`` is plain GRPO over ``uid`` groups and ``magrpo``
single-turn MAGRPO (exact for one turn), each logging a warning once; our trainer does not use this path. Why
and what each reduces to: ``docs/architecture.md``, "What the registry path sees".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from mgrpo_verl.algorithms.config import MAGRPOConfig, MGRPOConfig
from mgrpo_verl.algorithms.grouping import broadcast_to_tokens, factorize
from mgrpo_verl.algorithms.magrpo import magrpo_node_advantage
from mgrpo_verl.algorithms.mgrpo import mgrpo_scalar_advantage

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(name: str, what: str) -> None:
    if name not in _warned:
        _warned.add(name)
        logger.warning(
            "adv_estimator=%s through verl's registry sees no agent metadata: computing %s. Use the mgrpo_verl "
            "trainer (python -m mgrpo_verl.main_ppo) for the full algorithm.",
            name,
            what,
        )


def _setting(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _require_index(name: str, index: Optional[np.ndarray]) -> np.ndarray:
    if index is None:
        raise ValueError(f"adv_estimator={name} needs the 'uid' column in non_tensor_batch to form groups")
    return np.asarray(index).reshape(-1)


@register_adv_est("mgrpo")
def compute_mgrpo_registry_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Optional[np.ndarray] = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-GRPO with main rows only (= GRPO over ``uid``).

    Args:
        token_level_rewards: (bs, L); response_mask: (bs, L); index: (bs,) uid.

    Returns:
        advantages, returns: (bs, L), equal, as verl's GRPO.
    """
    uid = _require_index("mgrpo", index)
    _warn_once("mgrpo", "GRPO over uid groups (every row a main row)")
    cfg = MGRPOConfig(
        norm_adv_by_std=bool(_setting(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)),
        epsilon=float(epsilon),
    )
    scores = token_level_rewards.sum(dim=-1)
    adv, _ = mgrpo_scalar_advantage(scores, np.zeros(len(uid), dtype=np.int64), uid, np.full(len(uid), -1), cfg)
    token_adv = broadcast_to_tokens(adv.to(token_level_rewards.dtype), response_mask)
    return token_adv, token_adv


@register_adv_est("magrpo")
def compute_magrpo_registry_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Optional[np.ndarray] = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Single-turn MAGRPO, mean baseline over ``uid``.

    Args:
        token_level_rewards: (bs, L); response_mask: (bs, L); index: (bs,) uid.

    Returns:
        advantages: (bs, L) ``(r - mean_uid(r)) * mask``; returns: (bs, L) ``r * mask``.
    """
    uid = _require_index("magrpo", index)
    _warn_once("magrpo", "single-turn MAGRPO with the mean baseline over uid groups")
    codes, uniques = factorize(uid)
    reward = token_level_rewards.sum(dim=-1).to(torch.float64)
    adv = magrpo_node_advantage(reward, torch.from_numpy(codes), len(uniques), MAGRPOConfig())
    dtype = token_level_rewards.dtype
    return broadcast_to_tokens(adv.to(dtype), response_mask), broadcast_to_tokens(reward.to(dtype), response_mask)
