"""mgrpo_verl: multi-agent RL on verl, one model per agent.

The public algorithm API (ALGORITHMS.md):

- :func:`compute_mgrpo_advantage` — hierarchical M-GRPO advantages for main and sub-agent rows;
- :func:`align_trajectories` — fixed-size batches from a variable number of sub-agent calls (D_max);
- :func:`compute_magrpo_advantage` — cooperative MAGRPO advantages over a tree of joint actions.

``import verl`` loads :mod:`mgrpo_verl.plugin` through the ``verl.plugins`` entry point, which registers
``mgrpo`` and ``magrpo`` as advantage estimators in every process.
"""

from mgrpo_verl.algorithms import (
    MAGRPOConfig,
    MGRPOConfig,
    align_trajectories,
    compute_magrpo_advantage,
    compute_mgrpo_advantage,
)

__version__ = "0.1.0"

__all__ = [
    "MAGRPOConfig",
    "MGRPOConfig",
    "__version__",
    "align_trajectories",
    "compute_magrpo_advantage",
    "compute_mgrpo_advantage",
]
