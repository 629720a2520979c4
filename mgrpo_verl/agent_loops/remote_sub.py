"""Delegation calls across trainer processes (decoupled M-GRPO): the wire format and the main side's client.

A sub-agent's model lives in another trainer process, the sub side; :class:`RemoteSubAgent` (what
``MultiAgentLLMClient.for_agent(sub)`` returns on the main side) reaches it over HTTP with the shared secret.
Only text and ids cross, never tokens; verl has no such call. The endpoints, the bodies and the secret:
``docs/decoupled.md``, "The wire between the sides".
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, fields
from typing import Any

#: Endpoint paths (the service registers the same constants).
HEALTH_PATH = "/health"
CALL_PATH = "/v1/sub_call"
MODE_PATH = "/v1/mode"


#: The environment variable that holds the shared secret when ``multi_agent.decoupled.secret_file`` is null.
SECRET_ENV = "MGRPO_DECOUPLED_SECRET"
#: Shortest secret accepted (characters).
MIN_SECRET_CHARS = 16
#: How to make one (the message of a missing or short secret says it).
SECRET_HINT = "python -c 'import secrets; print(secrets.token_hex(32))'"


def shared_secret(secret_file: str | None, key: str = "multi_agent.decoupled.secret_file",
                  environ: dict | os._Environ | None = None) -> str:
    """The secret both decoupled sides share: the content of ``secret_file`` (whitespace stripped) when it is set,
    else ``$MGRPO_DECOUPLED_SECRET``. ``ValueError`` naming ``key`` and the variable when there is none or it is
    shorter than :data:`MIN_SECRET_CHARS`: the sub side's service never runs open."""
    environ = os.environ if environ is None else environ
    if secret_file:
        path = os.path.expanduser(str(secret_file))
        try:
            with open(path) as f:
                secret, source = f.read().strip(), f"{key}={secret_file}"
        except OSError as err:
            raise ValueError(f"{key}={secret_file!r}: cannot read the shared secret: {err}") from None
    else:
        secret, source = environ.get(SECRET_ENV, "").strip(), f"${SECRET_ENV}"
        if not secret:
            raise ValueError(
                f"decoupled M-GRPO needs a secret shared by both sides (the sub side's service refuses callers without "
                f"it): set {key} to a file holding it, or export {SECRET_ENV}; make one with {SECRET_HINT}"
            )
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"{source}: the shared secret has {len(secret)} characters, fewer than {MIN_SECRET_CHARS}; "
                         f"make one with {SECRET_HINT}")
    return secret


def bearer(secret: str) -> dict[str, str]:
    """The request header that presents ``secret``."""
    return {"Authorization": f"Bearer {secret}"}


class RemoteCallError(RuntimeError):
    """A sub side answered a call with an error, or could not be reached."""


class RemoteAuthError(RemoteCallError):
    """A sub side refused our secret (401): the two sides were given different ones."""


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


@dataclass(frozen=True)
class SubCallRequest:
    """One delegation call from the main side.

    Attributes:
        agent: the sub-agent called (the sub side refuses agents it does not serve).
        agent_loop: the registered agent loop the sub side runs for it (e.g. ``mgrpo_relay_sub``).
        traj_id: the sub trajectory's id, chosen by the main side (``{uid}/{session}/{agent}/{j}``), so that
            the main record can list the calls it used.
        parent_traj_id: the main trajectory's id.
        uid: the query group of the main trajectory.
        session: the main trajectory's session (rollout index within the group).
        messages: chat messages of the sub-agent's prompt.
        ground_truth: what the sub-agent's local reward needs (JSON).
        main_step: the main side's global step (for logs).
    """

    agent: str
    agent_loop: str
    traj_id: str
    parent_traj_id: str
    uid: str
    session: int
    messages: list
    ground_truth: Any = None
    main_step: int = 0

    def __post_init__(self) -> None:
        for name in ("agent", "agent_loop", "traj_id", "parent_traj_id", "uid"):
            value = getattr(self, name)
            _require(isinstance(value, str) and bool(value),
                     f"SubCallRequest.{name} must be a non-empty string, got {value!r}")
        for name in ("session", "main_step"):
            value = getattr(self, name)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                     f"SubCallRequest.{name} must be an int >= 0, got {value!r}")
        _require(
            isinstance(self.messages, list) and bool(self.messages)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in self.messages),
            f"SubCallRequest.messages must be a non-empty list of {{'role': str, 'content': str}}, "
            f"got {self.messages!r}",
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Any) -> SubCallRequest:
        """Parse a request body; ``ValueError`` naming the problem for anything malformed."""
        _require(isinstance(body, dict), f"sub call: expected a JSON object, got {type(body).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(body) - known)
        _require(not unknown, f"sub call: unknown field(s) {unknown}; known fields are {sorted(known)}")
        missing = sorted(f.name for f in fields(cls)
                         if f.name not in body and f.name not in ("ground_truth", "main_step"))
        _require(not missing, f"sub call: missing field(s) {missing}")
        return cls(**body)


@dataclass(frozen=True)
class SubCallReply:
    """The sub side's answer: the text the main agent sees, and which weights produced it."""

    traj_id: str
    text: str
    policy_version: int
    response_tokens: int

    @classmethod
    def from_json(cls, body: Any) -> SubCallReply:
        _require(isinstance(body, dict), f"sub call reply: expected a JSON object, got {body!r}")
        try:
            reply = cls(str(body["traj_id"]), str(body["text"]), int(body["policy_version"]),
                        int(body["response_tokens"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"sub call reply: malformed {body!r} ({err})") from None
        return reply


class RemoteSubAgent:
    """The main side's client of one sub-agent served by a sub side at ``url``.

    Picklable (it travels to verl's agent-loop worker processes, through Ray, which authenticates its peers);
    each call opens its own HTTP session in the caller's event loop. ``timeout_s`` bounds one call, waiting at
    the sub side's gate included (it closes while the sub side trains). Every request presents ``secret``.
    """

    def __init__(self, agent: str, url: str, timeout_s: float, secret: str):
        _require(isinstance(agent, str) and bool(agent),
                 f"RemoteSubAgent: agent must be a non-empty string, got {agent!r}")
        _require(isinstance(url, str) and url.startswith(("http://", "https://")), f"RemoteSubAgent: bad url {url!r}")
        _require(isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0,
                 f"RemoteSubAgent: timeout_s must be > 0, got {timeout_s!r}")
        _require(isinstance(secret, str) and len(secret) >= MIN_SECRET_CHARS,
                 f"RemoteSubAgent: secret must be a string of at least {MIN_SECRET_CHARS} characters")
        self.agent, self.url, self.timeout_s = agent, url.rstrip("/"), float(timeout_s)
        self._headers = bearer(secret)

    def __repr__(self) -> str:
        return f"RemoteSubAgent({self.agent!r}, {self.url!r})"

    async def call(self, request: SubCallRequest) -> SubCallReply:
        """One delegation call. Raises :class:`RemoteCallError` (unreachable, error status, bad reply)."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.post(self.url + CALL_PATH, json=request.to_json(),
                                        headers=self._headers) as response:
                    body = await response.json(content_type=None)
                    if response.status != 200:
                        message = body.get("error") if isinstance(body, dict) else body
                        error = RemoteAuthError if response.status == 401 else RemoteCallError
                        raise error(f"sub side {self.url} answered {response.status}: {message}")
        except (aiohttp.ClientError, json.JSONDecodeError) as err:
            raise RemoteCallError(f"sub side {self.url} unreachable or garbled: {type(err).__name__}: {err}") from None
        try:
            return SubCallReply.from_json(body)
        except ValueError as err:
            raise RemoteCallError(str(err)) from None

    # --------------------------------------------------------------- control calls (trainer process)

    def _request(self, path: str, body: dict | None = None, timeout_s: float = 10.0) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json", **self._headers},
                                     method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            error = RemoteAuthError if err.code == 401 else RemoteCallError
            raise error(f"sub side {self.url}{path} answered {err.code}: "
                        f"{err.read().decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as err:
            raise RemoteCallError(f"sub side {self.url}{path} unreachable: {err}") from None

    def health(self, timeout_s: float = 10.0) -> dict:
        return self._request(HEALTH_PATH, timeout_s=timeout_s)

    def wait_ready(self, timeout_s: float, poll_s: float = 1.0) -> dict:
        """Poll ``/health`` until the sub side answers for this agent; ``TimeoutError`` after ``timeout_s``;
        :class:`RemoteAuthError` at once when it refuses our secret."""
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while True:
            try:
                health = self.health(timeout_s=max(1.0, poll_s))
                if health.get("agent") != self.agent:
                    raise RemoteCallError(f"sub side {self.url} serves agent {health.get('agent')!r}, "
                                          f"not {self.agent!r}")
                return health
            except RemoteAuthError as err:
                raise RemoteAuthError(f"{err} (both sides need the same secret: multi_agent.decoupled.secret_file "
                                      f"or ${SECRET_ENV})") from None
            except RemoteCallError as err:
                if "serves agent" in str(err):
                    raise
                last = err
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no sub side answered at {self.url} for agent {self.agent!r} within {timeout_s:g}s "
                    f"(start it with multi_agent.decoupled.role=sub; last error: {last})"
                )
            time.sleep(poll_s)

    def set_validating(self, validating: bool) -> None:
        self._request(MODE_PATH, {"validating": bool(validating)})

    def announce_finished(self, step: int) -> None:
        """Tell the sub side that the main side ran its last step (``step``): a sub side still waiting for
        rows then stops with a clear error instead of waiting for its idle time-out."""
        self._request(MODE_PATH, {"main_finished_at": int(step)})


async def call_or_error(client: RemoteSubAgent, request: SubCallRequest) -> SubCallReply | str:
    """:meth:`RemoteSubAgent.call`, with a failure turned into the ``"<error: ...>"`` text the main agent sees."""
    try:
        return await client.call(request)
    except (RemoteCallError, asyncio.TimeoutError) as err:
        return f"<error: {type(err).__name__}: {err}>"
