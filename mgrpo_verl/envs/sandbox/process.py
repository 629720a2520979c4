"""The parent side of the sandbox: one sandboxed child process (:class:`Child`: its directory, pipes, limits
and relay buffers), :func:`run_python`, and the clean-up of what a run leaves. The child itself is
``_child.py``; the layers and what they guarantee are specified in ``docs/security.md`` ("The sandbox")."""

from __future__ import annotations

import json
import logging
import math
import os
import pwd
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from mgrpo_verl.envs.sandbox.codec import MAX_CALLS, MAX_DEPTH, MAX_ITEMS, MAX_MESSAGE_BYTES

logger = logging.getLogger(__name__)

#: The child's program and the codec it loads (run and read by path; see ``_child.py``).
CHILD_PATH = os.path.join(os.path.dirname(os.path.realpath(__file__)), "_child.py")
CODEC_PATH = os.path.join(os.path.dirname(os.path.realpath(__file__)), "codec.py")

#: Exit code of a child stopped by the guard (the report pipe names the event).
VIOLATION_EXIT = 86

#: Fresh uids/gids for root runs are drawn from [base, base + span): far above the ids of real users
#: (1000-60000), of ``nobody`` (65534) and of the usual container sub-id ranges (100000 + 65536 * k).
SANDBOX_ID_BASE = 1 << 30
SANDBOX_ID_SPAN = 1 << 24

#: Seconds between two checks of a running sandbox's directory by the disk monitor (:meth:`Child.check_disk`).
DISK_CHECK_S = 0.05

#: Deepest directory tree the disk monitor walks (it holds one descriptor per level); deeper is a violation.
MAX_TREE_DEPTH = 64

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
        "pwd", "grp", "spwd",  # the account databases, read by libc without an audit event
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
    #: Files and directories the program may create (the guard counts each open that may create a file and
    #: each ``os.mkdir``; the parent's disk monitor counts the entries of the sandbox directory, ``main.py``
    #: excluded): HumanEval programs create none; 256 stops inode floods (20,000 empty files took 0.9 s).
    max_files: int = 256
    #: Bytes the sandbox directory may hold (allocated blocks, checked by the parent every
    #: :data:`DISK_CHECK_S` and at exit; also the cap of each file, with ``max_file_bytes``): 64 MiB.
    max_disk_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        seconds = {"cpu_s": 0.01, "wall_s": 0.01}
        counts = {"memory_mb": 64, "max_output_bytes": 0, "max_processes": 1, "max_file_bytes": 0,
                  "max_open_files": 16, "max_files": 0, "max_disk_bytes": 0}
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
    #: stopped a forbidden operation, or the disk monitor found the sandbox directory over its limits; see
    #: ``violation``).
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


def run_python(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run the Python program ``source`` in the sandbox (see ``docs/security.md``) and return its result.

    Safe to call from several threads at once (no ``preexec_fn``; each run has its own directory and uid).

    Raises:
        TypeError: ``source`` is not a string.
        RuntimeError: the child could not set the sandbox up (limits, guard, privilege drop) before running
            the program; the program cannot cause this.
    """
    if not isinstance(source, str):
        raise TypeError(f"run_python needs the program as str, got {type(source).__name__}")
    proc = Child(source, limits, None)
    try:
        proc.start()
        deadline = proc.start_time + limits.wall_s
        timed_out = not pump([proc], deadline, lambda: bool(proc.open_reads()))
        return proc.finish(timed_out, deadline)
    finally:
        proc.cleanup()


def pump(procs: list[Child], deadline: float, step) -> bool:
    """Move bytes between this process and ``procs`` (outputs kept up to their caps, channel messages
    collected, pending channel writes flushed) until ``step()`` returns false (it is called after every
    batch of events); False if the deadline passed first. Every :data:`DISK_CHECK_S` the children's
    directories are checked (:meth:`Child.check_disk`)."""
    with selectors.DefaultSelector() as selector:
        registered: dict[int, tuple[int, Child]] = {}
        next_check = time.monotonic() + DISK_CHECK_S
        while step():
            if time.monotonic() >= next_check:
                for proc in procs:
                    proc.check_disk()
                next_check = time.monotonic() + DISK_CHECK_S
            wanted: dict[int, tuple[int, Child]] = {}
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
            for key, _ in selector.select(min(remaining, max(0.0, next_check - time.monotonic()))):
                events, proc = registered[key.fd]
                if events == selectors.EVENT_WRITE:
                    proc.flush()
                else:
                    proc.read(key.fd)
    return True


class Child:
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
        self.disk_violation: str | None = None

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
            file_bytes = min(self.limits.max_file_bytes, self.limits.max_disk_bytes)
            config = {
                "codec": CODEC_PATH,
                "own_files": [CHILD_PATH, CODEC_PATH],
                "dir": self.workdir,
                "ids": self.ids,
                "report_fd": report_w,
                "setup_fd": setup_w,
                "channel": channel,
                "violation_exit": VIOLATION_EXIT,
                "max_preloads": MAX_PRELOADS,
                "max_files": self.limits.max_files,
                "lazy_modules": LAZY_STDLIB_MODULES if self.ids is not None else (),
                "denied_imports": sorted(DENIED_IMPORTS),
                "denied_events": sorted(DENIED_EVENTS),
                "denied_prefixes": DENIED_EVENT_PREFIXES,
                "rlimits": (
                    ("RLIMIT_CORE", 0, 0),
                    ("RLIMIT_CPU", cpu, cpu + 1),
                    ("RLIMIT_AS", memory, memory),
                    ("RLIMIT_FSIZE", file_bytes, file_bytes),
                    ("RLIMIT_NOFILE", self.limits.max_open_files, self.limits.max_open_files),
                    ("RLIMIT_NPROC", nproc, nproc),
                ),
            }
            self.start_time = time.monotonic() if start_time is None else start_time
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-X", "utf8", CHILD_PATH, json.dumps(config)],
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

    def check_disk(self) -> None:
        """The disk monitor: when the sandbox directory holds more than ``max_disk_bytes`` (allocated blocks),
        more than ``max_files`` entries besides ``main.py``, or a tree deeper than :data:`MAX_TREE_DEPTH`, the
        process group is killed and the run becomes a violation. It runs in this process, so it holds even
        where the guard (in the child) is defeated."""
        if self.disk_violation is not None or self.workdir is None:
            return
        why = disk_usage(self.workdir, self.limits.max_disk_bytes, self.limits.max_files + 1)[2]
        if why is not None:
            self.disk_violation = "disk: " + why
            self.kill()

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
            raise RuntimeError(f"the sandbox could not be set up: "
                               f"{self.kept[self.setup_fd].decode('utf-8', 'replace')}")
        self.check_disk()  # what it wrote since the last check (or before it exited)
        report = self.kept[self.report_fd].decode("utf-8", "replace") or self.disk_violation or ""
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
        """Kill the child if it still runs, close our descriptors, remove its directory (and, in root runs,
        what its uid left in the shared temporary directories). Never raises: whatever the program left
        (a tree 1,200 levels deep, unreadable directories) is removed or, if that fails, logged."""
        try:
            if self.proc is not None and self.proc.returncode is None:
                _kill_group(self.proc)
        except Exception:  # logged; the descriptors and the directory go regardless
            logger.exception("could not kill the sandboxed process group %s", self.proc.pid)
        finally:
            streams = (self.proc.stdout, self.proc.stderr) if self.proc is not None else ()
            for stream in streams:
                try:
                    stream.close()
                except OSError:
                    pass
            for fd in self.fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.fds = []
            if self.workdir is not None and not remove_tree(self.workdir):
                logger.warning("could not remove the sandbox directory %s", self.workdir)
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
            except OSError:
                continue
            removed += remove_tree(entry.path)
    return removed


def disk_usage(path: str, max_bytes: int, max_entries: int) -> tuple[int, int, str | None]:
    """``(bytes, entries, why)`` of the directory tree ``path``: allocated bytes (``st_blocks``, the tree's
    directories included) and entries below it, counted until a limit is passed; ``why`` says which
    (``max_bytes``, ``max_entries``, :data:`MAX_TREE_DEPTH` levels), None within them. Never follows a
    link, holds one descriptor per level, never raises (an entry that vanishes meanwhile is skipped)."""
    total = entries = 0
    fds: list[int] = []
    pending: list[list[str]] = []  # per level: subdirectories still to walk
    try:
        try:
            fds.append(os.open(path, _DIR_FLAGS))
        except OSError:
            return 0, 0, None
        pending.append([])
        while True:
            fd = fds[-1]
            try:
                with os.scandir(fd) as listing:
                    for entry in listing:
                        entries += 1
                        if entries > max_entries:
                            return total, entries, f"more than {max_entries - 1} files and directories"
                        try:
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                            if entry.is_dir(follow_symlinks=False):
                                pending[-1].append(entry.name)
                        except OSError:
                            continue
                        if total > max_bytes:
                            return total, entries, f"more than {max_bytes} bytes"
            except OSError:
                pass
            while True:  # the next directory to scan: a pending subdirectory of the deepest open level
                while fds and not pending[-1]:
                    os.close(fds.pop())
                    pending.pop()
                if not fds:
                    return total, entries, None
                if len(fds) >= MAX_TREE_DEPTH:
                    return total, entries, f"a directory tree deeper than {MAX_TREE_DEPTH} levels"
                try:
                    fds.append(os.open(pending[-1].pop(), _DIR_FLAGS, dir_fd=fds[-1]))
                except OSError:  # vanished meanwhile, or not a directory any more
                    continue
                pending.append([])
                break
    finally:
        for fd in fds:
            os.close(fd)


#: How :func:`remove_tree` opens a directory: never through a symbolic link.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str) -> bool:
    """Remove ``path`` and everything below it, never following a symbolic link; True when it is gone.

    What differs from ``shutil.rmtree``, which recursed (``RecursionError`` on a tree ~1,000 levels deep,
    raised through ``ignore_errors``) and gave up on unreadable directories: iterative at any depth,
    working through descriptors (paths deeper than ``PATH_MAX`` are fine), at most two descriptors open at
    a time, unreadable directories made readable first (our uid owns them when we are not root), and it
    never raises. Only for trees no process changes meanwhile (the sandbox's processes are dead): it
    climbs back with ``..``."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError:  # a file or a link, or a directory we cannot open
        try:
            os.unlink(path)
        except OSError:
            pass
        return not os.path.lexists(path)
    names: list[str] = []  # the directories from path down to fd's
    todo = [_clear(fd)]  # per level: the subdirectories still to empty and remove
    try:
        while True:
            if todo[-1]:
                name = todo[-1].pop()
                try:
                    child = _open_dir(name, fd)
                except OSError:
                    continue
                os.close(fd)
                fd = child
                names.append(name)
                todo.append(_clear(fd))
                continue
            todo.pop()
            if not names:
                break
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = parent
            try:
                os.rmdir(names.pop(), dir_fd=fd)
            except OSError:
                pass
    except OSError:  # cannot climb back: what is left stays (the caller logs it)
        pass
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass
    return not os.path.lexists(path)


def _clear(fd: int) -> list[str]:
    """Remove the entries of the directory ``fd`` that are not directories, and its empty subdirectories;
    return the names of the other subdirectories (empty when it cannot be listed)."""
    try:
        entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in os.scandir(fd)]
    except OSError:
        return []
    left = []
    for name, is_dir in entries:
        try:
            if not is_dir:
                os.unlink(name, dir_fd=fd)
            else:
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError:
                    left.append(name)
        except OSError:
            pass
    return left


def _open_dir(name: str, parent: int) -> int:
    """A descriptor of the subdirectory ``name`` of ``parent``; an unreadable one is made readable first."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent)  # a directory (not a link: _clear saw it without following)
        return os.open(name, _DIR_FLAGS, dir_fd=parent)


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
