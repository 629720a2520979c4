"""Ray is shut down and its private temp dir removed when a run fails inside Ray, and on Ctrl-C."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from e2e import MainPPO, Proc, reaped, wait_for_log

pytestmark = pytest.mark.slow


@pytest.fixture
def temp_root():
    # private_temp_dir() creates the Ray dir under $TMPDIR; Ray's socket paths must stay under 108 bytes,
    # so this root is short (pytest's tmp_path is too deep).
    path = Path(tempfile.mkdtemp(prefix="mr"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(main_ppo: MainPPO, temp_root: Path, *overrides: str) -> Proc:
    # TMPDIR: where private_temp_dir() creates the run's Ray dir
    return main_ppo.start("run", "trainer.val_before_train=false", *overrides, config="single_agent",
                          env={"TMPDIR": str(temp_root)})


def _ray_processes_under(path: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(path) in line and "pytest" not in line]


def _assert_clean(temp_root: Path, proc: Proc) -> None:
    deadline = time.monotonic() + 30
    while _ray_processes_under(temp_root) and time.monotonic() < deadline:
        time.sleep(1)
    assert _ray_processes_under(temp_root) == [], proc.log()[-3000:]
    assert [p.name for p in temp_root.iterdir() if p.name.startswith("mgrpo-ray-")] == [], proc.log()[-3000:]


@pytest.mark.full  # Ctrl-C below and tests/platform/test_ray_session.py's error case check the same clean-up
def test_error_inside_ray_shuts_down_and_cleans_up(main_ppo, temp_root):
    # the reward workers fail to import the reward function, inside Ray (TaskRunner and workers started)
    proc = _start(main_ppo, temp_root, "reward.custom_reward_function.path=pkg://mgrpo_verl.no_such_module")
    with reaped(proc):
        assert proc.wait(timeout=600) != 0
    assert "no_such_module" in proc.log()
    _assert_clean(temp_root, proc)


def test_ctrl_c_shuts_down_and_cleans_up(main_ppo, temp_root):
    proc = _start(main_ppo, temp_root, "trainer.total_training_steps=200")
    with reaped(proc):
        wait_for_log(proc, "Training Progress", timeout=600)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) != 0
    _assert_clean(temp_root, proc)
