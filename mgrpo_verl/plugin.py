"""Entry point of group ``verl.plugins``: verl imports this module on ``import verl`` in every process
(driver and Ray workers), so everything we register with verl is registered here.

verl swallows exceptions raised while loading a plugin (it logs them at debug level only), so a broken
plugin would silently leave ``adv_estimator=mgrpo`` unknown. :func:`ensure_registered` lets our own
entry points re-run the registration and see the real error.
"""

from __future__ import annotations


def ensure_registered() -> None:
    """Register everything we add to verl (idempotent); raises if that is impossible.

    Our advantage estimators are registered when verl's ``core_algos`` (their registry) is imported, not on
    ``import verl``: importing them pulls in ``core_algos`` (transformers, pydantic) and pandas, about 1 CPU
    second and 30-55 MiB in each of a run's verl processes, most of which never compute an advantage."""
    from importlib import import_module

    from mgrpo_verl.platform import register_cpu_platform
    from mgrpo_verl.platform._import_hooks import when_imported
    from mgrpo_verl.hf_rollout import register as register_hf_rollout
    from mgrpo_verl.trainer.tq_storage import register as register_tq_storage

    when_imported("verl.trainer.ppo.core_algos", lambda _: import_module("mgrpo_verl.algorithms.verl_registry"))
    register_cpu_platform()
    register_hf_rollout()
    register_tq_storage()
    register_multi_agent()


def register_multi_agent() -> None:
    """Our agent loops, our tool parser (``hermes_strict``) and our trainer modes
    (:data:`mgrpo_verl.config.schema.TRAINER_MODES`), registered when verl defines their registries, so a
    process that never imports verl's agent-loop, tool-parser or trainer modules pays nothing. The trainer
    modes come with verl's v1 trainer package: ``multi_agent`` (``per_agent``), then ``mgrpo_decoupled_main`` /
    ``mgrpo_decoupled_sub`` (``decoupled``) as soon as ``per_agent`` is complete.

    A registration that fails makes the import of the verl module fail with its error (see
    :mod:`mgrpo_verl.platform._import_hooks`), never a later "unknown trainer". verl's own mechanisms were
    considered: ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (one YAML file of
    ``{name, _target_}``, read in each ``AgentLoopWorker``) covers the agent loops but is a single user
    setting we would take over; ``VERL_USE_EXTERNAL_MODULES`` would import our trainer and loops (and
    verl's trainer stack) eagerly in every process that imports verl; neither registers the trainer lazily."""
    from importlib import import_module

    from mgrpo_verl.platform._import_hooks import when_imported

    when_imported("verl.experimental.agent_loop.tool_parser",
                  lambda _: import_module("mgrpo_verl.agent_loops.tool_parser"))
    when_imported("verl.experimental.agent_loop.agent_loop",
                  lambda _: import_module("mgrpo_verl.agent_loops.delegation"))
    when_imported("verl.experimental.agent_loop.agent_loop",
                  lambda _: import_module("mgrpo_verl.agent_loops.tool_delegation"))
    when_imported("verl.experimental.agent_loop.agent_loop",
                  lambda _: import_module("mgrpo_verl.agent_loops.cooperative"))
    when_imported("verl.trainer.ppo.v1", lambda _: import_module("mgrpo_verl.trainer.per_agent"))
    # the decoupled sides subclass MultiAgentTrainer: imported once per_agent is complete (per_agent imports
    # verl's v1 package itself, so the hook above may run while per_agent is half-imported)
    when_imported("mgrpo_verl.trainer.per_agent", lambda _: import_module("mgrpo_verl.trainer.decoupled"))


ensure_registered()
