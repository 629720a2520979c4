"""The launcher's warm-start stage: build (or find) the warm start a run starts from, before Ray.

The config only names it: ``mgrpo_verl.warmstart`` holds the task and the settings
(:class:`~mgrpo_verl.warmstart.build.WarmStartSpec`; null: the default), and a model path
``${mgrpo_warmstart:<agent>,${mgrpo_verl.warmstart}}`` resolves to where that agent's checkpoint is published
(:func:`checkpoint_dir`: a path, nothing is built). ``main_ppo`` runs :func:`run_stage` after every check
passed (a typo never waits for the SFT), and only when one of the run's model paths lies in that warm start.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from mgrpo_verl.config.plan import RunPlan
from mgrpo_verl.warmstart import build

#: The agents a warm start publishes a checkpoint for.
AGENTS = ("main", "sub")


def requested(settings: Any) -> Optional[tuple[build.WarmStartSpec, Optional[str]]]:
    """(spec, root) of the warm start that ``mgrpo_verl.warmstart`` (``settings``, a mapping or DictConfig)
    names, or ``None`` when it names none (no section, or ``task`` null). ``root`` is ``out`` (null: the cache)."""
    if OmegaConf.is_config(settings):
        settings = OmegaConf.to_container(settings, resolve=True)
    settings = dict(settings or {})
    task = settings.pop("task", None)
    if task is None:
        return None
    root = settings.pop("out", None)
    return build.spec_from_settings(str(task), settings), root


def checkpoint_dir(agent: str, settings: Any) -> str:
    """The ``mgrpo_warmstart`` resolver: where ``agent``'s checkpoint of the warm start ``settings`` name is
    published (built by :func:`run_stage`, or already cached). Pure: builds nothing but the base models'
    folders its cache key names (the built-in tiny models, seconds)."""
    if agent not in AGENTS:
        raise ValueError(f"mgrpo_warmstart: agent must be 'main' or 'sub', got {agent!r}")
    found = requested(settings)
    if found is None:
        raise ValueError("mgrpo_warmstart: mgrpo_verl.warmstart.task is null: name the task whose warm start the "
                         "model starts from (e.g. mgrpo_verl.warmstart.task=relay_tools)")
    spec, root = found
    return str(build.target_dir(spec, root) / agent)


def _pending(plan: RunPlan) -> Optional[tuple[build.WarmStartSpec, Optional[str], Path]]:
    """(spec, root, target) of the warm start the run's model paths lie in and that is not published yet."""
    found = requested(OmegaConf.select(plan.config, "mgrpo_verl.warmstart", default=None))
    if found is None:
        return None
    spec, root = found
    target = build.target_dir(spec, root)
    paths = [OmegaConf.select(c, "actor_rollout_ref.model.path", default=None)
             for c in (plan.config, *plan.agent_configs.values())]  # the top-level model and each owner's
    if build.cached(spec, root) is not None or not any(p is not None and Path(str(p)).is_relative_to(target)
                                                       for p in paths):
        return None
    return spec, root, target


def pending_models(plan: RunPlan) -> Mapping[str, str]:
    """Checkpoint folder the stage will write -> the base model folder it starts from (the same architecture),
    for every model path of the run in a warm start not built yet: the launcher's checks accept these paths and
    read the architecture from the base."""
    pending = _pending(plan)
    if pending is None:
        return {}
    spec, _, target = pending
    bases = build.base_models(spec)
    return {str(target / agent): bases[agent][0] for agent in AGENTS}


def run_stage(plan: RunPlan) -> Optional[build.WarmStart]:
    """Build the warm start the run starts from when it is not published yet (minutes on CPU, progress on
    stderr); ``None`` when the run needs none or it is cached already."""
    pending = _pending(plan)
    if pending is None:
        return None
    spec, root, _ = pending
    return build.warm_start(spec, root, log=lambda msg: print(f"mgrpo_warmstart: {msg}", file=sys.stderr, flush=True))
