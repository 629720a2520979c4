"""Fixtures for the HF rollout tests (the tiny model and its tokenizer are in ``tests/conftest.py``): an
in-process engine, and a Ray instance that writes only under a temporary directory (docs/cpu.md: ``RAY_TMPDIR``)
and is closed to the network as the trainer's is (token authentication, loopback: docs/security.md "Network
exposure")."""

from __future__ import annotations

import shutil
import tempfile

import pytest
import torch


@pytest.fixture(scope="module")
def engine(tiny_paths):
    from mgrpo_verl.hf_rollout.engine import HFGenerationEngine

    torch.set_num_threads(1)
    return HFGenerationEngine.from_pretrained(tiny_paths.model_dir, dtype="float32", seed=0)


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray instance for one test module, writing only under a private temp dir. Module-scoped, not
    session-scoped: a Ray left up in the pytest process makes later tests' ``ray.init(address=...)`` fail.

    The Ray variables are set only around ``ray.init`` (the raylet captures them), so subprocesses that other
    tests start later do not inherit them. An already initialised Ray is reused and left running.
    """
    import ray

    if ray.is_initialized():
        yield ray
        return
    from mgrpo_verl.platform.ray_session import ray_closed_env, ray_environ

    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a length limit
    # closed to the network as the trainer's own Ray is (token, loopback): the CI machine runs no open Ray either
    with ray_environ({"RAY_TMPDIR": tmp, **ray_closed_env(tmp)}):
        ray.init(num_cpus=8, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
