"""Ray is shut down and its private temp dir removed when a run fails inside Ray, and on Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def temp_root():
    # private_temp_dir() creates the Ray dir under $TMPDIR; Ray's socket paths must stay under 108 bytes,
    # so this root is short (pytest's tmp_path is too deep).
    path = Path(tempfile.mkdtemp(prefix="mr"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(tmp_path: Path, temp_root: Path, *overrides: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "log.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "RAY_ADDRESS")}
    env.update(TMPDIR=str(temp_root), HOME=str(tmp_path), MGRPO_VERL_CACHE=str(tmp_path / "cache"),
               HF_HOME=str(tmp_path / "hf"), PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "mgrpo_verl.main_ppo", "--config-name", "single_agent", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "trainer.val_before_train=false", *overrides]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, log


def _ray_processes_under(path: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(path) in line and "pytest" not in line]


def _assert_clean(temp_root: Path, log: Path) -> None:
    deadline = time.monotonic() + 30
    while _ray_processes_under(temp_root) and time.monotonic() < deadline:
        time.sleep(1)
    assert _ray_processes_under(temp_root) == [], log.read_text()[-3000:]
    assert [p.name for p in temp_root.iterdir() if p.name.startswith("mgrpo-ray-")] == [], log.read_text()[-3000:]


def test_error_inside_ray_shuts_down_and_cleans_up(tmp_path, temp_root):
    # the reward workers fail to import the reward function, inside Ray (TaskRunner and workers started)
    proc, log = _start(tmp_path, temp_root, "reward.custom_reward_function.path=pkg://mgrpo_verl.no_such_module")
    assert proc.wait(timeout=600) != 0
    assert "no_such_module" in log.read_text()
    _assert_clean(temp_root, log)


def test_ctrl_c_shuts_down_and_cleans_up(tmp_path, temp_root):
    proc, log = _start(tmp_path, temp_root, "trainer.total_training_steps=200")
    deadline = time.monotonic() + 600
    while "Training Progress" not in log.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(2)
    assert "Training Progress" in log.read_text(), log.read_text()[-3000:]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) != 0
    _assert_clean(temp_root, log)
