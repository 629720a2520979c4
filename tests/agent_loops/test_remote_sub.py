"""Delegation across processes (decoupled M-GRPO): wire format, the main side's client and the sub side's
HTTP front, against real local HTTP servers (no Ray, no model). The relay loops' remote halves are tested
in test_relay_loop.py."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from mgrpo_verl.agent_loops import remote_sub
from mgrpo_verl.agent_loops.delegation import SUB_CALL_LOOP_NAME
from mgrpo_verl.agent_loops.remote_sub import (
    SECRET_ENV,
    RemoteAuthError,
    RemoteCallError,
    RemoteSubAgent,
    SubCallReply,
    SubCallRequest,
    call_or_error,
    shared_secret,
)
from mgrpo_verl.agent_loops.sub_service import SubAgentService

SECRET = "correct-horse-battery-staple-0123"


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
                out.append(await call_or_error(RemoteSubAgent("sub", url, 5.0, SECRET), request()))
            finally:
                await runner.cleanup()
        out.append(await call_or_error(RemoteSubAgent("sub", f"http://127.0.0.1:{_free_port()}", 5.0, SECRET), request()))
        return out

    good, failed, garbled, unreachable = asyncio.run(go())
    assert good == SubCallReply("u1/2/sub/0", "44", 5, 2)
    assert failed.startswith("<error: RemoteCallError") and "500: model on fire" in failed
    assert garbled.startswith("<error: RemoteCallError") and "malformed" in garbled
    assert unreachable.startswith("<error: RemoteCallError") and "unreachable" in unreachable


def test_wait_ready_times_out_with_a_clear_message():
    client = RemoteSubAgent("sub", f"http://127.0.0.1:{_free_port()}", 5.0, SECRET)
    with pytest.raises(TimeoutError, match="no sub side answered .* for agent 'sub'.*role=sub"):
        client.wait_ready(timeout_s=0.3, poll_s=0.1)


def test_client_arguments_are_checked():
    with pytest.raises(ValueError, match="url"):
        RemoteSubAgent("sub", "127.0.0.1:80", 1.0, SECRET)
    with pytest.raises(ValueError, match="timeout_s"):
        RemoteSubAgent("sub", "http://x", 0, SECRET)
    with pytest.raises(ValueError, match="secret must be a string of at least 16"):
        RemoteSubAgent("sub", "http://x", 1.0, "short")
    assert SECRET not in repr(RemoteSubAgent("sub", "http://x", 1.0, SECRET))


def test_the_shared_secret_comes_from_the_file_or_the_environment(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    assert shared_secret(str(path), environ={SECRET_ENV: "ignored-because-the-file-wins"}) == SECRET
    assert shared_secret(None, environ={SECRET_ENV: f"  {SECRET} "}) == SECRET
    with pytest.raises(ValueError, match=rf"set multi_agent.decoupled.secret_file to a file holding it, or export {SECRET_ENV}"):
        shared_secret(None, environ={})
    with pytest.raises(ValueError, match=rf"\${SECRET_ENV}: the shared secret has 5 characters, fewer than 16"):
        shared_secret(None, environ={SECRET_ENV: "short"})
    with pytest.raises(ValueError, match="multi_agent.decoupled.secret_file='/nowhere/secret': cannot read"):
        shared_secret("/nowhere/secret", environ={SECRET_ENV: SECRET})


# ------------------------------------------------------------------------ the sub side's HTTP front


class ScriptedService(SubAgentService):
    """The service's HTTP handlers and gate with a scripted ``_serve`` (no TransferQueue, no model)."""

    def __init__(self, agent):  # not verl's worker __init__: only what the handlers use
        self.agent, self.pending, self.policy_version, self.validating = agent, {}, 0, False
        self.main_finished_at, self.inflight, self._runner = None, 0, None
        self._gate = asyncio.Event()
        self._gate.set()
        self.calls = {"served": 0, "failed": 0, "refused": 0, "validation": 0, "unauthorized": 0, "overloaded": 0}
        self.seen: list[tuple[str, bool]] = []
        self.release = asyncio.Event()  # calls whose traj_id ends with "hold" wait for it
        self.release.set()

    async def _serve(self, call):
        self.seen.append((call.traj_id, self.validating))
        if call.traj_id.endswith("boom"):
            raise RuntimeError("boom")
        if call.traj_id.endswith("hold"):
            await self.release.wait()
        return {"traj_id": call.traj_id, "text": "4", "policy_version": self.policy_version, "response_tokens": 1}


def test_service_refuses_bad_calls_gates_and_switches_mode():
    async def go():
        svc = ScriptedService("sub")
        port = _free_port()
        url = await svc.start("127.0.0.1", port, SECRET)
        client = RemoteSubAgent("sub", url, 5.0, SECRET)
        try:
            out = {"ok": await call_or_error(client, request())}
            out["wrong_agent"] = await call_or_error(RemoteSubAgent("sub", url, 5.0, SECRET), request(agent="other"))
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
            bad = RemoteSubAgent("sub", url, 5.0, SECRET)
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


# ------------------------------------------------------------------- the doors, tried by a stranger (issue 29)


def _raw(url: str, path: str, body=None, headers=None) -> tuple[int, dict]:
    """A request as anyone who reaches the port can send it: no client of ours, any header."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


FORGED = [
    (remote_sub.MODE_PATH, {"main_finished_at": 0}),  # would stop the sub side's training
    (remote_sub.MODE_PATH, {"validating": True}),  # would starve it (no rows kept)
    (remote_sub.CALL_PATH, request().to_json()),  # a real generation and a training row each
    (remote_sub.HEALTH_PATH, None),
]
CREDENTIALS = {
    "none": {},
    "wrong": {"Authorization": "Bearer " + "x" * len(SECRET)},
    "prefix": {"Authorization": "Bearer " + SECRET[:-1]},
    "bare secret": {"Authorization": SECRET},
    "other scheme": {"Authorization": "Basic " + SECRET},
}


def test_a_stranger_is_refused_at_every_door():
    """Before the fix one ``POST /v1/mode {"main_finished_at": 0}`` from anyone who reached the port stopped the sub
    side's training, ``{"validating": true}`` starved it, and forged calls queued as real generations and rows."""

    async def go():
        svc = ScriptedService("sub")
        url = await svc.start("127.0.0.1", _free_port(), SECRET)
        try:
            answers = {(path, who): await asyncio.to_thread(_raw, url, path, body, headers)
                       for path, body in FORGED for who, headers in CREDENTIALS.items()}
            # the same requests with the secret go through
            allowed = [await asyncio.to_thread(_raw, url, path, body, {"Authorization": f"Bearer {SECRET}"})
                       for path, body in FORGED]
            return svc, answers, allowed
        finally:
            await svc.stop()

    svc, answers, allowed = asyncio.run(go())
    for (path, who), (status, body) in answers.items():
        assert status == 401 and "unauthorized" in body["error"], (path, who, status, body)
    assert svc.calls["unauthorized"] == len(FORGED) * len(CREDENTIALS)  # 4 doors x 5 credentials = 20
    assert [status for status, _ in allowed] == [200, 200, 200, 200]
    # only the authenticated requests had any effect: one call served, the two mode changes, in order
    assert svc.seen == [("u1/2/sub/0", True)] and svc.main_finished_at == 0 and svc.validating is True


def test_the_client_with_another_secret_is_told_so_at_once():
    async def go():
        svc = ScriptedService("sub")
        url = await svc.start("127.0.0.1", _free_port(), SECRET)
        try:
            other = RemoteSubAgent("sub", url, 5.0, "another-secret-of-32-characters!")
            reply = await call_or_error(other, request())
            try:
                await asyncio.to_thread(other.wait_ready, 60.0, 0.1)
            except RemoteAuthError as err:
                return reply, str(err)
        finally:
            await svc.stop()

    reply, err = asyncio.run(go())
    assert reply.startswith("<error: RemoteAuthError") and "401" in reply
    assert "401" in err and "both sides need the same secret" in err  # not a 60 s wait for a health answer


def test_calls_beyond_the_bound_are_refused_and_the_rest_are_served():
    """A flood (e.g. a main side gone wrong) is refused beyond ``max_inflight`` calls admitted at once, waiting at the
    closed gate included, instead of queueing unbounded generations."""

    async def go():
        svc = ScriptedService("sub")
        svc.release.clear()
        url = await svc.start("127.0.0.1", _free_port(), SECRET, max_inflight=3)
        client = RemoteSubAgent("sub", url, 10.0, SECRET)
        try:
            held = [asyncio.ensure_future(call_or_error(client, request(traj_id=f"u1/2/sub/{i}/hold"))) for i in range(3)]
            while len(svc.seen) < 3:
                await asyncio.sleep(0.01)
            flood = [await call_or_error(client, request(traj_id=f"u1/2/sub/f{i}")) for i in range(5)]
            svc.release.set()
            served = await asyncio.gather(*held)
            after = await call_or_error(client, request(traj_id="u1/2/sub/after"))  # room again
            return svc, flood, served, after
        finally:
            await svc.stop()

    svc, flood, served, after = asyncio.run(go())
    assert all(r.startswith("<error: RemoteCallError") and "503" in r for r in flood), flood
    assert [r.text for r in served] == ["4", "4", "4"] and after.text == "4"
    assert svc.calls["overloaded"] == 5 and svc.admitted == 0
    assert [t for t, _ in svc.seen] == ["u1/2/sub/0/hold", "u1/2/sub/1/hold", "u1/2/sub/2/hold", "u1/2/sub/after"]
