"""The launcher's warm-start stage: build (or find) the warm start a run starts from, before Ray.

The config only names it, in ``mgrpo_verl.warmstart``, of one of two kinds: ``task`` names a built-in one (its
settings: :class:`~mgrpo_verl.warmstart.build.WarmStartSpec`, null: the default), ``demos`` your own demonstrations
of any task and agents (:mod:`mgrpo_verl.warmstart.own`). A model path ``${mgrpo_warmstart:<agent>,
${mgrpo_verl.warmstart}}`` resolves to where that agent's checkpoint is published (:func:`checkpoint_dir`: a path,
nothing is built). ``main_ppo`` runs :func:`run_stage` after every check passed (a typo never waits for the SFT),
and only when one of the run's model paths lies in that warm start.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from omegaconf import OmegaConf

from mgrpo_verl.config.plan import RunPlan
from mgrpo_verl.warmstart import build, own

#: The agents a built-in warm start publishes a checkpoint for.
AGENTS = ("main", "sub")


def _log(msg: str) -> None:
    print(f"mgrpo_warmstart: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BuiltIn:
    """A built-in task's warm start (``mgrpo_verl.warmstart.task``)."""

    spec: build.WarmStartSpec
    root: Optional[str]
    agents = AGENTS

    def target(self) -> Path:
        return build.target_dir(self.spec, self.root)

    def bases(self) -> dict[str, str]:
        return {agent: dirs[0] for agent, dirs in build.base_models(self.spec).items()}

    def is_published(self, plan: Optional[RunPlan] = None) -> bool:
        return build.cached(self.spec, self.root) is not None

    def build(self, plan: RunPlan) -> build.WarmStart:
        return build.warm_start(self.spec, self.root, log=_log)


@dataclass(frozen=True)
class Own:
    """A warm start from the user's demonstrations (``mgrpo_verl.warmstart.demos``). Its tools come from the run's
    plan: checked against a cached one only with a plan (:func:`run_stage`, after the hooks were checked)."""

    spec: own.OwnSpec
    root: Optional[str]

    @property
    def agents(self) -> tuple[str, ...]:
        return self.spec.names

    def target(self) -> Path:
        return own.target_dir(self.spec, self.root)

    def bases(self) -> dict[str, str]:
        return {agent: dirs[0] for agent, dirs in own.base_models(self.spec).items()}

    def is_published(self, plan: Optional[RunPlan] = None) -> bool:
        tools = None if plan is None else own.agent_tools(plan, self.spec.names)
        return own.published(self.target(), tools) is not None

    def build(self, plan: RunPlan) -> own.OwnWarmStart:
        return own.warm_start(self.spec, own.agent_tools(plan, self.spec.names), self.root, log=_log)


def requested(settings: Any) -> Optional[Union[BuiltIn, Own]]:
    """The warm start that ``mgrpo_verl.warmstart`` (``settings``, a mapping or DictConfig) names, or ``None`` when
    it names none (no section, or ``task`` and ``demos`` null). ``out`` is its root (null: the cache).

    Raises:
        ValueError: ``task`` and ``demos`` both set, or a setting the kind does not know (naming it and the known).
    """
    if OmegaConf.is_config(settings):
        settings = OmegaConf.to_container(settings, resolve=True)
    settings = dict(settings or {})
    task, demos, root = settings.pop("task", None), settings.pop("demos", None), settings.pop("out", None)
    if task is not None and demos is not None:
        raise ValueError(f"mgrpo_verl.warmstart: task ({task}) and demos ({demos}) are both set: task names a "
                         f"built-in warm start, demos your own demonstrations; set the other to null")
    if task is not None:
        return BuiltIn(build.spec_from_settings(str(task), settings), root)
    if demos is not None:
        return Own(own.spec_from_settings({**settings, "demos": demos}), root)
    return None


def checkpoint_dir(agent: str, settings: Any) -> str:
    """The ``mgrpo_warmstart`` resolver: where ``agent``'s checkpoint of the warm start ``settings`` name is
    published (built by :func:`run_stage`, or already cached). Pure: builds nothing but the base models'
    folders its cache key names (the built-in tiny models, seconds)."""
    found = requested(settings)
    if found is None:
        raise ValueError("mgrpo_warmstart: mgrpo_verl.warmstart.task is null: name the task whose warm start the "
                         "model starts from (e.g. mgrpo_verl.warmstart.task=relay_tools), or your own "
                         "demonstrations (mgrpo_verl.warmstart.demos, docs/warmstart.md)")
    if agent not in found.agents:
        if isinstance(found, BuiltIn):
            raise ValueError(f"mgrpo_warmstart: agent must be 'main' or 'sub', got {agent!r}")
        raise ValueError(f"mgrpo_warmstart: agent {agent!r} is not one of mgrpo_verl.warmstart.agents "
                         f"{list(found.agents)}")
    return str(found.target() / agent)


def _used(plan: RunPlan) -> Optional[Union[BuiltIn, Own]]:
    """The warm start the config names when one of the run's model paths lies in it."""
    found = requested(OmegaConf.select(plan.config, "mgrpo_verl.warmstart", default=None))
    if found is None:
        return None
    target = found.target()
    paths = [OmegaConf.select(c, "actor_rollout_ref.model.path", default=None)
             for c in (plan.config, *plan.agent_configs.values())]  # the top-level model and each owner's
    return found if any(p is not None and Path(str(p)).is_relative_to(target) for p in paths) else None


def pending_models(plan: RunPlan) -> Mapping[str, str]:
    """Checkpoint folder the stage will write -> the base model folder it starts from (the same architecture; an
    agent based on another agent: that one's base), for every agent of a warm start the run's model paths lie in
    and that is not built yet: the launcher's checks accept these paths and read the architecture from the base."""
    found = _used(plan)
    if found is None or found.is_published():
        return {}
    target = found.target()
    return {str(target / agent): base for agent, base in found.bases().items()}


def run_stage(plan: RunPlan) -> Optional[Union[build.WarmStart, own.OwnWarmStart]]:
    """Build the warm start the run starts from when it is not published yet (minutes on CPU, progress on
    stderr); ``None`` when the run needs none or it is cached already (one of your own demonstrations: with the
    tools the plan offers, else :class:`~mgrpo_verl.warmstart.own.StaleTools`)."""
    found = _used(plan)
    if found is None or found.is_published(plan):
        return None
    return found.build(plan)
