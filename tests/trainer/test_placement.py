"""Placing the agents' pools on nodes (mgrpo_verl/trainer/placement.py): the exact fit check by hand-made
clusters, and pinning on a real two-node Ray cluster (slow: starts Ray)."""

from __future__ import annotations

import pytest

from mgrpo_verl.trainer.placement import PIN_AMOUNT, node_slots, placement_problem

GPU8 = {"GPU": 8, "CPU": 64}


def test_node_slots_counts_gpus_and_cpus_per_bundle():
    assert node_slots({"GPU": 8, "CPU": 64}, "GPU", 3) == 8
    assert node_slots({"GPU": 8, "CPU": 10}, "GPU", 3) == 3  # 10 CPUs hold three bundles of 3
    assert node_slots({"CPU": 64}, "GPU", 3) == 0
    assert node_slots({"GPU": 0.9999999999, "CPU": 3}, "GPU", 3) == 1  # Ray's float arithmetic


def test_two_agents_of_a_node_each_fit_on_two_nodes():
    assert placement_problem({"agent_main": 8, "agent_sub": 8}, {}, {"a": GPU8, "b": GPU8}) is None
    assert placement_problem({"agent_main": 4, "agent_sub": 4}, {}, {"a": GPU8}) is None


def test_an_agent_larger_than_every_node_is_named():
    problem = placement_problem({"agent_main": 16, "agent_sub": 4}, {}, {"a": GPU8, "b": GPU8})
    assert problem.startswith("multi_agent.agents.main.n_gpus_per_node=16: ")
    assert "largest node has 8 free GPU" in problem


def test_pools_that_fit_alone_but_not_together():
    # 6 + 6 on nodes of 8 and 4: each fits the 8-GPU node, not both
    problem = placement_problem({"agent_main": 6, "agent_sub": 6}, {}, {"a": GPU8, "b": {"GPU": 4, "CPU": 64}})
    assert problem.startswith("the agents' pools do not fit together")
    # 4 + 8 on 8 and 4: fits only as sub -> a, main -> b; the search finds it
    assert placement_problem({"agent_main": 4, "agent_sub": 8}, {}, {"a": GPU8, "b": {"GPU": 4, "CPU": 64}}) is None


def test_pins_restrict_the_nodes():
    nodes = {"a": {**GPU8, "node_main": 1}, "b": {**GPU8, "node_sub": 1}}
    assert placement_problem({"agent_main": 8, "agent_sub": 8}, {"agent_main": "node_main", "agent_sub": "node_sub"}, nodes) is None
    # both pinned to one node: 16 GPUs wanted there
    problem = placement_problem({"agent_main": 8, "agent_sub": 8}, {"agent_main": "node_main", "agent_sub": "node_main"}, nodes)
    assert problem.startswith("the agents' pools do not fit together") and "on 'node_main'" in problem
    problem = placement_problem({"agent_main": 1}, {"agent_main": "node_x"}, nodes)
    assert problem == "multi_agent.agents.main.node_resource: no node of the cluster has the resource 'node_x' (with room for 1 bundles)"
    # a node whose pinning resource is used up (each bundle takes PIN_AMOUNT) is not eligible
    assert placement_problem({"agent_main": 2}, {"agent_main": "node_main"}, {"a": {**GPU8, "node_main": PIN_AMOUNT}}) is not None


PINNING_SCRIPT = """
import json
import time

# verl first: importing mgrpo_verl.platform before verl leaves this process on verl's CUDA fallback
from mgrpo_verl.trainer.placement import PinnedResourcePoolManager

import ray
from ray.cluster_utils import Cluster

from mgrpo_verl.platform.ray_session import private_temp_dir, ray_cpu_env, ray_environ


def wait_free_gpus(n):
    # Ray's per-node view of free resources (what the check reads) lags behind the raylets by up to a second
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = ray._private.state.available_resources_per_node()
        if sum(r.get("GPU", 0) for r in nodes.values()) >= n:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the cluster never showed {n} free GPUs: {nodes}")

spec = {"agent_main": [1], "agent_sub": [1]}
mapping = {"main": "agent_main", "sub": "agent_sub"}
result = {"placed": []}
with private_temp_dir() as tmp, ray_environ(ray_cpu_env(tmp)):
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 4, "num_gpus": 1, "resources": {"node_a": 1}, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=4, num_gpus=1, resources={"node_b": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        names = {n["NodeID"]: next(r for r in n["Resources"] if r.startswith("node_")) for n in ray.nodes()}
        for pins in ({"agent_main": "node_b", "agent_sub": "node_a"}, {"agent_main": "node_a", "agent_sub": "node_b"}):
            wait_free_gpus(2)
            manager = PinnedResourcePoolManager(resource_pool_spec=dict(spec), mapping=mapping, node_resources=pins)
            manager.create_resource_pool()
            placed = {}
            for pool_name, pool in manager.resource_pool_dict.items():
                (pg,) = pool.get_placement_groups(device_name="cpu")
                placed[pool_name] = names[ray.util.placement_group_table(pg)["bundles_to_node_id"][0]]
                ray.util.remove_placement_group(pg)
            result["placed"].append(placed)
        wait_free_gpus(2)
        both = PinnedResourcePoolManager(resource_pool_spec=dict(spec), mapping=mapping,
                                         node_resources={"agent_main": "node_a", "agent_sub": "node_a"})
        try:
            both.create_resource_pool()
        except ValueError as err:
            result["refused"] = str(err)
    finally:
        ray.shutdown()
        cluster.shutdown()
print(json.dumps(result))
"""


@pytest.mark.slow
def test_pins_place_the_pools_on_their_nodes_on_a_real_cluster():
    """Two nodes with one logical GPU each; the pools go where their pins say, in both directions (so not by
    Ray's choice), and an impossible pin is refused before any placement group is requested. In a fresh
    interpreter: verl resolves its platform (ours: CPU, resource ``GPU``) once per process."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-c", PINNING_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["placed"] == [{"agent_main": "node_b", "agent_sub": "node_a"}, {"agent_main": "node_a", "agent_sub": "node_b"}]
    assert result["refused"].startswith("the agents' pools do not fit together"), result
