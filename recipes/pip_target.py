"""Run pip as if it were installing for another Python on Linux x86_64 (e.g. a GPU image's 3.12).

``python recipes/pip_target.py [--python 3.12] [--glibc 2.35] [--pip DIR] -- install --dry-run ...``

What it adds to a plain ``pip ... --python-version 3.12 --platform ...`` run, and why:

1. **Environment markers for the target.** pip evaluates markers such as ``python_version > "3.11"``
   against the interpreter running pip, whatever ``--python-version`` says (pypa/pip#10050, closed without
   a fix). vllm 0.24.0 needs ``setuptools`` and ``six`` only on Python > 3.11, so a 3.11 host would
   resolve a wrong set for 3.12. pip has no hook for this, so pip's marker environment is replaced for
   this process only (checked by a self-test below and in tests/install/).
2. **Every manylinux tag up to the target glibc.** ``--platform`` accepts exactly the tags given; one
   ``manylinux_2_28`` tag rejects wheels tagged ``manylinux_2_17`` or ``manylinux_2_31`` (vllm needs
   llguidance, whose wheels are ``manylinux_2_31``). The default glibc 2.35 is Ubuntu 22.04's.
3. **A pip that resolves from metadata only.** With ``--use-feature=fast-deps`` (added here) pip reads a
   wheel's metadata through HTTP range requests (or PEP 658 files where the index advertises them). The
   dry run of pip 23.2 (a Python 3.11 venv's own) still downloads every wheel at the end (torch alone is
   531 MB); pip 26.3 does not, so it is fetched once (``pip download pip==26.3``) and run from its wheel.

Only for resolving and downloading: nothing here installs into an environment for another Python.
"""

from __future__ import annotations

import argparse
import atexit
import os
import runpy
import subprocess
import sys
from pathlib import Path

PIP_VERSION = "26.3"
DEFAULT_PYTHON = "3.12"
DEFAULT_GLIBC = "2.35"
#: pure-Python packages of our dependency closure that PyPI publishes as source only: a cross-target run
#: (``--only-binary=:all:``) cannot build them, so they are built into wheels first (``build_sdist_wheels``)
SDIST_ONLY = ("antlr4-python3-runtime==4.9.3",)  # hydra-core 1.3's parser runtime


def platform_tags(glibc: str, arch: str = "x86_64") -> list[str]:
    """Every manylinux tag a Linux with this glibc accepts, newest first (PEP 600 and its aliases)."""
    major, minor = (int(x) for x in glibc.split("."))
    if major != 2 or minor < 17:
        raise ValueError(f"glibc must be 2.17 or newer, got {glibc!r}")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]


def target_flags(python: str, glibc: str) -> list[str]:
    """pip's options that select wheels for the target (Python version, platform tags, wheels only)."""
    flags = ["--python-version", python, "--implementation", "cp", "--only-binary=:all:"]
    for tag in platform_tags(glibc):
        flags += ["--platform", tag]
    return flags


def ensure_pip(cache: Path) -> Path:
    """The wheel of pip PIP_VERSION in ``cache`` (downloaded once with the running interpreter's pip)."""
    wheel = cache / f"pip-{PIP_VERSION}-py3-none-any.whl"
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(cache), f"pip=={PIP_VERSION}"], check=True)
    return wheel


def build_sdist_wheels(dest: Path) -> None:
    """Wheels of the SDIST_ONLY packages in ``dest`` (pure Python: valid for every target)."""
    dest.mkdir(parents=True, exist_ok=True)
    def built(requirement: str) -> bool:
        name, version = requirement.split("==")
        return any(dest.glob(f"{name.replace('-', '_')}-{version}-*.whl"))

    missing = [r for r in SDIST_ONLY if not built(r)]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), *missing], check=True)


def marker_environment(python: str) -> dict[str, str]:
    """PEP 508 marker values of CPython ``python`` on Linux x86_64."""
    full = python if python.count(".") == 2 else python + ".0"
    return {
        "implementation_name": "cpython", "implementation_version": full, "os_name": "posix",
        "platform_machine": "x86_64", "platform_python_implementation": "CPython", "platform_system": "Linux",
        "python_full_version": full, "python_version": ".".join(full.split(".")[:2]), "sys_platform": "linux",
    }


def use_target_markers(python: str) -> None:
    """Make the imported pip evaluate markers for ``python``; raises if pip's internals changed."""
    from pip._vendor.packaging import markers
    from pip._internal.models import installation_report

    if (not callable(getattr(markers, "default_environment", None))
            or not hasattr(installation_report, "default_environment")):
        raise RuntimeError("pip_target: this pip has no packaging.markers.default_environment to override")
    host = markers.default_environment()
    target = {**host, **marker_environment(python)}
    markers.default_environment = lambda: dict(target)
    installation_report.default_environment = markers.default_environment
    major_minor = target["python_version"]
    if not markers.Marker(f'python_version == "{major_minor}"').evaluate():
        raise RuntimeError("pip_target: pip still evaluates markers for the host Python")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="target Python X.Y (default %(default)s)")
    parser.add_argument("--glibc", default=DEFAULT_GLIBC, help="target glibc (default %(default)s)")
    parser.add_argument("--pip", type=Path, help=f"pip {PIP_VERSION} wheel (default: downloaded into --cache)")
    parser.add_argument("--cache", type=Path,
                        default=Path(os.environ.get("MGRPO_PIP_CACHE", Path.home() / ".cache" / "mgrpo_verl")))
    parser.add_argument("--sdist-wheels", type=Path, metavar="DIR",
                        help="only build the wheels of SDIST_ONLY into DIR (for --find-links) and exit")
    parser.add_argument("pip_args", nargs=argparse.REMAINDER, help="-- then pip's command and options")
    args = parser.parse_args(argv)
    if args.sdist_wheels:
        build_sdist_wheels(args.sdist_wheels)
        return 0
    pip_args = args.pip_args[1:] if args.pip_args[:1] == ["--"] else args.pip_args
    if not pip_args or pip_args[0] not in ("install", "download"):
        parser.error("give pip's command after --: install (with --dry-run) or download")
    wheel = args.pip or ensure_pip(args.cache)
    sys.path.insert(0, str(wheel))
    use_target_markers(args.python)
    extra = target_flags(args.python, args.glibc)
    if pip_args[0] == "install":
        if "--dry-run" not in pip_args:
            parser.error("install only with --dry-run: this resolves for another Python, it cannot install for it")
        extra.append("--use-feature=fast-deps")
    io_file = os.environ.get("MGRPO_PIP_IO_FILE")
    if io_file and Path("/proc/self/io").is_file():
        # bytes this process read (sockets included): shows that a dry run fetched metadata, not wheels
        atexit.register(lambda: Path(io_file).write_text(Path("/proc/self/io").read_text()))
    sys.argv = ["pip", pip_args[0], *extra, *pip_args[1:]]
    runpy.run_module("pip", run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
