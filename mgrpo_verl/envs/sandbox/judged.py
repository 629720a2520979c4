""":func:`run_judged`: trusted test code against an untrusted function, in two sandboxes, with only plain data
between them, relayed and re-checked by this process (specification: ``docs/security.md``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mgrpo_verl.envs.sandbox.codec import MAX_CALLS, MAX_DEPTH, MAX_ITEMS, MAX_MESSAGE_BYTES, plain_dumps, plain_loads
from mgrpo_verl.envs.sandbox.process import Child, SandboxLimits, SandboxResult, pump


@dataclass(frozen=True)
class JudgedRun:
    """Outcome of one :func:`run_judged` call."""

    #: The judge's run (trusted code: the tests); its ``status`` is "ok" when it ran to the end.
    judge: SandboxResult
    #: The candidate's run (untrusted code); "ok" when it served every call and exited normally.
    candidate: SandboxResult
    #: The plain value the judge reported with ``__sandbox_report__`` (the last one), None if none.
    report: Any
    #: Calls the judge made to the candidate's function.
    calls: int
    #: Why the candidate broke the call protocol (a malformed or oversized reply, a reply without a call,
    #: exiting during a call); None when it did not.
    protocol_error: str | None = None


#: :func:`run_judged`'s default limits (those of :func:`~mgrpo_verl.envs.sandbox.run_python`).
DEFAULT_LIMITS = SandboxLimits()


def run_judged(judge: str, candidate: str, function: str, limits: SandboxLimits = DEFAULT_LIMITS) -> JudgedRun:
    """Run trusted test code (``judge``) against the function ``function`` of untrusted code
    (``candidate``), each in its own sandbox (own process, directory and uid), with only plain data
    between them, relayed and re-checked by this process.

    ``candidate`` runs first as a program (its definitions), then serves calls: each call's arguments
    arrive as plain data, its result (or the exception's type and message) goes back as plain data. The
    judge program finds two functions in its globals: ``__sandbox_call__(args, kwargs)`` calls the
    candidate's function and returns its result, or raises ``CandidateError`` (also in its globals) when
    the call raised, returned something that is not plain data, or the candidate is gone;
    ``__sandbox_report__(value)`` sends a plain value (e.g. the test counts) to this process.

    Plain data: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` and ``list``, ``tuple``,
    ``dict``, ``set``, ``frozenset`` of plain data, exact types only (no subclass), nested at most
    :data:`MAX_DEPTH` levels, :data:`MAX_ITEMS` values and :data:`MAX_MESSAGE_BYTES` encoded. This process
    decodes every message with its own decoder into fresh builtin objects and encodes it again for the other
    side, so the judge only ever sees values built by trusted code: nothing the candidate does (patching
    builtins, lying ``__eq__``, writing to its descriptors, exiting) reaches the judge's comparisons or its
    report. Both runs share one wall-clock deadline (``limits.wall_s``) and each has ``limits``.

    Raises:
        TypeError: ``judge`` or ``candidate`` is not a string, or ``function`` not an identifier.
        RuntimeError: a child could not set the sandbox up (as :func:`run_python`).
    """
    if not isinstance(judge, str) or not isinstance(candidate, str):
        raise TypeError("run_judged needs both programs as str")
    if not isinstance(function, str) or not function.isidentifier():
        raise TypeError(f"run_judged needs a function name, got {function!r}")
    cand = Child(candidate, limits, ("serve", function))
    jud = Child(judge, limits, ("client", None))
    state = {"pending": False, "calls": 0, "report": None, "protocol": None, "candidate_gone": False,
             "judge_broken": None}

    def to_judge(status: str, value: Any) -> None:
        try:
            jud.send(plain_dumps((status, value), MAX_MESSAGE_BYTES, MAX_DEPTH + 2, MAX_ITEMS))
        except (TypeError, ValueError, RecursionError, MemoryError) as e:  # e.g. a too large result
            jud.send(plain_dumps(("error", f"the result cannot be passed on: {e}"[:1000]), MAX_MESSAGE_BYTES, 4, 10))

    def candidate_failed(why: str) -> None:
        if not state["candidate_gone"]:
            state["candidate_gone"] = True
            state["protocol"] = state["protocol"] or why
            cand.kill()
        if state["pending"]:
            state["pending"] = False
            to_judge("error", "the candidate is gone: " + why)

    def step() -> bool:
        # The candidate's frames first: every byte in its inbox was read before this step sends a call, so a
        # frame that finds no call pending was written before any call reached the candidate, whichever pipe
        # the selector served first (judge-first order made such junk look like a malformed reply).
        for frame in cand.frames():
            if state["candidate_gone"]:
                break
            message = None if frame is None else _decode_message(frame)
            if frame is None:
                candidate_failed("a reply over the size limit or malformed")
            elif not state["pending"]:
                candidate_failed("a reply without a call")
            elif message is None or len(message) != 2 or message[0] not in ("ok", "error") or (
                message[0] == "error" and type(message[1]) is not str
            ):
                candidate_failed("a reply that is not plain data in the expected shape")
            else:
                state["pending"] = False
                to_judge(message[0], message[1] if message[0] == "ok" else message[1][:1000])
        for frame in jud.frames():
            if frame is None:
                state["judge_broken"] = "a malformed message from the judge"
                jud.kill()
                break
            message = _decode_message(frame)
            if message is not None and message[0] == "report" and len(message) == 2:
                state["report"] = message[1]
            elif message is not None and message[0] == "call" and len(message) == 3 and not state["pending"]:
                _, args, kwargs = message
                if type(args) is not tuple or type(kwargs) is not dict or any(type(k) is not str for k in kwargs):
                    to_judge("error", "call arguments must be a tuple and a dict with str keys")
                elif state["candidate_gone"] or state["calls"] >= MAX_CALLS:
                    to_judge("error", "the candidate is not running" if state["candidate_gone"] else "too many calls")
                else:
                    state["calls"] += 1
                    state["pending"] = True
                    cand.send(plain_dumps((args, kwargs), MAX_MESSAGE_BYTES, MAX_DEPTH + 2, MAX_ITEMS))
            else:
                state["judge_broken"] = f"an unexpected message from the judge: {message!r:.200}"
                jud.kill()
        if state["pending"] and not cand.channel_open():
            candidate_failed("it exited during a call")
        if not jud.open_reads():  # the judge is done: the candidate's channel closes, it exits
            cand.close_channel()
            return cand.open_reads()
        return True

    try:
        cand.start()
        jud.start(cand.start_time)
        deadline = cand.start_time + limits.wall_s
        timed_out = not pump([cand, jud], deadline, step)
        judge_result = jud.finish(timed_out and bool(jud.open_reads()), deadline)
        candidate_result = cand.finish(timed_out and bool(cand.open_reads()), deadline)
        if state["judge_broken"] and judge_result.status == "ok":
            judge_result = dataclasses.replace(judge_result, status="error",
                                               stderr=judge_result.stderr + state["judge_broken"])
        return JudgedRun(judge_result, candidate_result, state["report"], state["calls"], state["protocol"])
    finally:
        try:
            cand.cleanup()
        finally:
            jud.cleanup()


def _decode_message(frame: bytes) -> tuple | None:
    """A channel message (a non-empty tuple whose first item is a str) decoded with :func:`plain_loads`,
    or None when it is not one."""
    try:
        message = plain_loads(frame, MAX_MESSAGE_BYTES, MAX_DEPTH + 2, MAX_ITEMS)
    except (TypeError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    if type(message) is not tuple or not message or type(message[0]) is not str:
        return None
    return message
