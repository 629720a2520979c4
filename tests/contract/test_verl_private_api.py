"""Every private verl 0.9.1 name mgrpo_verl uses, checked on CPU in seconds: after a verl upgrade these
fail first, and each failure names our file that depends on it and what to re-check there.

"Private": a leading underscore, or an attribute / behaviour that verl does not document (an attribute
its own code sets and reads, a key format, what a method does besides its return value). The table is
:data:`SEAMS` (name -> our users -> why); every test here is parametrised from it:

- ``test_seam_exists``: the name resolves;
- ``test_seam_signature``: its parameters are the ones we call it with, and an override of ours has the
  same parameters (verl calls it, sometimes by keyword);
- ``test_seam_source_unchanged``: where our code depends on what it *does* (we re-implement it, call it
  as a step of our own pipeline, or rely on a side effect), the sha256 of its source
  (:func:`mgrpo_verl.platform.patching.source_sha256`, the patches' guard) equals the recorded one;
- ``test_seam_behaviour``: a targeted check of the one fact we rely on (a key format, an attribute set in
  ``__init__``, which methods read an attribute...), for seams where that says more than a hash;
- ``test_every_private_verl_name_we_use_is_listed``: scans ``mgrpo_verl/`` (overridden ``_`` methods of
  verl classes, ``self._x`` / ``super()._x`` resolving to a verl class, ``from verl... import _x``,
  ``X._y`` on a name imported from verl, ``obj._x`` and ``getattr(obj, "_x")`` naming an attribute only
  verl defines) and fails on a private name that is not in the table.

Covered elsewhere, referenced rather than repeated: the attributes verl's four step methods read on
``self`` (``AgentView``, tests/contract/test_agent_view.py); the replica-rank seams of rollout adapters
(``replica_rank`` constructor argument, ``init_hybrid`` slicing, ``rollout_replica_class`` with verl's
real classes: tests/trainer/test_vllm_seams.py; here only their hash / hook checks); the runtime patches (tests/platform/test_verl_patch.py,
tests/platform/test_verl_offload_patch.py, tests/platform/test_verl_logprobs_patch.py).

When a hash fails: read verl's new source of that name, adapt the user named in the message, then record
the new hash printed in the message.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import textwrap
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import verl

from mgrpo_verl.platform.patching import source_sha256

PACKAGE = Path(__file__).resolve().parents[2] / "mgrpo_verl"
VERL_ROOT = Path(verl.__file__).resolve().parent

TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base"
AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
AGENT_LOOP_TQ = "verl.trainer.ppo.v1.agent_loop_tq"
TOOL_LOOP = "verl.experimental.agent_loop.tool_agent_loop"
PER_AGENT = "mgrpo_verl/trainer/per_agent.py"
DECOUPLED = "mgrpo_verl/trainer/decoupled.py"
ROWS = "mgrpo_verl/trainer/rows.py"
TOOL_DELEGATION = "mgrpo_verl/agent_loops/tool_delegation.py"
SUB_SERVICE = "mgrpo_verl/agent_loops/sub_service.py"
VLLM_LORA = "mgrpo_verl/vllm_rollout/lora.py"
VLLM_UTILS = "verl.workers.rollout.vllm_rollout.utils"
VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"


@dataclass(frozen=True)
class Seam:
    """One private verl name we use.

    ``target``: ``module:qualified.name``. ``users``: our files that use it. ``why``: what we rely on.
    ``params``: its parameter names, as we call or override it (``None``: not a callable we call).
    ``overrides``: our methods (``module:qualified.name``) that override it: same parameters required.
    ``sha256``: recorded source hash when we depend on its behaviour; ``recheck``: what to re-check in
    ``users`` when it changes. ``behaviour``: name of a targeted check in :data:`BEHAVIOURS`.
    ``names``: the private names this row covers, for the completeness scan (default: the last part).
    ``requires``: a package the target's module imports that the CPU set-up may lack (``vllm``: checked in
    ``.venv-vllm``, CI's second run of this file; skipped where it is absent).
    """

    target: str
    users: tuple[str, ...]
    why: str
    params: tuple[str, ...] | None = None
    overrides: tuple[str, ...] = ()
    sha256: str | None = None
    recheck: str = ""
    behaviour: str | None = None
    names: tuple[str, ...] = field(default=())
    requires: str | None = None

    @property
    def id(self) -> str:
        return self.target.split(":", 1)[1]

    @property
    def private_names(self) -> tuple[str, ...]:
        return self.names or (self.id.rsplit(".", 1)[-1],)


SEAMS: tuple[Seam, ...] = (
    # ---- PPOTrainer: setup, re-implemented per agent
    Seam(f"{TRAINER_BASE}:PPOTrainer._setup", (PER_AGENT, DECOUPLED),
         "MultiAgentTrainer._setup re-implements verl's setup steps once per agent (DecoupledMain/Sub "
         "extend it with super()); a step verl adds here is skipped by us",
         params=("self",), overrides=("mgrpo_verl.trainer.per_agent:MultiAgentTrainer._setup",),
         sha256="248aee497276b816dae699b676fc595294f90bb378f652fdf884d756d965b0da",
         recheck="compare verl's steps with MultiAgentTrainer._setup: every attribute verl now sets (managers, "
                 "resource_pool_to_cls, ref_in_actor, distillation/teacher, llm_server_manager, checkpoint_manager) "
                 "must be set per agent or on purpose left out"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._init_tokenizer", (PER_AGENT,),
         "called first in our _setup: sets self.tokenizer / self.processor from the top-level model",
         params=("self",), sha256="c4c19f471702b8276e0a4f9f155c919d1a58186129d2b32b1c0b59570b14fe1f",
         recheck="MultiAgentTrainer._setup calls it before _init_dataloader; check it still only sets the tokenizer/processor"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._init_dataloader", (PER_AGENT,),
         "called in our _setup before the run's plan (config/plan.py) is built: it writes the optimiser horizon "
         "(total_training_steps) into self.config, which every agent config of the plan copies",
         params=("self",), sha256="86cf3749e087b883b1ddfd5b153f1e8c0d1bc83aaa0c66bf43ce63c04602d3c4",
         recheck="MultiAgentTrainer._setup: build_plan (the agent configs) must still come after every "
                 "config value this method writes; its trainer_mode checks see 'sync'"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._init_dump_executor", (PER_AGENT,),
         "called in our _setup as in verl's (rollout data dumps); it sets _dump_executor (one thread) and "
         "_dump_futures, which MultiAgentTrainer._dump_rollouts submits to and drains as verl's _dump_generations",
         params=("self",), sha256="05f0fe277e759c8debbe9404e9c8777f943f5b393b42decd478a7aea80558ebd",
         recheck="MultiAgentTrainer._setup: still needed, still argument-free; _dump_rollouts: the two attributes",
         names=("_init_dump_executor", "_dump_executor", "_dump_futures")),
    Seam(f"{TRAINER_BASE}:PPOTrainer._log_rollout_data", (PER_AGENT,),
         "overridden: fit's step 6 (trainer.rollout_data_dir) writes the step's real rows with agent, trajectory, "
         "parent, turns, advantage and alignment fate (trainer/rollout_log.py) instead of verl's dump; called "
         "before verl clears the step's TransferQueue rows",
         params=("self", "batch", "timing_raw", "rollout_data_dir"),
         overrides=("mgrpo_verl.trainer.per_agent:MultiAgentTrainer._log_rollout_data",),
         sha256="c1fa53a46df397cb9c843ae919aa6798886d756e8864c27ac25c37602cfd218d",
         recheck="MultiAgentTrainer._log_rollout_data: where verl writes (<dir>/<step>.jsonl), what it now dumps"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._validate", (PER_AGENT,),
         "overridden around super(): with trainer.validation_data_dir, self.replay_buffer is a SampleRecorder "
         "during the call, which reads every batch verl samples from partition 'val' before verl clears it "
         "(verl's own validation dump, <dir>/<step>.jsonl, is left as it is)",
         params=("self",), overrides=("mgrpo_verl.trainer.per_agent:MultiAgentTrainer._validate",),
         sha256="f1d58a70e91d7883d78f827c5fb583094ae307c85f6e50ec7a6b4e44092f5bfa",
         recheck="MultiAgentTrainer._validate / rollout_log.SampleRecorder: verl still samples each validation "
                 "batch through self.replay_buffer.sample and clears it afterwards; its dump's file name"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._init_resource_pool_mgr", (PER_AGENT,),
         "overridden: one pool (or the shared pool) per agent; we set role_worker_mapping, mapping and "
         "resource_pool_manager as verl's does, keyed by (agent, role)",
         params=("self",), overrides=("mgrpo_verl.trainer.per_agent:MultiAgentTrainer._init_resource_pool_mgr",),
         sha256="9eaa3bab711e4deb4280bda7b256eb868c7b8eeae18b06b3b87c9a79466bb6f2",
         recheck="MultiAgentTrainer._init_resource_pool_mgr: the attributes verl's version sets and the "
                 "ResourcePoolManager arguments (max_colocate_count) it passes"),
    Seam(f"{TRAINER_BASE}:PPOTrainer.__init__", (PER_AGENT,),
         "verl's __init__ assigns self.trainer_mode from the config; MultiAgentTrainer.trainer_mode is a "
         "property that ignores the assignment and always says 'sync' (our trainer is synchronous under its "
         "own name 'multi_agent')",
         params=("self", "config"), sha256="6f938d77859b66aeeceb03a39bc9a7b5e7b6f50004aa8b1e2508f6e289fa1b93",
         recheck="MultiAgentTrainer.trainer_mode / __init__: the attributes __init__ derives from trainer_mode "
                 "(replay buffer class, parameter_sync_step) must still be the synchronous ones",
         behaviour="trainer_mode_readers", names=("trainer_mode",)),
    Seam(f"{TRAINER_BASE}:PPOTrainer.role_worker_mapping", (PER_AGENT,),
         "set by our _init_resource_pool_mgr keyed by (agent, Role); read only by verl's _setup and "
         "_init_resource_pool_mgr, which we override",
         behaviour="pool_attribute_readers", names=("role_worker_mapping", "mapping", "ref_in_actor")),
    # ---- PPOTrainer: the step
    Seam(f"{TRAINER_BASE}:PPOTrainer._step_once", (PER_AGENT, DECOUPLED),
         "overridden: sample, our advantages and aligned copies, then per agent verl's balance / old log-prob "
         "/ ref / update; verl's colocated reward, critic and advantage steps are not run",
         params=("self", "metrics", "timing_raw", "sample_batch_size"),
         overrides=("mgrpo_verl.trainer.per_agent:MultiAgentTrainer._step_once",
                    "mgrpo_verl.trainer.decoupled:DecoupledSubTrainer._step_once"),
         sha256="efdd4abe161c6deeaf6f93e77a132e2636e01bbd0fc8ec2638f043d9c4fc8fb0",
         recheck="MultiAgentTrainer._step_once / _update_agent and DecoupledSubTrainer._step_once: a step verl "
                 "added or reordered (e.g. extra_info written on the sampled batch) must be mirrored per agent"),
    Seam(f"{TRAINER_BASE}:PPOTrainer.step", (PER_AGENT, DECOUPLED),
         "calls our _step_once with (metrics, timing_raw, sample_batch_size) and counts the rows whose tag "
         "lacks is_padding (our aligned copies are tagged is_padding)",
         params=("self", "metrics", "timing_raw"), sha256="e22f53aadb7805d2d15d16ba6528b6ef8628dfab5949ef00abbc339f5a35ec80",
         recheck="rows.write_copies' is_padding tag and MultiAgentTrainer._step_once's return value"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._balance_batch", (PER_AGENT,),
         "called per agent on an AgentView: reorders the agent's rows and may append verl's padding rows, "
         "which _update_agent then gives zero advantages",
         params=("self", "batch", "metrics", "logging_prefix", "keep_minibatch"), sha256="f9b6e887d7504a65d89832af96dc590554ae1b234f84052c067980fba1cd5bb3",
         recheck="MultiAgentTrainer._update_agent: how padding rows are named/tagged (keys not in the input) and "
                 "which fields they copy; the attributes read are pinned by tests/contract/test_agent_view.py"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._compute_old_log_prob", (PER_AGENT,),
         "called per agent on an AgentView; returns the rows with the field list of that moment",
         params=("self", "batch", "metrics"), sha256="b2630e6178ed99f7b55b8e342911e746d7d48e148e87a3da090b0be8d5b8f70f",
         recheck="MultiAgentTrainer._update_agent (rows.fields = None before the update, see the fields seam)"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._compute_ref_log_prob", (PER_AGENT,),
         "called per agent on an AgentView when the agent has a reference policy",
         params=("self", "batch", "metrics"), sha256="f4d69ef51b12c284ab0f9961cd06a36b05b9cc662d9a8cec988701a86a6bf4f1",
         recheck="MultiAgentTrainer._update_agent and AgentView (ref_policy_wg / ref_in_actor routing)"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._update_actor", (PER_AGENT,),
         "called per agent on an AgentView: reads the agent's config for mini-batch / epochs / temperature",
         params=("self", "batch", "metrics"), sha256="d7009bd8a69d40b9e96c13bda5226cc0ab2c18db706606ea88e787b0ccdc3d83",
         recheck="MultiAgentTrainer._update_agent and AgentView: every config key it reads must be the agent's"),
    Seam("transfer_queue.metadata:KVBatchMeta.fields", (PER_AGENT,),
         "_update_agent sets rows.fields = None so the actor update reads every field of its rows "
         "(verl's kv_batch_meta2batch_meta selects fields only when the list is not None)",
         behaviour="fields_none_reads_all", names=("fields",)),
    # ---- PPOTrainer: checkpoints, rewritten per agent
    Seam(f"{TRAINER_BASE}:PPOTrainer._save_checkpoint", (PER_AGENT,),
         "overridden: one actor checkpoint per trainable agent under agents/<name>/actor, data.pt, "
         "agents.json, completion marker, tracker (atomic), checkpoint_callback.on_save, then pruning of whole "
         "complete step folders (verl's max_ckpt_to_keep is not passed: mgrpo_verl/trainer/checkpoints.py)",
         params=("self",), overrides=("mgrpo_verl.trainer.per_agent:MultiAgentTrainer._save_checkpoint",),
         sha256="8c2435b577e54f19ab6012e1eb5f44f01e6c8f4dd6380467914cb6afb9ab9d23",
         recheck="MultiAgentTrainer._save_checkpoint: anything verl now saves (new state, file names, callback "
                 "arguments) must be saved per agent"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._load_checkpoint", (PER_AGENT,),
         "overridden: resume modes auto / disable / resume_path, per-agent actor checkpoints, data.pt",
         params=("self",), overrides=("mgrpo_verl.trainer.per_agent:MultiAgentTrainer._load_checkpoint",),
         sha256="bb446d77c48ac6cc633e86c83b7195b78d899ece10d1b5e7150908acddb17265",
         recheck="MultiAgentTrainer._load_checkpoint / _resume_folder: resume modes and what verl restores"),
    # ---- resource pools
    Seam("verl.trainer.ppo.ray_trainer:ResourcePoolManager._check_resource_available", ("mgrpo_verl/trainer/placement.py",),
         "PinnedResourcePoolManager overrides it: verl's cluster-wide check (super()) then a per-node one",
         params=("self",),
         overrides=("mgrpo_verl.trainer.placement:PinnedResourcePoolManager._check_resource_available",),
         sha256="b0b46038e25a8f2593556cff9d1ed808de712a8143f89735815d5e164f3d4eaa",
         recheck="PinnedResourcePoolManager._check_resource_available: still called by create_resource_pool, "
                 "still only a check (no side effects we skip)"),
    # ---- TransferQueue rows
    Seam(f"{AGENT_LOOP_TQ}:AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess",
         (SUB_SERVICE, ROWS, "mgrpo_verl/agent_loops/delegation.py"),
         "puts an agent loop's outputs into TransferQueue under {uid}_{session_id}_{index} and copies the final "
         "output's reward onto the earlier ones (rows.py rewrites rm_scores from extra_fields['mgrpo']); "
         "SubAgentService overrides it for validation calls",
         params=("self", "output", "validate", "kwargs"),
         overrides=("mgrpo_verl.agent_loops.sub_service:SubAgentService._agent_loop_postprocess",),
         sha256="523edacbff73640dee470baf8c1f09fb3450e4095c05d5d2226f9ef706604b5b",
         recheck="rows.py (key format, COPY_INDEX_BASE, rm_scores rewrite), delegation.py (outputs[-1] is the "
                 "trajectory's final output), SubAgentService._serve (pending keys {uid}_{session}_{i})",
         behaviour="key_format_and_reward_copy"),
    Seam(f"{TRAINER_BASE}:PPOTrainer._validate", (ROWS, PER_AGENT),
         "verl parses TransferQueue keys with key.rsplit('_', 2) (uid may contain '_'); our copy keys "
         "{uid}_{session}_{100000+i} must parse the same way",
         behaviour="keys_parsed_with_rsplit", names=("{uid}_{session}_{index}",)),
    Seam(f"{AGENT_LOOP}:AgentLoopWorker._run_agent_loop", (SUB_SERVICE,),
         "SubAgentService._serve runs one sub-agent call through verl's own loop runner",
         params=("self", "sampling_params", "trajectory", "agent_name", "trace", "kwargs"), sha256="32c3d607c5d4c9fa124c9d53a476689b63aeb2662f28c9cc1933fc6ec3e9e989",
         recheck="SubAgentService._serve: the trajectory dict keys and kwargs it passes, and that the runner still "
                 "ends in _agent_loop_postprocess"),
    Seam(f"{AGENT_LOOP_TQ}:AgentLoopWorkerTQ.__ray_actor_class__", (SUB_SERVICE,),
         "SubAgentService subclasses the plain class behind verl's Ray actor class",
         behaviour="ray_actor_class"),
    Seam("verl.trainer.main_ppo:TaskRunnerV1.__ray_actor_class__", ("mgrpo_verl/main_ppo.py",),
         "DriverTaskRunner (mgrpo_verl.trainer_in_driver) runs the plain class behind verl's TaskRunner actor in the "
         "driver, handed to run_ppo as its task_runner_class, of which run_ppo uses only .remote() and "
         ".run.remote(config) under ray.get (.options only for nsys profiling on CUDA)",
         behaviour="task_runner_hook"),
    Seam(f"{AGENT_LOOP}:AgentLoopWorker._compute_score", (PER_AGENT, "mgrpo_verl/agent_loops/common.py"),
         "the multi-agent trainer starts no reward workers (RewardLoopManager with reward.num_workers 0) and hands "
         "the agent loops [UnscoredRows()]: verl calls a handle only for a trajectory whose last output has no "
         "reward_score, as random.choice(handles).compute_score.remote(data)",
         sha256="cf4b57719ad3c1b236e49fb99dddc4f6cf05bc0fb125e1475ce5c2534af2b742",
         recheck="MultiAgentTrainer.get_reward_handles / common.UnscoredRows: verl must still skip scoring an output "
                 "that has a reward_score, and call only compute_score.remote on a handle",
         behaviour="unscored_rows_refused"),
    Seam("verl.experimental.reward_loop.reward_loop:RewardLoopManager._init_reward_loop_workers", (PER_AGENT,),
         "MultiAgentTrainer._setup builds verl's RewardLoopManager with reward.num_workers 0: it must then start "
         "no worker (and need no other reward key)",
         sha256="d502171166a15f3d2f07188c8824894c03636da30767c3132926aeae7138ab10",
         recheck="MultiAgentTrainer._setup: that num_workers 0 still starts no RewardLoopWorker actor"),
    # ---- agent loops
    Seam(f"{TOOL_LOOP}:ToolAgentLoop._handle_generating_state", (TOOL_DELEGATION,),
         "ToolDelegationLoop overrides it: verl's step, then calls beyond the per-turn cap get an error",
         params=("self", "agent_data", "sampling_params", "ignore_termination"),
         overrides=("mgrpo_verl.agent_loops.tool_delegation:ToolDelegationLoop._handle_generating_state",),
         sha256="c5a8a2c76f069bae6d891a821e8ec01d539214e164b02e3572c196f9ddfc729b",
         recheck="ToolDelegationLoop._handle_generating_state: the states it returns, agent_data.tool_calls, and "
                 "how max_parallel_calls truncates (we set it to sys.maxsize and cap ourselves)"),
    Seam(f"{TOOL_LOOP}:ToolAgentLoop._call_tool", (TOOL_DELEGATION,),
         "ToolDelegationLoop and _SubToolLoop override it: validation, delegation to sub-agents, tool counts",
         params=("self", "tool_call", "tools_kwargs", "agent_data"),
         overrides=("mgrpo_verl.agent_loops.tool_delegation:ToolDelegationLoop._call_tool",
                    "mgrpo_verl.agent_loops.tool_delegation:_SubToolLoop._call_tool"),
         sha256="f89d8960df1fe382689b7c3027e8b19118e2d22822b04617aff35bca8b722567",
         recheck="ToolDelegationLoop._call_tool: the (ToolResponse, reward, metrics) result, how active tools are "
                 "looked up, errors verl now reports itself"),
    Seam(f"{TOOL_LOOP}:ToolAgentLoop.__init__", (TOOL_DELEGATION,),
         "ToolDelegationLoop reads/writes attributes verl's __init__ sets: tools, tool_schemas, tool_parser, "
         "tool_parser_name, max_parallel_calls; and agent_data._active_tools (per-sample tool selection)",
         behaviour="tool_loop_attributes", names=("_active_tools",)),
    Seam(f"{AGENT_LOOP}:_agent_loop_registry", ("mgrpo_verl/agent_loops/testing.py",),
         "the test harness looks registered loops up by name ({name: {'_target_': fqdn}})",
         behaviour="agent_loop_registry"),
    # ---- rollout registries and replicas
    Seam("verl.workers.rollout.base:_ROLLOUT_REGISTRY", ("mgrpo_verl/hf_rollout/__init__.py", "mgrpo_verl/hf_rollout/adapter.py"),
         "our HF adapter is added as (name, 'async') -> fqdn; verl has no public register for adapters",
         behaviour="rollout_registry"),
    Seam("verl.workers.rollout.replica:RolloutReplicaRegistry._registry", ("mgrpo_verl/hf_rollout/__init__.py",),
         "is_registered() looks our name up in it (register() is public)",
         behaviour="replica_registry"),
    Seam("verl.workers.rollout.replica:RolloutReplica.init_hybrid", ("mgrpo_verl/trainer/agents.py",),
         "_offset_replica_class re-implements it with the agent-local rank replica_rank - offset (behaviour "
         "with verl's real classes: tests/trainer/test_vllm_seams.py)",
         params=("self", "worker_group"), sha256="73c87e25af9a9c00338f0c35f44391c7b0b45a56c3a1a941a759130ff3af6a1e",
         recheck="agents._offset_replica_class.init_hybrid: the steps verl's version takes (rollout_mode, the "
                 "worker slice, launch_servers)"),
    Seam("verl.workers.rollout.llm_server:LLMServerManager.__init__", ("mgrpo_verl/trainer/agents.py",),
         "AgentLLMServerManager sets rollout_replica_class before super().__init__ (verl keeps a preset one) and "
         "passes start_rank",
         behaviour="replica_class_hook", names=("rollout_replica_class",)),
    Seam("verl.workers.rollout.replica:RolloutReplica._server_handle", ("mgrpo_verl/hf_rollout/replica.py",),
         "HFReplica.launch_servers sets _server_handle / _server_address, which verl's server_handle / "
         "server_address properties return",
         behaviour="replica_server_fields", names=("_server_handle", "_server_address")),
    Seam("verl.workers.rollout.llm_server:LLMServerClient._load_balancer", ("mgrpo_verl/agent_loops/multi_client.py",),
         "MultiAgentLLMClient passes the main client's balancer on (getattr(..., '_load_balancer', None): a "
         "rename would silently give None)",
         behaviour="client_load_balancer"),
    Seam("verl.plugin.platform.platform_manager:_current_platform", ("mgrpo_verl/platform/__init__.py",),
         "_resolved_platform() reads verl's platform singleton without resolving it (get_platform() would)",
         behaviour="platform_singleton"),
    Seam("verl.workers.engine.base:EngineRegistry._engines", ("mgrpo_verl/platform/engines.py",),
         "read to mirror verl's cuda engine classes to device cpu: model_type -> backend -> device -> class "
         "(behaviour: tests/platform/test_engines.py)",
         behaviour="engine_registry"),
    Seam("verl.workers.engine.fsdp.transformer_impl:FSDPEngine._build_fsdp_module", ("mgrpo_verl/platform/verl_cpu_offload_pinning.py",),
         "patched; hash-guarded by the patch itself (tests/platform/test_verl_offload_patch.py)",
         behaviour="patch_guarded"),
    Seam("verl.utils.torch_functional:logprobs_from_logits_v2", ("mgrpo_verl/platform/verl_cpu_logprobs.py",),
         "patched on CPU (its row loop runs per token there); hash-guarded with its dispatcher by the patch itself, "
         "through the original when applied (tests/platform/test_verl_logprobs_patch.py)",
         behaviour="logprobs_patch_guarded"),
    Seam("verl.utils.torch_functional:logprobs_from_logits", ("mgrpo_verl/platform/verl_cpu_logprobs.py",),
         "its fallback branch looks logprobs_from_logits_v2 up in the module's globals at each call, which is what "
         "makes the patch's attribute swap reach it; hash-guarded by the patch",
         behaviour="logprobs_patch_guarded"),
    Seam("verl.utils.dataset.multiturn_sft_dataset:MultiTurnSFTDataset._read_files_and_process",
         ("mgrpo_verl/warmstart/dataset.py",),
         "overridden by the warm start's SFT dataset: verl's reads the parquet and sets self.tools, ours then "
         "decodes JSON-text tool lists",
         params=("self",),
         overrides=("mgrpo_verl.warmstart.dataset:JsonToolsSFTDataset._read_files_and_process",),
         sha256="7c9cc7d0873f43d7ecbd6adb64cdb29a08c2fc0389fd671aac10cb1e9e258acd",
         recheck="JsonToolsSFTDataset: that verl still sets self.tools (one entry per row) in this method"),
    # ---- vLLM multi-LoRA across agents (checked where vLLM is installed)
    Seam(f"{VLLM_UTILS}:vLLMColocateWorkerExtension._update_weights", (VLLM_LORA,),
         "AgentLoRAWorkerExtension overrides it: an adapter sync (peft_config and base_sync_done) loads the named "
         "agent's adapter under its own id instead of VLLM_LORA_INT_ID; other syncs are verl's",
         params=("self", "weights", "peft_config", "base_sync_done"),
         overrides=("mgrpo_verl.vllm_rollout.lora:AgentLoRAWorkerExtension._update_weights",),
         sha256="92931d5a1a126c22a74ed65897bc483d4386abda4610ab5aa832026775f80f3d",
         recheck="AgentLoRAWorkerExtension._update_weights: verl's LoRA branch (clone, TensorLoRARequest fields, "
                 "add_lora) that ours re-implements per agent", requires="vllm"),
    Seam(f"{VLLM_UTILS}:vLLMColocateWorkerExtension.update_weights_from_ipc", (VLLM_LORA,),
         "AgentLoRAWorkerExtension wraps it: for an adapter it must call _update_weights once with every tensor "
         "(after is_last), and its remove_lora(VLLM_LORA_INT_ID) must stay a no-op for our ids",
         params=("self", "peft_config", "base_sync_done", "use_shm"),
         sha256="21edd41f704fbb7b4af76c658cd8d2a86d5f26e6694576580b242a52071a671d",
         recheck="AgentLoRAWorkerExtension.update_weights_from_ipc: the keyword arguments, that an adapter still "
                 "arrives whole at one _update_weights call", requires="vllm"),
    Seam(f"{VLLM_SERVER}:vLLMHttpServer._get_worker_extension_cls", (VLLM_LORA,),
         "AgentLoRAvLLMHttpServer overrides it to start vLLM with AgentLoRAWorkerExtension",
         params=("self",), overrides=("mgrpo_verl.vllm_rollout.lora:AgentLoRAvLLMHttpServer._get_worker_extension_cls",),
         requires="vllm"),
    Seam(f"{VLLM_SERVER}:vLLMHttpServer.generate", (VLLM_LORA,),
         "AgentLoRAvLLMHttpServer.generate sets the request's adapter in a context variable and calls it; "
         "_AdapterEngine then replaces the lora_request it passes to self.engine.generate",
         params=("self", "prompt_ids", "sampling_params", "request_id", "image_data", "video_data", "audio_data",
                 "mm_processor_kwargs", "priority", "kv_transfer_params"),
         sha256="383d680001635a761bd8a91534ae6c8a40c9aa970dcaced147a1a708af689db6",
         recheck="vllm_rollout/lora.py _AdapterEngine: that verl's generate still calls self.engine.generate(..., "
                 "lora_request=...) in the calling task, once per request, and takes no lora_name", requires="vllm"),
)

SEAM_IDS = [s.id for s in SEAMS]


def resolve(target: str) -> Any:
    module_name, qualname = target.split(":", 1)
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _where(seam: Seam) -> str:
    return f"used by {', '.join(seam.users)} ({seam.why})"


# -------------------------------------------------------------------------------- parametrised checks


def test_pinned_verl_version():
    assert verl.__version__ == "0.9.1", "SEAMS were recorded against verl 0.9.1: re-check every row"


def _skip_without_requirement(seam: Seam) -> None:
    if seam.requires and importlib.util.find_spec(seam.requires) is None:
        pytest.skip(f"needs {seam.requires} (checked in .venv-vllm: bash recipes/vllm_cpu_env.sh)")


@pytest.mark.parametrize("seam", [s for s in SEAMS if s.params is not None or s.sha256 or s.overrides], ids=lambda s: s.id)
def test_seam_exists(seam):
    _skip_without_requirement(seam)
    try:
        resolve(seam.target)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"verl no longer has {seam.target} ({e}); {_where(seam)}")


def _parameters(fn) -> list[inspect.Parameter]:
    """``fn``'s parameters, without the ``_ray_trace_ctx`` Ray adds to the methods of an actor class."""
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "_ray_trace_ctx"]


@pytest.mark.parametrize("seam", [s for s in SEAMS if s.params is not None], ids=lambda s: s.id)
def test_seam_signature(seam):
    _skip_without_requirement(seam)
    theirs = _parameters(resolve(seam.target))
    params = tuple(p.name for p in theirs)
    assert params == seam.params, (
        f"verl's {seam.id} now takes {params}, we call/override it as {seam.params}; {_where(seam)}")
    for ours in seam.overrides:
        mine = _parameters(resolve(ours))
        assert [(p.name, p.kind, p.default) for p in mine] == [(p.name, p.kind, p.default) for p in theirs], (
            f"{ours} must take the parameters of verl's {seam.id} (verl calls it): {mine} vs {theirs}")


@pytest.mark.parametrize("seam", [s for s in SEAMS if s.sha256], ids=lambda s: s.id)
def test_seam_source_unchanged(seam):
    _skip_without_requirement(seam)
    got = source_sha256(resolve(seam.target))
    assert got == seam.sha256, (
        f"verl's {seam.id} changed (sha256 {got}, recorded {seam.sha256}); {_where(seam)}. "
        f"Re-check: {seam.recheck}. Then record the new hash in tests/contract/test_verl_private_api.py.")


@pytest.mark.parametrize("seam", [s for s in SEAMS if s.behaviour], ids=lambda s: s.id)
def test_seam_behaviour(seam):
    BEHAVIOURS[seam.behaviour](seam)


# ---------------------------------------------------------------------------------- targeted checks


def _self_attribute_uses(cls: type, attr: str) -> set[tuple[str, str]]:
    """(method, 'Load'/'Store') for every ``self.<attr>`` in the methods and properties of ``cls`` itself."""
    out = set()
    for name, member in vars(cls).items():
        fn = member.fget if isinstance(member, property) else member
        if not inspect.isfunction(fn):
            continue
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
            if (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
                    and node.value.id == "self"):
                out.add((name, type(node.ctx).__name__))
    return out


def trainer_mode_readers(seam: Seam) -> None:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from mgrpo_verl.trainer.per_agent import MultiAgentTrainer

    uses = _self_attribute_uses(PPOTrainer, "trainer_mode")
    assert ("__init__", "Store") in uses, f"verl's __init__ no longer assigns trainer_mode; {_where(seam)}"
    readers = {m for m, ctx in uses if ctx == "Load"}
    expected = {"__init__", "_build_replay_buffer", "_init_dataloader", "_load_checkpoint",
                "_reissue_inflight_prompts", "_save_checkpoint", "_submit_batch_to_rollout"}
    assert readers == expected, (
        f"PPOTrainer methods reading self.trainer_mode are now {sorted(readers)} (recorded {sorted(expected)}); "
        f"{_where(seam)}. Re-check that 'sync' is what MultiAgentTrainer wants in the new readers.")
    trainer = object.__new__(MultiAgentTrainer)
    trainer.trainer_mode = "multi_agent"  # what verl's __init__ does with the configured name
    assert trainer.trainer_mode == "sync"


def pool_attribute_readers(seam: Seam) -> None:
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    recorded = {
        "role_worker_mapping": {("_init_resource_pool_mgr", "Load"), ("_init_resource_pool_mgr", "Store"), ("_setup", "Load")},
        "mapping": {("_init_resource_pool_mgr", "Load"), ("_init_resource_pool_mgr", "Store")},
        # _compute_ref_log_prob's read goes through AgentView (tests/contract/test_agent_view.py)
        "ref_in_actor": {("_compute_ref_log_prob", "Load"), ("_setup", "Load"), ("_setup", "Store")},
    }
    for attr, expected in recorded.items():
        got = _self_attribute_uses(PPOTrainer, attr)
        assert got == expected, (
            f"PPOTrainer's uses of self.{attr} are now {sorted(got)} (recorded {sorted(expected)}); {_where(seam)}. "
            f"Re-check MultiAgentTrainer._init_resource_pool_mgr / _setup: a new reader sees our (agent, Role) keys.")


def fields_none_reads_all(seam: Seam) -> None:
    from verl.utils import transferqueue_utils

    src = inspect.getsource(transferqueue_utils.async_kv_batch_meta2batch_meta)
    assert "fields = meta.fields" in src and "if fields is not None:" in src, (
        f"verl's kv_batch_meta2batch_meta no longer treats KVBatchMeta.fields=None as 'every field'; {_where(seam)}")


def key_format_and_reward_copy(seam: Seam) -> None:
    src = inspect.getsource(resolve(seam.target))
    assert 'keys.append(f"{uid}_{session_id}_{i}")' in src, (
        f"verl's TransferQueue key format changed; {_where(seam)}. Re-check rows.copy_keys and COPY_INDEX_BASE.")
    assert "for output in outputs[:-1]:" in src and "output.reward_score = final_output.reward_score" in src, (
        f"verl no longer copies the final output's reward onto earlier outputs; {_where(seam)}. Re-check the "
        f"rm_scores rewrite in rows.write_row_values and the module docstring of rows.py.")


def keys_parsed_with_rsplit(seam: Seam) -> None:
    from verl.trainer.ppo.v1 import trainer_base

    from mgrpo_verl.trainer.rows import COPY_INDEX_BASE

    src = inspect.getsource(trainer_base)
    assert src.count('key.rsplit("_", 2)') >= 3, f"verl parses TransferQueue keys differently; {_where(seam)}"
    uid, session, index = f"u_1_x_3_{COPY_INDEX_BASE + 2}".rsplit("_", 2)  # a uid with '_' in it
    assert (uid, int(session), int(index)) == ("u_1_x", 3, COPY_INDEX_BASE + 2)


def ray_actor_class(seam: Seam) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from mgrpo_verl.agent_loops.sub_service import SubAgentService

    cls = resolve(seam.target)
    assert inspect.isclass(cls) and issubclass(cls, AgentLoopWorker), f"{cls!r}; {_where(seam)}"
    assert cls in SubAgentService.__mro__


def task_runner_hook(seam: Seam) -> None:
    from verl.trainer.main_ppo import run_ppo

    cls = resolve(seam.target)
    assert inspect.isclass(cls) and list(inspect.signature(cls.run).parameters)[:2] == ["self", "config"], _where(seam)
    src = inspect.getsource(run_ppo)
    uses = {call for call in ("task_runner_class.remote()", "ray.get(runner.run.remote(config))") if call in src}
    assert len(uses) == 2 and src.count("task_runner_class") == 4, (  # the parameter, its doc, .options, .remote
        f"run_ppo uses its task_runner_class otherwise now; {_where(seam)}. Re-check DriverTaskRunner: it answers "
        f".remote() and .run.remote(config) only (and .options() is reached only under nsys)")


def unscored_rows_refused(seam: Seam) -> None:
    import asyncio

    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker

    from mgrpo_verl.agent_loops.common import UnscoredRows

    worker = object.__new__(AgentLoopWorker)  # the attributes _compute_score reads, as verl's __init__ sets them
    worker.reward_loop_worker_handles, worker.processor, worker.mm_processor_kwargs = [UnscoredRows()], None, None

    def output(score):
        return AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3], response_mask=[1], reward_score=score,
                               num_turns=2, metrics=AgentLoopMetrics(), extra_fields={})

    scored = [output(None), output(0.5)]  # only the last output counts: an earlier one without a score is fine
    asyncio.run(worker._compute_score(scored, {}))
    assert scored[-1].reward_score == 0.5 and "reward_extra_info" not in scored[-1].extra_fields, _where(seam)
    with pytest.raises(ValueError, match="reward_score None: in multi-agent mode the loop scores its own rows"):
        asyncio.run(worker._compute_score([output(None)], {}))


def tool_loop_attributes(seam: Seam) -> None:
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    init = inspect.getsource(ToolAgentLoop.__init__)
    for attr in ("tools", "tool_schemas", "tool_parser", "tool_parser_name", "max_parallel_calls"):
        assert f"self.{attr} =" in init, f"ToolAgentLoop.__init__ no longer sets self.{attr}; {_where(seam)}"
    src = inspect.getsource(ToolAgentLoop)
    assert "agent_data._active_tools = " in src and 'getattr(agent_data, "_active_tools", self.tools)' in src, (
        f"ToolAgentLoop's per-sample tool selection (agent_data._active_tools) changed; {_where(seam)}. "
        f"Re-check ToolDelegationLoop._call_tool's tool lookup.")
    assert "self.max_parallel_calls]" in src, (
        f"ToolAgentLoop no longer truncates a turn's calls with max_parallel_calls; {_where(seam)}. Re-check "
        f"ToolDelegationLoop.__init__ (turn_call_limit) and _handle_generating_state.")


def agent_loop_registry(seam: Seam) -> None:
    from verl.experimental.agent_loop.agent_loop import register

    registry = resolve(seam.target)
    assert isinstance(registry, dict)

    class Probe:  # registered under a scratch name, removed again
        pass

    try:
        register("mgrpo_contract_probe")(Probe)
        assert registry["mgrpo_contract_probe"] == {"_target_": f"{Probe.__module__}.{Probe.__qualname__}"}
    finally:
        registry.pop("mgrpo_contract_probe", None)


def rollout_registry(seam: Seam) -> None:
    from verl.workers.rollout import base

    from mgrpo_verl.hf_rollout import ADAPTER_FQN, ROLLOUT_NAME, register

    registry = resolve(seam.target)
    assert isinstance(registry, dict) and ("vllm", "async") in registry, f"{_where(seam)}"
    register()
    assert registry[(ROLLOUT_NAME, "async")] == ADAPTER_FQN
    assert base.get_rollout_class(ROLLOUT_NAME, "async").__name__ == ADAPTER_FQN.rsplit(".", 1)[1], (
        f"get_rollout_class no longer reads _ROLLOUT_REGISTRY; {_where(seam)}")


def replica_registry(seam: Seam) -> None:
    from mgrpo_verl.hf_rollout import ROLLOUT_NAME, is_registered, register

    register()
    assert ROLLOUT_NAME in resolve(seam.target) and is_registered(), f"{_where(seam)}"


def replica_class_hook(seam: Seam) -> None:
    params = inspect.signature(resolve(seam.target)).parameters
    assert {"config", "worker_group", "rollout_resource_pool", "start_rank"} <= set(params), f"{_where(seam)}"
    src = inspect.getsource(resolve(seam.target))
    assert 'if not hasattr(self, "rollout_replica_class"):' in src, (
        f"LLMServerManager no longer keeps a rollout_replica_class set before __init__; {_where(seam)}")


def replica_server_fields(seam: Seam) -> None:
    from verl.workers.rollout.replica import RolloutReplica

    fake = SimpleNamespace(_server_handle="handle", _server_address="address")
    assert RolloutReplica.server_handle.fget(fake) == "handle", f"{_where(seam)}"
    assert RolloutReplica.server_address.fget(fake) == "address", f"{_where(seam)}"
    init = inspect.getsource(RolloutReplica.__init__)
    assert "self._server_handle" in init and "self._server_address" in init


def client_load_balancer(seam: Seam) -> None:
    from verl.workers.rollout.llm_server import LLMServerClient

    balancer = object()
    assert LLMServerClient(config=None, load_balancer_handle=balancer)._load_balancer is balancer, f"{_where(seam)}"


def platform_singleton(seam: Seam) -> None:
    from verl.plugin.platform import platform_manager

    assert "global _current_platform" in inspect.getsource(platform_manager.get_platform), f"{_where(seam)}"
    platform = platform_manager.get_platform()
    assert resolve(seam.target) is platform, f"get_platform() no longer caches in _current_platform; {_where(seam)}"


def engine_registry(seam: Seam) -> None:
    from mgrpo_verl.platform.engines import register_cpu_engines

    register_cpu_engines()
    registry = resolve(seam.target)
    assert isinstance(registry["language_model"]["fsdp2"]["cuda"], type), f"{_where(seam)}"


def patch_guarded(seam: Seam) -> None:
    from mgrpo_verl.platform import verl_cpu_offload_pinning as patch

    assert f"{patch.TARGET_MODULE}:{patch.TARGET_METHOD}" == seam.target and patch.RECORDED_SOURCE_SHA256
    resolve(seam.target)


def logprobs_patch_guarded(seam: Seam) -> None:
    from mgrpo_verl.platform import verl_cpu_logprobs as patch

    module, name = seam.target.split(":")
    assert module == patch.TARGET_MODULE and name in patch.RECORDED_SOURCE_SHA256, f"{_where(seam)}"
    assert name not in patch.upstream_drift(), f"{_where(seam)}: verl's source changed"


BEHAVIOURS: dict[str, Callable[[Seam], None]] = {
    f.__name__: f
    for f in (trainer_mode_readers, pool_attribute_readers, fields_none_reads_all, key_format_and_reward_copy,
              keys_parsed_with_rsplit, ray_actor_class, task_runner_hook, unscored_rows_refused, tool_loop_attributes, agent_loop_registry, rollout_registry,
              replica_registry, replica_class_hook, replica_server_fields, client_load_balancer, platform_singleton, engine_registry,
              logprobs_patch_guarded,
              patch_guarded)
}


def test_every_behaviour_is_used():
    assert {s.behaviour for s in SEAMS if s.behaviour} == set(BEHAVIOURS)


# --------------------------------------------------------------------------------- completeness scan


def _defined_private_names(files) -> set[str]:
    """``_x`` names a body of source defines: functions, classes, assigned attributes and names."""
    names = set()
    for path in files:
        try:
            tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name = node.target.id
            else:
                continue
            if name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return names


@lru_cache(maxsize=1)
def private_verl_names_used() -> dict[str, set[str]]:
    """private verl name -> our files using it (see the module docstring for what is scanned)."""
    verl_defined = _defined_private_names(VERL_ROOT.rglob("*.py"))
    ours = sorted(PACKAGE.rglob("*.py"))
    our_defined = _defined_private_names(ours)
    found: dict[str, set[str]] = {}

    def hit(name: str, path: Path) -> None:
        found.setdefault(name, set()).add(str(path.relative_to(PACKAGE.parent)))

    for path in ours:
        tree = ast.parse(path.read_text())
        verl_names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
                for alias in node.names:
                    verl_names.add(alias.asname or alias.name)
                    if alias.name.startswith("_"):
                        hit(alias.name, path)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "verl":
                        verl_names.add((alias.asname or alias.name).split(".")[0])
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in verl_names:
                    hit(node.attr, path)  # e.g. EngineRegistry._engines, rollout_base._ROLLOUT_REGISTRY
                elif node.attr in verl_defined and node.attr not in our_defined:
                    hit(node.attr, path)  # e.g. view._balance_batch, self._init_tokenizer()
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                name = node.args[1].value
                if name.startswith("_") and name in verl_defined and name not in our_defined:
                    hit(name, path)  # e.g. getattr(agent_data, "_active_tools", ...)
            elif isinstance(node, ast.Attribute) and node.attr == "__ray_actor_class__":
                hit(node.attr, path)
        # methods and self/super() attributes of our subclasses of verl classes, resolved on the real MRO
        module_name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.bases]
        if not classes or not verl_names:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != "vllm":
                raise
            continue  # mgrpo_verl/vllm_rollout/lora.py without vLLM: scanned in .venv-vllm (CI's second run of this file)
        for class_node in classes:
            cls = getattr(module, class_node.name, None)
            verl_bases = [b for b in getattr(cls, "__mro__", ()) if b.__module__.split(".")[0] == "verl"]
            if not verl_bases:
                continue
            for node in ast.walk(class_node):
                name = None
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = node.name
                elif isinstance(node, ast.Attribute) and (
                    (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    or (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "super")
                ):
                    name = node.attr
                if not name or not name.startswith("_") or name.startswith("__"):
                    continue
                if any(name in vars(b) or _sets_attribute(b, name) for b in verl_bases):
                    hit(name, path)
    return found


def _sets_attribute(cls: type, name: str) -> bool:
    source = _class_source(cls)
    return f"self.{name} =" in source or f"self.{name}:" in source


@lru_cache(maxsize=None)
def _class_source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def covered_names() -> set[str]:
    return {name for seam in SEAMS for name in seam.private_names}


def test_every_private_verl_name_we_use_is_listed():
    used = private_verl_names_used()
    missing = {name: sorted(files) for name, files in used.items() if name not in covered_names()}
    assert not missing, (
        f"mgrpo_verl uses private verl names with no row in SEAMS: {missing}. Add a row (users, why, signature, "
        f"and a source hash if we depend on what it does).")


def test_scan_finds_the_known_seams():
    """The scan itself works: it finds a sample of names through each of its routes."""
    used = private_verl_names_used()
    for name, user in [("_setup", PER_AGENT), ("_balance_batch", PER_AGENT), ("_engines", "mgrpo_verl/platform/engines.py"),
                       ("_ROLLOUT_REGISTRY", "mgrpo_verl/hf_rollout/__init__.py"), ("_active_tools", TOOL_DELEGATION),
                       ("_agent_loop_registry", "mgrpo_verl/agent_loops/testing.py"), ("_server_handle", "mgrpo_verl/hf_rollout/replica.py"),
                       ("__ray_actor_class__", SUB_SERVICE), ("_check_resource_available", "mgrpo_verl/trainer/placement.py"),
                       *([("_update_weights", VLLM_LORA), ("_get_worker_extension_cls", VLLM_LORA)]
                         if importlib.util.find_spec("vllm") else [])]:
        assert user in used.get(name, set()), (name, used.get(name))
