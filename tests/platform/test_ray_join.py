"""Joining an existing Ray cluster (docs/multinode.md): which address, and what ``ray.init`` gets."""

from __future__ import annotations

import inspect

from mgrpo_verl.platform.ray_session import (
    NODE_RESOURCE_KEYS,
    existing_cluster_address,
    ray_init_for_existing_cluster,
)


def test_address_from_config_then_environment():
    assert existing_cluster_address({"address": "10.0.0.1:6379"}, {"RAY_ADDRESS": "10.0.0.2:6379"}) == "10.0.0.1:6379"
    assert existing_cluster_address({"address": None}, {"RAY_ADDRESS": "10.0.0.2:6379"}) == "10.0.0.2:6379"
    assert existing_cluster_address({}, {"RAY_ADDRESS": "auto"}) == "auto"


def test_no_address_or_local_starts_a_cluster():
    assert existing_cluster_address({"num_cpus": 16}, {}) is None
    assert existing_cluster_address({}, {"RAY_ADDRESS": ""}) is None
    assert existing_cluster_address({"address": "local"}, {"RAY_ADDRESS": "10.0.0.2:6379"}) is None


def test_joining_drops_node_resources_and_forwards_env():
    ray_init = {"num_cpus": 16, "num_gpus": 2, "address": None, "runtime_env": {"py_executable": None}}
    joined = ray_init_for_existing_cluster(ray_init, {"VERL_FILE_LOGGER_PATH": "/shared/m.jsonl", "MGRPO_VERL_DEVICE": "cpu"})
    assert joined == {
        "address": None,
        "runtime_env": {
            "py_executable": None,
            "env_vars": {"VERL_FILE_LOGGER_PATH": "/shared/m.jsonl", "MGRPO_VERL_DEVICE": "cpu"},
        },
    }
    assert ray_init == {"num_cpus": 16, "num_gpus": 2, "address": None, "runtime_env": {"py_executable": None}}


def test_env_vars_already_in_runtime_env_win():
    ray_init = {"runtime_env": {"env_vars": {"VERL_FILE_LOGGER_PATH": "/mine.jsonl", "A": "1"}}}
    joined = ray_init_for_existing_cluster(ray_init, {"VERL_FILE_LOGGER_PATH": "/driver.jsonl", "B": "2"})
    assert joined["runtime_env"]["env_vars"] == {"VERL_FILE_LOGGER_PATH": "/mine.jsonl", "A": "1", "B": "2"}
    assert ray_init_for_existing_cluster({}, {})["runtime_env"] == {"env_vars": {}}


def test_the_dropped_keys_are_the_ones_ray_refuses_when_joining():
    """Contract with Ray: a joining driver may not pass these (``ray.init`` raises ValueError)."""
    import ray._private.worker as worker

    source = inspect.getsource(worker.init)
    assert NODE_RESOURCE_KEYS == ("num_cpus", "num_gpus")
    assert "if num_cpus is not None or num_gpus is not None:" in source
    assert '"When connecting to an existing cluster, num_cpus "' in source


def test_transfer_queue_controller_is_one_per_cluster():
    """docs/multinode.md says two verl jobs must not share a Ray cluster: TransferQueue's controller is a named
    actor in a fixed namespace, and a second job that finds the name taken connects to the first job's queue.
    If this changes, revisit that sentence (and tests/trainer/test_multinode_e2e.py's choice of one cluster
    per decoupled side)."""
    import transfer_queue.interface as tq_interface

    source = inspect.getsource(tq_interface)
    assert 'name="TransferQueueController", namespace="transfer_queue"' in source
    assert 'ray.get_actor("TransferQueueController", namespace="transfer_queue")' in source
    assert "Some other rank has initialized TransferQueueController. Try to connect to existing controller." in source
