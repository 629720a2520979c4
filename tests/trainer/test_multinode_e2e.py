"""Several machines, simulated on CPU with ``ray.cluster_utils.Cluster`` (raylets on this machine, each a
"node" with its own logical GPU and a custom resource naming it), joined by ``python -m mgrpo_verl.main_ppo``
through ``RAY_ADDRESS``, as after ``ray start --head`` / ``ray start --address`` on real machines
(docs/multinode.md). On CPU our platform reports logical GPUs under Ray's ``GPU`` resource. Both runs are session
fixtures of conftest.py, shared with the test files that check their training:

1. **one job on a two-node cluster** (``two_agent_job``: ``node_a``, ``node_b``, one GPU each; its training,
   checkpoints and resume are checked by test_multi_agent_e2e.py): the default two-agent job trains 2 steps.
   Every model-owning agent's pool is a STRICT_PACK placement group of one bundle per GPU, so with one GPU per
   node and one per agent the two pools cannot share a node; which agent gets which node is pinned with
   ``multi_agent.agents.<name>.node_resource`` (against Ray's own choice, which put main on ``node_b`` in every
   unpinned run), and the run joins with no extra overrides. Read back from Ray's GCS tables (which keep
   removed placement groups and dead actors with their nodes): the ``agent_main`` and ``agent_sub``
   placement groups are on different nodes, one on each; the workers' own report (``mgrpo placement:``
   lines) names those placement groups; each node runs exactly one rollout server, on its agent's node.
2. **decoupled M-GRPO, one side per machine** (``decoupled_on_two_machines``; the statistics exchange is checked by
   test_decoupled_e2e.py): two single-node clusters (``node_main``, ``node_sub``), each side joins its own. Each
   side's pool and rollout server are on its node, each side trains, and the sub side trained exactly the calls
   that the main side's records list.

   Not two jobs of one cluster: verl 0.9.1's TransferQueue controller is a named actor in a fixed
   namespace (``TransferQueueController`` in ``transfer_queue``), so a second verl job on the same cluster
   silently connects to the first job's queue (``tests/platform/test_ray_join.py`` guards this fact).

Small clusters: 16 logical CPUs per node (for verl's long-lived actors), a few real processes.
"""

from __future__ import annotations

import math

import pytest
from e2e import MAIN_ROWS, by_step, pool_node, reported_nodes, store_records

from mgrpo_verl.store import open_store

pytestmark = pytest.mark.slow


def test_two_agents_each_on_its_own_node(two_agent_job):
    run, state = two_agent_job.run, two_agent_job.state
    assert run.returncode == 0, run.log[-6000:]
    assert f"Connecting to existing Ray cluster at address: {two_agent_job.address}" in run.log
    assert run.steps() == [1, 2]
    m = run.at(1)
    for agent in ("main", "sub"):
        assert m[f"agent/{agent}/update_rows"] > 0 and math.isfinite(m[f"agent/{agent}/actor/pg_loss"])

    main_node, sub_node = pool_node(state, "main"), pool_node(state, "sub")
    assert (state["nodes"][main_node], state["nodes"][sub_node]) == ("node_a", "node_b")  # where the pins put them
    # the workers themselves report being in those placement groups
    assert reported_nodes(run.log, state) == {"main": {main_node}, "sub": {sub_node}}
    # each agent's rollout server runs on its own pool's node (the HF replica follows its first worker):
    # one server per node, and each got its model's weights there (initial sync and after each step)
    servers = sorted(a["node"] for a in state["actors"] if a["name"].startswith("hf_server_"))
    assert servers == sorted([main_node, sub_node]), state["actors"]
    for replica in (0, 1):
        assert f"HF rollout replica {replica}: " in run.log
    print(f"placement: main -> {state['nodes'][main_node]}, sub -> {state['nodes'][sub_node]}")


def test_decoupled_sides_each_on_its_own_machine(decoupled_on_two_machines):
    d = decoupled_on_two_machines
    assert d.main.returncode == 0, d.main.log[-4000:]
    assert d.sub.returncode == 0, d.sub.log[-4000:]
    for side, run in (("main", d.main), ("sub", d.sub)):
        assert f"Connecting to existing Ray cluster at address: {d.addresses[side]}" in run.log

    # each side's pool, workers and rollout server on its own machine's node; nothing of the other side there
    for side, run in (("main", d.main), ("sub", d.sub)):
        state = d.states[side]
        (node,) = state["nodes"]
        assert state["nodes"][node] == f"node_{side}"
        assert pool_node(state, side) == node
        assert not any(name.startswith("agent_") and not name.startswith(f"agent_{side}verl_group") for name in state["pgs"])
        assert reported_nodes(run.log, state) == {side: {node}}
        assert [a["node"] for a in state["actors"] if a["name"].startswith("hf_server_")] == [node]
    assert [a["name"] for a in d.states["sub"]["actors"] if a["name"].startswith("mgrpo_sub_service_")] == ["mgrpo_sub_service_sub"]

    # step 1 trained on each side; the sub side's rows are exactly the calls the main records list
    main_m, sub_m = by_step(d.main.metrics), by_step(d.sub.metrics)
    assert main_m[1]["agent/main/update_rows"] == MAIN_ROWS
    assert not any(k.startswith("agent/sub/") for k in main_m[1])
    assert math.isfinite(sub_m[1]["agent/sub/actor/pg_loss"])
    assert sub_m[1]["decoupled/missing_parent_rows"] == 0 and sub_m[1]["decoupled/unclaimed_rows"] == 0
    records = store_records(d.store_db)
    mains = [r for r in records.values() if r.parent_traj_id == "" and r.step == 1]
    subs = [r for r in records.values() if r.parent_traj_id != "" and r.step == 1]
    listed = {t for r in mains for t in r.extra["sub_calls"]}
    assert len(mains) == MAIN_ROWS and listed
    assert {r.traj_id for r in subs} == listed
    assert sub_m[1]["decoupled/ready_rows"] == len(listed)
    with open_store(f"sqlite:///{d.store_db}") as store:
        assert store.consumed("sub:sub", sorted(listed)) == listed
