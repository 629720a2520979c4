"""Several machines, simulated on CPU: a two-node Ray cluster (``ray.cluster_utils.Cluster``) that
``python -m mgrpo_verl.main_ppo`` joins, as after ``ray start --head`` / ``ray start --address`` on two
machines (docs/multinode.md).

Each simulated node has one logical GPU (on CPU our platform reports logical GPUs under Ray's ``GPU``
resource) and a custom resource naming it (``node_a``, ``node_b``). Every model-owning agent's resource
pool is a STRICT_PACK placement group of one bundle per GPU, so with one GPU per node and one per agent
the two pools cannot share a node: placement on two nodes is forced by the arithmetic, no new setting.
Which agent gets which node is Ray's choice (it differs between runs); the tests prove the split, not a
particular assignment.

1. the default two-agent job joins the cluster and trains 1 step; read back from Ray's state (GCS tables,
   which keep removed placement groups and dead actors with their nodes): the ``agent_main`` and
   ``agent_sub`` placement groups are on different nodes, one on each, and each node runs exactly one
   rollout server, on its agent's node;
2. decoupled M-GRPO, its two sides as two jobs of the same cluster (two job ids, so the per-job socket
   paths of colocated weight sync cannot collide): each side's pool on its own node, one step trained on
   each side, the sub side trained exactly the calls that the main side's records list.

The cluster is small: two raylets (16 logical CPUs each, for verl's long-lived actors) on this machine.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from mgrpo_verl.platform.ray_session import patched_environ, private_temp_dir, ray_cpu_env
from mgrpo_verl.store import open_store

pytestmark = pytest.mark.slow

NODES = ("node_a", "node_b")
NODE_CPUS = 16
# B = 4 prompts x n = 4 rollouts per step
MAIN_ROWS = 16


def join_overrides(metrics_file: Path) -> list[str]:
    """What a run that joins an existing cluster sets today (docs/multinode.md): no logical CPUs / GPUs of its
    own (the nodes declared them; Ray refuses both from a joining driver), and the metrics file's path through
    the job's runtime_env (the cluster's workers do not inherit the driver's environment)."""
    return [
        "ray_kwargs.ray_init.num_cpus=null",
        "ray_kwargs.ray_init.num_gpus=null",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={metrics_file}",
    ]


@pytest.fixture
def two_nodes():
    """A two-node Ray cluster on this machine: (cluster, its temp dir). Shut down afterwards."""
    from ray.cluster_utils import Cluster

    with private_temp_dir() as tmp:
        # the raylets inherit this environment (and pass it to their workers): private temp dir, no auth
        # token under $HOME, no usage stats
        with patched_environ(ray_cpu_env(tmp)):
            cluster = Cluster(
                initialize_head=True,
                connect=False,
                head_node_args={"num_cpus": NODE_CPUS, "num_gpus": 1, "resources": {NODES[0]: 1}, "include_dashboard": False},
            )
            try:
                cluster.add_node(num_cpus=NODE_CPUS, num_gpus=1, resources={NODES[1]: 1})
                cluster.wait_for_nodes()
            except BaseException:
                cluster.shutdown()
                raise
        try:
            yield cluster, tmp
        finally:
            cluster.shutdown()


def cluster_state(cluster, tmp) -> dict:
    """Ray's record of the cluster: node id -> our node name, placement groups (name -> node ids of
    their bundles) and actors (name, job, node), removed and dead ones included."""
    import ray
    from ray._private.state import actors

    with patched_environ(ray_cpu_env(tmp)):
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            names = {n["NodeID"]: next(r for r in n["Resources"] if r in NODES) for n in ray.nodes() if n["Alive"]}
            pgs: dict[str, set] = defaultdict(set)
            for pg in ray.util.placement_group_table().values():
                pgs[pg["name"]].update(pg["bundles_to_node_id"].values())
            actor_list = [
                {"name": a["Name"], "job": a["JobID"], "node": a["Address"]["NodeID"], "class": a["ActorClassName"]}
                for a in actors().values()
            ]
        finally:
            ray.shutdown()
    return {"nodes": names, "pgs": dict(pgs), "actors": actor_list}


def pool_node(state: dict, agent: str) -> str:
    """The one node of agent ``agent``'s resource pool (verl names its placement groups
    ``<pool name>verl_group_...``; our pools are ``agent_<name>``)."""
    nodes = {n for name, ns in state["pgs"].items() if name.startswith(f"agent_{agent}verl_group") for n in ns}
    assert len(nodes) == 1, (agent, state["pgs"])
    return nodes.pop()


def test_two_agents_each_on_its_own_node(two_nodes, main_ppo, tmp_path):
    cluster, tmp = two_nodes
    run = main_ppo(
        "joined", "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true",
        *join_overrides(tmp_path / "joined" / "metrics.jsonl"),
        env={"RAY_ADDRESS": cluster.address},
    )
    assert run.returncode == 0, run.log[-6000:]
    assert f"Connecting to existing Ray cluster at address: {cluster.address}" in run.log
    assert run.steps() == [1]
    m = run.at(1)
    for agent in ("main", "sub"):
        assert m[f"agent/{agent}/update_rows"] > 0 and math.isfinite(m[f"agent/{agent}/actor/pg_loss"])

    state = cluster_state(cluster, tmp)
    main_node, sub_node = pool_node(state, "main"), pool_node(state, "sub")
    assert main_node != sub_node
    assert {state["nodes"][main_node], state["nodes"][sub_node]} == set(NODES)
    # each agent's rollout server runs on its own pool's node (the HF replica follows its first worker);
    # one server per node
    servers = sorted(a["node"] for a in state["actors"] if a["name"].startswith("hf_server_"))
    assert servers == sorted([main_node, sub_node]), state["actors"]
    # and each server got its own actor's weights, on its node, at start and after step 1
    for replica in (0, 1):
        assert f"HF rollout replica {replica}: " in run.log
    print(f"placement: main -> {state['nodes'][main_node]}, sub -> {state['nodes'][sub_node]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(path: Path) -> dict[int, dict]:
    merged: dict[int, dict] = defaultdict(dict)
    for line in path.read_text().splitlines():
        record = json.loads(line)
        merged[record["step"]].update(record["data"])
    return merged


def test_decoupled_sides_on_two_nodes(two_nodes, main_ppo, tmp_path):
    cluster, tmp = two_nodes
    port = _free_port()
    store_url = f"sqlite:///{tmp_path / 'stats.db'}"
    common = [f"multi_agent.decoupled.store={store_url}", "trainer.total_training_steps=1", "trainer.n_gpus_per_node=1",
              "multi_agent.d_max=2", "trainer.val_before_train=false", "trainer.test_freq=-1"]
    # the conftest fixture runs one process at a time; the two sides run together, so they are started here
    # with the fixture's environment rules (private HOME and caches, Ray/platform variables cleared)
    cleared = ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "RAY_ADDRESS", "VERL_FILE_LOGGER_PATH")
    env = {k: v for k, v in os.environ.items() if k not in cleared}
    env.update(HOME=str(main_ppo.home), MGRPO_VERL_CACHE=str(main_ppo.cache), HF_HOME=str(tmp_path / "hf"),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", RAY_ADDRESS=cluster.address)

    def start(side: str, *overrides: str) -> subprocess.Popen:
        out = tmp_path / side
        out.mkdir()
        args = [sys.executable, "-m", "mgrpo_verl.main_ppo", f"multi_agent.decoupled.role={side}",
                f"trainer.default_local_dir={out / 'ckpt'}", f"mgrpo_verl.metrics_file={out / 'metrics.jsonl'}",
                *join_overrides(out / "metrics.jsonl"), *common, *overrides]
        return subprocess.Popen(args, cwd=out, env=env, stdout=open(out / "log.txt", "w"), stderr=subprocess.STDOUT)

    sub = start("sub", f"multi_agent.decoupled.serve_port={port}")
    main = start("main", f"multi_agent.decoupled.sub_urls.sub=http://127.0.0.1:{port}")
    try:
        main_rc = main.wait(timeout=1200)
        sub_rc = sub.wait(timeout=300)
    finally:
        for proc in (main, sub):
            if proc.poll() is None:
                proc.kill()
    main_log, sub_log = ((tmp_path / side / "log.txt").read_text() for side in ("main", "sub"))
    assert main_rc == 0, main_log[-4000:]
    assert sub_rc == 0, sub_log[-4000:]
    for log in (main_log, sub_log):
        assert f"Connecting to existing Ray cluster at address: {cluster.address}" in log

    # one step trained on each side; the sub side's rows are exactly the calls the main records list
    main_m, sub_m = _metrics(tmp_path / "main" / "metrics.jsonl"), _metrics(tmp_path / "sub" / "metrics.jsonl")
    assert main_m[1]["agent/main/update_rows"] == MAIN_ROWS
    assert not any(k.startswith("agent/sub/") for k in main_m[1])
    assert math.isfinite(sub_m[1]["agent/sub/actor/pg_loss"])
    assert sub_m[1]["decoupled/missing_parent_rows"] == 0 and sub_m[1]["decoupled/unclaimed_rows"] == 0
    import sqlite3

    with sqlite3.connect(tmp_path / "stats.db") as conn:
        ids = [row[0] for row in conn.execute("SELECT traj_id FROM stats")]
    with open_store(store_url) as store:
        records = store.get(ids)
        mains = [r for r in records.values() if r.parent_traj_id == ""]
        subs = [r for r in records.values() if r.parent_traj_id != ""]
        listed = {t for r in mains if r.step == 1 for t in r.extra["sub_calls"]}
        assert len(mains) == MAIN_ROWS and listed
        assert {r.traj_id for r in subs if r.step == 1} == listed
        assert sub_m[1]["decoupled/ready_rows"] == len(listed)
        assert store.consumed("sub:sub", sorted(listed)) == listed

    # two jobs of one cluster, each side's pool on its own node
    state = cluster_state(cluster, tmp)
    main_node, sub_node = pool_node(state, "main"), pool_node(state, "sub")
    assert main_node != sub_node
    assert {state["nodes"][main_node], state["nodes"][sub_node]} == set(NODES)
    servers = [a for a in state["actors"] if a["name"].startswith("hf_server_")]
    assert len({a["job"] for a in servers}) == 2, servers
    assert sorted(a["node"] for a in servers) == sorted([main_node, sub_node]), servers
    service = [a for a in state["actors"] if a["name"] == "mgrpo_sub_service_sub"]
    assert len(service) == 1, state["actors"]
    print(f"placement: main side -> {state['nodes'][main_node]}, sub side -> {state['nodes'][sub_node]}, "
          f"sub service on {state['nodes'][service[0]['node']]}")
