"""M-GRPO advantages: group-relative for main and sub-agents, with hierarchical credit.

Formulas (docs/algorithms.md, "M-GRPO"); for query q with K main rollouts, rollout k calling a sub-agent
d_k >= 0 times:

- main score ``s_M(k)`` = the main row's own score (sum of its token rewards);
- sub effective score ``s_S(k,j) = w_local * local(k,j) + w_main * s_M(k)``;
- advantage ``A = (s - mean_g) / (std_g + eps)`` (or ``s - mean_g``) where g is the row's group:
  the K main rows of the query, or every call of one sub-agent (same ``agent`` and ``uid``) across
  those K rollouts. std is unbiased; a group of one has mean 0 and std 1, exactly as verl's GRPO.

Statistics use the real rows only; :func:`mgrpo_verl.align_trajectories` runs afterwards and copies
carry their source's advantage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.algorithms.fields import check_lengths, require_non_tensor, require_tensor, row_scores
from mgrpo_verl.algorithms.grouping import broadcast_to_tokens, combine_codes, factorize, group_mean_std
from mgrpo_verl.algorithms.hierarchy import resolve_parents

MGRPO_FIELDS = ("agent", "uid", "traj_id", "parent_traj_id")


def mgrpo_scalar_advantage(
    scores: torch.Tensor,
    agent: np.ndarray,
    uid: np.ndarray,
    parent_row: np.ndarray,
    config: MGRPOConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-level M-GRPO advantages (pure function, no verl types).

    Args:
        scores: (N,) each row's own score.
        agent: (N,) agent name of each row.
        uid: (N,) query group of each row.
        parent_row: (N,) int64 index of the parent main row, ``-1`` for main rows
            (see :func:`mgrpo_verl.algorithms.hierarchy.resolve_parents`).
        config: weights, normalisation and epsilon.

    Returns:
        advantages: (N,) float64; effective_scores: (N,) float64 (``s_M`` for main rows, ``s_S`` for
        sub rows).
    """
    s = scores.to(torch.float64)
    parent = torch.from_numpy(np.asarray(parent_row, dtype=np.int64))
    sub = parent >= 0
    effective = s.clone()
    effective[sub] = config.sub_reward_local_weight * s[sub] + config.sub_reward_main_weight * s[parent[sub]]

    # Main rows form one group per uid whatever their agent name; sub rows one per (agent, uid). The
    # role is part of the key, so a sub-agent sharing the main agent's name (one model playing every
    # role) never joins the main group.
    agent_code, agents = factorize(agent)
    role_agent = np.where(parent_row >= 0, agent_code, len(agents))
    uid_code, uids = factorize(uid)
    group, n_groups = combine_codes(role_agent, uid_code, len(uids))
    group_t = torch.from_numpy(group)
    mean, std, _ = group_mean_std(effective, group_t, n_groups)
    centred = effective - mean[group_t]
    if not config.norm_adv_by_std:
        return centred, effective
    if config.norm_scope == "agent":
        agent_t = torch.from_numpy(role_agent)
        _, agent_std, _ = group_mean_std(effective, agent_t, len(agents) + 1)
        scale = agent_std[agent_t]
    else:
        scale = std[group_t]
    return centred / (scale + config.epsilon), effective


def compute_mgrpo_advantage(data: Any, config: Any = None) -> Any:
    """M-GRPO advantages for a verl ``DataProto`` of main and sub-agent rows.

    Reads ``non_tensor_batch`` fields ``agent``, ``uid``, ``traj_id``, ``parent_traj_id`` and
    ``batch`` tensors ``token_level_rewards`` (N, L) and ``response_mask`` (N, L). Writes
    ``batch["advantages"]`` and ``batch["returns"]`` (N, L), the row's advantage times its response
    mask (as verl's GRPO, returns equal advantages), and returns ``data`` (updated in place, like
    verl's ``compute_advantage``).

    Args:
        data: verl ``DataProto``.
        config: :class:`MGRPOConfig`, a mapping with its keys, or ``None`` for the defaults.

    Raises:
        ValueError: a missing field, NaN/inf rewards, an empty/duplicated ``traj_id``, a sub row whose
            parent is not in the batch (or belongs to another ``uid``), or a bad setting; the message
            names the offending value.
    """
    who = "compute_mgrpo_advantage"
    cfg = MGRPOConfig.from_any(config)
    f = require_non_tensor(data, MGRPO_FIELDS, who)
    t = require_tensor(data, ("token_level_rewards", "response_mask"), who)
    rewards, mask = t["token_level_rewards"], t["response_mask"]
    check_lengths(who, rewards.shape[0], **f)
    scores = row_scores(rewards, f["traj_id"], who)
    parent_row = resolve_parents(f["traj_id"], f["parent_traj_id"], f["uid"], who)
    advantages, _ = mgrpo_scalar_advantage(scores, f["agent"], f["uid"], parent_row, cfg)
    token_adv = broadcast_to_tokens(advantages.to(rewards.dtype), mask)
    data.batch["advantages"] = token_adv
    data.batch["returns"] = token_adv
    return data
