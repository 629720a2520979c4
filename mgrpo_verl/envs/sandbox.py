"""Run untrusted Python code (programs written by the models we train) in a contained child process.

:func:`run_python` runs one program and returns a :class:`SandboxResult`; :func:`run_judged` runs trusted
test code and an untrusted function in two such sandboxes, with only plain data between them (what
``docs/security.md`` relies on). Containment is layered; the kernel
layers (1-4) hold even if the in-process guard (5) is defeated:

1. **A separate process** of the same interpreter, ``python -I -S -B -X utf8``: isolated mode (no
   ``PYTHON*`` variables, no user site, no script directory on ``sys.path``), no ``site`` (nothing from
   site-packages), no bytecode written. It starts a new session, so on timeout the whole process group is
   killed; stdin is ``/dev/null``; the environment holds only ``HOME`` and ``TMPDIR``, both the sandbox
   directory.
2. **A fresh temporary directory** as working directory, holding the program as ``main.py``; it is removed
   afterwards, whatever the program left in it.
3. **Resource limits** (``resource.setrlimit`` in the child, soft = hard so the program cannot raise them,
   see :class:`SandboxLimits`): ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``,
   ``RLIMIT_CORE = 0`` and ``RLIMIT_NPROC``, plus the wall-clock timeout enforced by the parent.
4. **An unprivileged user** when we run as root: the kernel ignores ``RLIMIT_NPROC`` for root, and root may
   touch every file, so the child drops to a fresh uid/gid (one per run, owning nothing but the sandbox
   directory, so concurrent sandboxes cannot signal or read each other), or to ``nobody`` where the user
   namespace maps no such id. ``RLIMIT_NPROC`` counts every task of a uid, so it is set to the uid's current
   task count plus :attr:`SandboxLimits.max_processes` (0 + 1 for a fresh uid; when we are not root the
   count is all of our own processes and threads).
5. **An audit hook** (``sys.addaudithook``) installed before the program runs. Audit hooks cannot be
   removed, and this one keeps everything it uses (its policy, ``os.write``, ``os._exit``, ``str``, ...) in
   its closure, which the program cannot reach: no frame or module refers to the hook, and
   ``gc.get_objects``/``get_referrers``/``get_referents`` and ``sys.settrace``/``setprofile`` are
   forbidden. It forbids network (``socket.*``, ``urllib.Request``, ``http.client.*``, ...); process
   creation (``os.fork``, ``os.forkpty``, ``os.posix_spawn``, ``os.exec*``, ``os.spawn*``, ``os.system``,
   ``subprocess.Popen``, ``pty.spawn``, importing ``_posixsubprocess``); signals to other processes
   (``os.kill``, ``os.killpg``); native code (``ctypes``, extension modules from outside the Python
   installation, CPython's test modules, sub-interpreters, crafted code objects: ``code.__new__``,
   ``marshal.loads``); writes, deletes and renames outside the sandbox directory (``open`` for writing,
   ``os.remove``, ``os.rmdir``, ``os.rename``, ``os.mkdir``, ``os.utime``, ``os.truncate``, and
   ``shutil.rmtree``/``move``/``copy`` through them); links, ``chmod``/``chown``; ``os.chdir`` (relative
   paths always mean the sandbox); reading files or listing directories outside the sandbox and the
   interpreter's ``sys.path`` (the standard library; also ``/dev/null`` and ``/dev/urandom``). A violation
   ends the program at once (``os._exit``, which cannot be caught) with status ``"violation"`` and the
   event named in :attr:`SandboxResult.violation`.

Imports: before it drops privileges and hardens the guard, the child imports the modules named by the
program's import statements (``import x``, ``from x import y``; at most :data:`MAX_PRELOADS`; as root also
:data:`LAZY_STDLIB_MODULES`) under the guard in its lenient mode, where a forbidden operation raises instead
of ending the process. Imports are then fast (bytecode caches are read in this phase only) and work where
the interpreter is unreadable for the unprivileged uid (e.g. a pyenv under ``/root``, mode 0700; there,
modules imported only dynamically, through ``importlib`` or ``__import__`` of a computed name, are not
found). Importing a module whose preload the guard refused (``subprocess`` needs ``_posixsubprocess``) is
a violation. Paths must be ``str`` or ``bytes`` (a ``pathlib.Path`` could show the guard one path and open
another); ``shutil.rmtree`` and other ``dir_fd`` users are refused (the directory of a descriptor is unknown).

Functions without an audit event are replaced before the program runs by stubs that go through the hook,
which alone keeps the originals: ``os.stat``/``os.lstat`` (checked like reads), ``os.mknod``/``os.mkfifo``
(violations: device files, FIFOs), ``_imp.create_builtin`` (no second copy of a loaded builtin module such
as ``posix``, which would hold the originals). After root runs, what the run's fresh uid left in ``/tmp``,
``/var/tmp`` or ``/dev/shm`` is removed (:func:`remove_owned`).

Not contained (CPython raises no audit event for them; the CPython docs say audit hooks are no sandbox):
``os.access``/``os.statvfs``/``os.pathconf`` (metadata of paths outside), ``signal.pidfd_send_signal``
and ``os.setpriority`` (processes of the same uid), ``pwd``/``grp`` (the account databases, through libc),
and memory-corruption bugs of CPython, which could run native code. The kernel layers bound the damage: as
root the program runs as a uid that owns nothing but the sandbox directory and can create no process; when
we are not root it runs as our user, so run untrusted code as root (it then drops privileges) or in a
container. Linux only.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import pwd
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from typing import Any

#: Exit code of a child stopped by the guard (the report pipe names the event).
VIOLATION_EXIT = 86

#: Fresh uids/gids for root runs are drawn from [base, base + span): far above the ids of real users
#: (1000-60000), of ``nobody`` (65534) and of the usual container sub-id ranges (100000 + 65536 * k).
SANDBOX_ID_BASE = 1 << 30
SANDBOX_ID_SPAN = 1 << 24

#: At most this many modules named by the program's import statements are imported before it runs.
MAX_PRELOADS = 64

#: Modules the standard library imports lazily (codecs looked up by name, ``datetime.strptime``), imported
#: in root runs before privileges are dropped, so they work where the interpreter is unreadable afterwards.
LAZY_STDLIB_MODULES = (
    "encodings.ascii", "encodings.latin_1", "encodings.utf_16", "encodings.utf_32", "encodings.idna",
    "encodings.unicode_escape", "encodings.raw_unicode_escape", "_strptime",
)

#: Modules whose import is a violation: they give native code, processes, sub-interpreters or unaudited
#: files (``_posixsubprocess.fork_exec`` has no audit event; ``subprocess`` and ``asyncio`` import it).
DENIED_IMPORTS = frozenset(
    {
        "ctypes", "_ctypes", "_ctypes_test", "_posixsubprocess", "_posixshmem", "_multiprocessing",
        "_xxsubinterpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi", "_testmultiphase",
        "_testsinglephase", "_testbuffer", "_testclinic", "_testimportmultiple", "_xxtestfuzz", "_sqlite3",
        "_dbm", "_gdbm", "_tkinter", "nis",
    }
)

#: Audit events that are always violations.
DENIED_EVENTS = frozenset(
    {
        "cpython.PyInterpreterState_New",  # a sub-interpreter would not have our hook
        "gc.get_objects", "gc.get_referrers", "gc.get_referents",  # would reach the hook's closure
        "sys.settrace", "sys.setprofile",  # tracers can rewrite frames
        "code.__new__",  # crafted bytecode can corrupt memory
        "fcntl.ioctl", "setopencode", "shutil.chown", "pty.spawn",
    }
)

#: Prefixes of audit events that are always violations (network, native code, processes, limits).
DENIED_EVENT_PREFIXES = (
    "socket.", "urllib.", "http.client.", "ftplib.", "imaplib.", "nntplib.", "poplib.", "smtplib.",
    "telnetlib.", "webbrowser.", "ensurepip.", "ctypes.", "subprocess.", "sqlite3.", "syslog.", "resource.",
    "winreg.", "_winapi.", "msvcrt.",
)


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run. The defaults fit a HumanEval-sized program and its tests.

    Raises:
        ValueError: a limit out of range (named in the message).
    """

    #: CPU seconds (``RLIMIT_CPU``, rounded up to whole seconds; SIGXCPU then, SIGKILL one second later):
    #: HumanEval tests need milliseconds, 2 s stops busy loops well before the wall clock.
    cpu_s: float = 2.0
    #: Wall-clock seconds before the whole process group is killed: catches programs that sleep or block,
    #: which use no CPU. Interpreter start-up (~20-50 ms) counts.
    wall_s: float = 5.0
    #: Address space in MiB (``RLIMIT_AS``): the interpreter needs ~25 MiB; 512 MiB leaves room for real
    #: work and turns runaway allocations into ``MemoryError`` instead of swapping the host.
    memory_mb: int = 512
    #: Bytes kept of stdout and of stderr each (the rest is read and discarded): enough for tracebacks and
    #: test output, bounded so a printing loop cannot fill our memory.
    max_output_bytes: int = 64_000
    #: Tasks (processes and threads) the program may have, itself included (``RLIMIT_NPROC``): 1 means no
    #: child process and no thread, which tests never need and which keeps every descendant in reach of
    #: the kill.
    max_processes: int = 1
    #: Largest file the program may write, in bytes (``RLIMIT_FSIZE``; Python ignores SIGXFSZ, so a write
    #: past it raises ``OSError: File too large``): 16 MiB keeps a writing loop from filling the disk.
    max_file_bytes: int = 16 * 2**20
    #: Open file descriptors (``RLIMIT_NOFILE``): the interpreter and its imports need ~10; 64 stops
    #: descriptor exhaustion.
    max_open_files: int = 64

    def __post_init__(self) -> None:
        seconds = {"cpu_s": 0.01, "wall_s": 0.01}
        counts = {"memory_mb": 64, "max_output_bytes": 0, "max_processes": 1, "max_file_bytes": 0,
                  "max_open_files": 16}
        for name, minimum in {**seconds, **counts}.items():
            value = getattr(self, name)
            kind = "an integer" if name in counts else "a finite number"
            if isinstance(value, bool) or not isinstance(value, int if name in counts else (int, float)):
                raise ValueError(f"SandboxLimits.{name} must be {kind} >= {minimum}, got {value!r}")
            if not minimum <= value < math.inf:
                raise ValueError(f"SandboxLimits.{name} must be {kind} >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one :func:`run_python` call."""

    #: "ok" (exit 0), "error" (non-zero exit, e.g. an exception or a syntax error), "timeout" (the wall
    #: clock or the CPU limit ran out), "killed" (another signal, e.g. a crash), "violation" (the guard
    #: stopped a forbidden operation; see ``violation``).
    status: str
    #: Exit code; negative: the signal that ended the process.
    returncode: int
    #: Output, decoded as UTF-8 (invalid bytes replaced), truncated to ``max_output_bytes`` bytes.
    stdout: str
    stderr: str
    #: Wall-clock seconds from start to exit.
    seconds: float
    #: The forbidden event and why, e.g. ``"open: read outside the sandbox: '/etc/passwd'"``; None unless
    #: status is "violation".
    violation: str | None = None


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


#: Limits of the plain-data channel of :func:`run_judged` (both directions).
MAX_MESSAGE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_ITEMS = 100_000
MAX_CALLS = 10_000


def run_python(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run the Python program ``source`` in the sandbox (see the module docstring) and return its result.

    Safe to call from several threads at once (no ``preexec_fn``; each run has its own directory and uid).

    Raises:
        TypeError: ``source`` is not a string.
        RuntimeError: the child could not set the sandbox up (limits, guard, privilege drop) before running
            the program; the program cannot cause this.
    """
    if not isinstance(source, str):
        raise TypeError(f"run_python needs the program as str, got {type(source).__name__}")
    proc = _Proc(source, limits, None)
    try:
        proc.start()
        deadline = proc.start_time + limits.wall_s
        timed_out = not _pump([proc], deadline, lambda: bool(proc.open_reads()))
        return proc.finish(timed_out, deadline)
    finally:
        proc.cleanup()


def run_judged(judge: str, candidate: str, function: str, limits: SandboxLimits = SandboxLimits()) -> JudgedRun:
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
    cand = _Proc(candidate, limits, ("serve", function))
    jud = _Proc(judge, limits, ("client", None))
    state = {"pending": False, "calls": 0, "report": None, "protocol": None, "candidate_gone": False,
             "judge_broken": None}

    def to_judge(status: str, value: Any) -> None:
        try:
            jud.send(_plain_dumps((status, value), MAX_MESSAGE_BYTES, MAX_DEPTH + 2, MAX_ITEMS))
        except (TypeError, ValueError, RecursionError, MemoryError) as e:  # e.g. a too large result
            jud.send(_plain_dumps(("error", f"the result cannot be passed on: {e}"[:1000]), MAX_MESSAGE_BYTES, 4, 10))

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
                    cand.send(_plain_dumps((args, kwargs), MAX_MESSAGE_BYTES, MAX_DEPTH + 2, MAX_ITEMS))
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
        timed_out = not _pump([cand, jud], deadline, step)
        judge_result = jud.finish(timed_out and bool(jud.open_reads()), deadline)
        candidate_result = cand.finish(timed_out and bool(cand.open_reads()), deadline)
        if state["judge_broken"] and judge_result.status == "ok":
            judge_result = dataclasses.replace(judge_result, status="error", stderr=judge_result.stderr + state["judge_broken"])
        return JudgedRun(judge_result, candidate_result, state["report"], state["calls"], state["protocol"])
    finally:
        cand.cleanup()
        jud.cleanup()


def _decode_message(frame: bytes) -> tuple | None:
    """A channel message (a non-empty tuple whose first item is a str) decoded with :func:`_plain_loads`,
    or None when it is not one."""
    try:
        message = _plain_loads(frame, MAX_MESSAGE_BYTES, MAX_DEPTH + 2, MAX_ITEMS)
    except (TypeError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    if type(message) is not tuple or not message or type(message[0]) is not str:
        return None
    return message


def _pump(procs: list[_Proc], deadline: float, step) -> bool:
    """Move bytes between this process and ``procs`` (outputs kept up to their caps, channel messages
    collected, pending channel writes flushed) until ``step()`` returns false (it is called after every
    batch of events); False if the deadline passed first."""
    with selectors.DefaultSelector() as selector:
        registered: dict[int, tuple[int, _Proc]] = {}
        while step():
            wanted: dict[int, tuple[int, _Proc]] = {}
            for proc in procs:
                for fd in proc.open_reads():
                    wanted[fd] = (selectors.EVENT_READ, proc)
                if proc.outbox and proc.to_child >= 0:
                    wanted[proc.to_child] = (selectors.EVENT_WRITE, proc)
            for fd in [fd for fd in registered if fd not in wanted]:
                selector.unregister(fd)
                del registered[fd]
            for fd, (events, proc) in wanted.items():
                if fd not in registered:
                    selector.register(fd, events)
                    registered[fd] = (events, proc)
            if not registered:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for key, _ in selector.select(remaining):
                events, proc = registered[key.fd]
                if events == selectors.EVENT_WRITE:
                    proc.flush()
                else:
                    proc.read(key.fd)
    return True


class _Proc:
    """One sandboxed child: its directory, pipes, output kept so far and channel buffers (parent side)."""

    def __init__(self, source: str, limits: SandboxLimits, channel: tuple[str, str | None] | None):
        self.source, self.limits, self.channel = source, limits, channel
        self.workdir: str | None = None
        self.proc: subprocess.Popen | None = None
        self.ids: tuple[int, int] | None = None
        self.fds: list[int] = []  # our ends, closed in cleanup
        self.caps: dict[int, int] = {}
        self.kept: dict[int, bytearray] = {}
        self.closed: set[int] = set()
        self.from_child = self.to_child = -1
        self.inbox = bytearray()
        self.inbox_total = 0
        self.outbox = bytearray()
        self.killed = False
        self.start_time = 0.0

    def start(self, start_time: float | None = None) -> None:
        self.workdir = os.path.realpath(tempfile.mkdtemp(prefix="mgrpo-sandbox-"))
        report_r, report_w = os.pipe()  # the guard's violation report
        setup_r, setup_w = os.pipe()  # a setup failure; closed by the child before the program runs
        self.fds += [report_r, setup_r]
        child_fds = [report_w, setup_w]
        channel = None
        if self.channel is not None:
            down_r, down_w = os.pipe()  # requests / replies to the child
            up_r, up_w = os.pipe()  # messages from the child
            os.set_blocking(down_w, False)
            self.to_child, self.from_child = down_w, up_r
            self.fds += [down_w, up_r]
            child_fds += [down_r, up_w]
            channel = {"mode": self.channel[0], "function": self.channel[1], "in_fd": down_r, "out_fd": up_w,
                       "max_bytes": MAX_MESSAGE_BYTES, "max_depth": MAX_DEPTH + 2, "max_items": MAX_ITEMS}
        try:
            with open(os.path.join(self.workdir, "main.py"), "w", encoding="utf-8") as f:
                f.write(self.source)
            self.ids = _sandbox_ids() if os.geteuid() == 0 else None
            if self.ids is not None:
                os.chown(self.workdir, *self.ids)
            nproc = _count_tasks(self.ids[0] if self.ids else os.getuid()) + self.limits.max_processes
            cpu = math.ceil(self.limits.cpu_s)
            memory = self.limits.memory_mb * 2**20
            config = {
                "dir": self.workdir,
                "ids": self.ids,
                "report_fd": report_w,
                "setup_fd": setup_w,
                "channel": channel,
                "violation_exit": VIOLATION_EXIT,
                "max_preloads": MAX_PRELOADS,
                "lazy_modules": LAZY_STDLIB_MODULES if self.ids is not None else (),
                "denied_imports": DENIED_IMPORTS,
                "denied_events": DENIED_EVENTS,
                "denied_prefixes": DENIED_EVENT_PREFIXES,
                "rlimits": (
                    ("RLIMIT_CORE", 0, 0),
                    ("RLIMIT_CPU", cpu, cpu + 1),
                    ("RLIMIT_AS", memory, memory),
                    ("RLIMIT_FSIZE", self.limits.max_file_bytes, self.limits.max_file_bytes),
                    ("RLIMIT_NOFILE", self.limits.max_open_files, self.limits.max_open_files),
                    ("RLIMIT_NPROC", nproc, nproc),
                ),
            }
            self.start_time = time.monotonic() if start_time is None else start_time
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", f"{_child_source()}\n_child_main({config!r})\n"],
                cwd=self.workdir,
                env={"HOME": self.workdir, "TMPDIR": self.workdir},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=tuple(child_fds),
                start_new_session=True,
            )
        finally:
            for fd in child_fds:
                os.close(fd)
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        cap = self.limits.max_output_bytes
        self.caps = {out: cap, err: cap, report_r: 4096, setup_r: 4096}
        self.kept = {fd: bytearray() for fd in self.caps}
        self.stdout_fd, self.stderr_fd, self.report_fd, self.setup_fd = out, err, report_r, setup_r

    def open_reads(self) -> list[int]:
        fds = [*self.caps, *([self.from_child] if self.from_child >= 0 else [])]
        return [fd for fd in fds if fd not in self.closed]

    def channel_open(self) -> bool:
        return self.from_child >= 0 and self.from_child not in self.closed

    def read(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            self.closed.add(fd)
        elif fd == self.from_child:
            self.inbox_total += len(chunk)
            if self.inbox_total <= MAX_CALLS * (MAX_MESSAGE_BYTES // 64) and len(self.inbox) <= MAX_MESSAGE_BYTES + 4:
                self.inbox += chunk
        else:  # keep the head, read and drop the rest so the child never blocks on a full pipe
            self.kept[fd] += chunk[: self.caps[fd] - len(self.kept[fd])]

    def frames(self) -> list[bytes | None]:
        """Complete messages received so far; None for one over :data:`MAX_MESSAGE_BYTES` (the rest of the
        inbox is then dropped: the sender broke the protocol)."""
        out: list[bytes | None] = []
        while len(self.inbox) >= 4:
            size = int.from_bytes(self.inbox[:4], "big")
            if size > MAX_MESSAGE_BYTES:
                self.inbox.clear()
                out.append(None)
                break
            if len(self.inbox) < 4 + size:
                break
            out.append(bytes(self.inbox[4 : 4 + size]))
            del self.inbox[: 4 + size]
        return out

    def send(self, payload: bytes) -> None:
        if self.to_child >= 0:
            self.outbox += len(payload).to_bytes(4, "big") + payload
            self.flush()

    def flush(self) -> None:
        try:
            written = os.write(self.to_child, self.outbox)
        except BlockingIOError:
            return
        except OSError:  # the child closed its end: it is gone
            self.outbox.clear()
            self.close_channel()
            return
        del self.outbox[:written]

    def close_channel(self) -> None:
        if self.to_child >= 0:
            os.close(self.to_child)
            self.fds.remove(self.to_child)
            self.to_child = -1
            self.outbox.clear()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None and not self.killed:
            self.killed = True
            _kill_group(self.proc)

    def finish(self, timed_out: bool, deadline: float) -> SandboxResult:
        """The child's result once its outputs are closed (or the deadline passed: ``timed_out``)."""
        proc = self.proc
        if not timed_out and proc.returncode is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            _kill_group(proc)
        seconds = time.monotonic() - self.start_time
        if self.kept[self.setup_fd]:
            raise RuntimeError(f"the sandbox could not be set up: {self.kept[self.setup_fd].decode('utf-8', 'replace')}")
        report = self.kept[self.report_fd].decode("utf-8", "replace")
        if report or proc.returncode == VIOLATION_EXIT:
            status = "violation"
        elif timed_out or proc.returncode == -signal.SIGXCPU:
            status = "timeout"
        elif proc.returncode < 0:
            status = "killed"
        else:
            status = "ok" if proc.returncode == 0 else "error"
        return SandboxResult(
            status=status,
            returncode=proc.returncode,
            stdout=self.kept[self.stdout_fd].decode("utf-8", "replace"),
            stderr=self.kept[self.stderr_fd].decode("utf-8", "replace"),
            seconds=seconds,
            violation=(report or "the program exited with the guard's exit code") if status == "violation" else None,
        )

    def cleanup(self) -> None:
        if self.proc is not None:
            if self.proc.returncode is None:
                _kill_group(self.proc)
            self.proc.stdout.close()
            self.proc.stderr.close()
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.ids is not None and self.ids[0] >= SANDBOX_ID_BASE:
            remove_owned(self.ids[0])


#: World-writable directories where a sandboxed uid could create entries (swept after root runs).
SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def remove_owned(uid: int, directories: tuple[str, ...] = SHARED_WRITABLE_DIRS) -> int:
    """Remove the entries of ``directories`` (top level) owned by ``uid``, a fresh sandbox uid that owns
    nothing else: what a run left outside its own directory, if anything got past the guard. Returns how
    many were removed."""
    removed = 0
    for directory in directories:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
                removed += 1
            except OSError:
                continue
    return removed


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group, then reap the child. Only called before the child is
    reaped: its pid, which is the group id, cannot have been reused yet."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _sandbox_ids() -> tuple[int, int]:
    """The uid and gid a root run drops to: a fresh id drawn from :data:`SANDBOX_ID_BASE` when the user
    namespace maps it (``/proc/self/uid_map``, ``gid_map``), else ``nobody``'s."""
    candidate = SANDBOX_ID_BASE + secrets.randbelow(SANDBOX_ID_SPAN)
    mapped = True
    for table in ("/proc/self/uid_map", "/proc/self/gid_map"):
        with open(table) as f:
            ranges = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
        mapped = mapped and any(inside <= candidate < inside + count for inside, _, count in ranges)
    if mapped:
        return candidate, candidate
    nobody = pwd.getpwnam("nobody")
    return nobody.pw_uid, nobody.pw_gid


def _count_tasks(uid: int) -> int:
    """Tasks (processes and threads) whose real uid is ``uid``: what ``RLIMIT_NPROC`` is compared with."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # the process exited meanwhile
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


@functools.cache
def _child_source() -> str:
    """Source of the child's bootstrap: :func:`_install_guard` and :func:`_child_main`, sent with ``-c``."""
    functions = (_plain_dumps, _plain_loads, _channel_io, _serve, _install_guard, _child_main)
    return "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in functions)


# ----------------------------------------------------------------------------------------------------
# Code below runs in the child only (its source is the child's ``-c`` program; it imports nothing of ours).


def _plain_dumps(value, max_bytes, max_depth, max_items):
    """``value`` encoded as plain data (JSON with tagged containers), or ``TypeError`` / ``ValueError`` when
    it is not plain data (an exact builtin type: None, bool, int, float, str, bytes, list, tuple, dict, set,
    frozenset) or exceeds a limit. Runs in the children and in the parent (it imports nothing of ours)."""
    import json

    budget = [max_items]
    type_, none_, bool_, int_, float_, str_, bytes_ = type, type(None), bool, int, float, str, bytes
    tags = {list: "l", tuple: "t", set: "s", frozenset: "f"}

    def tree(v, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError("more than %d values" % max_items)
        t = type_(v)
        if t is none_ or t is bool_ or t is int_ or t is float_ or t is str_:
            return v
        if depth >= max_depth:
            raise ValueError("nested deeper than %d levels" % max_depth)
        if t is bytes_:
            return {"b": v.hex()}
        if t is dict:
            return {"d": [[tree(k, depth + 1), tree(x, depth + 1)] for k, x in dict.items(v)]}
        tag = tags.get(t) if t in tags else None
        if tag is None:
            raise TypeError("not plain data: a value of type " + repr(getattr(t, "__name__", "?")))
        return {tag: [tree(x, depth + 1) for x in t.__iter__(v)]}

    data = json.dumps(tree(value, 0), ensure_ascii=True, allow_nan=True, separators=(",", ":")).encode("ascii")
    if len(data) > max_bytes:
        raise ValueError("encoded as %d bytes, more than %d" % (len(data), max_bytes))
    return data


def _plain_loads(data, max_bytes, max_depth, max_items):
    """The plain value encoded in ``data`` by :func:`_plain_dumps`, built from fresh builtin objects;
    ``ValueError`` (or ``TypeError`` for an unhashable set item or key) when ``data`` is anything else."""
    import json

    if type(data) is not bytes or len(data) > max_bytes:
        raise ValueError("not bytes within the size limit")
    try:
        raw = json.loads(data.decode("ascii"))
    except RecursionError as e:
        raise ValueError("nested too deeply") from e
    budget = [max_items]
    builders = {"l": list, "t": tuple, "s": set, "f": frozenset}

    def build(v, depth):
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError("more than %d values" % max_items)
        t = type(v)
        if v is None or t is bool or t is int or t is float or t is str:
            return v
        if depth >= max_depth or t is not dict or len(v) != 1:
            raise ValueError("not a plain-data encoding")
        ((tag, body),) = v.items()
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is not list:
            raise ValueError("not a plain-data encoding")
        if tag == "d":
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("not a plain-data encoding")
                out[build(pair[0], depth + 1)] = build(pair[1], depth + 1)
            return out
        if tag not in builders:
            raise ValueError("not a plain-data encoding")
        return builders[tag](build(x, depth + 1) for x in body)

    return build(raw, 0)




def _channel_io(in_fd, out_fd, max_bytes, max_depth, max_items):
    """``(send, recv)`` of a child's channel: length-prefixed plain-data messages (:func:`_plain_dumps`)
    on the descriptors ``out_fd`` / ``in_fd``; ``recv`` raises ``EOFError`` when the parent closed it."""
    import os

    read, write = os.read, os.write

    def read_exactly(size):
        chunks, got = [], 0
        while got < size:
            chunk = read(in_fd, min(1 << 16, size - got))
            if not chunk:
                raise EOFError("the channel is closed")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def recv():
        size = int.from_bytes(read_exactly(4), "big")
        if size > max_bytes:
            raise ValueError("a message over the size limit")
        return _plain_loads(read_exactly(size), max_bytes, max_depth, max_items)

    def send(value):
        data = _plain_dumps(value, max_bytes, max_depth, max_items)
        data = len(data).to_bytes(4, "big") + data
        while data:
            data = data[write(out_fd, data) :]

    return send, recv


def _serve(namespace, function, send, recv):
    """The candidate's side of :func:`run_judged`: call ``namespace[function]`` on each request's plain
    arguments and send back ``("ok", result)`` or ``("error", "<type>: <message>")``, until the parent
    closes the channel."""

    def describe(error, prefix=""):
        try:
            text = prefix + type(error).__name__ + ": " + str(error)
        except BaseException:
            text = prefix + "an exception"
        return text[:1000] if type(text) is str else prefix + "an exception"

    while True:
        try:
            args, kwargs = recv()
        except EOFError:
            return
        try:
            reply = ("ok", namespace[function](*args, **kwargs))
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the call failed
            reply = ("error", describe(e))
        try:
            send(reply)
        except BaseException as e:  # not plain data, over a limit
            send(("error", describe(e, "the result is not plain data: ")))


def _install_guard(sandbox, read_roots, report_fd, violation_exit, denied_imports, denied_events, denied_prefixes):
    """Install the audit hook and return ``harden(refusals)``, which switches it from lenient (a forbidden
    operation raises ``ImportError``/``PermissionError``: used while the child preloads modules) to strict
    (a forbidden operation reports itself on ``report_fd`` and ends the process with ``violation_exit``;
    importing a module of ``refusals`` counts as the operation refused when it was preloaded).

    Everything the hook uses is bound here, in its closure, before the program runs: the program may patch
    ``os``, ``os.path`` or ``builtins`` without effect. The mutable state (``strict``, ``refused``) is held
    by the closure alone, and the hook is referenced by no frame or module the program could walk to.
    """
    import _imp
    import os
    import sys

    write, exit_now = os.write, os._exit
    stat_, audit_, create_builtin_, list_, fspath_ = os.stat, sys.audit, _imp.create_builtin, list, os.fspath
    namespace_ = type(sys.implementation)  # types.SimpleNamespace
    loaded_builtins = []  # builtin modules loaded when the guard hardens: never created again
    str_, bytes_, int_, type_, repr_ = str, bytes, int, type, repr
    base_exception, import_error, permission_error = BaseException, ImportError, PermissionError
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    inside = sandbox + "/"
    read_roots = tuple(read_roots)
    read_prefixes = tuple(root + "/" for root in read_roots)
    devices = ("/dev/null", "/dev/urandom")
    # event -> (indexes of the paths it writes, indexes of its dir_fd arguments)
    path_writes = {
        "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
        "os.rename": ((0, 1), (2, 3)), "os.utime": ((0,), (3,)), "os.truncate": ((0,), ()),
    }
    path_reads = ("os.listdir", "os.scandir", "os.listxattr", "os.getxattr")
    harmless_os = ("os.putenv", "os.unsetenv", "os.walk", "os.fwalk", "os.lockf")
    strict = [False]
    refused = {}

    def as_text(path):
        """``path`` as str when it is exactly str or bytes; None otherwise (a path object could show the
        guard one path and open another)."""
        if type_(path) is bytes_:
            return str_(path, "utf-8", "surrogateescape")
        return path if type_(path) is str_ else None

    def absolute(text):
        """Absolute, lexically normalised form of a path; relative ones are relative to the sandbox, the
        working directory, which the program cannot change (so no signal handler can change it between
        this check and the system call)."""
        if not text.startswith("/"):
            text = inside + text
        parts = []
        for part in text.split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part and part != ".":
                parts.append(part)
        return "/" + "/".join(parts)

    def in_sandbox(path):
        return path.startswith(inside)

    def readable(path):
        return (
            path == sandbox or path.startswith(inside) or path in devices
            or path in read_roots or path.startswith(read_prefixes)
        )

    def problem(event, args):
        """Why ``event`` with ``args`` is forbidden, or None when it is allowed."""
        if event == "open":
            path, mode, flags = args
            if type_(path) is int_:  # an already open descriptor
                return None
            text = as_text(path)
            if text is None:
                return "the path is not str or bytes"
            writing = flags & write_flags
            if mode is None and not text.startswith("/"):  # os.open: maybe relative to a dir_fd we cannot see
                if writing:
                    return "os.open for writing with a relative path: " + repr_(text)
                if ".." in text.split("/"):
                    return "os.open with '..' in a relative path: " + repr_(text)
            full = absolute(text)
            if writing:  # the sandbox itself: O_TMPFILE (tempfile) opens the directory for writing
                ok = in_sandbox(full) or full == sandbox or full == "/dev/null"
                return None if ok else "write outside the sandbox: " + repr_(full)
            return None if readable(full) else "read outside the sandbox: " + repr_(full)
        if event == "import":
            name = args[0]
            if type_(name) is not str_:
                return "the module name is not str"
            if name in denied_imports or name.partition(".")[0] in denied_imports:
                return "forbidden module " + repr_(name)
            filename = args[1]
            if filename is not None:  # an extension module: native code
                text = as_text(filename)
                full = absolute(text) if text is not None else ""
                if not (full in read_roots or full.startswith(read_prefixes)):
                    return "native code from outside the Python installation: " + repr_(full)
            return None
        if event.startswith("os."):
            if event in path_reads:
                path = args[0]
                if path is None or type_(path) is int_:
                    return None
                text = as_text(path)
                if text is None:
                    return "the path is not str or bytes"
                full = absolute(text)
                return None if readable(full) else "read outside the sandbox: " + repr_(full)
            rule = path_writes.get(event)
            if rule is not None:
                for index in rule[1]:
                    if args[index] is not None and args[index] != -1:
                        return "a dir_fd argument (its directory cannot be checked)"
                for index in rule[0]:
                    path = args[index]
                    if type_(path) is int_:
                        continue
                    text = as_text(path)
                    if text is None:
                        return "the path is not str or bytes"
                    full = absolute(text)
                    if not in_sandbox(full):
                        return "outside the sandbox: " + repr_(full)
                return None
            return None if event in harmless_os else "forbidden"
        if event in denied_events or event.startswith(denied_prefixes):
            return "forbidden"
        if strict[0] and event in ("marshal.load", "marshal.loads"):  # code objects from bytes
            return "forbidden"
        return None

    def checked_stat(path, dir_fd, follow_symlinks, box):
        """``os.stat`` for the stubs of :func:`harden`, or why not: the original function is held here only."""
        if type_(box) is not list_:
            return "forbidden"
        if dir_fd is not None:
            return "a dir_fd argument (its directory cannot be checked)"
        if type_(path) is not int_:
            text = as_text(path)
            if text is None:
                return "the path is not str or bytes"
            full = absolute(text)
            if not readable(full):
                return "outside the sandbox: " + repr_(full)
        box.append(stat_(path, follow_symlinks=follow_symlinks is not False))  # OSError propagates
        return None

    def checked_create_builtin(spec, box):
        name = spec.name
        if type_(name) is not str_ or type_(box) is not list_:
            return "forbidden"
        if name in loaded_builtins:  # a second copy of a module would hold the originals of the stubs
            return "creating module " + repr_(name) + " again"
        box.append(create_builtin_(namespace_(name=name)))
        return None

    def hook(event, args):
        if event.startswith("sandbox.") and strict[0]:  # the stubs of harden(), or the program itself
            if event == "sandbox.stat" and len(args) == 4:
                why = checked_stat(*args)
            elif event == "sandbox.create_builtin" and len(args) == 2:
                why = checked_create_builtin(*args)
            else:
                why = "forbidden"
            if why is None:
                return
            event = {"sandbox.stat": "os.stat", "sandbox.create_builtin": "_imp.create_builtin"}.get(event, event)
            try:
                write(report_fd, (event + ": " + why).encode("utf-8", "replace")[:4000])
            except base_exception:
                pass
            exit_now(violation_exit)
        why = problem(event, args)  # an error in here propagates: the operation is refused
        if why is None and strict[0] and event == "import" and type_(args[0]) is str_:
            why = refused.get(args[0])  # its import was refused while preloading
        if why is None:
            return
        if not strict[0]:
            raise (import_error if event == "import" else permission_error)("sandbox: " + event + ": " + why)
        try:
            write(report_fd, (event + ": " + why).encode("utf-8", "replace")[:4000])
        except base_exception:  # the program closed the report pipe: the exit code still tells
            pass
        exit_now(violation_exit)

    def harden(refusals):
        """Switch to strict mode; ``refusals``: module -> why the guard refused its import while preloading."""
        nonlocal refused
        refused = {str_(name): str_(why) for name, why in refusals.items()}
        loaded_builtins.extend(name for name in sys.builtin_module_names if name in sys.modules)

        # Functions without an audit event are replaced by stubs that go through the hook: os.stat / lstat
        # (checked like reads), os.mknod / mkfifo (refused: device files, FIFOs, files anywhere the uid
        # may write), _imp.create_builtin (a fresh posix module would hold the originals). The originals
        # are dropped from every loaded module and from os.supports_* (which hold the function objects).
        def stat(path, *, dir_fd=None, follow_symlinks=True):
            box = []  # a path object is converted once, here: the hook checks and stats that same str
            audit_("sandbox.stat", path if type_(path) is int_ else fspath_(path), dir_fd, follow_symlinks, box)
            return box[0]

        def lstat(path, *, dir_fd=None):
            box = []
            audit_("sandbox.stat", path if type_(path) is int_ else fspath_(path), dir_fd, False, box)
            return box[0]

        def mknod(path, mode=0o600, device=0, *, dir_fd=None):
            audit_("sandbox.os.mknod", path)

        def mkfifo(path, mode=0o666, *, dir_fd=None):
            audit_("sandbox.os.mkfifo", path)

        def create_builtin(spec):
            box = []
            audit_("sandbox.create_builtin", spec, box)
            return box[0]

        stubs = {"stat": stat, "lstat": lstat, "mknod": mknod, "mkfifo": mkfifo}
        originals = {id(getattr(os, name)): stub for name, stub in stubs.items() if hasattr(os, name)}
        originals[id(create_builtin_)] = create_builtin
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if type_(namespace) is dict:
                for key, value in list(namespace.items()):
                    if id(value) in originals and value is not originals[id(value)]:
                        namespace[key] = originals[id(value)]
        for name in ("supports_dir_fd", "supports_fd", "supports_follow_symlinks", "supports_effective_ids"):
            functions = getattr(os, name, None)
            if type_(functions) is set:
                for function in [f for f in functions if id(f) in originals]:
                    functions.discard(function)
                    functions.add(originals[id(function)])
        strict[0] = True

    sys.addaudithook(hook)
    return harden


def _child_main(config):
    """The child: limits, guard, preloads, privilege drop, then the program as ``__main__``."""
    import ast
    import builtins
    import os
    import resource
    import sys

    try:
        for name, soft, hard in config["rlimits"]:
            kind = getattr(resource, name)
            ceiling = resource.getrlimit(kind)[1]
            if ceiling != resource.RLIM_INFINITY:  # only root may raise a hard limit
                soft, hard = min(soft, ceiling), min(hard, ceiling)
            resource.setrlimit(kind, (soft, hard))
        sandbox = config["dir"]
        main_path = sandbox + "/main.py"
        with open(main_path, "rb") as f:
            source = f.read()
        harden = _install_guard(
            sandbox, [os.path.realpath(p) for p in sys.path if p], config["report_fd"], config["violation_exit"],
            config["denied_imports"], config["denied_events"], config["denied_prefixes"],
        )
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # e.g. nested too deeply
            tree = ast.Module(body=[], type_ignores=[])
        wanted = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wanted.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                wanted.add(node.module)
                wanted.update(f"{node.module}.{alias.name}" for alias in node.names)
        refusals = {}
        for name in ["json", *sorted(wanted)[: config["max_preloads"]], *config["lazy_modules"]]:
            try:
                __import__(name)
            except BaseException as e:  # e.g. ModuleNotFoundError: the program will meet the same error
                if str(e).startswith("sandbox: "):
                    refusals[name] = str(e)[len("sandbox: "):]
        if config["ids"] is not None:
            uid, gid = config["ids"]
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        sys.implementation.cache_tag = None  # imports compile sources: no marshal.loads of bytecode files
        sys.dont_write_bytecode = True
        sys.path.insert(0, sandbox)
        sys.argv = [main_path]
        module = type(sys)("__main__")
        module.__file__ = main_path
        module.__builtins__ = builtins
        sys.modules["__main__"] = module
        channel = config["channel"]
        if channel is not None:
            send, recv = _channel_io(channel["in_fd"], channel["out_fd"], channel["max_bytes"],
                                     channel["max_depth"], channel["max_items"])
            if channel["mode"] == "client":  # the judge: calls the candidate's function through the parent

                class CandidateError(Exception):
                    """The candidate's call raised, returned something that is not plain data, or it is gone."""

                def call(args, kwargs):
                    send(("call", tuple(args), dict(kwargs)))
                    status, value = recv()
                    if status == "ok":
                        return value
                    raise CandidateError(value)

                def report(value):
                    send(("report", value))

                module.__dict__.update(__sandbox_call__=call, __sandbox_report__=report, CandidateError=CandidateError)
            else:
                os.dup2(2, 1)  # the candidate's prints go to stderr
        harden(refusals)
        del harden
    except BaseException as e:  # reported on a pipe the program never sees; the parent raises it
        os.write(config["setup_fd"], f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:4000])
        os._exit(1)
    os.close(config["setup_fd"])
    exec(compile(source, main_path, "exec"), module.__dict__)
    if channel is not None and channel["mode"] == "serve":
        _serve(module.__dict__, channel["function"], send, recv)
