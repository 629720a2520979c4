"""Our rollout request router (mgrpo_verl/trainer/balancer.py) routes as verl's GlobalRequestLoadBalancer, call for
call, and its module imports neither verl nor torch (the point of it: a Ray actor process of ~70 MiB, not ~320)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl.trainer.agents import AgentLLMServerManager
from mgrpo_verl.trainer.balancer import DeterministicRequestBalancer, RequestBalancer, balancer_class
from verl.workers.rollout.router import GlobalRequestLoadBalancer

SERVERS = {"a:1": "handle-a", "b:2": "handle-b", "c:3": "handle-c"}

# one call on both balancers: (method, argument); request ids from a small set so that sticky sessions recur
_request = st.sampled_from([f"r{i}" for i in range(6)])
_server = st.sampled_from([*SERVERS, "gone:9"])
CALLS = st.lists(st.one_of(
    st.tuples(st.just("acquire_server"), _request),
    st.tuples(st.just("release_server"), _server),
    st.tuples(st.just("remove_servers"), st.lists(_server, max_size=2)),
    st.tuples(st.just("add_servers"), st.dictionaries(_server, st.just("handle-new"), max_size=2)),
    st.tuples(st.just("clear_sticky_cache"), st.none()),
), max_size=40)


def _call(balancer, method: str, arg):
    try:
        return getattr(balancer, method)() if arg is None else getattr(balancer, method)(arg)
    except RuntimeError as error:  # an empty pool: both must refuse with the same message
        return ("error", str(error))


@settings(max_examples=200, deadline=None)
@given(calls=CALLS, seed=st.integers(0, 2**16))
def test_routes_as_verls_balancer_call_for_call(calls, seed):
    ours = RequestBalancer(servers=SERVERS, max_cache_size=4)
    verls = GlobalRequestLoadBalancer(servers=SERVERS, max_cache_size=4)
    rng_state = random.Random(seed).getstate()
    for method, arg in calls:
        # both draw ties with the module's random.choice: the same state before each call, the same choice
        random.setstate(rng_state)
        expected = _call(verls, method, arg)
        random.setstate(rng_state)
        got = _call(ours, method, arg)
        rng_state = random.getstate()
        assert got == expected, (method, arg)
        assert ours.get_status() == verls.get_status()
        assert ours.get_all_servers() == verls.get_all_servers()
        assert ours.get_total_inflight() == verls.get_total_inflight()


@settings(max_examples=50, deadline=None)
@given(requests=st.lists(_request, max_size=20))
def test_full_determinism_routes_as_verls(requests):
    ours = DeterministicRequestBalancer(servers=SERVERS)
    verls = GlobalRequestLoadBalancer(servers=SERVERS, full_determinism=True)
    for request_id in requests:
        assert ours.acquire_server(request_id) == verls.acquire_server(request_id)


def test_sticky_then_least_loaded_by_hand():
    b = RequestBalancer(servers={"a": 1, "b": 2})
    first = b.acquire_server("x")                      # a tie: a or b
    other = "b" if first[0] == "a" else "a"
    assert b.acquire_server("y")[0] == other           # least loaded: the one x did not take
    assert b.acquire_server("x") == first              # sticky: x again on its server, now 2 in flight there
    assert b.get_inflight_count(first[0]) == 2 and b.get_inflight_count(other) == 1
    for _ in range(3):
        b.release_server(first[0])                      # the third is one too many: never below 0
    assert b.get_inflight_count(first[0]) == 0
    b.remove_servers([first[0]])
    assert b.acquire_server("x")[0] == other           # its server gone: re-routed, not an error
    b.remove_servers([other])
    with pytest.raises(RuntimeError, match="No available servers"):
        b.acquire_server("z")


def test_the_class_follows_full_determinism():
    assert balancer_class({"full_determinism": True}) is DeterministicRequestBalancer
    assert balancer_class({}) is RequestBalancer


@pytest.mark.parametrize("module", ["mgrpo_verl.trainer.balancer", "mgrpo_verl.hf_rollout.server"])
def test_the_router_process_imports_neither_verl_nor_torch(module):
    # the router's own module, and the module of the server actors whose handles it holds: Ray imports an actor's
    # module wherever it deserialises a handle of it
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('verl', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_agents_server_manager_hands_it_to_verl_unless_a_router_is_configured():
    from omegaconf import OmegaConf

    def manager(**rollout):
        config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "hf", "nnodes": 0, "full_determinism": False,
                                                                     "disaggregation": {"enabled": False}, **rollout},
                                                         "model": {"path": "unused"}}})
        return AgentLLMServerManager(config, worker_group=object())

    assert manager()._load_balancer_cls is RequestBalancer
    assert manager(full_determinism=True)._load_balancer_cls is DeterministicRequestBalancer
    assert manager(router_config_path="my_router.yaml")._load_balancer_cls is None  # verl loads the user's router


def test_it_answers_every_method_of_verls_balancer():
    # a method verl adds (and its trainers call on the router) must be added here too
    public = {name for name in vars(GlobalRequestLoadBalancer) if not name.startswith("_")}
    assert public <= {name for name in dir(RequestBalancer) if not name.startswith("_")}
