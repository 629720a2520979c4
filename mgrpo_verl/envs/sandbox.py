"""Run untrusted Python code (programs written by the models we train) in a contained child process.

:func:`run_python` runs one program and returns a :class:`SandboxResult`. Containment is layered; the kernel
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

Not contained (CPython raises no audit event for them; the CPython docs say audit hooks are no sandbox):
``os.mkfifo``/``os.mknod`` (a FIFO or empty file where the uid may write), ``signal.pidfd_send_signal``
and ``os.setpriority`` (processes of the same uid), ``pwd``/``grp`` (the account databases, through libc),
and memory-corruption bugs of CPython, which could run native code. The kernel layers bound the damage: as
root the program runs as a uid that owns nothing but the sandbox directory and can create no process; when
we are not root it runs as our user, so run untrusted code as root (it then drops privileges) or in a
container. Linux only.
"""

from __future__ import annotations

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
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="mgrpo-sandbox-"))
    report_r, report_w = os.pipe()  # the guard's violation report
    setup_r, setup_w = os.pipe()  # a setup failure; closed by the child before the program runs
    proc = None
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(source)
        ids = _sandbox_ids() if os.geteuid() == 0 else None
        if ids is not None:
            os.chown(workdir, *ids)
        nproc = _count_tasks(ids[0] if ids else os.getuid()) + limits.max_processes
        cpu = math.ceil(limits.cpu_s)
        config = {
            "dir": workdir,
            "ids": ids,
            "report_fd": report_w,
            "setup_fd": setup_w,
            "violation_exit": VIOLATION_EXIT,
            "max_preloads": MAX_PRELOADS,
            "lazy_modules": LAZY_STDLIB_MODULES if ids is not None else (),
            "denied_imports": DENIED_IMPORTS,
            "denied_events": DENIED_EVENTS,
            "denied_prefixes": DENIED_EVENT_PREFIXES,
            "rlimits": (
                ("RLIMIT_CORE", 0, 0),
                ("RLIMIT_CPU", cpu, cpu + 1),
                ("RLIMIT_AS", limits.memory_mb * 2**20, limits.memory_mb * 2**20),
                ("RLIMIT_FSIZE", limits.max_file_bytes, limits.max_file_bytes),
                ("RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files),
                ("RLIMIT_NPROC", nproc, nproc),
            ),
        }
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", f"{_child_source()}\n_child_main({config!r})\n"],
            cwd=workdir,
            env={"HOME": workdir, "TMPDIR": workdir},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(report_w, setup_w),
            start_new_session=True,
        )
        for fd in (report_w, setup_w):
            os.close(fd)
        report_w = setup_w = -1
        caps = {proc.stdout.fileno(): limits.max_output_bytes, proc.stderr.fileno(): limits.max_output_bytes,
                report_r: 4096, setup_r: 4096}
        kept = {fd: bytearray() for fd in caps}
        deadline = start + limits.wall_s
        timed_out = False
        with selectors.DefaultSelector() as selector:
            for fd in caps:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                for key, _ in selector.select(remaining):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        selector.unregister(key.fd)
                    else:  # keep the head, read and drop the rest so the child never blocks on a full pipe
                        kept[key.fd] += chunk[: caps[key.fd] - len(kept[key.fd])]
        if not timed_out:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            _kill_group(proc)
        seconds = time.monotonic() - start
        if kept[setup_r]:
            raise RuntimeError(f"the sandbox could not be set up: {kept[setup_r].decode('utf-8', 'replace')}")
        report = kept[report_r].decode("utf-8", "replace")
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
            stdout=kept[proc.stdout.fileno()].decode("utf-8", "replace"),
            stderr=kept[proc.stderr.fileno()].decode("utf-8", "replace"),
            seconds=seconds,
            violation=(report or "the program exited with the guard's exit code") if status == "violation" else None,
        )
    finally:
        if proc is not None:
            if proc.returncode is None:
                _kill_group(proc)
            proc.stdout.close()
            proc.stderr.close()
        for fd in (report_r, report_w, setup_r, setup_w):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(workdir, ignore_errors=True)


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
    return "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in (_install_guard, _child_main))


# ----------------------------------------------------------------------------------------------------
# Code below runs in the child only (its source is the child's ``-c`` program; it imports nothing of ours).


def _install_guard(sandbox, read_roots, report_fd, violation_exit, denied_imports, denied_events, denied_prefixes):
    """Install the audit hook and return ``harden(refusals)``, which switches it from lenient (a forbidden
    operation raises ``ImportError``/``PermissionError``: used while the child preloads modules) to strict
    (a forbidden operation reports itself on ``report_fd`` and ends the process with ``violation_exit``;
    importing a module of ``refusals`` counts as the operation refused when it was preloaded).

    Everything the hook uses is bound here, in its closure, before the program runs: the program may patch
    ``os``, ``os.path`` or ``builtins`` without effect. The mutable state (``strict``, ``refused``) is held
    by the closure alone, and the hook is referenced by no frame or module the program could walk to.
    """
    import os
    import sys

    write, exit_now = os.write, os._exit
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

    def hook(event, args):
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
        except (SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        wanted = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wanted.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                wanted.add(node.module)
                wanted.update(f"{node.module}.{alias.name}" for alias in node.names)
        refusals = {}
        for name in [*sorted(wanted)[: config["max_preloads"]], *config["lazy_modules"]]:
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
        harden(refusals)
        del harden
    except BaseException as e:  # reported on a pipe the program never sees; the parent raises it
        os.write(config["setup_fd"], f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:4000])
        os._exit(1)
    os.close(config["setup_fd"])
    exec(compile(source, main_path, "exec"), module.__dict__)
