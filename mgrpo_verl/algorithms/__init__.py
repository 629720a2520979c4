"""Pure algorithms: tensors and arrays in, tensors out. No Ray, no trainer, no verl config objects."""

from mgrpo_verl.algorithms.alignment import AlignmentPlan, align_trajectories, plan_alignment, resolve_d_max
from mgrpo_verl.algorithms.config import MAGRPOConfig, MGRPOConfig
from mgrpo_verl.algorithms.magrpo import compute_magrpo_advantage, magrpo_node_advantage, magrpo_node_returns
from mgrpo_verl.algorithms.mgrpo import compute_mgrpo_advantage, mgrpo_scalar_advantage

__all__ = [
    "AlignmentPlan",
    "MAGRPOConfig",
    "MGRPOConfig",
    "align_trajectories",
    "compute_magrpo_advantage",
    "compute_mgrpo_advantage",
    "magrpo_node_advantage",
    "magrpo_node_returns",
    "mgrpo_scalar_advantage",
    "plan_alignment",
    "resolve_d_max",
]
