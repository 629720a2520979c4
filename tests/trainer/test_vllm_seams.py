"""Where our per-agent replicas meet verl's vLLM code: weight-sync socket paths and the vLLM tokenizer.

No GPU, no vLLM, no Ray: ``vllm`` is replaced in ``sys.modules`` by empty stub modules (and
``verl.third_party.vllm`` / the ``verl.workers.rollout.vllm_rollout`` package ``__init__``, which refuse to
import without an installed vLLM, by stand-ins) so that verl's REAL ``ServerAdapter``,
``vLLMColocateWorkerExtension._get_zmq_handle``, ``vLLMReplica`` and ``build_cli_args_from_config`` run on
CPU. ``ray.get_runtime_context`` is faked (one job id for the sender and the receiver, as in one Ray
cluster; ``01000000`` for both decoupled sides, as two fresh clusters get).

Sender: the trainer-side adapter built as verl's ``ActorRolloutRefWorker.init_model`` builds it, then
through our ``AgentActorRolloutRefWorker.init_model``. Receiver: the path verl's vLLM worker extension
computes from ``VERL_REPLICA_RANK`` (set by ``vLLMHttpServer`` to its replica's rank) and its local rank
(its position in the replica's worker slice, made by our ``AgentLLMServerManager``).
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.abc
import importlib.machinery
import inspect
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.trainer import agents
from mgrpo_verl.trainer.agents import REPLICA_OFFSET_KEY, AgentActorRolloutRefWorker, AgentLLMServerManager
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.config.rules import agent_full_config

register_resolvers()

JOB_ID = "01000000"  # the first driver's job id in every fresh Ray cluster

# --------------------------------------------------------------------------------------------- vLLM stubs


class _Anything:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()


class _StubModule(types.ModuleType):
    """A module whose every public attribute is a fresh class (usable as a base class or a decorator)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_Anything,), {"__module__": self.__name__})
        setattr(self, name, value)
        return value


class _VLLMStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "vllm" or fullname.startswith("vllm."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        if spec.name == "vllm":
            module.__version__ = "0.20.0"
        return module

    def exec_module(self, module):
        pass


_STUBBED_PREFIXES = ("vllm", "verl.third_party.vllm", "verl.workers.rollout.vllm_rollout", "verl.utils.vllm")


def _stubbed(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in _STUBBED_PREFIXES)


@pytest.fixture(scope="module")
def vllm():
    """verl's vLLM modules imported against stub ``vllm`` modules; everything is removed afterwards."""
    import verl.workers.rollout as rollout_pkg

    saved = {name: mod for name, mod in sys.modules.items() if _stubbed(name)}
    finder = _VLLMStubFinder()
    sys.meta_path.insert(0, finder)
    try:
        third_party = types.ModuleType("verl.third_party.vllm")
        third_party.VLLM_SLEEP_LEVEL = 2
        third_party.get_version = lambda pkg: None
        sys.modules[third_party.__name__] = third_party
        # the package __init__ raises without an installed vLLM: load its modules from the real folder
        package = types.ModuleType("verl.workers.rollout.vllm_rollout")
        package.__path__ = [str(Path(rollout_pkg.__file__).parent / "vllm_rollout")]
        sys.modules[package.__name__] = package
        adapter = importlib.import_module("verl.workers.rollout.vllm_rollout.vllm_rollout")
        package.ServerAdapter = adapter.ServerAdapter  # what get_rollout_class("vllm") reads
        utils = importlib.import_module("verl.workers.rollout.vllm_rollout.utils")
        server = importlib.import_module("verl.workers.rollout.vllm_rollout.vllm_async_server")
        yield SimpleNamespace(
            ServerAdapter=adapter.ServerAdapter,
            Extension=utils.vLLMColocateWorkerExtension,
            build_cli_args_from_config=utils.build_cli_args_from_config,
            vLLMReplica=server.vLLMReplica,
            vLLMHttpServer=server.vLLMHttpServer,
        )
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if _stubbed(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture
def ray_job(monkeypatch):
    """``ray.get_runtime_context().get_job_id()`` without Ray: returns ``ray_job.id``."""
    state = SimpleNamespace(id=JOB_ID)
    context = SimpleNamespace(get_job_id=lambda: state.id)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    return state


# ------------------------------------------------------------------------------------------------ configs


def _compose(name: str, *overrides: str):
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        cfg = compose(name, overrides=list(overrides))
    OmegaConf.resolve(cfg)  # as the driver does (mgrpo_verl.main_ppo.run) before anything else reads it
    return cfg


def _agent_configs(*overrides: str) -> dict:
    """Each model owner's full config (as the trainer builds it) with its replica offset, from the
    trainer's own offset rule."""
    from mgrpo_verl.trainer.per_agent import _replica_count

    cfg = _compose("mgrpo_trainer", "task=relay", "actor_rollout_ref.rollout.name=vllm", *overrides)
    ma = build_plan(cfg).multi_agent
    configs = {s.name: agent_full_config(cfg, s) for s in ma.local_owners}
    offsets = agents.side_replica_offsets(ma, {n: _replica_count(c) for n, c in configs.items()})
    for name, c in configs.items():
        c.actor_rollout_ref.rollout.custom[REPLICA_OFFSET_KEY] = offsets[name]
    return configs


@dataclass
class FakeWorkerGroup:
    """What ``init_hybrid`` reads of a worker group: its workers (here: their RANK) and size."""

    workers: list

    @property
    def world_size(self) -> int:
        return len(self.workers)


# ------------------------------------------------------------------------------------- sender / receiver


def _worker_adapter(monkeypatch, agent_config, rank: int, local_world_size: int):
    """The rollout adapter of the hybrid worker with ``RANK=rank``: verl's rollout construction (step 3.2 of
    ``ActorRolloutRefWorker.init_model``, checked by ``test_verl_builds_the_adapter_without_a_rank``), then our
    ``AgentActorRolloutRefWorker.init_model``."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.rollout.base import get_rollout_class

    model_config = omega_conf_to_dataclass(agent_config.actor_rollout_ref.model, dataclass_type=HFModelConfig)

    def verl_rollout_step(self):
        rollout_config = omega_conf_to_dataclass(self.config.rollout)
        rollout_cls = get_rollout_class(rollout_config.name, rollout_config.mode)
        self.rollout = rollout_cls(config=rollout_config, model_config=model_config, device_mesh=None)

    monkeypatch.setattr(ActorRolloutRefWorker, "init_model", verl_rollout_step)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("RAY_LOCAL_WORLD_SIZE", str(local_world_size))
    worker = object.__new__(AgentActorRolloutRefWorker)
    worker.config = agent_config.actor_rollout_ref
    AgentActorRolloutRefWorker.init_model(worker)
    return worker.rollout


def _replicas(monkeypatch, agent_config, n_workers: int, replica_class=None):
    """The agent's replicas as our ``AgentLLMServerManager`` creates them (real replica class, launch
    stubbed out): each with its rank and its slice of the worker group (worker RANKs)."""
    launched = []

    async def launch_servers(self):
        launched.append(self)

    offset = agent_config.actor_rollout_ref.rollout.custom[REPLICA_OFFSET_KEY]
    manager = AgentLLMServerManager(
        config=agent_config, worker_group=FakeWorkerGroup(list(range(n_workers))), start_rank=offset
    )
    monkeypatch.setattr(manager.rollout_replica_class, "launch_servers", launch_servers)
    asyncio.run(manager._initialize_llm_servers())
    assert launched == manager.rollout_replicas
    return manager.rollout_replicas


def _receiver_path(vllm, monkeypatch, job_id: str, replica_rank: int, local_rank: int) -> str:
    """The socket path verl's vLLM worker extension computes in the worker at ``local_rank`` of the replica's
    server, whose ``vLLMHttpServer`` exported ``VERL_REPLICA_RANK`` / ``VERL_RAY_JOB_ID``."""
    monkeypatch.setenv("VERL_REPLICA_RANK", str(replica_rank))
    monkeypatch.setenv("VERL_RAY_JOB_ID", job_id)
    worker = SimpleNamespace(local_rank=local_rank, model_runner=SimpleNamespace(vllm_config=None))
    return vllm.Extension._get_zmq_handle(worker)


def _agent_socket_pairs(vllm, monkeypatch, ray_job, agent_config, n_gpus: int) -> list[tuple[str, str]]:
    """(sender path, receiver path) of every hybrid worker of one agent."""
    pairs = []
    for replica in _replicas(monkeypatch, agent_config, n_gpus):
        for local_rank, rank in enumerate(replica.workers):
            adapter = _worker_adapter(monkeypatch, agent_config, rank, n_gpus)
            assert adapter.replica_rank == replica.replica_rank
            pairs.append((adapter.zmq_handle, _receiver_path(vllm, monkeypatch, ray_job.id, replica.replica_rank, local_rank)))
    return pairs


# --------------------------------------------------------------------------------------------------- fix 1

#: the relay's 16 rows per model over 4 GPUs: 4 per GPU, micro-batches of 4 (the plan refuses a partial one)
FOUR_PER_GPU = ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")

LAYOUTS = {
    # name: (overrides, GPUs of each agent, expected replica offsets)
    "1 GPU per agent": ((), {"main": 1, "sub": 1}, {"main": 0, "sub": 1}),
    "4+4 GPUs, TP=1": (
        ("trainer.n_gpus_per_node=8", "multi_agent.agents.main.n_gpus_per_node=4", "multi_agent.agents.sub.n_gpus_per_node=4",
         *FOUR_PER_GPU),
        {"main": 4, "sub": 4},
        {"main": 0, "sub": 4},
    ),
    "4+4 GPUs, TP=2": (
        ("trainer.n_gpus_per_node=8", "multi_agent.agents.main.n_gpus_per_node=4", "multi_agent.agents.sub.n_gpus_per_node=4",
         "actor_rollout_ref.rollout.tensor_model_parallel_size=2", *FOUR_PER_GPU),
        {"main": 4, "sub": 4},
        {"main": 0, "sub": 2},
    ),
    # both agents' worker groups on the same GPU (one pool): one worker each, RANK 0 in its own group
    "two agents on one GPU": (
        ("multi_agent.placement=shared", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"),
        {"main": 1, "sub": 1},
        {"main": 0, "sub": 1},
    ),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_vllm_weight_sync_socket_agrees_for_every_agent(vllm, monkeypatch, ray_job, layout):
    overrides, gpus, expected_offsets = LAYOUTS[layout]
    configs = _agent_configs(*overrides)
    assert {n: c.actor_rollout_ref.rollout.custom[REPLICA_OFFSET_KEY] for n, c in configs.items()} == expected_offsets
    every = []
    for name, config in configs.items():
        pairs = _agent_socket_pairs(vllm, monkeypatch, ray_job, config, gpus[name])
        for sender, receiver in pairs:
            assert sender == receiver, f"{layout}, agent {name}: trainer binds {sender}, vLLM worker dials {receiver}"
        every += [sender for sender, _ in pairs]
    assert len(set(every)) == len(every) == sum(gpus.values())  # no two workers of any agent share a socket
    tp = configs["main"].actor_rollout_ref.rollout.tensor_model_parallel_size
    sub = expected_offsets["sub"]
    assert f"ipc:///tmp/rl-colocate-zmq-{JOB_ID}-replica-{sub}-rank-{tp - 1}.sock" in every  # hand-computed


def test_rebuilt_adapter_keeps_verls_other_attributes(vllm, monkeypatch, ray_job):
    """The offset adapter is verl's adapter for that rank: the same attributes as one verl builds with
    ``replica_rank`` given, the rank-independent ones equal to the group-local adapter's."""
    config = _agent_configs()["sub"]
    shifted = _worker_adapter(monkeypatch, config, rank=0, local_world_size=1)
    direct = vllm.ServerAdapter(config=shifted.config, model_config=shifted.model_config, device_mesh=None, replica_rank=1)
    assert type(shifted) is vllm.ServerAdapter
    assert vars(shifted) == vars(direct)
    local = vllm.ServerAdapter(config=shifted.config, model_config=shifted.model_config, device_mesh=None)
    differ = sorted(k for k in vars(local) if vars(local)[k] != vars(shifted)[k])
    assert differ == ["replica_rank", "zmq_handle"]


def test_hf_adapter_addresses_its_offset_server(monkeypatch, tmp_path):
    """The CPU path (our HF adapter and replica) through the same worker and manager code: each adapter
    names the server actor its replica starts."""
    from mgrpo_verl.hf_rollout import register
    from mgrpo_verl.hf_rollout.adapter import HFServerAdapter, server_actor_name

    register()
    configs = _agent_configs("actor_rollout_ref.rollout.name=hf")
    for name, config in configs.items():
        for replica in _replicas(monkeypatch, config, 1):
            adapter = _worker_adapter(monkeypatch, config, replica.workers[0], 1)
            assert type(adapter) is HFServerAdapter
            expected = {"main": "hf_server_0_0", "sub": "hf_server_1_0"}[name]
            assert server_actor_name("hf", adapter.replica_rank) == replica._server_name() == expected


def test_a_backend_that_ignores_replica_rank_is_refused():
    class IgnoresRank:
        def __init__(self, config, model_config, device_mesh, replica_rank=-1):
            self.config, self.model_config, self.device_mesh, self.replica_rank = config, model_config, device_mesh, 0

    with pytest.raises(RuntimeError, match="ignored replica_rank=2"):
        agents.offset_rollout_adapter(IgnoresRank(None, None, None), 2)
    same = IgnoresRank(None, None, None)
    assert agents.offset_rollout_adapter(same, 0) is same


def test_trtllm_agent_with_offset_replicas_is_refused():
    """TRT-LLM's replicas take their worker slice in ``init_hybrid_colocated`` from their own rank, which our
    offset replica class does not override: refused with the key named, rather than a wrong slice."""
    config = _agent_configs("actor_rollout_ref.rollout.name=trtllm")["sub"]
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.name is 'trtllm'"):
        AgentLLMServerManager(config=config, worker_group=FakeWorkerGroup([0]), start_rank=1)


# --------------------------------------------------------------------------------------------------- fix 5


def _side_configs(role: str, tmp_path) -> dict:
    from mgrpo_verl.trainer.decoupled import DecoupledMainTrainer, DecoupledSubTrainer

    overrides = ["actor_rollout_ref.rollout.name=vllm", f"multi_agent.decoupled.role={role}",
                 f"multi_agent.decoupled.store=sqlite:///{tmp_path}/store.db"]
    if role == "main":
        overrides.append("multi_agent.decoupled.sub_urls.sub=http://127.0.0.1:8470")
    else:
        overrides += ["trainer.val_before_train=false", "trainer.test_freq=-1"]
    cfg = _compose("mgrpo_trainer", "task=relay", *overrides)
    cls = DecoupledMainTrainer if role == "main" else DecoupledSubTrainer
    trainer = object.__new__(cls)  # only what _agent_runtimes reads
    trainer.config, trainer.plan = cfg, build_plan(cfg)
    trainer.multi_agent = trainer.plan.multi_agent
    return {name: rt.config for name, rt in cls._agent_runtimes(trainer).items()}


def test_decoupled_sides_on_one_host_use_different_sockets(vllm, monkeypatch, ray_job, tmp_path):
    """Both sides are fresh Ray clusters (job id 01000000 each); the sub side's replicas come after the main
    side's, so its sockets differ, and each side's sender and receiver still agree."""
    paths = {}
    for role in ("main", "sub"):
        configs = _side_configs(role, tmp_path)
        assert len(configs) == 1
        (name, config), = configs.items()
        pairs = _agent_socket_pairs(vllm, monkeypatch, ray_job, config, 1)
        assert all(s == r for s, r in pairs), (role, pairs)
        paths[role] = {s for s, _ in pairs}
    assert paths["main"] == {f"ipc:///tmp/rl-colocate-zmq-{JOB_ID}-replica-0-rank-0.sock"}
    assert paths["sub"] == {f"ipc:///tmp/rl-colocate-zmq-{JOB_ID}-replica-1-rank-0.sock"}


def test_side_offsets_count_the_other_sides_gpus():
    cfg = _compose("mgrpo_trainer", "task=relay", "trainer.n_gpus_per_node=8", "multi_agent.agents.main.n_gpus_per_node=4",
                   "multi_agent.agents.sub.n_gpus_per_node=4", *FOUR_PER_GPU)
    ma = build_plan(cfg).multi_agent
    assert agents.side_replica_offsets(ma, {"main": 2, "sub": 2}) == {"main": 0, "sub": 2}  # synchronous: as before
    assert agents.side_replica_offsets(ma, {"sub": 2}) == {"main": 0, "sub": 4}  # sub side: main has at most 4


# --------------------------------------------------------------------------------------------------- fix 6


def _vllm_serve_args(vllm, manager: AgentLLMServerManager) -> list[str]:
    """The extra ``vllm serve`` arguments of the manager's first replica's server: the engine kwargs that
    ``vLLMHttpServer.launch_server`` reads from the config its replica hands it (checked by
    ``test_verl_passes_engine_kwargs_to_vllm_serve``), through verl's own CLI builder."""
    replica = vllm.vLLMReplica(replica_rank=0, config=manager.rollout_config, model_config=manager.model_config)
    engine_kwargs = replica.config.get("engine_kwargs", {}).get("vllm", {}) or {}
    return vllm.build_cli_args_from_config({k: v for k, v in engine_kwargs.items() if v is not None})


def _flag_value(args: list[str], flag: str):
    return args[args.index(flag) + 1] if flag in args else None


def test_single_agent_vllm_gets_the_builtin_tokenizer(vllm):
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _compose("single_agent", "actor_rollout_ref.rollout.name=vllm")
    model = cfg.actor_rollout_ref.model
    assert model.tokenizer_path and model.tokenizer_path != model.path
    replica = vllm.vLLMReplica(replica_rank=0, config=cfg.actor_rollout_ref.rollout, model_config=model)
    engine_kwargs = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout).engine_kwargs["vllm"]
    assert replica.config.engine_kwargs["vllm"] == engine_kwargs
    assert _flag_value(vllm.build_cli_args_from_config(dict(engine_kwargs)), "--tokenizer") == model.tokenizer_path
    # a model with its tokenizer inside: no tokenizer_path, no --tokenizer (vLLM reads the model folder)
    own = _compose("single_agent", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.path=/models/x",
                   "actor_rollout_ref.model.tokenizer_path=null")
    assert "--tokenizer" not in vllm.build_cli_args_from_config(
        {k: v for k, v in own.actor_rollout_ref.rollout.engine_kwargs.vllm.items() if v is not None})


def test_each_agents_vllm_server_gets_its_own_tokenizer(vllm, tmp_path):
    main_tok = _compose("mgrpo_trainer", "task=relay").actor_rollout_ref.model.tokenizer_path
    sub_tok = tmp_path / "sub_tokenizer"
    shutil.copytree(main_tok, sub_tok)
    configs = _agent_configs(f"multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path={sub_tok}")
    # the driver resolved the YAML default once, for the main agent: the sub-agent's config inherits it
    assert configs["sub"].actor_rollout_ref.rollout.engine_kwargs.vllm.tokenizer == main_tok
    args = {}
    for name, config in configs.items():
        manager = AgentLLMServerManager(config=config, worker_group=FakeWorkerGroup([0]), start_rank=0)
        args[name] = _vllm_serve_args(vllm, manager)
    assert _flag_value(args["main"], "--tokenizer") == main_tok
    assert _flag_value(args["sub"], "--tokenizer") == str(sub_tok)


def test_agent_whose_tokenizer_is_its_model_folder_gets_no_tokenizer_flag(vllm):
    configs = _agent_configs("multi_agent.agents.sub.actor_rollout_ref.model.path=/models/sub",
                             "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=/models/sub")
    manager = AgentLLMServerManager(config=configs["sub"], worker_group=FakeWorkerGroup([0]), start_rank=1)
    assert "--tokenizer" not in _vllm_serve_args(vllm, manager)


def test_tokenizer_rule_leaves_other_engines_alone():
    config = _agent_configs("actor_rollout_ref.rollout.name=hf")["sub"]
    assert agents.with_agent_vllm_tokenizer(config) is config


# ------------------------------------------------------------------------------- verl contracts used above


def test_verl_builds_the_adapter_without_a_rank():
    """``_worker_adapter`` builds the adapter as verl 0.9.1's ``ActorRolloutRefWorker.init_model`` does: no
    ``replica_rank`` (the group-local rank from ``RANK``), which ``offset_rollout_adapter`` shifts."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    src = inspect.getsource(ActorRolloutRefWorker.init_model)
    assert "rollout_cls: type[BaseRollout] = get_rollout_class(rollout_config.name, rollout_config.mode)" in src
    assert "self.rollout = rollout_cls(\n                config=rollout_config, model_config=model_config, device_mesh=rollout_device_mesh\n            )" in src


def test_adapters_take_replica_rank_before_deriving_from_it(vllm):
    """vLLM's, SGLang's (source only: SGLang is not installed) and our HF adapter take ``replica_rank`` and
    use it instead of ``RANK // replica size``."""
    from mgrpo_verl.hf_rollout.adapter import HFServerAdapter

    for cls in (vllm.ServerAdapter, HFServerAdapter):
        assert inspect.signature(cls.__init__).parameters["replica_rank"].default == -1
    import verl.workers.rollout as rollout_pkg

    path = Path(rollout_pkg.__file__).parent / "sglang_rollout" / "sglang_rollout.py"
    tree = ast.parse(path.read_text())
    adapter = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerAdapter")
    init = next(n for n in adapter.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert "replica_rank" in [a.arg for a in init.args.args]
    src = ast.get_source_segment(path.read_text(), init)
    assert "if replica_rank == -1:\n            self.replica_rank = rank // rollout_world_size\n        else:\n            self.replica_rank = replica_rank" in src


def test_verl_passes_the_replica_rank_to_the_vllm_worker(vllm):
    """The receiver side of the socket: ``vLLMReplica`` starts its server with its own ``replica_rank``, and
    the server exports it as ``VERL_REPLICA_RANK`` for its vLLM worker processes."""
    assert "replica_rank=self.replica_rank," in inspect.getsource(vllm.vLLMReplica.launch_servers)
    init = inspect.getsource(vllm.vLLMHttpServer.__init__)
    assert 'os.environ["VERL_REPLICA_RANK"] = str(replica_rank)' in init
    assert 'os.environ["VERL_RAY_JOB_ID"] = ray.get_runtime_context().get_job_id()' in init


def test_verl_passes_engine_kwargs_to_vllm_serve(vllm):
    src = inspect.getsource(vllm.vLLMHttpServer.launch_server)
    assert 'engine_kwargs = self.config.get("engine_kwargs", {}).get(self._get_engine_kwargs_key(), {}) or {}' in src
    assert "engine_kwargs = {key: val for key, val in engine_kwargs.items() if val is not None}" in src
    assert "**engine_kwargs," in src
    assert 'server_args = ["serve", self.model_config.local_path] + build_cli_args_from_config(args)' in src
