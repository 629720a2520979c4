"""The sandboxed child process of :mod:`mgrpo_verl.envs.sandbox`, run by path as
``python -I -S -B -X utf8 _child.py <config JSON>`` (see ``docs/security.md``, "The sandbox").

It imports nothing of ours (site-packages are not on its path): the plain-data codec is ``codec.py`` of
this directory, compiled from its path before the guard is installed. Everything here runs in the child.
"""

import json
import sys


def _load_codec(path):
    """``(plain_dumps, plain_loads)`` of ``codec.py``, compiled from ``path`` (this directory's)."""
    namespace = {"__name__": "mgrpo_sandbox_codec"}
    with open(path, "rb") as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return namespace["plain_dumps"], namespace["plain_loads"]


def _channel_io(in_fd, out_fd, max_bytes, max_depth, max_items, dumps, loads):
    """``(send, recv)`` of a child's channel: length-prefixed plain-data messages (``dumps``, ``loads``: the codec)
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
        return loads(read_exactly(size), max_bytes, max_depth, max_items)

    def send(value):
        data = dumps(value, max_bytes, max_depth, max_items)
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


def _install_guard(sandbox, read_roots, read_files, report_fd, violation_exit, denied_imports, denied_events,
                   denied_prefixes, max_files):
    """Install the audit hook and return ``harden(refusals)``, which switches it from lenient (a forbidden
    operation raises ``ImportError``/``PermissionError``: used while the child preloads modules) to strict
    (a forbidden operation reports itself on ``report_fd`` and ends the process with ``violation_exit``;
    importing a module of ``refusals`` counts as the operation refused when it was preloaded). In strict
    mode it also counts the files and directories the program creates: past ``max_files`` is a violation.

    Everything the hook uses is bound here, in its closure, before the program runs: the program may patch
    ``os``, ``os.path`` or ``builtins`` without effect. The mutable state (``strict``, ``refused``,
    ``created``) is held by the closure alone, and the hook is referenced by no frame or module the program
    could walk to.
    """
    import _imp
    import os
    import sys

    write, exit_now = os.write, os._exit
    stat_, audit_, create_builtin_, list_, fspath_ = os.stat, sys.audit, _imp.create_builtin, list, os.fspath
    open_, access_, readlink_, statvfs_, pathconf_ = os.open, os.access, os.readlink, os.statvfs, os.pathconf
    namespace_ = type(sys.implementation)  # types.SimpleNamespace
    loaded_builtins = []  # builtin modules loaded when the guard hardens: never created again
    str_, bytes_, int_, type_, repr_, tuple_ = str, bytes, int, type, repr, tuple
    base_exception, import_error, permission_error = BaseException, ImportError, PermissionError
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    create_flag, tmpfile_flags = os.O_CREAT, getattr(os, "O_TMPFILE", 0)
    created = [0]  # opens that may create a file, and directories made, in strict mode (at most max_files)
    inside = sandbox + "/"
    read_roots = tuple(read_roots)
    read_prefixes = tuple(root + "/" for root in read_roots)
    read_files = tuple(read_files)  # this child's own sources (tracebacks show their lines)
    devices = ("/dev/null", "/dev/urandom")
    # event -> (indexes of the paths it writes, indexes of its dir_fd arguments)
    path_writes = {
        "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
        "os.rename": ((0, 1), (2, 3)), "os.utime": ((0,), (3,)), "os.truncate": ((0,), ()),
    }
    path_reads = ("os.listdir", "os.scandir", "os.listxattr", "os.getxattr")
    harmless_os = ("os.putenv", "os.unsetenv", "os.walk", "os.fwalk", "os.lockf")
    path_stubs = ("open", "access", "readlink", "statvfs", "pathconf")
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
            path == sandbox or path.startswith(inside) or path in devices or path in read_files
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
                if not ok:
                    return "write outside the sandbox: " + repr_(full)
                creates = flags & create_flag or (tmpfile_flags and flags & tmpfile_flags == tmpfile_flags)
                return too_many_files() if creates and full != "/dev/null" else None
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
                return too_many_files() if event == "os.mkdir" else None
            return None if event in harmless_os else "forbidden"
        if event in denied_events or event.startswith(denied_prefixes):
            return "forbidden"
        if strict[0] and event in ("marshal.load", "marshal.loads"):  # code objects from bytes
            return "forbidden"
        return None

    def too_many_files():
        """Counts one more file or directory the program creates; why not, past ``max_files``."""
        if not strict[0]:
            return None
        created[0] += 1
        return None if created[0] <= max_files else "more than " + str_(max_files) + " files created in the sandbox"

    def outside(path, dir_fd):
        """Why a path-taking function without an audit event may not see ``path``, or None (checked like reads)."""
        if dir_fd is not None:
            return "a dir_fd argument (its directory cannot be checked)"
        if type_(path) is int_:
            return None
        text = as_text(path)
        if text is None:
            return "the path is not str or bytes"
        full = absolute(text)
        return None if readable(full) else "outside the sandbox: " + repr_(full)

    def checked_path(name, path, dir_fd, arguments, box):
        """``os.open`` (its "open" event checks the path), ``os.access``, ``os.readlink``, ``os.statvfs``,
        ``os.pathconf`` for the stubs of :func:`harden`, called with the arguments the stub passed, or why not."""
        if type_(box) is not list_ or type_(arguments) is not tuple_ or len(arguments) != 2:
            return "forbidden"
        if name == "open":
            if dir_fd is not None:
                return "a dir_fd argument (its directory cannot be checked)"
            box.append(open_(path, arguments[0], arguments[1]))  # raises the "open" event: checked there
            return None
        why = outside(path, None if name == "statvfs" or name == "pathconf" else dir_fd)
        if why is not None:
            return why
        if name == "access":
            box.append(access_(path, arguments[0], effective_ids=arguments[1] is True))
        elif name == "readlink":
            box.append(readlink_(path))
        elif name == "statvfs":
            box.append(statvfs_(path))
        elif name == "pathconf":
            box.append(pathconf_(path, arguments[0]))
        else:
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
            elif event == "sandbox.path" and len(args) == 5 and args[0] in path_stubs:
                why = checked_path(*args)
                event = "os." + args[0]
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

        def posix_fallocate(fd, offset, length):  # disk blocks without writing: 2 GiB in 0.009 CPU-s
            audit_("sandbox.os.posix_fallocate", fd)

        # os.open (dir_fd refused: relative paths then mean the sandbox), os.access / readlink / statvfs /
        # pathconf (metadata of paths: checked like reads); a path object is converted once, here
        def open(path, flags, mode=0o777, *, dir_fd=None):
            box = []
            audit_("sandbox.path", "open", path if type_(path) is int_ else fspath_(path), dir_fd, (flags, mode), box)
            return box[0]

        def access(path, mode, *, dir_fd=None, effective_ids=False, follow_symlinks=True):
            box = []
            path = path if type_(path) is int_ else fspath_(path)
            audit_("sandbox.path", "access", path, dir_fd, (mode, effective_ids), box)
            return box[0]

        def readlink(path, *, dir_fd=None):
            box = []
            audit_("sandbox.path", "readlink", path if type_(path) is int_ else fspath_(path), dir_fd, (None, None),
                   box)
            return box[0]

        def statvfs(path):
            box = []
            audit_("sandbox.path", "statvfs", path if type_(path) is int_ else fspath_(path), None, (None, None), box)
            return box[0]

        def pathconf(path, name):
            box = []
            audit_("sandbox.path", "pathconf", path if type_(path) is int_ else fspath_(path), None, (name, None), box)
            return box[0]

        def create_builtin(spec):
            box = []
            audit_("sandbox.create_builtin", spec, box)
            return box[0]

        stubs = {
            "stat": stat, "lstat": lstat, "mknod": mknod, "mkfifo": mkfifo, "posix_fallocate": posix_fallocate,
            "open": open, "access": access, "readlink": readlink, "statvfs": statvfs, "pathconf": pathconf,
        }
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
        dumps, loads = _load_codec(config["codec"])
        sandbox = config["dir"]
        main_path = sandbox + "/main.py"
        with open(main_path, "rb") as f:
            source = f.read()
        harden = _install_guard(
            sandbox, [os.path.realpath(p) for p in sys.path if p], config["own_files"], config["report_fd"],
            config["violation_exit"], frozenset(config["denied_imports"]), frozenset(config["denied_events"]),
            tuple(config["denied_prefixes"]), config["max_files"],
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
                                     channel["max_depth"], channel["max_items"], dumps, loads)
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


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))  # the config JSON of process.py's Child.start
