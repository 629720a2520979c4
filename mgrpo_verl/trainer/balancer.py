"""The request router of every agent's rollout servers: verl's routing, in a process that never imports verl.

verl 0.9.1 starts one ``GlobalRequestLoadBalancer`` Ray actor per ``LLMServerManager``, so one per model-owning agent
here. Its module imports ``verl``, and ``import verl`` imports torch and transformers: each balancer process holds
about 320 MiB (PSS) to keep a dict of in-flight counts. :class:`RequestBalancer` implements the same routing
(verl's ``RequestLoadBalancer`` protocol: sticky sessions by request id, least in-flight otherwise, a hash of the
request id under ``rollout.full_determinism``) and imports only Ray and cachetools; ``AgentLLMServerManager`` hands
it to verl through ``LLMServerManager``'s ``load_balancer_cls`` (verl's documented way to change the router). The
routing is checked against verl's own class, call for call (tests/trainer/test_balancer.py); its size, against
verl's, in ``benchmarks/bench_footprint.py``.
"""

from __future__ import annotations

import random
from typing import Any

from cachetools import LRUCache


class RequestBalancer:
    """Sticky + least-in-flight routing over ``{server_id: actor handle}`` (verl's ``GlobalRequestLoadBalancer``).

    ``acquire_server`` returns a request's earlier server while that server is registered, else one of the least
    loaded (a random one among ties, as verl); ``release_server`` decrements its count, never below 0.
    """

    #: route by ``hash(request_id)`` over the whole pool instead (verl's ``rollout.full_determinism``): the same
    #: request goes to the same replica on every run, whatever the arrival order
    FULL_DETERMINISM = False

    def __init__(self, servers: dict[str, Any], max_cache_size: int = 10000):
        self._servers = dict(servers)
        self._inflight = {sid: 0 for sid in servers}
        self._sticky: LRUCache = LRUCache(maxsize=max_cache_size)

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        server_id = self._sticky.get(request_id)
        if server_id is not None and server_id not in self._inflight:  # its server was removed
            del self._sticky[request_id]
            server_id = None
        if server_id is None:
            if not self._inflight:
                raise RuntimeError("No available servers in load balancer")
            if self.FULL_DETERMINISM:
                server_id = list(self._servers)[hash(request_id) % len(self._servers)]
            else:
                least = min(self._inflight.values())
                server_id = random.choice([sid for sid, n in self._inflight.items() if n == least])
            self._sticky[request_id] = server_id
        self._inflight[server_id] += 1
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1

    def require_acquire_fields(self) -> list[str]:
        return []

    def require_release_fields(self) -> list[str]:
        return []

    def add_servers(self, servers: dict[str, Any]) -> None:
        for sid, handle in servers.items():
            self._inflight[sid] = 0
            self._servers[sid] = handle

    def remove_servers(self, server_ids: list[str]) -> None:
        for sid in server_ids:
            self._inflight.pop(sid, None)
            self._servers.pop(sid, None)

    def get_inflight_count(self, server_id: str) -> int:
        return self._inflight.get(server_id, 0)

    def get_all_servers(self) -> list[str]:
        return list(self._inflight)

    def clear_sticky_cache(self) -> dict:
        cleared = len(self._sticky)
        self._sticky.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_status(self) -> dict:
        return {
            "servers": dict(self._inflight),
            "total_inflight": sum(self._inflight.values()),
            "active_servers": len(self._inflight),
            "registered_handles": list(self._servers),
        }

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())


class DeterministicRequestBalancer(RequestBalancer):
    """:class:`RequestBalancer` under ``rollout.full_determinism`` (verl forwards the flag only to its own class)."""

    FULL_DETERMINISM = True


def balancer_class(rollout_config) -> type[RequestBalancer]:
    """The router class for an agent's rollout config (``full_determinism`` read as verl reads it)."""
    return DeterministicRequestBalancer if rollout_config.get("full_determinism", False) else RequestBalancer
