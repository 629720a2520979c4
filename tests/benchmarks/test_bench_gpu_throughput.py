"""benchmarks/bench_gpu_throughput.py: the report from recorded stage folders (hand-computed ratios, verdicts only
when the token counts match), the stock config it hands to verl's own main_ppo, the labels (a cpu run is never a
GPU figure), and T2's agent loop against stock's: each of our rows holds exactly the tokens of a stock row."""

from __future__ import annotations

import asyncio
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


R, P = 256, 64  # response tokens per row (fixed), prompt tokens per row


def _rec(step_s, rows, gen, n_gpus=1, response=R):
    tokens = rows * (P + response)
    return {"timing_s/step": step_s, "timing_s/gen": gen, "timing_s/update_actor": step_s - gen,
            "perf/total_num_tokens": tokens, "perf/time_per_step": step_s, "perf/throughput": tokens / (step_s * n_gpus),
            "prompt_length/mean": P, "response_length/mean": response, "response_length/min": response,
            "response_length/max": response}


# recorded in verl's file-logger layout, step 1 the warm-up (left out). B x n = 128 rows per model:
# stock T1 128 rows, ours T2 2 x 128 (each model T1's rows), stock T3 256 rows (2n rollouts)
STOCK = [_rec(30.0, 128, 20.0), _rec(10.0, 128, 6.0), _rec(12.0, 128, 7.0), _rec(11.0, 128, 6.5)]
OURS = [_rec(60.0, 256, 40.0), _rec(20.0, 256, 12.0), _rec(22.0, 256, 13.0), _rec(24.0, 256, 14.0)]
STOCK_X2 = [_rec(40.0, 256, 25.0), _rec(19.0, 256, 10.0), _rec(20.0, 256, 11.0), _rec(21.0, 256, 11.5)]


def _settings(work: Path) -> None:
    (work / "throughput_settings.json").write_text(json.dumps({"preset": "qwen2.5-0.5b", "response_tokens": R}))


def test_report_ratios_from_recorded_metrics(tmp_path):
    _settings(tmp_path)
    _stage(tmp_path, "T1", STOCK)
    _stage(tmp_path, "T2", OURS)
    _stage(tmp_path, "T3", STOCK_X2)
    rep = bt.build_report(tmp_path)
    tokens = 128 * (P + R)  # 40,960 per 128 rows
    # the work is matched: ours = stock_x2 = 2 x stock tokens per step, every response R tokens
    assert rep["stock"]["tokens_per_step"] == tokens and rep["ours"]["tokens_per_step"] == 2 * tokens
    assert rep["stock_x2"]["tokens_per_step"] == rep["ours"]["tokens_per_step"]
    assert rep["matched"] == {"ours_equals_stock_x2": True, "ours_equals_twice_stock": True, "fixed_length": True}
    assert rep["ours"]["rows_per_step"] == 256 and rep["stock"]["rows_per_step"] == 128
    # stock: measured 10, 12, 11 s -> 11; ours 20, 22, 24 -> 22; stock_x2 19, 20, 21 -> 20
    assert rep["stock"]["step_s"] == pytest.approx(11.0) and rep["ours"]["step_s"] == pytest.approx(22.0)
    assert rep["stock_x2"]["step_s"] == pytest.approx(20.0)
    # per token: median perf/throughput, ours 81920/22 (medians of 81920/20, /22, /24), stock_x2 81920/20:
    # 20/22 = 0.909 (>= 0.9: pass); per model step: 22 / 11 = 2.0 (<= 2.2: pass)
    assert rep["ours"]["throughput"] == pytest.approx(2 * tokens / 22)
    assert rep["throughput_ratio"] == pytest.approx(20 / 22) and rep["step_ratio"] == pytest.approx(2.0)
    assert rep["verdicts"] == {"throughput": "pass", "step": "pass"} and rep["why"] == {}
    assert rep["stock"]["tokens_per_step_time"] == pytest.approx(tokens / 11)  # one GPU: equal to verl's figure
    assert rep["stock"]["phases"]["gen"] == pytest.approx(6.5) and rep["ours"]["peak_gpu_used_mib"] == 30000.0
    assert rep["gpu_results"] and rep["device"] == "cuda"
    md = bt.render(rep)
    assert md.startswith("# Throughput, ours") and "(T2/T3): **0.91** (goal >= 0.9: pass)" in md
    assert "(T2/T1): **2.00** (bar <= 2.2: pass)" in md and md.count("| stock") == 2


def test_unmatched_tokens_give_no_verdict(tmp_path):
    """Ours with more tokens per row than stock (e.g. the relay's sub-agent reply in the main row): ratios shown,
    no verdict."""
    _settings(tmp_path)
    _stage(tmp_path, "T1", STOCK)
    _stage(tmp_path, "T2", [_rec(20.0, 256, 12.0, response=300), _rec(20.0, 256, 12.0, response=300)])
    _stage(tmp_path, "T3", STOCK_X2)
    rep = bt.build_report(tmp_path)
    assert rep["matched"] == {"ours_equals_stock_x2": False, "ours_equals_twice_stock": False, "fixed_length": False}
    assert rep["verdicts"] == {"throughput": "unmatched", "step": "unmatched"}
    assert rep["throughput_ratio"] is not None and "no verdict" in rep["why"]["throughput"]


def test_slow_ours_fails_the_goals(tmp_path):
    _settings(tmp_path)
    _stage(tmp_path, "T1", STOCK)
    _stage(tmp_path, "T2", [_rec(60.0, 256, 40.0), _rec(30.0, 256, 12.0)])
    _stage(tmp_path, "T3", STOCK_X2)
    rep = bt.build_report(tmp_path)
    # 30 / 11 = 2.73 > 2.2; (81920 / 30) / (81920 / 20) = 0.667 < 0.9
    assert rep["step_ratio"] == pytest.approx(30 / 11) and rep["throughput_ratio"] == pytest.approx(20 / 30)
    assert rep["verdicts"] == {"throughput": "fail", "step": "fail"}


def test_partial_runs_report_what_finished(tmp_path):
    """A call stopped after T2 and T3 (T1 not run): the per-token ratio, and why there is no per-model one."""
    _settings(tmp_path)
    _stage(tmp_path, "T2", OURS)
    _stage(tmp_path, "T3", STOCK_X2)
    rep = bt.build_report(tmp_path)
    assert rep["stock"] is None and rep["verdicts"] == {"throughput": "pass"}
    assert rep["why"] == {"step": "T1 not run"} and rep["matched"]["ours_equals_twice_stock"] is None
    assert "| stock | T1 | – | not run |" in bt.render(rep)


def test_cpu_run_is_labelled_and_a_failed_side_gives_no_ratio(tmp_path):
    _stage(tmp_path, "T1", STOCK, device="cpu")
    _stage(tmp_path, "T2", OURS[:1], device="cpu", rc=1)
    _stage(tmp_path, "T3", STOCK_X2, device="cpu")
    rep = bt.build_report(tmp_path)
    assert not rep["gpu_results"] and rep["device"] == "cpu"
    assert rep["throughput_ratio"] is None and rep["why"]["throughput"] == "T2: failed"
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


# ------------------------------------------------------------------------------ T2's agent loop vs stock's


class _Server:
    """Answers every call with ``length`` tokens (ignore_eos: always the full length), recording the prompts."""

    def __init__(self, tokenizer, length):
        self.ids = tokenizer.encode("7", add_special_tokens=False) * length
        self.prompts = []

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(list(prompt_ids))
        n = min(len(self.ids), int(sampling_params.get("max_tokens", len(self.ids))))
        return TokenOutput(token_ids=self.ids[:n], log_probs=[-0.5] * n, extra_fields={"min_global_steps": 1, "max_global_steps": 1})


class _Manager:
    def __init__(self, servers):
        self.servers = servers

    def for_agent(self, name):
        return self.servers[name]

    async def generate(self, request_id=None, **kwargs):  # stock's single_turn_agent calls the one model here
        return await self.servers["main"].generate(request_id, **kwargs)


def test_twin_rows_hold_the_tokens_of_a_stock_row(tmp_path, tokenizer, monkeypatch):
    """T2's loop, registered from the file the kit writes (as verl's agent-loop worker reads it), against verl's own
    single_turn_agent (stock's loop) on the same dataset row: two rows, one per model, each with stock's prompt ids
    and R response tokens; the sub row's parent is the main row; main last."""
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from mgrpo_verl.agent_loops.testing import build_agent_loop
    from mgrpo_verl.experiments.gpu_smoke import TWIN_LOOP

    path = bt.twin_files(tmp_path)
    for entry in OmegaConf.load(path):  # what AgentLoopWorker does with rollout.agent.agent_loop_config_path
        monkeypatch.setitem(_agent_loop_registry, entry.name, entry)
    row = pd.read_parquet(tmp_path / "data" / "train.parquet").iloc[0].to_dict()
    assert "agent_name" not in row
    kwargs = {"raw_prompt": list(row["prompt"]), "reward_model": row["reward_model"], "uid": "u", "session_id": 3}
    cfg = OmegaConf.create({"actor_rollout_ref": {"model": {"path": "/m"}, "rollout": {"prompt_length": 64, "response_length": 8}},
                            "data": {}})
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}

    async def go(name, manager):
        return await build_agent_loop(name, cfg, manager, tokenizer).run(dict(sampling), **kwargs)

    stock = asyncio.run(go("single_turn_agent", _Manager({"main": _Server(tokenizer, 8)})))
    servers = {"main": _Server(tokenizer, 8), "sub": _Server(tokenizer, 8)}
    ours = asyncio.run(go(TWIN_LOOP, _Manager(servers)))
    assert len(ours) == 2 and len(stock.response_ids) == 8
    for r in ours:
        assert r.prompt_ids == stock.prompt_ids and r.response_ids == stock.response_ids and r.response_mask == [1] * 8
    assert servers["main"].prompts == servers["sub"].prompts == [stock.prompt_ids]  # each model generated once
    sub, main = (r.extra_fields["mgrpo"] for r in ours)
    assert (main["agent"], main["traj_id"], main["parent_traj_id"]) == ("main", "u/3/main", "")
    assert (sub["agent"], sub["parent_traj_id"]) == ("sub", "u/3/main")
