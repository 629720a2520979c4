"""recipes/gpu_campaign.sh's CPU dry run: the campaign's steps at tiny size on vLLM's CPU build (.venv-vllm), labelled
cpu: the vLLM smoke stage B1, then the throughput comparison (stock verl's main_ppo vs ours, two models) with its
ratio. Runs in CI under .venv-vllm (.ci/run); skipped where vLLM is not importable."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="needs vLLM's CPU build: bash recipes/vllm_cpu_env.sh, then .venv-vllm/bin/python -m pytest")


def test_campaign_dry_run_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "SMOKE_WORK": str(tmp_path / "work")}
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_campaign.sh"), "dry-run"], env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    smoke = json.loads((out / "gpu_smoke.json").read_text())
    [b1] = smoke["stages"]
    assert (b1["stage"], b1["status"], b1["device"]) == ("B1", "ok", "cpu") and not smoke["gpu_results"]
    tp = json.loads((out / "tp-tiny_h32" / "throughput.json").read_text())
    assert tp["device"] == "cpu" and not tp["gpu_results"]
    assert tp["stock"]["status"] == "ok" and tp["ours"]["status"] == "ok", tp
    # stock: 2 prompts x 2 rollouts of (prompt + 8 tokens); ours: the same rows for each of two models, so more
    # tokens per step than stock (the main agent's row also carries the sub-agent's reply)
    assert tp["ours"]["tokens_per_step"] > tp["stock"]["tokens_per_step"] > 0
    assert tp["throughput_ratio"] > 0 and tp["step_ratio"] > 0
    assert (out / "tp-tiny_h32" / "throughput.md").read_text().startswith("# Throughput kit, device cpu: NOT GPU results")
