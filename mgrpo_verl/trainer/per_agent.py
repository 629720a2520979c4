"""``trainer.v1.trainer_mode=multi_agent``: verl's v1 trainer with one model per agent (M-GRPO, MAGRPO).

Unlike verl's ``PPOTrainerSync`` it builds a worker group, rollout servers and checkpoint engine per
model-owning agent, computes the advantages on every agent's real rows together, aligns them (``D_max``) and
runs verl's own update methods once per model on an :class:`AgentView`; checkpoints, metrics and rollout dumps
are per agent. The full list of differences: ``docs/multi_agent.md``, "What differs from verl's synchronous
trainer"; the decoupled sides subclass it (:mod:`mgrpo_verl.trainer.decoupled`).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
import os
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import ray
import torch
from omegaconf import OmegaConf, open_dict
from transfer_queue import KVBatchMeta

from verl.checkpoint_engine import CheckpointEngineManager
from verl.experimental.reward_loop import RewardLoopManager
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from verl.single_controller.ray.base import ResourcePoolManager, create_colocated_worker_cls
from verl.trainer.ppo.utils import Role, need_reference_policy
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer
from verl.utils.ray_utils import auto_await
from verl.workers.config import HFModelConfig

from mgrpo_verl.algorithms.alignment import plan_resolved_alignment
from mgrpo_verl.config.schema import TRAINER_MODES
from mgrpo_verl.agent_loops.common import UnscoredRows
from mgrpo_verl.agent_loops.multi_client import MultiAgentLLMClient
from mgrpo_verl.trainer import checkpoints as ckpt
from mgrpo_verl.trainer.agents import (
    REPLICA_OFFSET_KEY,
    AgentActorRolloutRefWorker,
    AgentLLMServerManager,
    AgentRuntime,
    side_replica_offsets,
)
from mgrpo_verl.config.lora import VLLM_ADAPTERS_KEY
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.hf_rollout.adapters import AdapterLLMServerClient
from mgrpo_verl.trainer.lora_export import lora_settings
from mgrpo_verl.trainer.memory import check_memory
from mgrpo_verl.trainer.placement import PinnedResourcePoolManager
from mgrpo_verl.trainer import rollout_log
from mgrpo_verl.trainer.rollout_log import StepRows
from mgrpo_verl.trainer.rowless import RowlessSteps
from mgrpo_verl.trainer.rows import (
    RowTable,
    row_metrics,
    copy_keys,
    plan_update_sets,
    read_row_table,
    scalar_advantages,
    write_copies,
    write_row_values,
)

logger = logging.getLogger(__name__)


@register_trainer(TRAINER_MODES[None])
class MultiAgentTrainer(PPOTrainer):
    """verl's synchronous PPO trainer, one model per agent (``docs/multi_agent.md``, "What differs from verl's
    synchronous trainer")."""

    #: The ``multi_agent.decoupled.role`` this class runs (null: one process trains every agent).
    ROLE: str | None = None

    # The base class switches to asynchronous behaviour (async replay buffer, persistent TransferQueue,
    # in-flight re-issue) whenever trainer_mode != "sync"; this trainer is synchronous under its own name.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:  # the base __init__ assigns the configured name
        pass

    def __init__(self, config):
        # one key read here, to refuse the wrong class at once; the plan is built in _setup, once the config is complete
        role = OmegaConf.select(config, "multi_agent.decoupled.role", default=None)
        if role != self.ROLE:  # verl's registry picked the class by trainer mode; it must run this role
            raise ValueError(
                f"trainer mode {TRAINER_MODES[self.ROLE]!r} ({type(self).__name__}) runs multi_agent.decoupled.role="
                f"{self.ROLE!r}, but the role is {role!r}, which needs the trainer mode {TRAINER_MODES.get(role)!r}: "
                f"start the run with python -m mgrpo_verl.main_ppo, which sets the mode from the role"
            )
        super().__init__(config)
        self.step_rows: StepRows | None = None  # the last step's rows, for its dump (fit's step 6)

    # ------------------------------------------------------------------------------------------ setup

    def _setup(self):
        self._init_tokenizer()
        self._init_dataloader()  # writes the optimiser horizon into the config: the plan's agent configs come after
        self._init_dump_executor()
        self.plan = build_plan(self.config)  # the one parse of this process
        self.multi_agent = self.plan.multi_agent
        print(self.plan.describe(), flush=True)
        self.agents = self._agent_runtimes()
        # main_ppo checks it before Ray starts; again here, before any GPU memory is taken, for other entry points
        check_memory(self.plan)
        self._init_resource_pool_mgr()
        self.resource_pool_manager.create_resource_pool()
        self.ref_in_actor = False
        # agents on pools of their own start their worker groups together, as their rollout servers below: each
        # start is a chain of process start-up, imports and model load, which verl's single-model trainer runs
        # once. Agents sharing one pool start one after the other: verl creates a pool's placement groups on
        # first use, under one name per pool, and two groups creating them at once collide.
        together = len(self.agents) if self._start_together() else 1
        with ThreadPoolExecutor(together, thread_name_prefix="mgrpo-spawn") as spawner:
            list(spawner.map(self._spawn_workers, self.agents.values()))
        # no reward workers: every multi-agent loop scores its rows itself (docs/agent_loops.md, "Rows"), so
        # verl's would idle, each a process of its own (~330 MiB, torch and verl imported); verl's manager stays,
        # empty, for the base class's checks (a reward model is refused in multi-agent mode: config/rules.py)
        self.reward_loop_manager = RewardLoopManager(
            config=OmegaConf.merge(self.config, {"reward": {"num_workers": 0}}), rm_resource_pool=None
        )
        self.teacher_model_manager, self.distillation_config = None, None
        self._start_rollout_servers()
        for rt in self.agents.values():
            ce_config = omega_conf_to_dataclass(rt.config.actor_rollout_ref.rollout.checkpoint_engine)
            ce_config.backend = "naive"  # colocated hybrid workers, as verl's own trainer
            rt.checkpoint = CheckpointEngineManager(
                config=ce_config, actor_wg=rt.worker_group, replicas=rt.llm.get_replicas()
            )
        main = self.agents.get(self.multi_agent.owner_of(self.multi_agent.main)) or next(iter(self.agents.values()))
        # verl's untouched paths (validation with a colocated reward model, profiling) see the main model
        self.actor_rollout_wg = self.ref_policy_wg = main.worker_group
        self.llm_server_manager, self.checkpoint_manager = main.llm, main.checkpoint
        for rt in self._trainable():
            rt.checkpoint.sleep_replicas()
        self._load_checkpoint()

    @auto_await
    async def _start_rollout_servers(self) -> None:
        """Every engine-owning agent's ``AgentLLMServerManager``, started concurrently when the agents have pools
        of their own (verl's ``create`` is a coroutine); a LoRA agent on another agent's base then shares that
        agent's manager (config/lora.py)."""

        async def start(rt: AgentRuntime) -> None:
            pool = self.resource_pool_manager.get_resource_pool((rt.name, self._role(rt)))
            offset = rt.config.actor_rollout_ref.rollout.custom[REPLICA_OFFSET_KEY]
            rt.llm = await AgentLLMServerManager.create(
                config=rt.config, worker_group=rt.worker_group, rollout_resource_pool=pool, start_rank=offset
            )

        hosts = {name: self.plan.adapter_hosts.get(name, name) for name in self.agents}
        owners = [rt for name, rt in self.agents.items() if hosts[name] == name]
        if self._start_together():
            await asyncio.gather(*(start(rt) for rt in owners))
        else:  # one pool: one after the other, as the worker groups
            for rt in owners:
                await start(rt)
        for name, rt in self.agents.items():
            rt.llm = self.agents[hosts[name]].llm

    def _start_together(self) -> bool:
        """Whether the agents' worker groups and servers start concurrently: only on pools of their own (see _setup)."""
        return self.multi_agent.placement != "shared"

    def _agent_runtimes(self) -> dict[str, AgentRuntime]:
        ma, hosts = self.multi_agent, self.plan.adapter_hosts
        # copies: the runtime configs gain the replica offsets below, the plan stays as built
        configs = {name: copy.deepcopy(cfg) for name, cfg in self.plan.local_configs.items()}
        own = {name: hosts.get(name, name) == name for name in configs}  # guests have no replicas
        # decoupled sides count the other side's owners too, so that their replicas never share a rank
        offsets = side_replica_offsets(ma, {name: _replica_count(cfg) if own[name] else 0
                                            for name, cfg in configs.items()})
        runtimes = {}
        for spec in ma.local_owners:
            cfg = configs[spec.name]
            with open_dict(cfg):  # a guest's workers push their adapter to its host's replicas
                cfg.actor_rollout_ref.rollout.custom[REPLICA_OFFSET_KEY] = offsets[hosts.get(spec.name, spec.name)]
                # the agents on its vLLM engine and their ids (vllm_rollout/lora.py)
                if spec.name in self.plan.vllm_adapters:
                    cfg.actor_rollout_ref.rollout.custom[VLLM_ADAPTERS_KEY] = self.plan.vllm_adapters[spec.name]
            runtimes[spec.name] = AgentRuntime(
                name=spec.name,
                trainable=spec.trainable,
                config=cfg,
                plays=tuple(n for n in ma.agents if ma.owner_of(n) == spec.name),
                tokenizer=omega_conf_to_dataclass(cfg.actor_rollout_ref.model, dataclass_type=HFModelConfig).tokenizer,
                use_reference_policy=spec.trainable and need_reference_policy(cfg),
                ref_in_actor=lora_settings(cfg.actor_rollout_ref.model) is not None,  # verl's rule for LoRA
            )
        return runtimes

    @staticmethod
    def _role(rt: AgentRuntime) -> Role:
        return Role.ActorRolloutRef if rt.use_reference_policy and not rt.ref_in_actor else Role.ActorRollout

    def _init_resource_pool_mgr(self):
        """``multi_agent.placement``: ``separate``, a pool ``agent_<name>`` per model owner (its share of the GPUs);
        ``shared``, one pool ``agents_shared`` of all GPUs whose bundles every owner's worker group uses (verl
        gives each worker ``1 / max_colocate_count`` of its bundle's GPU: at least 3 groups fit, as in verl)."""
        shared = self.multi_agent.placement == "shared"
        self.role_worker_mapping, self.mapping, spec = {}, {}, {}
        for rt in self.agents.values():
            key = (rt.name, self._role(rt))
            self.role_worker_mapping[key] = ray.remote(AgentActorRolloutRefWorker)
            self.mapping[key] = SHARED_POOL if shared else f"agent_{rt.name}"
            spec[self.mapping[key]] = [rt.config.trainer.n_gpus_per_node]
        colocate = max(ResourcePoolManager.max_colocate_count, len(self.agents) if shared else 1)
        pins = {} if shared else {f"agent_{s.name}": s.node_resource
                                  for s in self.multi_agent.local_owners if s.node_resource}
        # verl's manager plus optional node pins and a per-node fit check (a pool no node can hold would wait forever)
        self.resource_pool_manager = PinnedResourcePoolManager(
            resource_pool_spec=spec, mapping=self.mapping, max_colocate_count=colocate, node_resources=pins
        )

    def _spawn_workers(self, rt: AgentRuntime) -> None:
        role = self._role(rt)
        cls = RayClassWithInitArgs(
            cls=self.role_worker_mapping[(rt.name, role)],
            config=rt.config.actor_rollout_ref,
            distillation_config=None,
            role=str(role),
        )
        group = RayWorkerGroup(
            resource_pool=self.resource_pool_manager.get_resource_pool((rt.name, role)),
            ray_cls_with_init=create_colocated_worker_cls(class_dict={str(role): cls}),
            device_name=self.config.trainer.device,
        )
        rt.worker_group = group.spawn(prefix_set={str(role)})[str(role)]
        rt.worker_group.init_model()
        self._report_placement(rt)

    def _report_placement(self, rt: AgentRuntime) -> None:
        """Print where Ray placed each worker of ``rt`` (asked inside the worker: placement group, GPU ids), one
        line per worker: ``mgrpo placement: agent <name> rank <r> pool <pool> placement_group <id> bundle <r>
        gpus <ids>``. Tests read it to check that ``placement: shared`` puts agents on the same GPUs."""
        pool = self.mapping[(rt.name, self._role(rt))]
        where = ray.get([w.__ray_call__.remote(_worker_placement) for w in rt.worker_group.workers])
        for rank, (group, gpus) in enumerate(where):
            print(f"mgrpo placement: agent {rt.name} rank {rank} pool {pool} placement_group {group} bundle {rank} "
                  f"gpus {','.join(gpus)}", flush=True)

    def get_reward_handles(self) -> list:
        """What verl's agent loops get as reward workers: :class:`~mgrpo_verl.agent_loops.common.UnscoredRows`,
        which refuses a trajectory a loop left unscored (none started, see ``_setup``)."""
        return [UnscoredRows()]

    def _trainable(self) -> list[AgentRuntime]:
        return [rt for rt in self.agents.values() if rt.trainable]

    def get_llm_client(self) -> MultiAgentLLMClient:
        ma = self.multi_agent
        clients = {}
        for name in ma.agents:
            owner = ma.owner_of(name)
            llm = self.agents[owner].llm
            # on a shared engine (adapter_hosts) the client's requests name the owner's adapter
            clients[name] = (llm.get_client(client_cls=AdapterLLMServerClient, lora_name=owner)
                             if owner in self.plan.adapter_hosts else llm.get_client())
        return MultiAgentLLMClient(clients, main=ma.main)

    # ------------------------------------------------------------------------------------ weight sync

    def on_init_end(self):
        for rt in self.agents.values():  # frozen models too: their servers start from the model path
            rt.checkpoint.update_weights(self.global_steps)
        if self.multi_agent.placement == "shared":
            # a frozen actor is never used again once its engine has the weights: free its GPU memory for the
            # agents that share the GPU (verl's own offload, as param_offload would do)
            for rt in self.agents.values():
                if not rt.trainable:
                    rt.worker_group.to("cpu", model=True, optimizer=True, grad=True)

    def on_sample_end(self):
        for rt in self._trainable():
            rt.checkpoint.sleep_replicas()

    def on_step_end(self):
        for rt in self._trainable():
            with marked_timer(f"agent/{rt.name}/update_weights", self.timing_raw):
                rt.checkpoint.update_weights(self.global_steps)

    # ------------------------------------------------------------------------------------------- step

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        """One step on every agent's rows; returns every key and tag the step wrote (verl counts and clears them)."""
        # 1. sample: the step's rows of every agent, from verl's replay buffer
        with marked_timer("gen", timing_raw, color="red"):
            batch = self._sample(metrics, sample_batch_size)
        with marked_timer("adv", timing_raw, color="brown"):
            # 2. score and advantages: on the real rows together, in trajectory order, written to TransferQueue;
            #    then the hook
            batch, table, advantage = self._compute_row_advantages(batch)
            self.on_advantages(table, batch)  # decoupled main side: publish its records
            # 3. align: every sub-agent to D_max rows per main rollout; each model's update set
            alignment, updates = self._plan_updates(table, advantage)
        # 4. log: per-agent and alignment statistics of the real rows; keep them for the rollout dump
        metrics.update(row_metrics(table, advantage, batch.tags, alignment))
        self.step_rows = StepRows(self.global_steps, batch.partition_id, table, advantage, alignment)
        # 5. update each trainable model on its rows (aligned copies first, then verl's chain per model)
        keys, tags = self._train_models(batch, table, updates, metrics, timing_raw)
        return KVBatchMeta(partition_id=batch.partition_id, keys=keys, tags=tags)

    def _sample(self, metrics: dict, batch_size: int) -> KVBatchMeta:
        """The step's rows from verl's replay buffer, between the sample hooks (as verl's step); adds its
        off-policy metrics."""
        self.on_sample_begin()
        batch, off_policy = self.replay_buffer.sample(global_steps=self.global_steps, partition_id="train",
                                                      batch_size=batch_size)
        metrics.update(off_policy)
        self.on_sample_end()
        return batch

    def _compute_row_advantages(self, batch: KVBatchMeta) -> tuple[KVBatchMeta, RowTable, np.ndarray]:
        """``batch`` in trajectory order (the same on every run, whatever order rollouts finished in), the row table
        of its real rows and their advantages (``multi_agent.algorithm``), written back as ``rm_scores`` (each
        row's own score), ``advantages`` and ``returns``."""
        ma = self.multi_agent
        batch, table = read_row_table(batch)
        advantage = scalar_advantages(table, ma.algorithm, ma.magrpo if ma.algorithm == "magrpo" else ma.mgrpo)
        write_row_values(list(batch.keys), batch.partition_id,
                         {"rm_scores": table.score, "advantages": advantage, "returns": advantage})
        return batch, table, advantage

    def on_advantages(self, table: RowTable, batch: KVBatchMeta) -> None:
        """Called once the step's advantages are computed and written, before any model trains."""
        return

    def _plan_updates(self, table: RowTable, advantage: np.ndarray):
        """(alignment or None, model name -> :class:`~mgrpo_verl.trainer.rows.UpdateSet`) of the step."""
        ma = self.multi_agent
        alignment = None
        if (~table.is_main).any():
            alignment = plan_resolved_alignment(table.parent_row, table.agent, table.uid, ma.d_max,
                                                seed=self.global_steps)
        owner_of = {n: ma.owner_of(n) for n in ma.agents}
        return alignment, plan_update_sets(table, alignment, advantage, owner_of)

    def _train_models(self, batch: KVBatchMeta, table: RowTable, updates: dict, metrics: dict, timing_raw: dict):
        """Each local trainable model's update on its rows, with verl's own balance / old-log-prob /
        reference / actor-update methods called on an :class:`AgentView` of that model. ``batch`` holds
        the step's real rows in TransferQueue. Returns every key and tag the step wrote (real rows,
        copies, verl's padding), in agent order.

        Differs from verl (one policy): the aligned copies of every model are written first, on this
        thread (their keys come from one shared set); then each model's chain runs, in a thread of its
        own when the models own disjoint resource pools (:meth:`_concurrent_updates`), else one after the
        other. Metrics and ``agent/<name>/*`` timings are gathered per model and merged in agent order,
        so both ways give the same dicts; ``agent_updates`` times the whole phase."""
        keys, tags = list(batch.keys), list(batch.tags)
        taken = set(keys) | set(table.keys)
        tag_of = dict(zip(keys, tags))
        jobs = []  # (runtime, rows, copy keys, copy tags, update size)
        skipped = []
        for rt in self._trainable():
            update = updates.get(rt.name)
            # every step, for every trainable model: 1.0 without rows (nothing trains), else 0.0 (main_ppo's summary)
            metrics[f"agent/{rt.name}/skipped"] = float(update is None or not len(update))
            if update is None or not len(update):
                skipped.append(rt)
                continue
            with marked_timer(f"agent/{rt.name}/align", timing_raw):
                new_keys = copy_keys(table, update, taken)
                new_tags = write_copies(batch, table, update, new_keys)
            tag_of.update(zip(new_keys, new_tags))
            real = iter(new_keys)
            rows_keys = [next(real) if c else table.keys[s] for s, c in zip(update.source, update.copy)]
            rows = KVBatchMeta(
                partition_id=batch.partition_id,
                keys=rows_keys,
                tags=[tag_of[k] for k in rows_keys],
                extra_info={"temperature": rt.config.actor_rollout_ref.rollout.temperature},
            )
            jobs.append((rt, rows, new_keys, new_tags, len(update)))
        self._warn_rowless(skipped, [job[0] for job in jobs])
        concurrent = self._concurrent_updates([job[0] for job in jobs])
        with marked_timer("agent_updates", timing_raw):
            results = _run_agent_updates(self._update_agent, [(rt, rows) for rt, rows, *_ in jobs], concurrent)
        metrics["mgrpo/concurrent_updates"] = float(concurrent)
        for (rt, _, new_keys, new_tags, size), (agent_metrics, agent_timing, pads) in zip(jobs, results):
            keys.extend(new_keys)
            tags.extend(new_tags)
            keys.extend(k for k, _ in pads)
            tags.extend(t for _, t in pads)
            for name, seconds in agent_timing.items():
                timing_raw[name] = timing_raw.get(name, 0.0) + seconds
            metrics.update({f"agent/{rt.name}/{k}": v for k, v in agent_metrics.items()})
            metrics[f"agent/{rt.name}/update_rows"] = float(size)
        return keys, tags

    def _warn_rowless(self, skipped: list[AgentRuntime], trained: list[AgentRuntime]) -> None:
        """Count the step's trainable models without rows (:class:`~mgrpo_verl.trainer.rowless.RowlessSteps`); from
        the third step in a row without rows, print a warning naming the agent each step (it reaches the
        driver's terminal through Ray, as the trainer's other prints)."""
        counter = self.__dict__.get("rowless_steps")
        if counter is None:
            counter = self.rowless_steps = RowlessSteps(main=self.multi_agent.main)
        plays = {rt.name: rt.plays for rt in skipped}
        for warning in counter.observe(self.global_steps, [rt.name for rt in skipped], [rt.name for rt in trained],
                                       plays):
            print(warning, flush=True)

    def _update_agent(self, rt: AgentRuntime, rows: KVBatchMeta) -> tuple[dict, dict, list[tuple[str, dict]]]:
        """One model's chain on its rows: verl's balance (which may add padding rows), zero advantages
        for those padding rows, old log-probs, reference log-probs, actor update. Thread-safe for distinct
        models: it writes only to its own dicts and rows, and to TransferQueue keys of its own. Returns
        (metrics without the agent prefix, ``agent/<name>/*`` timings, verl's padding rows as (key, tag))."""
        view = AgentView(self, rt)
        agent_metrics: dict = {}
        timing: dict = {}
        before = set(rows.keys)
        rows = view._balance_batch(rows, metrics=agent_metrics)
        pads = [(k, t) for k, t in zip(rows.keys, rows.tags) if k not in before]
        # verl's padding rows copy a real row's fields: give them advantages of their own length
        zeros = np.zeros(len(pads))
        write_row_values([k for k, _ in pads], rows.partition_id, {"advantages": zeros, "returns": zeros})
        with marked_timer(f"agent/{rt.name}/old_log_prob", timing):
            rows = view._compute_old_log_prob(rows, metrics=agent_metrics)
        if rt.use_reference_policy:
            with marked_timer(f"agent/{rt.name}/ref", timing):
                rows = view._compute_ref_log_prob(rows, metrics=agent_metrics)
        # verl's old-log-prob step returns the rows with the field list of that moment, which lacks
        # ref_log_prob (verl's own step refreshes it when it writes advantages, which we wrote
        # earlier); None makes the update read every field of its rows
        rows.fields = None
        with marked_timer(f"agent/{rt.name}/update_actor", timing):
            view._update_actor(rows, metrics=agent_metrics)
        return agent_metrics, timing, pads

    def _concurrent_updates(self, agents: list[AgentRuntime]) -> bool:
        """Whether the models' update chains run in threads of their own: ``multi_agent.concurrent_updates``
        ``auto`` (the default) when at least two models update and every one owns a resource pool of its
        own (models sharing a pool share GPUs: they stay sequential); ``false``: always sequential."""
        if self.multi_agent.concurrent_updates is False or len(agents) < 2:
            return False
        pools = [self.resource_pool_manager.get_resource_pool((rt.name, self._role(rt))) for rt in agents]
        return len({id(pool) for pool in pools}) == len(pools)

    # ---------------------------------------------------------------------------------- rollout dumps

    def _log_rollout_data(self, batch: KVBatchMeta, timing_raw: dict, rollout_data_dir: str):
        """fit's step 6 (``trainer.rollout_data_dir``): the step's real rows, each decoded with its own agent's
        tokenizer, with its advantage and alignment fate, to ``<rollout_data_dir>/<step>.jsonl``
        (docs/rollouts.md). Differs from verl, which decodes every key of the step (aligned copies and padding
        rows included) with the main model's tokenizer and names no agent. A step that kept no
        :class:`StepRows` (the decoupled sub side's) gets verl's dump."""
        step = self.step_rows
        if step is None or step.step != self.global_steps:
            return super()._log_rollout_data(batch, timing_raw, rollout_data_dir)
        with marked_timer("dump_rollout_generations", timing_raw, color="green"):
            rows = rollout_log.read_rollouts(
                list(step.table.keys), step.partition_id, step.step, rollout_log.TRAIN, self._tokenizer_of,
                advantage=step.advantage, fates=rollout_log.alignment_fates(len(step.table), step.alignment),
                trainable=self._agent_trains,
            )
            self._dump_rollouts(rows, rollout_log.dump_path(rollout_data_dir, step.step, rollout_log.TRAIN),
                                rollout_log.TRAIN)

    def _validate(self) -> dict[str, float]:
        """verl's validation; with ``trainer.validation_data_dir``, every validation row is also read as verl samples
        it (before verl clears it: :class:`~mgrpo_verl.trainer.rollout_log.SampleRecorder` stands in for the
        replay buffer meanwhile) and dumped to ``<validation_data_dir>/agents/<step>.jsonl``, beside verl's own
        ``<step>.jsonl`` (kept as verl writes it: ``experiments/research_eval.py`` reads it)."""
        directory = self.config.trainer.get("validation_data_dir", None)
        if not directory:
            return super()._validate()
        buffer = self.replay_buffer
        recorder = rollout_log.SampleRecorder(buffer, self._read_validation_rows)
        self.replay_buffer = recorder
        try:
            metrics = super()._validate()
        finally:
            self.replay_buffer = buffer
        self._dump_rollouts(recorder.rows, rollout_log.dump_path(directory, self.global_steps, rollout_log.VAL),
                            rollout_log.VAL)
        return metrics

    def _read_validation_rows(self, batch: KVBatchMeta) -> list[dict]:
        return rollout_log.read_rollouts(list(batch.keys), batch.partition_id, self.global_steps, rollout_log.VAL,
                                         self._tokenizer_of)

    def _dump_rollouts(self, rows: list[dict], path: str, split: str) -> None:
        """A table of sample trajectories per agent to the trackers (wandb, tensorboard: verl's ``Tracking``), then
        the rows written to ``path`` in verl's dump thread (its failures surface at the next dump, as verl's)."""
        rollout_log.log_sample_tables(getattr(self, "logger", None), rows, split, self.global_steps)
        self._dump_futures.append(self._dump_executor.submit(rollout_log.write_rows, rows, path))
        pending = []
        for future in self._dump_futures:
            if future.done():
                future.result()
            else:
                pending.append(future)
        self._dump_futures = pending

    def _runtime_of(self, agent: str) -> AgentRuntime | None:
        """The runtime of the model that plays ``agent`` here, ``None`` for an agent played elsewhere or unknown."""
        ma = self.multi_agent
        return self.agents.get(ma.owner_of(agent)) if agent in ma.agents else None

    def _tokenizer_of(self, agent: str):
        """The tokenizer of the model that plays ``agent`` (the main model's for an agent played elsewhere)."""
        rt = self._runtime_of(agent)
        return rt.tokenizer if rt is not None else self.tokenizer

    def _agent_trains(self, agent: str) -> bool:
        rt = self._runtime_of(agent)
        return rt is not None and rt.trainable

    # ------------------------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self):
        """All or nothing (:mod:`mgrpo_verl.trainer.checkpoints`): every trainable agent's actor, ``data.pt`` and
        ``agents.json``, then the completion marker, then the tracker; older complete step folders are pruned
        only after that (verl's per-worker ``max_ckpt_to_keep`` deletion is off: it would remove an agent's
        previous actor before the other agents' new ones exist)."""
        from verl.utils.fs import local_mkdir_safe

        trainer = self.config.trainer
        root = trainer.default_local_dir
        folder = ckpt.step_dir(root, self.global_steps)
        keep = 1 if trainer.get("remove_previous_ckpt_in_save", False) else trainer.get("max_actor_ckpt_to_keep", None)
        saved = [rt.name for rt in self._trainable()]
        if os.path.exists(folder):  # left by a run that resumed from an earlier step, or a save cut short
            logger.warning("replacing the existing checkpoint folder %s", folder)
            ckpt.remove_folder(folder)
        for rt in self._trainable():
            sub = ckpt.actor_subdir(rt.name)
            remote = (None if trainer.default_hdfs_dir is None
                      else os.path.join(trainer.default_hdfs_dir, f"global_step_{self.global_steps}", sub))
            rt.worker_group.save_checkpoint(os.path.join(folder, sub), remote, self.global_steps, max_ckpt_to_keep=None)
        local_mkdir_safe(folder)
        torch.save(self.train_dataloader.state_dict(), os.path.join(folder, ckpt.DATA))
        manifest = {
            rt.name: {"model": rt.config.actor_rollout_ref.model.path, "trainable": rt.trainable,
                      "plays": list(rt.plays)}
            for rt in self.agents.values()
        }
        # a LoRA agent's settings, which the merged export needs (trainer/lora_export.py)
        for rt in self.agents.values():
            if (lora := lora_settings(rt.config.actor_rollout_ref.model)) is not None:
                manifest[rt.name]["lora"] = lora
        ckpt.write_atomic(os.path.join(folder, ckpt.MANIFEST), json.dumps(manifest, indent=2))
        ckpt.write_marker(folder, self.global_steps, saved)  # after fsync of all the step's files
        ckpt.write_atomic(os.path.join(root, ckpt.TRACKER), str(self.global_steps))
        self.checkpoint_callback.on_save(trainer=self, global_step=self.global_steps, checkpoint_dir=folder,
                                         async_save=False)
        ckpt.prune(root, self.global_steps, keep, saved)

    def _resume_folder(self) -> str | None:
        """A complete step folder, or None for ``disable`` / nothing saved yet. Differs from verl: never a partial
        folder; ``auto`` falls back to the newest complete one (with a warning), ``resume_path`` to a partial
        folder raises, and folders that exist with none complete raise instead of training from base weights."""
        trainer = self.config.trainer
        return ckpt.resume_folder(trainer.resume_mode, trainer.resume_from_path, trainer.default_local_dir,
                                  [rt.name for rt in self._trainable()])

    def _load_checkpoint(self):
        self.global_steps = 0
        folder = self._resume_folder()
        if folder is None:
            logger.info("Training from scratch")
            return
        marker, frozen = ckpt.read_marker(folder), ckpt.frozen_when_saved(folder)
        load = []
        for rt in self._trainable():
            path = os.path.join(folder, ckpt.actor_subdir(rt.name))
            if (marker is None or rt.name in marker["agents"]) and os.path.isdir(path):
                load.append((rt, path))
            elif rt.name in frozen:  # its weights at that step were its model path's: nothing is lost
                logger.warning("agent %r was frozen at %s: it starts from %s", rt.name, folder,
                               rt.config.actor_rollout_ref.model.path)
            else:
                raise ckpt.CheckpointError(
                    f"{folder} has no weights of agent {rt.name!r}, which is trainable now, and its agents.json does "
                    f"not list it as frozen (saved: {marker['agents'] if marker else 'unknown'}). Resume with the "
                    "agents of that run, or set trainer.resume_mode=disable."
                )
        for rt, path in load:
            rt.worker_group.load_checkpoint(local_path=path,
                                            del_local_after_load=self.config.trainer.del_local_ckpt_after_load)
        state = os.path.join(folder, ckpt.DATA)
        if os.path.exists(state):
            self.train_dataloader.load_state_dict(torch.load(state, weights_only=False))
        self.global_steps = ckpt.step_of(folder)
        logger.info("Resumed from %s at global step %d", folder, self.global_steps)


SHARED_POOL = "agents_shared"
"""Name of the one resource pool of ``multi_agent.placement: shared``."""


def _worker_placement(worker) -> tuple[str, list[str]]:
    """Run inside a worker actor (``__ray_call__``): its placement group id and the GPU ids Ray gave it."""
    context = ray.get_runtime_context()
    group = context.get_placement_group_id() or "none"
    return group, sorted(str(i) for i in context.get_accelerator_ids().get("GPU", []))


def _replica_count(config) -> int:
    """Rollout replicas of one agent: its GPUs over the GPUs of one replica (verl's rule)."""
    rollout = config.actor_rollout_ref.rollout
    world = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    return config.trainer.n_gpus_per_node // world


# ------------------------------------------------------------------------------ per-agent view / threads

#: verl's step methods that :meth:`MultiAgentTrainer._update_agent` calls on an :class:`AgentView`.
AGENT_STEP_METHODS = ("_balance_batch", "_compute_old_log_prob", "_compute_ref_log_prob", "_update_actor")
#: Attributes those methods read (directly or through the methods below) that differ per model.
AGENT_VIEW_ROUTED = ("config", "actor_rollout_wg", "ref_policy_wg", "tokenizer", "use_reference_policy", "ref_in_actor")
#: Attributes they read that are the same for every model: taken from the trainer.
AGENT_VIEW_SHARED = ("use_critic", "global_steps", "distillation_config")
#: Trainer methods they call on ``self``: bound to the view, so that they too see the model's attributes.
AGENT_VIEW_METHODS = ("_get_required_batch_multiple",)


class AgentView:
    """The trainer as one model's update sees it, for verl's step methods (:data:`AGENT_STEP_METHODS`).

    Differs from verl, where those methods act on the trainer's single policy: the attributes in
    :data:`AGENT_VIEW_ROUTED` are the model's (``rt.config``, ``rt.worker_group`` as actor and reference
    group, ``rt.tokenizer``, ``rt.use_reference_policy``, ``rt.ref_in_actor``); any other attribute is the trainer's
    (verl's methods read :data:`AGENT_VIEW_SHARED`), and the trainer's methods are bound to the view
    (:data:`AGENT_VIEW_METHODS`). A view replaces swapping those attributes on the trainer itself, which
    two models updating in threads at once could not share. Writing any attribute raises: verl's step
    methods write none (``tests/contract/test_agent_view.py`` checks the list against verl's source), and
    a write would otherwise land on the view silently, or leak between models.
    """

    __slots__ = ("_trainer", *AGENT_VIEW_ROUTED)

    def __init__(self, trainer: PPOTrainer, rt: AgentRuntime):
        routed = {
            "config": rt.config,
            "actor_rollout_wg": rt.worker_group,
            "ref_policy_wg": rt.worker_group,
            "tokenizer": rt.tokenizer,
            "use_reference_policy": rt.use_reference_policy,
            "ref_in_actor": rt.ref_in_actor,  # a LoRA agent's reference: its actor, adapter off
        }
        object.__setattr__(self, "_trainer", trainer)
        for name, value in routed.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):  # only for names that are not routed
        trainer = object.__getattribute__(self, "_trainer")
        cls = type(trainer)
        if name not in getattr(trainer, "__dict__", {}):
            member = inspect.getattr_static(cls, name, None)
            if isinstance(member, (types.FunctionType, property)):
                return member.__get__(self, cls)
        return getattr(trainer, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(
            f"AgentView: verl's step method set self.{name}; the per-agent view forbids writes (they would be "
            f"lost or shared between agents updating at once): update AGENT_VIEW_* in mgrpo_verl/trainer/per_agent.py"
        )


class AgentUpdateError(RuntimeError):
    """A model's update chain failed; ``agent`` names the model, the cause is chained."""

    def __init__(self, agent: str, error: BaseException):
        super().__init__(f"update of agent {agent!r} failed: {type(error).__name__}: {error}")
        self.agent = agent


def _run_agent_updates(update: Callable, jobs: list[tuple[AgentRuntime, KVBatchMeta]], concurrent: bool) -> list:
    """``update(rt, rows)`` for every job, in agent order, or in one thread per job when ``concurrent``
    (the worker-group calls wait on Ray, which releases the GIL). Returns the results in job order.
    Every thread is waited for; a failure raises :class:`AgentUpdateError` for the first failed agent in
    job order, naming the others in a note."""
    if not concurrent:
        results = []
        for rt, rows in jobs:
            try:
                results.append(update(rt, rows))
            except Exception as err:
                raise AgentUpdateError(rt.name, err) from err
        return results
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="mgrpo-update") as pool:
        futures = [pool.submit(update, rt, rows) for rt, rows in jobs]
        wait(futures)
    failed = [(rt.name, f.exception()) for (rt, _), f in zip(jobs, futures) if f.exception() is not None]
    if failed:
        name, err = failed[0]
        error = AgentUpdateError(name, err)
        if len(failed) > 1:
            error.add_note("other agents that failed in the same step: " + ", ".join(
                f"{n!r} ({type(e).__name__}: {e})" for n, e in failed[1:]))
        raise error from err
    return [f.result() for f in futures]
