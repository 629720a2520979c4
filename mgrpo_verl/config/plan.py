"""The run's plan: its config read once into the typed facts that every later stage takes.

:func:`build_plan` is a pure function of the composed, resolved trainer config. It types the ``multi_agent``
section, checks every rule across sections (:func:`mgrpo_verl.config.rules.check_multi_agent`) and builds each
model owner's full config once, with the facts derived from them (which LoRA agents share an engine). The
launcher's checks, the memory estimate and the trainer take a :class:`RunPlan` instead of re-reading the config.
Each process builds its plan once: the driver before Ray starts, the trainer in its Ray actor (verl starts it
with the config alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from mgrpo_verl.config.lora import adapter_hosts, shared_vllm_adapters
from mgrpo_verl.config.rules import check_multi_agent, multi_agent_enabled
from mgrpo_verl.config.schema import MultiAgentConfig


@dataclass(frozen=True)
class RunPlan:
    """A run's config and what :func:`build_plan` derived from it. ``multi_agent`` is ``None`` for a
    single-model run (verl's own trainer, ``--config-name single_agent``)."""

    config: DictConfig
    """The run's config, as given (not modified)."""

    multi_agent: Optional[MultiAgentConfig] = None
    """The typed ``multi_agent`` section, every rule checked, GPU shares filled in."""

    agent_configs: Mapping[str, DictConfig] = field(default_factory=dict)
    """Every model owner's full config (``rules.agent_full_config``: the top-level config with the agent's
    ``actor_rollout_ref`` overrides merged and its GPU share), main first."""

    adapter_hosts: Mapping[str, str] = field(default_factory=dict)
    """LoRA agent -> the agent whose rollout engine serves its adapter, among this process's owners
    (:func:`mgrpo_verl.config.lora.adapter_hosts`)."""

    vllm_adapters: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    """LoRA agent on a shared vLLM engine -> that engine's adapter table (``config.lora.shared_vllm_adapters``)."""

    trainer_mode: str = ""
    """``trainer.v1.trainer_mode`` that runs the plan: the role's (``schema.TRAINER_MODES``) in multi-agent
    mode, else the config's."""

    @property
    def local_configs(self) -> dict[str, DictConfig]:
        """The full configs of the model owners this process builds workers for (``local_owners``)."""
        if self.multi_agent is None:
            return {}
        return {spec.name: self.agent_configs[spec.name] for spec in self.multi_agent.local_owners}

    def source_key(self, agent: Optional[str], leaf: str) -> str:
        """The key a user sets to change ``leaf`` (e.g. ``actor_rollout_ref.rollout.name``) for ``agent``: its
        ``multi_agent.agents.<agent>.`` override when it has one, else the top-level key (also for ``None``).
        Errors name it."""
        prefix = "actor_rollout_ref."
        if agent is None or self.multi_agent is None or not leaf.startswith(prefix):
            return leaf
        return self.multi_agent.agent(agent).key_of(leaf[len(prefix):])

    def describe(self) -> str:
        """One line: the mode and each model owner with its model, for the launcher's and trainer's logs."""
        if self.multi_agent is None:
            return f"mgrpo plan: one model, trainer mode {self.trainer_mode}"
        ma = self.multi_agent
        owners = []
        for spec in ma.model_owners:
            plays = [n for n in ma.agents if ma.owner_of(n) == spec.name]
            path = OmegaConf.select(self.agent_configs[spec.name], "actor_rollout_ref.model.path", default=None)
            frozen = "" if spec.trainable else ", frozen"
            owners.append(f"{spec.name} ({'/'.join(plays)}{frozen}: {path})")
        return (f"mgrpo plan: trainer mode {self.trainer_mode}, algorithm {ma.algorithm}, placement {ma.placement}, "
                f"models {'; '.join(owners)}")


def build_plan(config: DictConfig) -> RunPlan:
    """The plan of a composed trainer config (resolved: the launcher resolves it first). Raises ``ValueError``
    naming the key of the first rule it breaks; pure: no Ray, no models, ``config`` is not modified."""
    if not multi_agent_enabled(config):
        return RunPlan(config=config, trainer_mode=OmegaConf.select(config, "trainer.v1.trainer_mode", default=""))
    ma, fulls, mode = check_multi_agent(config)
    local = {spec.name: fulls[spec.name] for spec in ma.local_owners}
    hosts = adapter_hosts(local)
    return RunPlan(
        config=config,
        multi_agent=ma,
        agent_configs=fulls,
        adapter_hosts=hosts,
        vllm_adapters=shared_vllm_adapters(local, hosts),
        trainer_mode=mode,
    )
