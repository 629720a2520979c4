"""MultiAgentLLMClient: default route = main agent, for_agent routing, errors, pickle round trip.

The clients are real ``LLMServerClient`` objects whose load balancer and server are small fakes with
Ray's ``.remote(...)`` call shape, so verl's own ``generate`` runs unchanged without Ray.
"""

from __future__ import annotations

import asyncio
import pickle

import pytest
from omegaconf import OmegaConf

from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from mgrpo_verl.agent_loops.multi_client import MultiAgentLLMClient


class _Remote:
    """``actor.method.remote(...)`` stand-in: calls ``fn`` (an awaitable result when ``fn`` is async)."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class FakeServer:
    """A rollout server that answers with its agent's token id."""

    def __init__(self, token: int):
        self.token = token

    async def _generate(self, **kwargs):
        return TokenOutput(token_ids=[self.token], extra_fields={"global_steps": 5, "lora_name": kwargs.get("lora_name")})

    @property
    def generate(self):
        return _Remote(self._generate)


class FakeBalancer:
    """verl's ``GlobalRequestLoadBalancer`` surface used by ``LLMServerClient``, with one server."""

    def __init__(self, token: int):
        self.token = token

    async def _no_fields(self):
        return []

    async def _acquire(self, request_id, **kwargs):
        return "server-0", FakeServer(self.token)

    def _release(self, **kwargs):
        return None

    require_acquire_fields = property(lambda self: _Remote(self._no_fields))
    require_release_fields = property(lambda self: _Remote(self._no_fields))
    acquire_server = property(lambda self: _Remote(self._acquire))
    release_server = property(lambda self: _Remote(self._release))


def _client(name: str, token: int) -> LLMServerClient:
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"path": f"/models/{name}"}, "rollout": {"name": "hf"}}})
    return LLMServerClient(config=config, load_balancer_handle=FakeBalancer(token))


def _generate(client) -> TokenOutput:
    return asyncio.run(client.generate("req", prompt_ids=[1, 2], sampling_params={"max_tokens": 1}))


@pytest.fixture
def multi():
    return MultiAgentLLMClient({"main": _client("main", 11), "sub": _client("sub", 22)}, main="main")


def test_generate_goes_to_main_and_for_agent_to_each_agent(multi):
    assert isinstance(multi, LLMServerClient)
    assert multi.agents == ("main", "sub")
    assert multi.config is multi.for_agent("main").config  # the main client's own constructor arguments
    out = _generate(multi)
    assert out.token_ids == [11]
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 5  # verl's generate ran
    assert _generate(multi.for_agent("sub")).token_ids == [22]
    assert _generate(multi.for_agent("main")).token_ids == [11]


def test_main_route_is_the_main_clients_own_generate():
    """Two LoRA agents on one shared engine: each client names its agent's adapter (AdapterLLMServerClient), and
    the default route (what the main agent's turns use) must name main's, not none (the engine would generate
    with the bare base, as it did before 2026-11-26)."""
    from mgrpo_verl.hf_rollout.adapters import AdapterLLMServerClient

    def adapter(name):
        plain = _client(name, 7)
        return AdapterLLMServerClient(config=plain.config, load_balancer_handle=plain._load_balancer, lora_name=name)

    multi = MultiAgentLLMClient({"main": adapter("main"), "sub": adapter("sub")}, main="main")
    assert _generate(multi).extra_fields["lora_name"] == "main"
    assert _generate(multi.for_agent("sub")).extra_fields["lora_name"] == "sub"
    assert _generate(pickle.loads(pickle.dumps(multi))).extra_fields["lora_name"] == "main"


def test_unknown_agent_and_bad_construction(multi):
    with pytest.raises(ValueError, match=r"unknown agent 'critic'.*\['main', 'sub'\]"):
        multi.for_agent("critic")
    with pytest.raises(ValueError, match=r"main agent 'boss' has no client.*\['main', 'sub'\]"):
        MultiAgentLLMClient({"main": _client("main", 1), "sub": _client("sub", 2)}, main="boss")
    with pytest.raises(ValueError, match="at least one"):
        MultiAgentLLMClient({}, main="main")


def test_pickle_round_trip(multi):
    again = pickle.loads(pickle.dumps(multi))
    assert isinstance(again, MultiAgentLLMClient)
    assert again.agents == ("main", "sub") and again.main == "main"
    assert again.for_agent("sub").config.actor_rollout_ref.model.path == "/models/sub"
    assert _generate(again).token_ids == [11]
    assert _generate(again.for_agent("sub")).token_ids == [22]
