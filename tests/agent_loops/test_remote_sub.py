"""Delegation across processes (decoupled M-GRPO): wire format, the main side's client and the sub side's
HTTP front, against real local HTTP servers (no Ray, no model). The relay loops' remote halves are tested
in test_relay_loop.py."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from mgrpo_verl.agent_loops import remote_sub
from mgrpo_verl.agent_loops.delegation import SUB_CALL_LOOP_NAME
from mgrpo_verl.agent_loops.remote_sub import (
    RemoteCallError,
    RemoteSubAgent,
    SubCallReply,
    SubCallRequest,
    call_or_error,
)
from mgrpo_verl.agent_loops.sub_service import SubAgentService


def request(**over):
    base = dict(agent="sub", agent_loop=SUB_CALL_LOOP_NAME, traj_id="u1/2/sub/0", parent_traj_id="u1/2/main", uid="u1",
                session=2, messages=[{"role": "user", "content": "hi"}], ground_truth="4", main_step=3)
    return SubCallRequest(**{**base, **over})


# ------------------------------------------------------------------------------------------ wire format


def test_request_round_trip():
    r = request()
    assert SubCallRequest.from_json(r.to_json()) == r


@pytest.mark.parametrize(
    "body, match",
    [
        ([], "JSON object"),
        ({**request().to_json(), "tokens": [1]}, "unknown field"),
        ({k: v for k, v in request().to_json().items() if k != "uid"}, "missing field"),
        ({**request().to_json(), "messages": []}, "messages"),
        ({**request().to_json(), "messages": [{"role": "user"}]}, "messages"),
        ({**request().to_json(), "session": -1}, "session"),
        ({**request().to_json(), "session": True}, "session"),
        ({**request().to_json(), "traj_id": ""}, "traj_id"),
    ],
)
def test_malformed_requests_are_refused(body, match):
    with pytest.raises(ValueError, match=match):
        SubCallRequest.from_json(body)


def test_reply_parsing():
    assert SubCallReply.from_json({"traj_id": "t", "text": "4", "policy_version": 2, "response_tokens": 1}).text == "4"
    with pytest.raises(ValueError, match="malformed"):
        SubCallReply.from_json({"traj_id": "t"})


# ----------------------------------------------------------------------------- client against a server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _serve(handler):
    app = web.Application()
    app.router.add_post(remote_sub.CALL_PATH, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def test_client_reply_error_status_garbage_and_unreachable():
    async def ok(req):
        body = await req.json()
        return web.json_response({"traj_id": body["traj_id"], "text": "44", "policy_version": 5, "response_tokens": 2})

    async def fail(req):
        return web.json_response({"error": "model on fire"}, status=500)

    async def garbage(req):
        return web.json_response({"what": 1})

    async def go():
        out = []
        for handler in (ok, fail, garbage):
            runner, url = await _serve(handler)
            try:
                out.append(await call_or_error(RemoteSubAgent("sub", url, 5.0), request()))
            finally:
                await runner.cleanup()
        out.append(await call_or_error(RemoteSubAgent("sub", f"http://127.0.0.1:{_free_port()}", 5.0), request()))
        return out

    good, failed, garbled, unreachable = asyncio.run(go())
    assert good == SubCallReply("u1/2/sub/0", "44", 5, 2)
    assert failed.startswith("<error: RemoteCallError") and "500: model on fire" in failed
    assert garbled.startswith("<error: RemoteCallError") and "malformed" in garbled
    assert unreachable.startswith("<error: RemoteCallError") and "unreachable" in unreachable


def test_wait_ready_times_out_with_a_clear_message():
    client = RemoteSubAgent("sub", f"http://127.0.0.1:{_free_port()}", 5.0)
    with pytest.raises(TimeoutError, match="no sub side answered .* for agent 'sub'.*role=sub"):
        client.wait_ready(timeout_s=0.3, poll_s=0.1)


def test_client_arguments_are_checked():
    with pytest.raises(ValueError, match="url"):
        RemoteSubAgent("sub", "127.0.0.1:80", 1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        RemoteSubAgent("sub", "http://x", 0)


# ------------------------------------------------------------------------ the sub side's HTTP front


class ScriptedService(SubAgentService):
    """The service's HTTP handlers and gate with a scripted ``_serve`` (no TransferQueue, no model)."""

    def __init__(self, agent):  # not verl's worker __init__: only what the handlers use
        self.agent, self.pending, self.policy_version, self.validating = agent, {}, 0, False
        self.main_finished_at, self.inflight, self._runner = None, 0, None
        self._gate = asyncio.Event()
        self._gate.set()
        self.calls = {"served": 0, "failed": 0, "refused": 0, "validation": 0}
        self.seen: list[tuple[str, bool]] = []

    async def _serve(self, call):
        self.seen.append((call.traj_id, self.validating))
        if call.traj_id.endswith("boom"):
            raise RuntimeError("boom")
        return {"traj_id": call.traj_id, "text": "4", "policy_version": self.policy_version, "response_tokens": 1}


def test_service_refuses_bad_calls_gates_and_switches_mode():
    async def go():
        svc = ScriptedService("sub")
        port = _free_port()
        url = await svc.start("127.0.0.1", port)
        client = RemoteSubAgent("sub", url, 5.0)
        try:
            out = {"ok": await call_or_error(client, request())}
            out["wrong_agent"] = await call_or_error(RemoteSubAgent("sub", url, 5.0), request(agent="other"))
            out["failing"] = await call_or_error(client, request(traj_id="u1/2/sub/boom"))
            # closed gate: a call waits until resume, and gets the new version
            await svc.pause()
            pending = asyncio.ensure_future(call_or_error(client, request(traj_id="u1/2/sub/1")))
            await asyncio.sleep(0.3)
            out["waited"] = not pending.done()
            svc.resume(7)
            out["after_resume"] = await pending
            await asyncio.to_thread(client.set_validating, True)
            out["validation"] = await call_or_error(client, request(traj_id="u1/2/sub/2"))
            await asyncio.to_thread(client.set_validating, False)
            await asyncio.to_thread(client.announce_finished, 4)
            out["health"] = await asyncio.to_thread(client.health)
            bad = RemoteSubAgent("sub", url, 5.0)
            try:
                await asyncio.to_thread(bad._request, remote_sub.MODE_PATH, {"validating": "yes"})
            except RemoteCallError as err:
                out["bad_mode"] = str(err)
            return svc, out
        finally:
            await svc.stop()

    svc, out = asyncio.run(go())
    assert out["ok"].text == "4" and out["ok"].policy_version == 0
    assert "404" in out["wrong_agent"] and "serves agent 'sub', not 'other'" in out["wrong_agent"]
    assert "500" in out["failing"] and "RuntimeError: boom" in out["failing"]
    assert out["waited"] and out["after_resume"].policy_version == 7
    assert ("u1/2/sub/2", True) in svc.seen and ("u1/2/sub/1", False) in svc.seen
    assert out["health"]["agent"] == "sub" and out["health"]["main_finished_at"] == 4
    assert out["health"]["calls"]["refused"] == 1 and out["health"]["calls"]["failed"] == 1
    assert "400" in out["bad_mode"]
