"""One LLM client for several agents, each with its own model and rollout servers.

verl hands one ``LLMServerClient`` to every agent loop; :class:`MultiAgentLLMClient` is the main agent's own
client (so verl's stock loops reach the main model unchanged) plus ``for_agent(name)``, which our delegation
loops use to reach a sub-agent's servers. Picklable. Details and history: ``docs/multi_agent.md``, "One runtime
per agent".
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
