"""recipes/gpu_wheelhouse.sh and recipes/gpu_install.sh on CPU.

The slow test plays the air-gapped GPU machine with what this machine has: a fresh venv whose "image"
packages are this project's venv (a .pth line, read-only: pip never uninstalls outside its own prefix),
like a GPU image with torch preinstalled. The wheelhouse is built for that image (Python 3.11, this
glibc) with one package deliberately at another version than the image's, the way transformers 5.17 in
a GPU image differs from verl's lock: the install must keep everything else, put that one package in the
venv over the image's copy, install our wheel, and do it with no index.
"""

import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE, INSTALL = ROOT / "recipes/gpu_wheelhouse.sh", ROOT / "recipes/gpu_install.sh"
#: installing must not read this machine's pip configuration (its extra indexes and wheel folders)
OFFLINE_ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}


def _run(*cmd, env=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env or os.environ)


def test_install_needs_a_wheelhouse(tmp_path):
    done = _run("bash", INSTALL)
    assert done.returncode == 2 and "--wheelhouse DIR is required" in done.stderr
    done = _run("bash", INSTALL, "--wheelhouse", tmp_path)
    assert done.returncode == 1 and f"{tmp_path}/requirements.lock is missing" in done.stderr


def test_install_refuses_a_wheelhouse_for_another_python(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    (wh / "requirements.lock").write_text("torch==2.11.0\n")
    (wh / "target.txt").write_text("python=3.12\nglibc=2.35\nextra=vllm\n")
    (wh / "mgrpo_verl-0.1.0-py3-none-any.whl").write_bytes(b"")
    done = _run("bash", INSTALL, "--wheelhouse", wh, "--venv", tmp_path / "venv", "--python", sys.executable,
                env=OFFLINE_ENV)
    assert done.returncode == 1
    assert f"{wh} was built for Python 3.12, {tmp_path}/venv/bin/python is 3.11" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--python", "3.13"], "--python must be 3.11 or 3.12"),
    (["--extra", "sglang2"], "--extra must be one of"),
])
def test_wheelhouse_refuses_bad_targets(args, message, tmp_path):
    done = _run("bash", WHEELHOUSE, "--out", tmp_path / "wh", *args)
    assert done.returncode == 2 and message in done.stderr and not (tmp_path / "wh").exists()


def _glibc() -> str:
    import platform

    return platform.libc_ver()[1]


@pytest.mark.slow
@pytest.mark.full  # an install recipe for air-gapped GPU images, on no training path; its refusals above stay in CI
@pytest.mark.timeout(1200)
def test_offline_install_into_an_image_keeps_its_packages_and_shadows_one(tmp_path):
    image_site = Path(metadata.distribution("verl").locate_file(""))  # this venv's site-packages
    shadowed = "cachetools"
    image_version = metadata.version(shadowed)
    other = "5.5.2" if image_version != "5.5.2" else "5.5.1"

    # the "image": a fresh venv that sees this venv's packages after its own
    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", venv).returncode == 0
    vpy = venv / "bin/python"
    site = Path(_run(vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site / "zz_image.pth").write_text(f"{image_site}\n")

    # resolve like the image (its versions as constraints), but the shadowed package at another version
    constraints = tmp_path / "image.txt"
    pins = {d.metadata["Name"].lower(): d.version.split("+")[0] for d in metadata.distributions()
            if d.metadata["Name"] and d.metadata["Name"].lower() not in ("mgrpo_verl", "mgrpo-verl")}
    pins[shadowed] = other
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    wh = tmp_path / "wh"
    cuda = "nvidia-*,triton,cuda-*"  # PyPI's torch 2.13.0 needs them; the image's CPU torch does not
    done = _run("bash", WHEELHOUSE, "--out", wh, "--python", "3.11", "--glibc", _glibc(), "--extra", "none",
                "--constraint", constraints, "--exclude-present", vpy, "--exclude", cuda)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # our wheel carries every config file (the editable install reads them from the checkout)
    own = zipfile.ZipFile(next(wh.glob("mgrpo_verl-*.whl"))).namelist()
    shipped = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "mgrpo_verl/config").rglob("*.yaml"))
    assert sorted(n for n in own if n.endswith(".yaml")) == shipped
    lock = dict(line.split("==") for line in (wh / "requirements.lock").read_text().split())
    # torch: PyPI's 2.13.0, or 2.13.0+cpu where pip's configuration has a CPU wheel folder (this machine)
    assert lock[shadowed] == other and lock["torch"].split("+")[0] == "2.13.0" and lock["verl"] == "0.9.1"
    wheels = sorted(p.name.split("-")[0].lower() for p in wh.glob("*.whl"))
    # nothing else was downloaded (setuptools always is: the new venv's own 65.5 hides the image's)
    assert wheels == sorted(["antlr4_python3_runtime", shadowed, "mgrpo_verl"] + ["setuptools"] * ("setuptools" in lock))

    before = (image_site / f"{shadowed}-{image_version}.dist-info").stat().st_mtime_ns
    done = _run("bash", INSTALL, "--wheelhouse", wh, "--venv", venv, "--skip", cuda, env=OFFLINE_ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert f"{shadowed} {image_version} -> {other}; the venv's copy shadows {image_site}" in out
    assert "to install" in out and "gpu_install: ok: mgrpo_verl from " + str(site) in out, out
    seen = _run(vpy, "-c", f"from importlib import metadata; print(metadata.version('{shadowed}'))").stdout.strip()
    assert seen == other
    # the image is untouched
    assert metadata.version(shadowed) == image_version
    assert (image_site / f"{shadowed}-{image_version}.dist-info").stat().st_mtime_ns == before
