"""Plumbing shared by the end-to-end tests of ``tests/trainer``: ``python -m mgrpo_verl.main_ppo`` run hermetically
in subprocesses, waited for with a deadline and killed with its whole process tree, its log and its metrics file
read back; simulated Ray clusters (several "nodes" on this machine) and what Ray recorded about them.

Imported by ``conftest.py`` (which puts this folder on ``sys.path``) and by the e2e test modules.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mgrpo_verl.launcher.step_progress import metrics_by_step as by_step

# Steer platform choice or Ray; cleared so every run starts from the same state.
CLEARED = ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "RAY_ADDRESS", "VERL_FILE_LOGGER_PATH", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
           "RAY_AUTH_TOKEN_PATH")

# A dense score for the delegation scorer (``multi_agent.delegation.scorer=<file>:score``): the vowel share of the
# whole text. A random tiny model's samples get rewards that differ, hence non-zero advantages and a real update in
# step 1 (the tasks' own rewards are zero for nearly every answer of such a model). The share of the first 16
# characters it replaced took only 17 values: a group of 2 tied often enough (~15 %) that CI saw a run whose
# sub-agent had every group tied in step 1, so no update (2026-12-03). Over the whole text two samples tie only
# when their vowel and character counts have the same ratio.
DENSE_SCORER = """
def score(role, text, ground_truth):
    return sum(c in "aeiouAEIOU" for c in text) / max(len(text), 1)
"""


# B = 4 prompts x n = 4 rollouts per step: the main agent's rows of a step
MAIN_ROWS = 16

# the two-agent job (default config, named so that the tests do not depend on it staying the default)
MGRPO_CONFIG = "mgrpo_trainer"
# its task, named for the same reason (the default choice of the ``task`` group may become relay_tools, which
# would build a warm start per run): :meth:`MainPPO.start` adds it to every ``mgrpo_trainer`` run whose
# overrides name no task
RELAY_TASK = "task=relay"
TWO_MODELS = (
    # the sub-agent is a smaller architecture than the main agent (1 layer, width 32 vs 2 layers, 64)
    "multi_agent.agents.sub.actor_rollout_ref.model.path=${mgrpo_model:tiny_small}",
    # every tiny model shares one tokenizer: the main agent's
    "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}",
    # the rollout servers log a fingerprint of the weights they hold after every sync
    "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true",
    # a KL loss against each model's own reference policy (the per-agent reference path)
    "actor_rollout_ref.actor.use_kl_loss=true",
)


# decoupled M-GRPO end to end (conftest.py's decoupled_on_two_machines)
DECOUPLED_STEPS, DECOUPLED_D_MAX = 2, 2


def dense_scorer(folder: Path) -> str:
    """Write :data:`DENSE_SCORER` under ``folder``; returns the override value ``<file>:score``."""
    path = folder / "dense_scorer.py"
    path.write_text(DENSE_SCORER)
    return f"{path}:score"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ metrics
def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics JSON-lines file (``mgrpo_verl.metrics_file``); ``[]`` when there is none."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []




@dataclass
class Run:
    """A finished run: exit status, stdout + stderr, metrics records."""

    returncode: int
    log: str
    metrics: list[dict]

    def steps(self) -> list[int]:
        """The training steps logged (validation-only records carry no score)."""
        return [r["step"] for r in self.metrics if "critic/score/mean" in r["data"]]

    def at(self, step: int) -> dict:
        return by_step(self.metrics).get(step, {})


def assert_every_sync_reaches_its_server(run: Run) -> None:
    """Both agents of a vLLM run (main, sub): every step synced its weights, vLLM generated with the trained actor's
    weights, and the updates changed them."""
    for agent in ("main", "sub"):
        for step in run.steps():
            m = run.at(step)
            assert m[f"timing_s/agent/{agent}/update_weights"] > 0
            # the token probabilities vLLM returned while generating step `step` are the trained actor's: the server
            # holds the weights of the previous update. Synced: differences of 0-1e-9, correlation 1. Measured with the
            # sub-agent's syncs skipped (a scratch copy, docs/cpu.md): its differences 1.9e-3-2.7e-3 and correlation
            # 0.27 down to -0.04 from step 2 on, while the synced main agent stayed at 1e-9 and 1.0
            assert m[f"agent/{agent}/training/rollout_probs_diff_max"] < 1e-5, (agent, step)
            assert m[f"agent/{agent}/training/rollout_actor_probs_pearson_corr"] > 0.999, (agent, step)
        # ... and those updates changed the weights (the dense score gives non-zero advantages from step 1)
        assert any(run.at(s)[f"agent/{agent}/actor/grad_norm"] > 0 for s in run.steps()[:-1]), agent


def synced(log: str, replica: int) -> list[tuple[int, str]]:
    """(global step, fingerprint) of every weight sync the HF rollout server of ``replica`` logged
    (``+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true``)."""
    pattern = rf"HF rollout replica {replica}: .*global_steps=(\S+), fingerprint=(\w+)"
    return [(int(step), fp) for step, fp in re.findall(pattern, log)]


def store_records(db_path: Path) -> dict:
    """traj_id -> record of every record in a SQLite statistics store (the store API reads by id; the ids are
    listed from the file)."""
    from mgrpo_verl.store import open_store

    with sqlite3.connect(db_path) as conn:
        ids = [row[0] for row in conn.execute("SELECT traj_id FROM stats")]
    with open_store(f"sqlite:///{db_path}") as store:
        return store.get(ids)


# ---------------------------------------------------------------------------------------- processes
def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first found first), from ``ps``."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = defaultdict(list)
    for line in out.splitlines():
        child, parent = (int(x) for x in line.split())
        children[parent].append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.pop(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything it started (Ray's GCS, raylet and workers of a run that started its own
    Ray), collected before the first kill so that nothing gets re-parented out of reach."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Proc:
    """A started ``main_ppo`` process; its stdout and stderr go to ``stdout.txt`` and ``stderr.txt`` of its folder
    (two files, so that a line of one is never split by a write to the other)."""

    def __init__(self, popen: subprocess.Popen, workdir: Path, metrics_path: Path):
        self.popen, self.workdir, self.metrics_path = popen, workdir, metrics_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def log(self) -> str:
        """stdout, then stderr, as written so far."""
        return "".join((self.workdir / f"{name}.txt").read_text() for name in ("stdout", "stderr"))

    def wait(self, timeout: float) -> int:
        """The exit status; past ``timeout`` seconds the process tree is killed and ``TimeoutError`` raised (with
        the end of the log)."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.pid)
            self.popen.wait()
            raise TimeoutError(f"{self.popen.args[:3]} still running after {timeout:g} s, killed:\n{self.log()[-4000:]}") from None

    def result(self, timeout: float) -> Run:
        returncode = self.wait(timeout)
        return Run(returncode, self.log(), read_metrics(self.metrics_path))


@contextmanager
def reaped(*procs: Proc) -> Iterator[None]:
    """On leaving (an assertion or a time-out included), kill the process tree of every process still running."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.popen.wait()


class MainPPO:
    """Runs of the real entry point, ``python -m mgrpo_verl.main_ppo``, under ``root``: each run in
    ``root/<name>`` (``stdout.txt``, ``stderr.txt``, ``metrics.jsonl``) with a private HOME, cache and Hugging Face home shared by the
    runs of this object; checkpoints under ``root/ckpt`` by default (shared by the runs, for resuming)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.home = self.root / "home"
        self.home.mkdir(exist_ok=True)
        self.cache = self.root / "cache"
        self.checkpoints = self.root / "ckpt"

    def env(self, extra: dict | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in CLEARED}
        env.update(
            HOME=str(self.home),
            MGRPO_VERL_CACHE=str(self.cache),
            HF_HOME=str(self.root / "hf"),
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
            # Ray folds similar log lines of different workers into one ("[repeated 3x across cluster]"), which
            # would hide per-server lines the tests read
            RAY_DEDUP_LOGS="0",
        )
        env.update(extra or {})
        return env

    def start(self, name: str, *overrides: str, config: str | None = None, env: dict | None = None,
              checkpoints: Path | None = None) -> Proc:
        """Start a run in ``root/name``; ``env`` is applied after the clearing (e.g. ``{"RAY_ADDRESS": ...}`` to
        join an existing cluster). A run of ``mgrpo_trainer`` (``config`` None or :data:`MGRPO_CONFIG`) gets
        :data:`RELAY_TASK` unless its overrides name a task."""
        workdir = self.root / name
        workdir.mkdir()
        metrics = workdir / "metrics.jsonl"
        names_task = any(o.split("=", 1)[0].lstrip("+~") == "task" for o in overrides)
        task = (RELAY_TASK,) if config in (None, MGRPO_CONFIG) and not names_task else ()
        args = [
            sys.executable, "-m", "mgrpo_verl.main_ppo",
            *(("--config-name", config) if config else ()),
            *task,
            f"trainer.default_local_dir={checkpoints or self.checkpoints}",
            f"mgrpo_verl.metrics_file={metrics}",
            *overrides,
        ]
        with (workdir / "stdout.txt").open("w") as out, (workdir / "stderr.txt").open("w") as err:
            # SIGINT at its default, as in a terminal: started from a shell's background job the run would inherit
            # it ignored, and the Ctrl-C tests would wait for a KeyboardInterrupt that never comes
            popen = subprocess.Popen(args, cwd=workdir, env=self.env(env), stdout=out, stderr=err,
                                     preexec_fn=_default_sigint)
        return Proc(popen, workdir, metrics)

    def __call__(self, name: str, *overrides: str, timeout: float = 900, config: str | None = None,
                 env: dict | None = None) -> Run:
        """Run to the end (see :meth:`start`)."""
        proc = self.start(name, *overrides, config=config, env=env)
        with reaped(proc):
            return proc.result(timeout)


# ----------------------------------------------------------------------------------- Ray clusters
NODE_CPUS = 16  # logical CPUs per simulated node, for verl's long-lived actors


class SimulatedCluster:
    """A Ray cluster of several "nodes" (raylets on this machine; one custom resource name and one logical GPU
    each)."""

    def __init__(self, cluster, tmp: str):
        self.cluster, self.tmp = cluster, tmp

    @property
    def address(self) -> str:
        return self.cluster.address

    @property
    def join_env(self) -> dict[str, str]:
        """What a driver joining this cluster exports (docs/multinode.md): its address and its token."""
        from mgrpo_verl.platform.ray_session import AUTH_TOKEN_FILE

        return {"RAY_ADDRESS": self.address, "RAY_AUTH_TOKEN_PATH": os.path.join(self.tmp, AUTH_TOKEN_FILE)}

    def state(self) -> dict:
        """Ray's record of the cluster: node id -> our node name, placement groups (name -> node ids of their
        bundles; id -> node ids) and actors (name, job, node), removed and dead ones included."""
        import ray
        from ray._private.state import actors

        from mgrpo_verl.platform.ray_session import ray_cpu_env, ray_environ

        with ray_environ(ray_cpu_env(self.tmp)):  # the cluster's token: the one in its temp dir
            ray.init(address=self.address, log_to_driver=False)
            try:
                names = {n["NodeID"]: next(r for r in n["Resources"] if r.startswith("node_"))
                         for n in ray.nodes() if n["Alive"]}
                pgs: dict[str, set] = defaultdict(set)
                pg_ids: dict[str, set] = {}
                for pg_id, pg in ray.util.placement_group_table().items():
                    pgs[pg["name"]].update(pg["bundles_to_node_id"].values())
                    pg_ids[pg_id] = set(pg["bundles_to_node_id"].values())
                actor_list = [{"name": a["Name"], "job": a["JobID"], "node": a["Address"]["NodeID"]}
                              for a in actors().values()]
            finally:
                ray.shutdown()
        return {"nodes": names, "pgs": dict(pgs), "pg_ids": pg_ids, "actors": actor_list}


@contextmanager
def simulated_cluster(*nodes: str, env: dict[str, str] | None = None) -> Iterator[SimulatedCluster]:
    """A cluster of ``nodes`` (custom resource names), as after ``ray start --head`` / ``ray start --address``;
    its raylets (hence every worker of a job on it) have ``env`` too, as a cluster started with it exported."""
    from ray.cluster_utils import Cluster

    from mgrpo_verl.platform.ray_session import private_temp_dir, ray_cpu_env, ray_environ

    with private_temp_dir() as tmp:
        # the raylets inherit this environment (and pass it to their workers): private temp dir, token
        # authentication with the token there (SimulatedCluster.join_env), loopback, no usage stats
        with ray_environ({**ray_cpu_env(tmp), **(env or {})}):
            cluster = Cluster(
                initialize_head=True,
                connect=False,
                head_node_args={"num_cpus": NODE_CPUS, "num_gpus": 1, "resources": {nodes[0]: 1}, "include_dashboard": False},
            )
            try:
                for node in nodes[1:]:
                    cluster.add_node(num_cpus=NODE_CPUS, num_gpus=1, resources={node: 1})
                cluster.wait_for_nodes()
            except BaseException:
                cluster.shutdown()
                raise
        try:
            yield SimulatedCluster(cluster, tmp)
        finally:
            cluster.shutdown()


def pool_node(state: dict, agent: str) -> str:
    """The one node of agent ``agent``'s resource pool (verl names its placement groups
    ``<pool name>verl_group_...``; our pools are ``agent_<name>``)."""
    nodes = {n for name, ns in state["pgs"].items() if name.startswith(f"agent_{agent}verl_group") for n in ns}
    assert len(nodes) == 1, (agent, state["pgs"])
    return nodes.pop()


def reported_nodes(log: str, state: dict) -> dict[str, set]:
    """agent -> nodes of the placement groups its workers reported from inside (the trainer's
    ``mgrpo placement: agent <name> rank <r> pool <pool> placement_group <id> ...`` lines)."""
    found: dict[str, set] = defaultdict(set)
    for agent, pg_id in re.findall(r"mgrpo placement: agent (\S+) rank \d+ pool \S+ placement_group (\w+)", log):
        found[agent] |= state["pg_ids"][pg_id]
    return dict(found)


def wait_for_log(proc: Proc, text: str, timeout: float) -> None:
    """Wait until ``text`` appears in the log of ``proc``, which must keep running meanwhile."""
    deadline = time.monotonic() + timeout
    while text not in proc.log():
        assert proc.poll() is None, proc.log()[-3000:]
        assert time.monotonic() < deadline, f"{text!r} not logged in {timeout:g} s:\n{proc.log()[-3000:]}"
        time.sleep(2)
