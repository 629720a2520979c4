"""One reward function for verl's ``reward.custom_reward_function`` that knows our tasks.

``compute_score`` dispatches on ``data_source``: our built-in tasks are scored by their own module,
anything else by verl's ``default_compute_score`` (gsm8k, math, ...), so pointing verl at this module
never breaks a dataset verl already scores.
"""

from __future__ import annotations

from typing import Any

from mgrpo_verl.envs import echo, relay
from mgrpo_verl.envs.research.dataset import DATA_SOURCE_PREFIX

_SCORERS = {echo.DATA_SOURCE: echo.compute_score, relay.DATA_SOURCE: relay.compute_score}


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any):
    """verl's reward-function signature."""
    scorer = _SCORERS.get(data_source)
    if scorer is not None:
        return scorer(data_source, solution_str, ground_truth, extra_info)
    if str(data_source).startswith(DATA_SOURCE_PREFIX + "/"):  # built-in questions and converted benchmarks
        from mgrpo_verl.envs.research import rewards as research

        return research.compute_score(data_source, solution_str, ground_truth, extra_info)
    from verl.utils.reward_score import default_compute_score

    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
