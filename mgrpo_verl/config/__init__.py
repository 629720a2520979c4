"""Hydra YAML of our trainers (extending verl's ``ppo_trainer``), the typed ``multi_agent`` section
(:mod:`.schema`), its rules (:mod:`.rules`, :mod:`.lora`) and the run's plan (:mod:`.plan`); and :func:`setting`,
the package's one way to read a value from a config with a default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue


def setting(node: Any, key: str, default: Any = None) -> Any:
    """The value at the dotted ``key`` of a config: an OmegaConf ``DictConfig`` (interpolations resolved), a
    mapping, or an object with attributes (verl's typed configs), level by level; ``default`` when a level is
    absent or the value is null or ``???``. A section comes back as a plain container."""
    for part in key.split("."):
        if node is None:
            return default
        try:
            if isinstance(node, DictConfig):
                node = node.get(part)
            elif isinstance(node, Mapping):
                node = node.get(part)
            else:
                node = getattr(node, part, None)
        except MissingMandatoryValue:
            return default
    if node is None:
        return default
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
