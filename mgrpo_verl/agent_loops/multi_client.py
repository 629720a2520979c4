"""One LLM client for several agents, each with its own model and rollout servers.

verl hands a single ``LLMServerClient`` to every agent loop (``AgentLoopWorker`` keeps it as
``llm_client`` and passes it to each loop as ``server_manager``). With one model per agent the trainer
gives it a :class:`MultiAgentLLMClient` instead:

* it *is* an ``LLMServerClient`` built from the main agent's own constructor arguments (its config and
  load balancer), so ``generate(...)``, which verl's stock loops (``single_turn_agent``, ``tool_agent``)
  call, goes to the main agent's servers exactly as a plain client of the main agent would;
* ``for_agent(name)`` returns the client of any agent, which our delegation loops use to route a
  sub-agent's generations to that sub-agent's own servers.

``generate`` is the main agent's own client's: what that client adds reaches the main agent's requests too
(a LoRA agent on a shared engine names its adapter, ``AdapterLLMServerClient``; verl's
``FullyAsyncLLMServerClient`` retries while the balancer is empty). Until 2026-11-26 it was the base class's
``generate`` with the main client's config, so the main agent's requests on a shared LoRA engine named no
adapter and the HF engine generated them with the bare base.

Picklable (it is shipped to the Ray agent-loop workers): it holds only the clients (each a config and a
Ray actor handle, which verl already ships) and the main agent's name.
"""

from __future__ import annotations

from collections.abc import Mapping

from verl.workers.rollout.llm_server import LLMServerClient


class MultiAgentLLMClient(LLMServerClient):
    """Routes ``generate`` to the main agent and ``for_agent(name)`` to any agent.

    Args:
        clients: agent name -> that agent's ``LLMServerClient`` (each agent's own rollout servers).
        main: name of the main agent, a key of ``clients``.

    Raises:
        ValueError: ``clients`` is empty, a name is not a non-empty string, or ``main`` is not a key.
    """

    def __init__(self, clients: Mapping[str, LLMServerClient], main: str):
        clients = dict(clients)
        if not clients:
            raise ValueError("MultiAgentLLMClient needs at least one agent client, got none")
        bad = [name for name in clients if not isinstance(name, str) or not name]
        if bad:
            raise ValueError(f"MultiAgentLLMClient agent names must be non-empty strings, got {bad!r}")
        if main not in clients:
            raise ValueError(f"main agent {main!r} has no client; known agents are {sorted(clients)}")
        main_client = clients[main]
        super().__init__(config=main_client.config, load_balancer_handle=getattr(main_client, "_load_balancer", None))
        self._clients = clients
        self.main = main

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        """The main agent's generation, by its own client."""
        return await self._clients[self.main].generate(request_id, prompt_ids=prompt_ids,
                                                       sampling_params=sampling_params, **kwargs)

    @property
    def agents(self) -> tuple[str, ...]:
        """Agent names, in the order the clients were given."""
        return tuple(self._clients)

    def for_agent(self, name: str) -> LLMServerClient:
        """The client of agent ``name``.

        Raises:
            ValueError: ``name`` is not an agent, naming the known agents.
        """
        try:
            return self._clients[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown agent {name!r}; known agents are {sorted(self._clients)}") from None
