"""Several machines, simulated on CPU with ``ray.cluster_utils.Cluster`` (raylets on this machine, each a
"node" with its own logical GPU and a custom resource naming it), joined by ``python -m mgrpo_verl.main_ppo``
through ``RAY_ADDRESS``, as after ``ray start --head`` / ``ray start --address`` on real machines
(docs/multinode.md). On CPU our platform reports logical GPUs under Ray's ``GPU`` resource.

1. **one job on a two-node cluster** (``node_a``, ``node_b``, one GPU each): the default two-agent job
   trains 1 step. Every model-owning agent's pool is a STRICT_PACK placement group of one bundle per GPU,
   so with one GPU per node and one per agent the two pools cannot share a node; which agent gets which
   node is pinned with ``multi_agent.agents.<name>.node_resource`` (against Ray's own choice, which put
   main on ``node_b`` in every unpinned run), and the run joins with no extra overrides. Read back from Ray's GCS tables (which keep
   removed placement groups and dead actors with their nodes): the ``agent_main`` and ``agent_sub``
   placement groups are on different nodes, one on each; the workers' own report (``mgrpo placement:``
   lines) names those placement groups; each node runs exactly one rollout server, on its agent's node.
2. **decoupled M-GRPO, one side per machine**: two single-node clusters (``node_main``, ``node_sub``),
   each side joins its own. Each side's pool and rollout server are on its node, one step is trained on
   each side, and the sub side trained exactly the calls that the main side's records list.

   Not two jobs of one cluster: verl 0.9.1's TransferQueue controller is a named actor in a fixed
   namespace (``TransferQueueController`` in ``transfer_queue``), so a second verl job on the same cluster
   silently connects to the first job's queue (``tests/platform/test_ray_join.py`` guards this fact).

Small clusters: 16 logical CPUs per node (for verl's long-lived actors), a few real processes.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mgrpo_verl.platform.ray_session import patched_environ, private_temp_dir, ray_cpu_env
from mgrpo_verl.store import open_store

pytestmark = pytest.mark.slow

NODE_CPUS = 16
# B = 4 prompts x n = 4 rollouts per step
MAIN_ROWS = 16


class SimulatedCluster:
    """A Ray cluster of ``nodes`` (one custom resource name each, one logical GPU) on this machine."""

    def __init__(self, cluster, tmp: str):
        self.cluster, self.tmp = cluster, tmp

    @property
    def address(self) -> str:
        return self.cluster.address

    def state(self) -> dict:
        """Ray's record of the cluster: node id -> our node name, placement groups (name -> node ids of their
        bundles; id -> node ids) and actors (name, job, node), removed and dead ones included."""
        import ray
        from ray._private.state import actors

        with patched_environ(ray_cpu_env(self.tmp)):
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
def simulated_cluster(*nodes: str) -> Iterator[SimulatedCluster]:
    from ray.cluster_utils import Cluster

    with private_temp_dir() as tmp:
        # the raylets inherit this environment (and pass it to their workers): private temp dir, no auth
        # token under $HOME, no usage stats
        with patched_environ(ray_cpu_env(tmp)):
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


def test_two_agents_each_on_its_own_node(main_ppo, tmp_path):
    nodes = ("node_a", "node_b")
    with simulated_cluster(*nodes) as cluster:
        run = main_ppo(
            "joined", "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
            # pinned against Ray's own choice (it put main on node_b in every unpinned run)
            "multi_agent.agents.main.node_resource=node_a", "multi_agent.agents.sub.node_resource=node_b",
            env={"RAY_ADDRESS": cluster.address},
        )
        assert run.returncode == 0, run.log[-6000:]
        assert f"Connecting to existing Ray cluster at address: {cluster.address}" in run.log
        state = cluster.state()
    assert run.steps() == [1]
    m = run.at(1)
    for agent in ("main", "sub"):
        assert m[f"agent/{agent}/update_rows"] > 0 and math.isfinite(m[f"agent/{agent}/actor/pg_loss"])

    main_node, sub_node = pool_node(state, "main"), pool_node(state, "sub")
    assert (state["nodes"][main_node], state["nodes"][sub_node]) == nodes  # where the pins put them
    # the workers themselves report being in those placement groups
    assert reported_nodes(run.log, state) == {"main": {main_node}, "sub": {sub_node}}
    # each agent's rollout server runs on its own pool's node (the HF replica follows its first worker):
    # one server per node, and each got its model's weights there (initial sync and after step 1)
    servers = sorted(a["node"] for a in state["actors"] if a["name"].startswith("hf_server_"))
    assert servers == sorted([main_node, sub_node]), state["actors"]
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


def test_decoupled_sides_each_on_its_own_machine(main_ppo, tmp_path):
    port = _free_port()
    store_url = f"sqlite:///{tmp_path / 'stats.db'}"
    common = [f"multi_agent.decoupled.store={store_url}", "trainer.total_training_steps=1", "trainer.n_gpus_per_node=1",
              "multi_agent.d_max=2", "trainer.val_before_train=false", "trainer.test_freq=-1"]
    # the conftest fixture runs one process at a time; the two sides run together, so they are started here
    # with the fixture's environment rules (private HOME and caches, Ray/platform variables cleared)
    cleared = ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "RAY_ADDRESS", "VERL_FILE_LOGGER_PATH")
    env = {k: v for k, v in os.environ.items() if k not in cleared}
    env.update(HOME=str(main_ppo.home), MGRPO_VERL_CACHE=str(main_ppo.cache), HF_HOME=str(tmp_path / "hf"),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")

    def start(side: str, address: str, *overrides: str) -> subprocess.Popen:
        out = tmp_path / side
        out.mkdir()
        args = [sys.executable, "-m", "mgrpo_verl.main_ppo", f"multi_agent.decoupled.role={side}",
                f"trainer.default_local_dir={out / 'ckpt'}", f"mgrpo_verl.metrics_file={out / 'metrics.jsonl'}",
                *common, *overrides]
        return subprocess.Popen(args, cwd=out, env={**env, "RAY_ADDRESS": address},
                                stdout=open(out / "log.txt", "w"), stderr=subprocess.STDOUT)

    with simulated_cluster("node_main") as main_machine, simulated_cluster("node_sub") as sub_machine:
        sub = start("sub", sub_machine.address, f"multi_agent.decoupled.serve_port={port}")
        main = start("main", main_machine.address, f"multi_agent.decoupled.sub_urls.sub=http://127.0.0.1:{port}")
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
        assert f"Connecting to existing Ray cluster at address: {main_machine.address}" in main_log
        assert f"Connecting to existing Ray cluster at address: {sub_machine.address}" in sub_log
        states = {"main": main_machine.state(), "sub": sub_machine.state()}

    # each side's pool, workers and rollout server on its own machine's node; nothing of the other side there
    for side, log in (("main", main_log), ("sub", sub_log)):
        state = states[side]
        (node,) = state["nodes"]
        assert state["nodes"][node] == f"node_{side}"
        assert pool_node(state, side) == node
        assert not any(name.startswith("agent_") and not name.startswith(f"agent_{side}verl_group") for name in state["pgs"])
        assert reported_nodes(log, state) == {side: {node}}
        assert [a["node"] for a in state["actors"] if a["name"].startswith("hf_server_")] == [node]
    assert [a["name"] for a in states["sub"]["actors"] if a["name"].startswith("mgrpo_sub_service_")] == ["mgrpo_sub_service_sub"]

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
