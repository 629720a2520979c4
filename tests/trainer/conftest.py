"""Running the real entry point, ``python -m mgrpo_verl.main_ppo``, hermetically in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Steer platform choice or Ray; cleared so every run starts from the same state.
_CLEARED = ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "RAY_ADDRESS", "VERL_FILE_LOGGER_PATH")


@dataclass
class Run:
    returncode: int
    log: str
    metrics: list[dict]

    def steps(self) -> list[int]:
        return [r["step"] for r in self.metrics if "critic/score/mean" in r["data"]]

    def at(self, step: int) -> dict:
        merged: dict = {}
        for r in self.metrics:
            if r["step"] == step:
                merged.update(r["data"])
        return merged


@pytest.fixture
def main_ppo(tmp_path):
    """``run(name, *overrides, timeout=900, config=None, env=None)``: run the entry point in ``tmp_path/name`` with a
    private HOME, cache and Hugging Face home; checkpoints under ``tmp_path/ckpt`` (shared by runs, for resuming).
    ``env`` is set after the clearing (e.g. ``{"RAY_ADDRESS": ...}`` to join an existing cluster)."""
    home = tmp_path / "home"
    home.mkdir()

    def run(name: str, *overrides: str, timeout: float = 900, config: str | None = None, env: dict | None = None) -> Run:
        workdir = tmp_path / name
        workdir.mkdir()
        metrics = workdir / "metrics.jsonl"
        extra_env = env or {}
        env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
        env.update(
            HOME=str(home),
            MGRPO_VERL_CACHE=str(tmp_path / "cache"),
            HF_HOME=str(tmp_path / "hf"),
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
            # Ray folds similar log lines of different workers into one ("[repeated 3x across cluster]"),
            # which would hide per-server lines the tests read
            RAY_DEDUP_LOGS="0",
        )
        env.update(extra_env)
        args = [
            sys.executable, "-m", "mgrpo_verl.main_ppo",
            *(("--config-name", config) if config else ()),
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"mgrpo_verl.metrics_file={metrics}",
            *overrides,
        ]
        proc = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
        (workdir / "log.txt").write_text(log)
        records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        return Run(proc.returncode, log, records)

    run.home = home
    run.checkpoints = tmp_path / "ckpt"
    run.cache = tmp_path / "cache"
    return run


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))
