"""The sandbox for model-written code (mgrpo_verl/envs/sandbox/), attacked by real hostile programs.

Runs as whoever runs pytest: as root the child drops to a fresh uid, otherwise it keeps ours; the
assertions hold either way (the guard catches what the kernel would, and the other way round).
"""

from __future__ import annotations

import ast
import os
import pathlib
import resource
import shutil
import signal
import stat
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from mgrpo_verl.envs import sandbox
from mgrpo_verl.envs.sandbox import codec, process
from mgrpo_verl.envs.sandbox import VIOLATION_EXIT, SandboxLimits, SandboxResult, run_python

FAST = SandboxLimits(cpu_s=1, wall_s=3)


def run(source: str, limits: SandboxLimits = FAST) -> SandboxResult:
    return run_python(textwrap.dedent(source), limits)


def assert_violation(result: SandboxResult, event: str) -> None:
    assert result.status == "violation", result
    assert result.returncode == VIOLATION_EXIT
    assert result.violation is not None and result.violation.startswith(event), result.violation


# ----------------------------------------------------------------------------------------------------
# ordinary programs


def test_ok_program_with_stdlib_imports():
    result = run(
        """
        import math, collections, itertools, re, typing
        from typing import List
        from collections import Counter

        def f(xs: List[int]) -> typing.Dict[int, int]:
            return dict(Counter(xs))

        print(math.isqrt(17), f([1, 1, 2]), list(itertools.accumulate([1, 2, 3])), re.findall(r"\\d", "a1b2"))
        """
    )
    assert result.status == "ok" and result.returncode == 0 and result.violation is None, result
    assert result.stdout == "4 {1: 2, 2: 1} [1, 3, 6] ['1', '2']\n" and result.stderr == ""
    assert 0 < result.seconds < FAST.wall_s


def test_exception_and_syntax_error_are_errors():
    result = run("raise ValueError('boom')")
    assert result.status == "error" and result.returncode == 1
    assert "ValueError: boom" in result.stderr and "main.py" in result.stderr
    result = run("def f(:\n    pass\n")
    assert result.status == "error" and "SyntaxError" in result.stderr
    result = run("import sys\nprint('bye')\nsys.exit(3)")
    assert (result.status, result.returncode, result.stdout) == ("error", 3, "bye\n")


def test_files_inside_the_sandbox_work_and_the_directory_is_removed():
    result = run(
        """
        import os, tempfile
        os.mkdir("d")
        with open("d/a.txt", "w") as f:
            f.write("hi")
        os.rename("d/a.txt", "d/b.txt")
        with tempfile.NamedTemporaryFile("w", delete=False) as t:
            t.write("x")
        print(os.getcwd(), open("d/b.txt").read(), sorted(os.listdir("d")), t.name.startswith(os.getcwd()))
        os.remove("d/b.txt")
        os.rmdir("d")
        """
    )
    assert result.status == "ok", result
    cwd, text, listing, in_cwd = result.stdout.split(" ", 3)
    assert (text, listing, in_cwd) == ("hi", "['b.txt']", "True\n")
    assert not os.path.exists(cwd)  # removed with whatever the program left in it


def test_limits_and_identity_inside_the_child():
    result = run(
        """
        import os, resource
        names = ["RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE", "RLIMIT_NPROC"]
        print(os.getuid(), os.getgid(), *(resource.getrlimit(getattr(resource, n)) for n in names), sep=";")
        print(sorted(os.environ))
        """,
        SandboxLimits(cpu_s=1.5, memory_mb=256, max_file_bytes=1000, max_open_files=32),
    )
    assert result.status == "ok", result
    uid, gid, cpu, memory, fsize, nofile, core, nproc = result.stdout.splitlines()[0].split(";")
    if os.geteuid() == 0:  # dropped to an unprivileged uid, where RLIMIT_NPROC is enforced
        assert int(uid) != 0 and int(gid) != 0
    else:
        assert int(uid) == os.getuid()
    assert (cpu, fsize, nofile, core) == ("(2, 3)", "(1000, 1000)", "(32, 32)", "(0, 0)")  # CPU: SIGXCPU, then SIGKILL
    assert memory == f"({256 << 20}, {256 << 20})"
    soft, hard = ast.literal_eval(nproc)
    assert soft == hard >= 1
    # only HOME and TMPDIR are passed; Python itself sets LC_CTYPE when it coerces the C locale to UTF-8
    assert set(ast.literal_eval(result.stdout.splitlines()[1])) <= {"HOME", "TMPDIR", "LC_CTYPE"}


def test_output_is_truncated():
    result = run("print('x' * 10_000_000)\nimport sys\nsys.stderr.write('e' * 200_000)")
    assert result.status == "ok", result.status
    assert result.stdout == "x" * 64_000 and result.stderr == "e" * 64_000
    result = run("print('abcdef')", SandboxLimits(max_output_bytes=3))
    assert result.stdout == "abc"


def test_concurrent_runs_are_independent():
    program = "import os, time\ntime.sleep(0.2)\nprint(os.getuid(), os.getcwd())"
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, [program] * 4))
    assert all(r.status == "ok" for r in results), results
    assert len({r.stdout.split()[1] for r in results}) == 4  # one directory each
    if os.geteuid() == 0:
        assert len({r.stdout.split()[0] for r in results}) == 4  # and one uid each


@pytest.mark.parametrize(
    "field, value",
    [("cpu_s", 0), ("wall_s", -1.0), ("wall_s", float("inf")), ("cpu_s", float("nan")), ("memory_mb", 8),
     ("memory_mb", 100.5), ("max_processes", 0), ("max_processes", True), ("max_output_bytes", -1),
     ("max_open_files", 2), ("max_file_bytes", "1")],
)
def test_limits_are_validated(field, value):
    with pytest.raises(ValueError, match=f"SandboxLimits.{field}"):
        SandboxLimits(**{field: value})
    with pytest.raises(TypeError, match="str"):
        run_python(b"print(1)")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------
# resource exhaustion


def test_infinite_loop_times_out_on_the_wall_clock():
    program = "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.01)"
    result = run(program, SandboxLimits(wall_s=1))
    assert result.status == "timeout" and result.returncode == -signal.SIGKILL
    assert result.stdout == "started\n"
    assert 1 <= result.seconds < 1 + 1  # wall_s plus slack for killing and reaping on a busy machine


def test_cpu_burn_is_stopped_by_the_cpu_limit():
    result = run("while True:\n    pass", SandboxLimits(cpu_s=1, wall_s=10))
    # SIGXCPU: the kernel stopped it after 1 s of CPU time (wall time depends on the machine's load). The
    # kernel charges CPU time by ticks, so the wall time can come out a little under 1 s (CI saw 0.998).
    assert result.status == "timeout" and result.returncode == -signal.SIGXCPU
    assert 0.9 <= result.seconds < 10


@pytest.mark.parametrize(
    "program",
    ["b'x' * 10**10", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))"],
    ids=["huge-bytes", "growing-list"],
)
def test_huge_allocations_are_contained(program):
    result = run(program, SandboxLimits(memory_mb=128))
    assert result.status == "error" and "MemoryError" in result.stderr, result


def test_file_size_limit():
    result = run("with open('big', 'wb') as f:\n    f.write(b'x' * 2_000_000)", SandboxLimits(max_file_bytes=1_000_000))
    assert result.status == "error" and "File too large" in result.stderr, result


def test_threads_are_refused_by_the_kernel():
    # starting a thread raises no audit violation: RLIMIT_NPROC (max_processes=1) refuses it
    result = run(
        """
        import threading
        try:
            threading.Thread(target=print).start()
        except RuntimeError as e:
            print("refused:", e)
        """
    )
    assert result.status == "ok" and result.stdout == "refused: can't start new thread\n", result


# ----------------------------------------------------------------------------------------------------
# processes and signals


def test_fork_bomb_is_stopped():
    result = run("import os\nwhile True:\n    os.fork()")
    assert_violation(result, "os.fork")


def test_subprocess_loop_is_stopped():
    result = run("import subprocess\nwhile True:\n    subprocess.Popen(['sleep', '100'])")
    assert_violation(result, "import")
    assert "_posixsubprocess" in result.violation


@pytest.mark.parametrize(
    "call",
    ["os.system('true')", "os.posix_spawn('/bin/true', ['true'], {})", "os.execv('/bin/true', ['true'])",
     "os.forkpty()", "os.kill(os.getppid(), 9)", "os.killpg(os.getpgid(0), 9)",
     "os.spawnv(os.P_WAIT, '/bin/true', ['true'])"],
)
def test_process_creation_and_signals_are_violations(call):
    result = run(f"import os\n{call}\nprint('escaped')")
    assert result.status == "violation" and "escaped" not in result.stdout, result
    assert result.violation.split(":")[0] in ("os.system", "os.posix_spawn", "os.exec", "os.forkpty", "os.kill",
                                                "os.killpg", "os.fork")


# ----------------------------------------------------------------------------------------------------
# the user's files


@pytest.fixture()
def open_dir():
    """A directory anyone may enter and write (pytest's tmp_path is under a 0700 directory): only the
    guard, not file permissions, protects what is in it."""
    path = tempfile.mkdtemp(prefix="mgrpo-sandbox-test-")
    os.chmod(path, 0o777)
    yield pathlib.Path(path)
    shutil.rmtree(path)


@pytest.fixture()
def precious(open_dir):
    path = open_dir / "precious.txt"
    path.write_text("keep me")
    os.chmod(path, 0o666)
    return path


@pytest.mark.parametrize(
    "attack",
    [
        "os.system('rm -f {p}')",
        "os.remove('{p}')",
        "os.unlink('{p}')",
        "os.rename('{p}', 'stolen')",
        "os.replace('{p}', '{p}.x')",
        "shutil.rmtree(os.path.dirname('{p}'))",
        "shutil.move('{p}', '.')",
        "open('{p}', 'w').write('pwned')",
        "open('{p}', 'a').write('pwned')",
        "os.truncate('{p}', 0)",
        "os.close(os.open('{p}', os.O_WRONLY | os.O_TRUNC))",
        "os.chmod('{p}', 0)",
        "os.symlink('{p}', 'link')",
        "os.link('{p}', 'hard')",
        "os.chdir(os.path.dirname('{p}')); open('precious.txt', 'w')",
        "open('../' * 20 + '{p}'.lstrip('/'), 'w')",
    ],
)
def test_files_outside_the_sandbox_survive(precious, attack):
    result = run(f"import os, shutil\n{attack.format(p=precious)}\nprint('escaped')")
    assert result.status == "violation" and "escaped" not in result.stdout, result
    assert precious.read_text() == "keep me"


@pytest.mark.parametrize(
    "attack, event",
    [("open('{t}', 'w').write('x')", "open"), ("open('/tmp/mgrpo-outside.txt', 'x')", "open"),
     ("os.mkdir('{t}.d')", "os.mkdir"), ("import shutil\nshutil.copy(__file__, '{t}')", "os.stat")],  # shutil stats the target first
)
def test_writing_outside_the_sandbox_is_refused(open_dir, attack, event):
    target = open_dir / "outside.txt"
    assert_violation(run(f"import os\n{attack.format(t=target)}"), event)
    assert not target.exists() and not os.path.exists(f"{target}.d") and not os.path.exists("/tmp/mgrpo-outside.txt")


@pytest.mark.parametrize(
    "attack, event",
    [
        ("print(open('/etc/passwd').read())", "open"),
        ("print(open('{p}').read())", "open"),
        ("print(open(b'{p}', 'rb').read())", "open"),
        ("import pathlib\nprint(pathlib.Path('{p}').read_text())", "open"),
        ("print(os.listdir('/'))", "os.listdir"),
        ("print(list(os.scandir(os.path.dirname('{p}'))))", "os.scandir"),
        # relative to a directory descriptor the guard cannot see: os.open refuses dir_fd (its stub)
        ("fd = os.open('.', os.O_RDONLY)\n"
         "print(os.read(os.open('../' * 30 + 'etc/passwd', os.O_RDONLY, dir_fd=fd), 9))",
         "os.open: a dir_fd"),
    ],
)
def test_reading_outside_the_sandbox_is_refused(precious, attack, event):
    result = run(f"import os\n{attack.format(p=precious)}")
    assert_violation(result, event)
    assert "keep me" not in result.stdout and "root:" not in result.stdout


def test_reading_a_file_of_the_test_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("token-1234")
    for attack in (f"print(open({str(secret)!r}).read())", f"print(os.listdir({str(tmp_path)!r}))"):
        result = run(f"import os\n{attack}")
        assert result.status == "violation" and "token-1234" not in result.stdout and "secret" not in result.stdout


# ----------------------------------------------------------------------------------------------------
# network and native code


@pytest.mark.parametrize(
    "attack, event",
    [
        ("import socket\nsocket.socket()", "socket."),
        ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "socket."),
        ("import socket\nsocket.getaddrinfo('example.com', 80)", "socket."),
        ("import socket\nsocket.gethostbyname('localhost')", "socket."),
        ("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/')", "urllib.Request"),
    ],
)
def test_network_is_refused(attack, event):
    assert_violation(run(attack), event)


@pytest.mark.parametrize(
    "attack, event",
    [
        ("import ctypes\nctypes.CDLL(None).system(b'true')", "import"),
        ("import _imp, importlib.machinery as m\nopen('evil.so', 'wb').write(b'\\x7fELF')\n"
         "_imp.create_dynamic(m.ModuleSpec('evil', None, origin='evil.so'))", "import"),
        ("(lambda: 0).__code__.replace(co_code=b'\\x00' * 8)", "code.__new__"),
        ("import marshal\nmarshal.loads(marshal.dumps(compile('1', 's', 'eval')))", "marshal.loads"),
        ("import _xxsubinterpreters", "import"),
    ],
)
def test_native_code_is_refused(attack, event):
    assert_violation(run(attack), event)


# ----------------------------------------------------------------------------------------------------
# attacks on the guard itself


@pytest.mark.parametrize(
    "attack",
    [
        "del sys.addaudithook",
        "sys.audit('cpython._PySys_ClearAuditHooks')",
        "sys.addaudithook(lambda *a: None)",
        # patch what a naive hook would call
        "import builtins, posixpath\nos.getcwd = lambda: '/'\n"
        "posixpath.abspath = posixpath.realpath = lambda p: '/tmp/x'\n"
        "builtins.isinstance = builtins.any = lambda *a: True\nbuiltins.str = bytes\nbuiltins.type = lambda o: str",
        # catch the refusal
        "try:\n    open('/etc/passwd')\nexcept BaseException:\n    print('escaped')",
        # patch every closure cell and default reachable from the frames above us
        "f = sys._getframe()\nwhile f:\n    for v in [*f.f_locals.values(), *f.f_globals.values()]:\n"
        "        for c in getattr(v, '__closure__', None) or ():\n            c.cell_contents = None\n"
        "        if callable(v) and getattr(v, '__defaults__', None):\n            v.__defaults__ = None\n"
        "    f = f.f_back",
        # close every descriptor, the guard's report pipe included: the exit code still tells
        "os.closerange(3, 1024)",
    ],
)
def test_the_guard_cannot_be_removed(attack):
    result = run(f"import os, sys\n{attack}\nopen('/etc/passwd').read()\nprint('escaped')")
    assert result.status == "violation" and result.returncode == VIOLATION_EXIT, result
    assert "escaped" not in result.stdout and "root:" not in result.stdout


@pytest.mark.parametrize(
    "attack, event",
    [
        ("import gc\nhooks = [o for o in gc.get_objects() if callable(o)]", "gc.get_objects"),
        ("import gc\ngc.get_referrers(sys)", "gc.get_referrers"),
        ("sys.settrace(lambda *a: None)", "sys.settrace"),
        ("sys.setprofile(lambda *a: None)", "sys.setprofile"),
        ("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))", "resource.setrlimit"),
        ("os.chdir('/')", "os.chdir"),
        ("os.mkdir('d')\nos.chdir('d')", "os.chdir"),  # relative paths must keep meaning the sandbox
    ],
)
def test_ways_around_the_guard_are_violations(attack, event):
    assert_violation(run(f"import os, sys\n{attack}"), event)


def test_the_guard_also_holds_in_atexit_handlers(precious):
    result = run(f"import atexit, os\natexit.register(os.remove, '{precious}')")
    assert_violation(result, "os.remove")
    assert precious.exists()


def test_a_broken_setup_raises_instead_of_scoring(monkeypatch):
    # an infrastructure failure in the child must not pass for the program's error (every reward 0)
    monkeypatch.setattr(process, "MAX_PRELOADS", "many")
    with pytest.raises(RuntimeError, match="could not be set up: TypeError: slice indices"):
        run_python("print(1)")


def test_the_program_cannot_fake_a_setup_failure():
    result = run(
        """
        import os
        for fd in range(3, 64):
            try:
                os.write(fd, b"setup failed")
            except OSError:
                pass
        """
    )
    assert result.status == "violation"  # it wrote into the guard's report pipe: its own loss, not ours


def test_the_parent_keeps_its_own_limits():
    before = [resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC")]
    run("print(1)")
    assert before == [resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC")]


# ----------------------------------------------------------------------------------------------------
# calls without audit events: device files, FIFOs, stat, a second posix module


@pytest.mark.parametrize(
    "attack, event",
    [
        ("os.mkfifo('{t}')", "sandbox.os.mkfifo"),
        ("os.mknod('{t}')", "sandbox.os.mknod"),
        ("import stat\nos.mknod('{t}', 0o600 | stat.S_IFCHR, os.makedev(1, 3))", "sandbox.os.mknod"),
        ("os.mkfifo('inside')", "sandbox.os.mkfifo"),  # in the sandbox too: nothing needs one
        ("import posix\nposix.mkfifo('{t}')", "sandbox.os.mkfifo"),
        # the function objects in os.supports_* were the originals
        ("[f for f in os.supports_dir_fd if f.__name__ == 'mkfifo'][0]('{t}')", "sandbox.os.mkfifo"),
        ("import _imp, importlib.machinery as m\n_imp.create_builtin(m.ModuleSpec('posix', None)).mkfifo('{t}')",
         "_imp.create_builtin"),
        ("import sys, importlib\ndel sys.modules['posix']\nimportlib.import_module('posix').mkfifo('{t}')",
         "_imp.create_builtin"),
    ],
)
def test_device_files_and_fifos_are_violations(open_dir, attack, event):
    target = open_dir / "fifo"
    result = run(f"import os\n{attack.format(t=target)}\nprint('escaped')")
    assert_violation(result, event)
    assert not target.exists() and "escaped" not in result.stdout


def test_twenty_thousand_fifos_are_not_made(open_dir):
    # the reported attack: 20,000 FIFOs in /tmp in 0.4 s, left behind; now the first one ends the run
    result = run(f"import os\nfor i in range(20000):\n    os.mkfifo('{open_dir}/f%d' % i)")
    assert_violation(result, "sandbox.os.mkfifo")
    assert list(open_dir.iterdir()) == []


@pytest.mark.parametrize(
    "attack",
    ["os.stat('/etc/passwd')", "os.lstat('/root')", "os.path.exists('{p}')", "os.path.isfile('/etc/shadow')",
     "os.stat('{p}', dir_fd=os.open('.', os.O_RDONLY))", "os.stat(b'/etc')", "import pathlib\npathlib.Path('/etc').stat()",
     "import posix\nposix.stat('/etc')", "sys.audit('sandbox.stat', '/etc', None, True, [])"],
)
def test_stat_outside_the_sandbox_is_refused(precious, attack):
    result = run(f"import os, sys\nprint({attack.format(p=precious)!r})\n{attack.format(p=precious)}\nprint('escaped')")
    assert_violation(result, "os.stat")
    assert "escaped" not in result.stdout


def test_stat_inside_the_sandbox_and_of_the_standard_library_works():
    result = run(
        """
        import os, json
        open("a.txt", "w").write("hello")
        print(os.stat("a.txt").st_size, os.path.exists("a.txt"), os.path.exists("missing"), os.path.isdir("."))
        print(os.stat("/dev/null").st_mode > 0, os.lstat(os.getcwd()).st_mode > 0, os.stat(0).st_mode >= 0)
        os.path.exists(json.__file__)  # the standard library is an allowed root (readable or not for this uid)
        import pathlib
        print(pathlib.Path("a.txt").exists(), pathlib.Path("a.txt").stat().st_size)  # path objects: converted once
        """
    )
    assert result.status == "ok", result
    assert result.stdout == "5 True False True\nTrue True True\nTrue 5\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="files of another uid need root")
def test_what_a_fresh_uid_left_in_shared_directories_is_removed(open_dir):
    uid = sandbox.SANDBOX_ID_BASE + 12345
    left = [open_dir / "x.txt", open_dir / "fifo", open_dir / "d"]
    left[0].write_text("x")
    os.mkfifo(left[1])
    (left[2] / "inner").mkdir(parents=True)
    mine = open_dir / "mine.txt"
    mine.write_text("keep")
    for path in left:
        os.chown(path, uid, uid)
    assert sandbox.remove_owned(uid, (str(open_dir),)) == 3
    assert [p.name for p in open_dir.iterdir()] == ["mine.txt"]


# ----------------------------------------------------------------------------------------------------
# disk use and unaudited reads (issue 29 item 7): each attack ran to the end before


@pytest.mark.parametrize(
    "attack, violation",
    [
        # blocks without writing: 128 x 16 MiB took 2 GiB in 0.009 CPU-s; 8 are enough to pass 64 MiB
        ("for i in range(8):\n    os.posix_fallocate(open(f'f{i}', 'wb').fileno(), 0, 16 * 2**20)",
         "sandbox.os.posix_fallocate"),
        # inodes: 20,000 empty files took 0.9 s; the guard stops the 257th
        ("for i in range(20_000):\n    open(f'e{i}', 'w').close()", "open: more than 256 files created in the sandbox"),
        ("for i in range(20_000):\n    os.mkdir(f'd{i}')", "os.mkdir: more than 256 files created in the sandbox"),
        # bytes: 48 files of 2 MiB (each under RLIMIT_FSIZE, 48 under max_files) = 96 MiB > max_disk_bytes:
        # the parent's disk monitor (every 50 ms and at exit)
        ("for i in range(48):\n    open(f'w{i}', 'wb').write(b'x' * 2**21)", "disk: more than 67108864 bytes"),
        # a tree deeper than the monitor walks (64 levels)
        ("p = 'd'\nfor i in range(100):\n    os.mkdir(p)\n    p += '/d'", "disk: a directory tree deeper than 64 levels"),
    ],
    ids=["fallocate", "empty_files", "directories", "bytes", "depth"],
)
def test_disk_use_is_bounded(sandbox_dirs, attack, violation):
    result = run(f"import os\n{attack}\nprint('done')", SandboxLimits(cpu_s=2, wall_s=10))
    assert result.status == "violation" and result.violation.startswith(violation), result
    if not violation.startswith("disk:"):  # the guard stops the program; the monitor may find it after exit
        assert result.returncode == VIOLATION_EXIT and "done" not in result.stdout
    assert not any(os.path.lexists(d) for d in sandbox_dirs)


@pytest.mark.parametrize(
    "attack, violation",
    [
        ("import pwd\nprint(len(pwd.getpwall()))", "import: forbidden module 'pwd'"),  # libc reads /etc/passwd
        ("import grp\nprint(len(grp.getgrall()))", "import: forbidden module 'grp'"),
        ("print(os.path.expanduser('~root'))", "import: forbidden module 'pwd'"),
        ("print(os.access('/etc/shadow', os.R_OK))", "os.access: outside the sandbox: '/etc/shadow'"),
        ("print(os.statvfs('/').f_bfree)", "os.statvfs: outside the sandbox: '/'"),
        ("print(os.pathconf('/etc', 'PC_NAME_MAX'))", "os.pathconf: outside the sandbox: '/etc'"),
        ("print(os.readlink('/proc/self/exe'))", "os.readlink: outside the sandbox: '/proc/self/exe'"),
        # a directory descriptor (e.g. of a standard-library directory): relative paths would be checked as
        # the sandbox's; refused whatever the directory
        ("print(os.open('os.py', os.O_RDONLY, dir_fd=os.open('.', os.O_RDONLY)))", "os.open: a dir_fd argument"),
        ("print(os.access('os.py', os.R_OK, dir_fd=os.open('.', os.O_RDONLY)))", "os.access: a dir_fd argument"),
        ("print(os.readlink('x', dir_fd=os.open('.', os.O_RDONLY)))", "os.readlink: a dir_fd argument"),
    ],
    ids=["getpwall", "getgrall", "expanduser", "access", "statvfs", "pathconf", "readlink", "open_dir_fd", "access_dir_fd",
         "readlink_dir_fd"],
)
def test_unaudited_reads_outside_are_violations(attack, violation):
    result = run(f"import os\n{attack}\nprint('read')")
    assert result.status == "violation" and result.violation.startswith(violation) and "read" not in result.stdout, result


def test_what_the_new_stubs_allow_still_works():
    result = run(
        """
        import os, shutil, tempfile
        fd, name = tempfile.mkstemp()  # os.open with an absolute path inside the sandbox, O_CREAT: counted
        os.write(fd, b"abc")
        os.close(fd)
        print(os.access("main.py", os.R_OK), os.access(name, os.W_OK), os.statvfs(".").f_bsize > 0)
        print(os.read(os.open("main.py", os.O_RDONLY), 6), os.readlink(name) if os.path.islink(name) else "file")
        print(os.pathconf(".", "PC_NAME_MAX") > 0, type(os.access(os.__file__, os.F_OK)).__name__)  # stdlib: allowed
        for i in range(250):  # 250 + mkstemp's 1 = 251 of the 256 files allowed
            open(f"f{i}", "w").close()
        shutil.rmtree  # imported without pwd (shutil's own `except ImportError`)
        print(len(os.listdir(".")))
        """
    )
    assert result.status == "ok", result
    assert result.stdout == "True True True\nb'\\nimpor' file\nTrue bool\n252\n", result.stdout


#: A program that leaves a directory tree 1,200 levels deep ("d/d/.../d": 2,400 characters, under PATH_MAX).
DEEP_TREE = "import os\np = 'd'\nfor _ in range(1200):\n    os.mkdir(p)\n    p += '/d'\n"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def sandbox_dirs(monkeypatch):
    """The directories the sandbox creates during a test (recorded where Child.start makes them)."""
    made = []

    def mkdtemp(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    real = tempfile.mkdtemp
    monkeypatch.setattr(process.tempfile, "mkdtemp", mkdtemp)
    return made


def test_cleanup_of_a_deep_tree_never_raises_nor_leaks(sandbox_dirs):
    # issue 29 item 6: shutil.rmtree recursed through the tree and raised RecursionError out of cleanup:
    # run_python / run_judged raised, both sandbox directories stayed in the temporary directory, and
    # run_judged never closed the judge's 4 descriptors (its cleanup did not run); ~5,000 such programs
    # exhaust the scorer's descriptors. Three rounds: nothing accumulates.
    # (max_files raised so the guard lets the tree be built; the disk monitor may stop the program once the
    # tree is deeper than MAX_TREE_DEPTH = 64 levels: a violation, and the tree left is at least that deep)
    limits = SandboxLimits(cpu_s=2, wall_s=10, max_files=5000)
    before = open_fds()
    for _ in range(3):
        result = run_python(DEEP_TREE + "print('made')\n", limits)
        assert result.status == "ok" or result.violation.startswith("disk: a directory tree deeper"), result
        judged = sandbox.run_judged(
            "__sandbox_report__(__sandbox_call__((2, 3), {}))", DEEP_TREE + "def f(a, b):\n    return a + b\n", "f", limits
        )
        assert judged.candidate.status in ("ok", "violation"), judged  # the judge errs when the candidate is stopped
    assert open_fds() == before
    assert len(sandbox_dirs) == 9 and not any(os.path.lexists(d) for d in sandbox_dirs)


def test_remove_tree_goes_any_depth_and_never_follows_links(tmp_path):
    # 3,000 levels: deeper than PATH_MAX allows by path (6,000 characters) and than rmtree's recursion
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    top = tmp_path / "tree"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        os.symlink(str(outside), "link", dir_fd=fd)  # to a directory outside: removed, never entered
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as f:
        f.write("x")
    os.mkdir("locked", mode=0, dir_fd=fd)  # unreadable (as our uid when not root)
    os.mknod("fifo", 0o600 | stat.S_IFIFO, dir_fd=fd)
    os.close(fd)
    before = open_fds()
    assert process.remove_tree(str(top)) is True
    assert not top.exists() and (outside / "keep.txt").read_text() == "keep"
    assert open_fds() == before
    assert process.remove_tree(str(top)) is True  # already gone
    single = tmp_path / "file.txt"
    single.write_text("x")
    assert process.remove_tree(str(single)) is True and not single.exists()


# ----------------------------------------------------------------------------------------------------
# run_judged: trusted tests against an untrusted function, plain data only


JUDGE = """
results = []
for args in ([1, 2], [2.5, 0.5], ["a", "b"]):
    try:
        results.append(__sandbox_call__(tuple(args), {}))
    except CandidateError as e:
        results.append("error: " + str(e)[:40])
__sandbox_report__(tuple(results))
"""


#: The candidate finds its reply channel through the bootstrap's frame (anything in its process is reachable).
CHANNEL_FD = """import os, sys
def channel_fd():
    f = sys._getframe()
    while 'config' not in f.f_locals:
        f = f.f_back
    return f.f_locals['config']['channel']['out_fd']"""


def test_run_judged_passes_plain_values_both_ways():
    run_ = sandbox.run_judged(JUDGE, "def f(a, b):\n    return a + b\n", "f", FAST)
    assert (run_.judge.status, run_.candidate.status, run_.calls, run_.protocol_error) == ("ok", "ok", 3, None)
    assert run_.report == (3, 3.0, "ab")
    assert [type(v) for v in run_.report] == [int, float, str]


@pytest.mark.parametrize(
    "body, first",
    [
        ("class I(int):\n        pass\n    return I(a + b)", "error: the result is not plain data: TypeError"),
        ("return (x for x in [a])", "error: the result is not plain data: TypeError"),
        ("x = [a]\n    x.append(x)\n    return x", "error: the result is not plain data: ValueError"),
        ("raise KeyError('k')", "error: KeyError: 'k'"),
        ("raise SystemExit(0)", "error: SystemExit: 0"),
    ],
)
def test_results_that_are_not_plain_data_are_call_errors(body, first):
    run_ = sandbox.run_judged(JUDGE, f"def f(a, b):\n    {body}\n", "f", FAST)
    assert run_.candidate.status == "ok" and run_.report[0].startswith(first), run_


#: A judge that waits before its first call, so that a frame the candidate writes while defining its function
#: reaches this process before any call does. With JUDGE alone the first call may reach the candidate first
#: (both start together); its junk is then read as the reply to that call, a malformed one.
LATE_JUDGE = "import time\ntime.sleep(1.0)\n" + JUDGE


@pytest.mark.parametrize(
    "judge, candidate, why",
    [
        (JUDGE, "import os\ndef f(a, b):\n    os._exit(0)\n", "it exited during a call"),
        (LATE_JUDGE, f"{CHANNEL_FD}\nos.write(channel_fd(), b'\\x00\\x00\\x00\\x05junk!')\ndef f(a, b):\n    return 1\n",
         "a reply without a call"),
        (JUDGE, f"{CHANNEL_FD}\ndef f(a, b):\n    os.write(channel_fd(), b'\\xff\\xff\\xff\\xff')\n    return 1\n",
         "a reply over the size limit"),
        (JUDGE, f"{CHANNEL_FD}\ndef f(a, b):\n    os.write(channel_fd(), b'\\x00\\x00\\x00\\x02[]')\n    return 1\n",
         "a reply that is not plain data"),
    ],
    ids=["exits", "writes-before-any-call", "oversized-frame", "malformed-frame"],
)
def test_protocol_breaches_end_the_candidate_not_the_judge(judge, candidate, why):
    run_ = sandbox.run_judged(judge, candidate, "f", FAST)
    assert run_.judge.status == "ok" and run_.report is not None
    assert all(str(v).startswith("error: the candidate") for v in run_.report), run_.report
    assert run_.protocol_error.startswith(why), run_.protocol_error


def test_a_candidate_that_never_answers_times_out():
    run_ = sandbox.run_judged(JUDGE, "def f(a, b):\n    while True:\n        pass\n", "f", SandboxLimits(cpu_s=1, wall_s=3))
    assert run_.candidate.status == "timeout"


def test_plain_codec_round_trip_and_refusals():
    value = (None, True, 1, -2**100, 1.5, float("inf"), "é\ud800", b"\x00\xff", [1, [2]], {(1, "a"): {3}}, frozenset({1}))
    data = codec.plain_dumps(value, 10**6, 8, 1000)
    back = codec.plain_loads(data, 10**6, 8, 1000)
    assert back == value and type(back[9]) is dict and type(back[10]) is frozenset
    for bad in (object(), [1] * 1001, [[[[[[[[[[1]]]]]]]]]], type("I", (int,), {})(1)):
        with pytest.raises((TypeError, ValueError)):
            codec.plain_dumps(bad, 10**6, 8, 1000)
    for bad in (b"[1]", b'{"x": []}', b'{"s": [{"l": []}]}', b"[" * 100_000, b'{"l": 1}', "x"):
        with pytest.raises((TypeError, ValueError)):
            codec.plain_loads(bad, 10**6, 8, 1000)
