"""Run untrusted Python code (programs written by the models we train) in contained child processes.

:func:`run_python` runs one program; :func:`run_judged` runs trusted test code against an untrusted function,
each in its own sandbox, with only plain data between them. Layers (a separate ``python -I -S`` process in
its own session and temporary directory, rlimits, an unprivileged uid as root, an audit-hook guard), what
they guarantee and what they do not are specified in ``docs/security.md`` ("The sandbox").

Modules: :mod:`.process` (the parent side of one child, :func:`run_python`, clean-up), :mod:`.judged`
(:func:`run_judged`), :mod:`.codec` (the plain-data codec, also loaded by the child) and ``_child.py`` (the
child, run by path; it imports nothing of ours). Linux only.
"""

from mgrpo_verl.envs.sandbox.codec import MAX_CALLS, MAX_DEPTH, MAX_ITEMS, MAX_MESSAGE_BYTES
from mgrpo_verl.envs.sandbox.judged import JudgedRun, run_judged
from mgrpo_verl.envs.sandbox.process import (
    DENIED_EVENT_PREFIXES,
    DENIED_EVENTS,
    DENIED_IMPORTS,
    LAZY_STDLIB_MODULES,
    MAX_PRELOADS,
    SANDBOX_ID_BASE,
    SANDBOX_ID_SPAN,
    SHARED_WRITABLE_DIRS,
    VIOLATION_EXIT,
    SandboxLimits,
    SandboxResult,
    remove_owned,
    run_python,
)

__all__ = [
    "DENIED_EVENTS", "DENIED_EVENT_PREFIXES", "DENIED_IMPORTS", "LAZY_STDLIB_MODULES", "MAX_CALLS", "MAX_DEPTH",
    "MAX_ITEMS", "MAX_MESSAGE_BYTES", "MAX_PRELOADS", "SANDBOX_ID_BASE", "SANDBOX_ID_SPAN", "SHARED_WRITABLE_DIRS",
    "VIOLATION_EXIT", "JudgedRun", "SandboxLimits", "SandboxResult", "remove_owned", "run_judged", "run_python",
]
