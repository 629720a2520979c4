"""benchmarks/bench_gpu_throughput.py: the report from recorded stage folders (hand-computed ratios), the stock
config it hands to verl's own main_ppo, and the labels (a cpu run is never a GPU figure)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_gpu_throughput", ROOT / "benchmarks" / "bench_gpu_throughput.py")
bt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bt)


def _stage(work: Path, name: str, records: list[dict], device: str = "cuda", rc: int = 0) -> None:
    d = work / name
    d.mkdir(parents=True)
    for f, v in {"device": device, "rc": str(rc), "seconds": "100", "cmd.txt": "x", "log.txt": ""}.items():
        (d / f).write_text(v + "\n")
    env = {"torch": {"cuda_available": device == "cuda"}, "gpus": [{"name": "H100"}] if device == "cuda" else []}
    (d / "env.json").write_text(json.dumps(env))
    (d / "smi_total.csv").write_text("1.0,20000 MiB\n1.5,30000 MiB\n")
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "data": r}) + "\n" for i, r in enumerate(records)))


def _rec(step_s, tokens, gen, n_gpus=1):
    return {"timing_s/step": step_s, "timing_s/gen": gen, "timing_s/update_actor": step_s - gen,
            "perf/total_num_tokens": tokens, "perf/time_per_step": step_s, "perf/throughput": tokens / (step_s * n_gpus)}


# recorded in verl's file-logger layout: step 1 is the warm-up and is left out
STOCK = [_rec(30.0, 40000, 20.0), _rec(10.0, 40000, 6.0), _rec(12.0, 40000, 7.0), _rec(11.0, 40000, 6.5)]
OURS = [_rec(60.0, 90000, 40.0), _rec(20.0, 90000, 12.0), _rec(22.0, 90000, 13.0), _rec(24.0, 90000, 14.0)]


def test_report_ratios_from_recorded_metrics(tmp_path):
    _stage(tmp_path, "T1", STOCK)
    _stage(tmp_path, "T2", OURS)
    rep = bt.build_report(tmp_path)
    # stock: measured steps 10, 12, 11 s -> median 11 s; throughput 4000, 3333.3, 3636.4 -> median 3636.36
    # ours: 20, 22, 24 s -> median 22 s; throughput 4500, 4090.9, 3750 -> median 4090.91
    assert rep["stock"]["step_s"] == pytest.approx(11.0) and rep["ours"]["step_s"] == pytest.approx(22.0)
    assert rep["stock"]["throughput"] == pytest.approx(40000 / 11) and rep["ours"]["throughput"] == pytest.approx(90000 / 22)
    # ratio = ours / stock = (90000 / 22) / (40000 / 11) = 1.125 (goal >= 0.9: pass); step ratio 22 / 11 = 2.0 (<= 2.2)
    assert rep["throughput_ratio"] == pytest.approx(1.125) and rep["step_ratio"] == pytest.approx(2.0)
    assert rep["verdicts"] == {"throughput": "pass", "step": "pass"}
    assert rep["stock"]["tokens_per_step"] == 40000 and rep["ours"]["tokens_per_step"] == 90000
    assert rep["stock"]["tokens_per_step_time"] == pytest.approx(40000 / 11)  # one GPU: equal to verl's figure
    assert rep["stock"]["phases"]["gen"] == pytest.approx(6.5) and rep["ours"]["peak_gpu_used_mib"] == 30000.0
    assert rep["gpu_results"] and rep["device"] == "cuda"
    md = bt.render(rep)
    assert md.startswith("# Throughput, ours") and "throughput ours/stock: **1.12**" in md
    assert "step time ours/stock: **2.00** (bar <= 2.2: pass)" in md


def test_slow_ours_fails_the_goals(tmp_path):
    _stage(tmp_path, "T1", STOCK)
    _stage(tmp_path, "T2", [_rec(60.0, 90000, 40.0), _rec(30.0, 90000, 12.0)])
    rep = bt.build_report(tmp_path)
    # 30 / 11 = 2.73 > 2.2; (90000 / 30) / (40000 / 11) = 0.825 < 0.9
    assert rep["step_ratio"] == pytest.approx(30 / 11) and rep["throughput_ratio"] == pytest.approx(0.825)
    assert rep["verdicts"] == {"throughput": "fail", "step": "fail"}


def test_cpu_run_is_labelled_and_a_failed_side_gives_no_ratio(tmp_path):
    _stage(tmp_path, "T1", STOCK, device="cpu")
    _stage(tmp_path, "T2", OURS[:1], device="cpu", rc=1)
    rep = bt.build_report(tmp_path)
    assert not rep["gpu_results"] and rep["device"] == "cpu"
    assert rep["throughput_ratio"] is None and rep["why"] == "T1: ok, T2: failed"
    assert bt.render(rep).startswith("# Throughput kit, device cpu: NOT GPU results")


def test_stock_config_is_verls_schema_with_our_values(tmp_path):
    """The file verl's own main_ppo runs: our sections gone, the shared workload settings kept, the relay prompts
    without agent_name (verl's single-turn loop)."""
    import pandas as pd
    from omegaconf import OmegaConf

    path = bt.stock_config(["mgrpo_verl.device=cpu", "data.train_batch_size=3", "actor_rollout_ref.rollout.n=5",
                            "actor_rollout_ref.rollout.ignore_eos=true", "data.max_response_length=12"], tmp_path)
    cfg = OmegaConf.load(path)
    assert "mgrpo_verl" not in cfg and "multi_agent" not in cfg and "hydra" not in cfg
    assert cfg.data.train_batch_size == 3 and cfg.actor_rollout_ref.rollout.n == 5
    assert cfg.actor_rollout_ref.rollout.ignore_eos is True and cfg.data.max_response_length == 12
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.trainer.device == "cpu"
    frame = pd.read_parquet(cfg.data.train_files)
    assert "agent_name" not in frame.columns and set(frame.data_source) == {"mgrpo_verl/relay"}
    assert "${" not in path.read_text()  # resolved: stock verl needs none of our resolvers
