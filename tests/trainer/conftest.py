"""Fixtures of the end-to-end tests: the real entry point, ``python -m mgrpo_verl.main_ppo``, run hermetically in
subprocesses (the plumbing is in ``e2e.py``), and the training runs that several tests check, started once per
test session:

- ``two_agent_job``: the default two-agent job on a simulated two-node cluster (one agent pinned to each node),
  2 steps with validation, checkpoints and rollout dumps; checked by ``test_multi_agent_e2e.py`` (training,
  checkpoints, then a resume on this machine's own Ray), ``test_multinode_e2e.py`` (where Ray placed the agents)
  and ``test_rollout_dump_e2e.py`` (the dumps, the tensorboard tables, the viewer's page);
- ``frozen_sub_on_one_gpu``: a frozen sub-agent beside the trained main agent on one shared logical GPU, 1 step;
  checked by ``test_multi_agent_e2e.py`` (frozen) and ``test_one_gpu_e2e.py`` (shared GPU);
- ``decoupled_on_two_machines``: decoupled M-GRPO, the main and the sub side as two processes, each joined to its
  own simulated single-node cluster, 2 steps with validation on the main side; checked by
  ``test_decoupled_e2e.py`` (statistics exchange, advantages) and ``test_multinode_e2e.py`` (placement).

Each of these fixtures runs its processes to the end and shuts its clusters down before any test reads it: what
a test gets is files and values, nothing that holds a process.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the e2e helper module, for this file and the tests

from e2e import (  # noqa: E402
    DECOUPLED_D_MAX,
    DECOUPLED_STEPS,
    MGRPO_CONFIG,
    TWO_MODELS,
    MainPPO,
    Run,
    dense_scorer,
    free_port,
    reaped,
    simulated_cluster,
)


#: The secret the decoupled sides of these tests share (docs/decoupled.md): exported for every test here, so that
#: configs with a role parse and the runs they start (which inherit the environment) find it.
TEST_SECRET = "tests-decoupled-secret-0123456789"


@pytest.fixture(autouse=True)
def decoupled_secret(monkeypatch):
    from mgrpo_verl.agent_loops.remote_sub import SECRET_ENV

    monkeypatch.setenv(SECRET_ENV, TEST_SECRET)


@pytest.fixture
def main_ppo(tmp_path) -> MainPPO:
    """``main_ppo(name, *overrides, timeout=900, config=None, env=None) -> Run`` in ``tmp_path`` (see
    :class:`e2e.MainPPO`); ``.start(...)`` starts one without waiting. ``.home``, ``.cache``, ``.checkpoints``."""
    return MainPPO(tmp_path)


@dataclass
class ClusterRun:
    """A run joined to a simulated cluster, and Ray's record of the cluster after it (``SimulatedCluster.state``)."""

    run: Run
    address: str
    state: dict
    main_ppo: MainPPO
    scorer: str
    dumps: Path  # rollouts/, validation/ and tensorboard/ of the run


@pytest.fixture(scope="session")
def two_agent_job(tmp_path_factory) -> ClusterRun:
    """The default two-agent job (M-GRPO, two models of different sizes, KL loss, dense scorer), 2 steps, validation
    before training and after step 2, a checkpoint per step, on a two-node cluster (``node_a``, ``node_b``, one
    GPU each) joined through ``RAY_ADDRESS`` and the cluster's token alone; main is pinned to ``node_a`` and sub to ``node_b`` (against
    Ray's own choice, which put main on ``node_b`` in every unpinned run). Its training and validation rows are
    dumped (``trainer.rollout_data_dir``, ``trainer.validation_data_dir``) and verl's tensorboard logger is on:
    one run for all three test files (each run is ~60-90 s of start-up)."""
    main_ppo = MainPPO(tmp_path_factory.mktemp("two_agent_job"))
    scorer = dense_scorer(main_ppo.root)
    dumps = main_ppo.root / "out"
    # verl's tensorboard logger reads TENSORBOARD_DIR in the trainer, a worker of the cluster's raylets
    tensorboard = {"TENSORBOARD_DIR": str(dumps / "tensorboard")}
    with simulated_cluster("node_a", "node_b", env=tensorboard) as cluster:
        run = main_ppo(
            "joint", "trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.test_freq=2", *TWO_MODELS,
            f"multi_agent.delegation.scorer={scorer}",
            "multi_agent.agents.main.node_resource=node_a", "multi_agent.agents.sub.node_resource=node_b",
            f"trainer.rollout_data_dir={dumps / 'rollouts'}", f"trainer.validation_data_dir={dumps / 'validation'}",
            "trainer.logger=[console,file,tensorboard]",
            config=MGRPO_CONFIG, env={**cluster.join_env, **tensorboard},
        )
        state = cluster.state() if run.returncode == 0 else {}
        return ClusterRun(run, cluster.address, state, main_ppo, scorer, dumps)


@pytest.fixture(scope="session")
def frozen_sub_on_one_gpu(tmp_path_factory) -> Run:
    """The two models of ``two_agent_job`` with the sub-agent frozen (``trainable=false``), both on ONE logical GPU
    (``placement=shared``), 1 step, validation after it; no GPU memory is given, so the pre-flight estimate is
    skipped. verl's own layout of the controller (a TaskRunner actor: ``mgrpo_verl.trainer_in_driver=false``, the
    accelerator default), where the other runs keep it in the driver (the CPU default)."""
    main_ppo = MainPPO(tmp_path_factory.mktemp("frozen_sub_on_one_gpu"))
    return main_ppo(
        "frozen", "trainer.n_gpus_per_node=1", "multi_agent.placement=shared", "multi_agent.agents.sub.trainable=false",
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=1", *TWO_MODELS,
        f"multi_agent.delegation.scorer={dense_scorer(main_ppo.root)}", "mgrpo_verl.trainer_in_driver=false",
        config=MGRPO_CONFIG,
    )


@dataclass
class DecoupledRun:
    main: Run
    sub: Run
    port: int
    store_db: Path
    addresses: dict  # side -> address of its cluster
    states: dict  # side -> SimulatedCluster.state() after the run


@pytest.fixture(scope="session")
def decoupled_on_two_machines(tmp_path_factory) -> DecoupledRun:
    """Decoupled M-GRPO on the relay task: the sub side and the main side as two ``main_ppo`` processes sharing only
    a SQLite store, each joined to its own single-node cluster (``node_main``, ``node_sub``), as one side per
    machine. B = 4 queries x n = 4 rollouts per step, 2 steps, D_max = 2; the main side validates before training
    and after step 2 (its calls reach the sub side, which must keep no row of them).

    Not two jobs of one cluster: verl 0.9.1's TransferQueue controller is a named actor in a fixed namespace
    (``TransferQueueController`` in ``transfer_queue``), so a second verl job on the same cluster silently connects
    to the first job's queue (``tests/platform/test_ray_join.py`` guards this fact)."""
    main_ppo = MainPPO(tmp_path_factory.mktemp("decoupled"))
    port = free_port()
    db = main_ppo.root / "stats.db"
    secret = main_ppo.root / "secret"  # the two machines' copies of one file
    secret.write_text(TEST_SECRET)
    secret.chmod(0o600)
    # the dense scorer on both sides: with the relay task's own reward nearly every row of a random tiny model scores
    # 0, every group ties and the sub side's update is zero (the suite saw max(grad_norm) == 0 under load)
    common = (f"multi_agent.decoupled.store=sqlite:///{db}", f"trainer.total_training_steps={DECOUPLED_STEPS}",
              "trainer.n_gpus_per_node=1", f"multi_agent.d_max={DECOUPLED_D_MAX}",
              f"multi_agent.decoupled.secret_file={secret}",
              f"multi_agent.delegation.scorer={dense_scorer(main_ppo.root)}")

    def start(side: str, machine, *overrides: str):
        return main_ppo.start(side, f"multi_agent.decoupled.role={side}", *common, *overrides,
                              env=machine.join_env, checkpoints=main_ppo.root / side / "ckpt")

    with simulated_cluster("node_main") as main_machine, simulated_cluster("node_sub") as sub_machine:
        # the sub side is started first (its model is built and cached then), the main side waits for its /health
        sub = start("sub", sub_machine, f"multi_agent.decoupled.serve_port={port}",
                    "trainer.val_before_train=false", "trainer.test_freq=-1")
        main = start("main", main_machine, f"multi_agent.decoupled.sub_urls.sub=http://127.0.0.1:{port}",
                     f"trainer.test_freq={DECOUPLED_STEPS}")
        with reaped(main, sub):
            main_run = main.result(timeout=1500)
            sub_run = sub.result(timeout=300)
        ok = main_run.returncode == 0 and sub_run.returncode == 0
        states = {"main": main_machine.state(), "sub": sub_machine.state()} if ok else {}
        addresses = {"main": main_machine.address, "sub": sub_machine.address}
    return DecoupledRun(main_run, sub_run, port, db, addresses, states)
