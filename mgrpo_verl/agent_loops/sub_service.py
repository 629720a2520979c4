"""The sub side's delegation service (decoupled M-GRPO): it serves one sub-agent's model to the main side.

:class:`SubAgentService` is verl's TransferQueue agent-loop worker (``AgentLoopWorkerTQ``) with an HTTP front:
each call runs the agent loop the request names through verl's own ``_run_agent_loop``, so its row lands in
this side's TransferQueue as a synchronous row would, pending until its parent's record is in the store. A gate
holds calls during the update; a shared secret and an admission bound close it to strangers:
``docs/decoupled.md``, "The wire between the sides".
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

from mgrpo_verl.agent_loops.remote_sub import (
    CALL_PATH, HEALTH_PATH, MIN_SECRET_CHARS, MODE_PATH, SubCallRequest, bearer,
)
from mgrpo_verl.rowmeta import RowMeta

logger = logging.getLogger(__name__)

#: Sessions of rows written by the service start here, far above any rollout index, so that a sub row's
#: key ``{uid}_{session}_0`` never meets the keys of the main side's sessions (or their aligned copies).
SESSION_BASE = 1_000_000
#: Calls admitted at once (waiting at the gate or generating); more are answered 503. Far above what a main side's
#: agent loops have in flight (one call per trajectory at a time), low enough that a flood queues no unbounded work.
MAX_INFLIGHT = 1024


@dataclass(frozen=True)
class PendingRow:
    """A row the service wrote to TransferQueue and the trainer has not taken yet."""

    key: str
    traj_id: str
    parent_traj_id: str
    uid: str
    agent: str
    score: float
    policy_version: int
    created: float  # time.time() when written


class SubAgentService(AgentLoopWorkerTQ.__ray_actor_class__):
    """verl's agent-loop worker serving delegation calls over HTTP (``docs/decoupled.md``).

    Args:
        config: the served model's full trainer config (its ``actor_rollout_ref`` and ``multi_agent``).
        llm_client: the client of this model's rollout servers.
        agent: the sub-agent name served (requests for others are refused).
    """

    def __init__(self, config, llm_client, agent: str):
        super().__init__(config, llm_client)
        self.agent = agent
        self.pending: dict[str, PendingRow] = {}
        self.policy_version = 0
        self.validating = False
        self.main_finished_at: int | None = None
        self.inflight = 0
        self._gate = asyncio.Event()
        self._gate.set()
        self._sessions = itertools.count(SESSION_BASE)
        self._runner = None
        self.calls = {"served": 0, "failed": 0, "refused": 0, "validation": 0, "unauthorized": 0, "overloaded": 0}

    # ---------------------------------------------------------------------------------------- HTTP

    async def start(self, host: str, port: int, secret: str, max_inflight: int = MAX_INFLIGHT) -> str:
        """Listen on ``host:port`` for callers presenting ``secret``, admitting ``max_inflight`` calls at once;
        returns the base URL."""
        from aiohttp import web

        if not isinstance(secret, str) or len(secret) < MIN_SECRET_CHARS:
            raise ValueError(f"SubAgentService.start: the secret must be a string of at least {MIN_SECRET_CHARS} "
                             "characters")
        self._expected = bearer(secret)["Authorization"].encode()
        self.max_inflight, self.admitted = int(max_inflight), 0
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get(HEALTH_PATH, self._health)
        app.router.add_post(CALL_PATH, self._call)
        app.router.add_post(MODE_PATH, self._mode)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        url = f"http://{host}:{port}"
        logger.info("sub-agent %r served at %s", self.agent, url)
        return url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _authenticate(self, request, handler):
        """aiohttp middleware: 401 unless the request presents the shared secret (before its body is read)."""
        from aiohttp import web

        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, self._expected):
            self.calls["unauthorized"] += 1
            return web.json_response({"error": "unauthorized: present the shared secret (Authorization: Bearer)"},
                                     status=401)
        return await handler(request)

    _authenticate.__middleware_version__ = 1  # what aiohttp's @web.middleware marks: (request, handler) signature

    async def _health(self, request):
        from aiohttp import web

        return web.json_response(
            {"agent": self.agent, "policy_version": self.policy_version, "pending_rows": len(self.pending),
             "validating": self.validating, "main_finished_at": self.main_finished_at, "calls": dict(self.calls)}
        )

    async def _mode(self, request):
        from aiohttp import web

        try:
            body = await request.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and set(body) == {"validating"} and isinstance(body["validating"], bool):
            self.validating = body["validating"]
        elif (isinstance(body, dict) and set(body) == {"main_finished_at"} and isinstance(body["main_finished_at"], int)
              and not isinstance(body["main_finished_at"], bool)):
            self.main_finished_at = body["main_finished_at"]
        else:
            return web.json_response(
                {"error": f"expected {{'validating': bool}} or {{'main_finished_at': int}}, got {body!r}"}, status=400
            )
        return web.json_response({"validating": self.validating, "main_finished_at": self.main_finished_at})

    async def _call(self, request):
        from aiohttp import web

        try:
            call = SubCallRequest.from_json(await request.json())
        except ValueError as err:  # json.JSONDecodeError is a ValueError too
            self.calls["refused"] += 1
            return web.json_response({"error": str(err)}, status=400)
        if call.agent != self.agent:
            self.calls["refused"] += 1
            return web.json_response({"error": f"this sub side serves agent {self.agent!r}, not {call.agent!r}"},
                                     status=404)
        if self.admitted >= self.max_inflight:
            self.calls["overloaded"] += 1
            return web.json_response({"error": f"{self.admitted} calls in flight already, "
                                               "the most this sub side admits"},
                                     status=503, headers={"Retry-After": "1"})
        self.admitted += 1
        try:
            await self._gate.wait()
            self.inflight += 1
            try:
                reply = await self._serve(call)
            except Exception as err:
                self.calls["failed"] += 1
                logger.warning("sub call %s failed: %r", call.traj_id, err)
                return web.json_response({"error": f"{type(err).__name__}: {err}"}, status=500)
            finally:
                self.inflight -= 1
        finally:
            self.admitted -= 1
        return web.json_response(reply)

    # ------------------------------------------------------------------------------------- serving

    async def _serve(self, call: SubCallRequest) -> dict[str, Any]:
        validate = self.validating
        rollout = self.config.actor_rollout_ref.rollout
        kwargs_of = rollout.val_kwargs if validate else rollout
        sampling_params = dict(
            temperature=kwargs_of.temperature, top_p=kwargs_of.top_p, top_k=kwargs_of.top_k,
            repetition_penalty=1.0, logprobs=rollout.calculate_log_probs,
        )
        session = next(self._sessions)
        version = self.policy_version
        outputs = await self._run_agent_loop(
            sampling_params,
            {"step": version, "sample_index": session, "rollout_n": 0, "validate": validate},
            agent_name=call.agent_loop,
            trace=False,
            raw_prompt=call.messages,
            reward_model={"ground_truth": call.ground_truth},
            uid=call.uid,
            session_id=session,
            global_steps=version,
            mgrpo_call={"agent": call.agent, "traj_id": call.traj_id, "parent_traj_id": call.parent_traj_id},
        )
        if validate:
            self.calls["validation"] += 1
        else:
            for i, out in enumerate(outputs):
                key = f"{call.uid}_{session}_{i}"
                meta = RowMeta.read(out.extra_fields, key)
                self.pending[key] = PendingRow(
                    key, meta.traj_id, meta.parent_traj_id, call.uid, meta.agent, meta.score, version, time.time(),
                )
            self.calls["served"] += 1
        final = outputs[-1]
        return {
            "traj_id": call.traj_id,
            "text": self.tokenizer.decode(final.response_ids, skip_special_tokens=True).strip(),
            "policy_version": version,
            "response_tokens": len(final.response_ids),
        }

    async def _agent_loop_postprocess(self, output, validate, **kwargs):
        """verl's (rows into TransferQueue) for training calls, nothing for validation calls; returns the
        outputs so that :meth:`_serve` can answer."""
        outputs = output if isinstance(output, list) else [output]
        if not validate:
            await super()._agent_loop_postprocess(outputs, validate, **kwargs)
        return outputs

    # ------------------------------------------------------------------------------ trainer controls

    def pending_rows(self) -> list[dict[str, Any]]:
        return [asdict(row) for row in self.pending.values()]

    def take(self, keys: list[str]) -> int:
        """Forget ``keys`` (the trainer took or dropped them); returns how many were pending."""
        return sum(self.pending.pop(k, None) is not None for k in keys)

    async def pause(self) -> None:
        """Close the gate and wait for the calls in flight to finish."""
        self._gate.clear()
        while self.inflight:
            await asyncio.sleep(0.01)

    def resume(self, policy_version: int) -> None:
        """Open the gate; new rows carry ``policy_version``."""
        self.policy_version = int(policy_version)
        self._gate.set()

    def stats(self) -> dict[str, Any]:
        return {"pending_rows": len(self.pending), "main_finished_at": self.main_finished_at, **self.calls}
