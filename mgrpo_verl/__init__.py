"""mgrpo_verl: multi-agent RL on verl, one model per agent.

The public algorithm API (docs/algorithms.md):

- :func:`compute_mgrpo_advantage` — hierarchical M-GRPO advantages for main and sub-agent rows;
- :func:`align_trajectories` — fixed-size batches from a variable number of sub-agent calls (D_max);
- :func:`compute_magrpo_advantage` — cooperative MAGRPO advantages over a tree of joint actions.

``import verl`` loads :mod:`mgrpo_verl.plugin` through the ``verl.plugins`` entry point in every process of a
run, which imports this package; so the names above are loaded on first use (PEP 562), not here: importing
them pulls in pandas and the algorithms, about 0.5 CPU second and 40 MiB in each of a run's processes that
never computes an advantage.
"""

from importlib import import_module

__version__ = "0.1.0"

__all__ = [
    "MAGRPOConfig",
    "MGRPOConfig",
    "__version__",
    "align_trajectories",
    "compute_magrpo_advantage",
    "compute_mgrpo_advantage",
]


def __getattr__(name: str):
    if name in __all__ and name != "__version__":
        value = getattr(import_module("mgrpo_verl.algorithms"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
