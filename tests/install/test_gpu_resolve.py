"""The README's GPU install commands resolve with pip for Python 3.12 on manylinux x86_64, to the versions
the README and pyproject.toml promise; the CPU set-up keeps its CPU torch. Needs PyPI (CI has it).

Each GPU command runs as ``pip install --dry-run --ignore-installed --report`` through
recipes/pip_target.py (target markers and tags, pip 26.3 reading metadata only): no wheel is downloaded,
which the bytes the process read confirm (torch's wheel alone is 531 MB, vllm's 279 MB).
"""

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {
    "vllm": {"torch": "2.11.0", "vllm": "0.24.0", "transformers": "5.9.0", "verl": "0.9.1"},
    "sglang": {"torch": "2.11.0", "sglang": "0.5.14", "transformers": "5.8.1", "verl": "0.9.1"},
}
#: bytes the resolving process may read (network, and python's and pip's own files): the metadata of the
#: ~250 packages took 184 MiB (November 2026); torch's wheel alone is 506 MiB, vllm's 266 MiB
MAX_READ_BYTES = 400 * 2**20
#: PyPI only: not this machine's pip configuration, whose local wheel folders pip would hash whole (850 MB
#: of CUDA libraries read from disk, which says nothing about the network)
PYPI_ONLY = {**{k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")},
             "PIP_CONFIG_FILE": os.devnull}


def readme_commands() -> dict[str, list[str]]:
    """The `pip install` lines of the README's "Install on GPUs" section, by extra."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Install on GPUs", 1)[1].split("\n## ", 1)[0]
    commands = {}
    for line in section.splitlines():
        if line.startswith("pip install"):
            args = shlex.split(line.split("#", 1)[0])
            extra = re.search(r"\[(\w+)\]", line).group(1)
            commands[extra] = args[2:]
    return commands


def test_readme_documents_one_command_per_engine():
    assert readme_commands() == {"vllm": ["-e", ".[vllm]"], "sglang": ["-e", ".[sglang]"]}


@pytest.fixture(scope="module")
def find_links(tmp_path_factory):
    """Wheels of the pure-Python packages PyPI has as source only (a cross-target run builds nothing)."""
    out = tmp_path_factory.mktemp("sdist_wheels")
    subprocess.run([sys.executable, str(ROOT / "recipes/pip_target.py"), "--sdist-wheels", str(out)], check=True)
    return out


@pytest.mark.full  # pip resolving the GPU stacks, ~2 min each; the GPU install itself is recipes/gpu_carry.sh's, tested in CI
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("extra", ["vllm", "sglang"])
def test_readme_gpu_command_resolves_for_python_312(extra, find_links, tmp_path):
    report, io = tmp_path / "report.json", tmp_path / "io.txt"
    cmd = [sys.executable, str(ROOT / "recipes/pip_target.py"), "--python", "3.12", "--", "install",
           *readme_commands()[extra], "--dry-run", "--ignore-installed", "--no-cache-dir", "--quiet",
           "--report", str(report), "--find-links", str(find_links)]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**PYPI_ONLY, "MGRPO_PIP_IO_FILE": str(io)})
    seconds = time.monotonic() - start
    assert done.returncode == 0, f"{' '.join(cmd)} no longer resolves:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"

    data = json.loads(report.read_text())
    assert data["environment"]["python_version"] == "3.12"
    versions = {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"] for i in data["install"]}
    assert {name: versions.get(name) for name in EXPECTED[extra]} == EXPECTED[extra]
    assert versions["mgrpo-verl"] == "0.1.0"
    # resolved with Python 3.12's markers: vllm / sglang need six only on Python > 3.11
    assert "six" in versions
    read = int(re.search(r"rchar: (\d+)", io.read_text()).group(1))
    print(f"{extra}: {len(versions)} packages in {seconds:.0f} s, {read / 2**20:.0f} MiB read")
    assert read < MAX_READ_BYTES, f"the dry run read {read / 2**20:.0f} MiB: wheels were downloaded"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cpu_install_keeps_the_cpu_torch(tmp_path):
    """recipes/setup_env.sh's second step on this venv (CPU torch 2.13.0 installed first) installs no torch
    and nothing from CUDA: with uv (its installer, when the venv has it) and with pip (its fallback)."""
    import torch

    assert torch.__version__ == "2.13.0+cpu" and torch.version.cuda is None
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                           "-e", f"{ROOT}[test]"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    names = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    assert not {n for n in names if n == "torch" or n.startswith(("nvidia-", "triton"))}, names
    uv = Path(sys.executable).parent / "uv"
    if uv.exists():
        done = subprocess.run([str(uv), "pip", "install", "--dry-run", "--python", sys.executable, "-e", f"{ROOT}[test]"],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        # uv lists the changes as " - name==old" / " + name==new" lines (on stderr)
        changed = {m.group(1).lower() for m in re.finditer(r"^ [+-] ([A-Za-z0-9_.-]+)", done.stderr, flags=re.M)}
        assert "mgrpo-verl" in changed, done.stderr  # the editable install itself is listed: the parse works
        assert not {n for n in changed if n == "torch" or n.startswith(("nvidia-", "triton"))}, done.stderr
