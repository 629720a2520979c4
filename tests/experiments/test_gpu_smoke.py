"""The GPU smoke kit's summariser (hand-written metrics files and nvidia-smi samples, hand-computed
expectations) and, marked slow, the kit's stage plumbing run for real on CPU (labelled cpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mgrpo_verl.experiments import gpu_smoke as gs

ROOT = Path(__file__).resolve().parents[2]


def _write_metrics(path: Path, records: list[tuple[int, dict]]) -> None:
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records))


def _stage(work: Path, name: str, *, device: str = "cuda", rc: int = 0, records=(), smi: str = "", total: str = "",
           procs: str = "", log: str = "", cuda_seen: bool = True) -> Path:
    d = work / name
    d.mkdir(parents=True)
    (d / "device").write_text(device + "\n")
    (d / "rc").write_text(f"{rc}\n")
    (d / "seconds").write_text("12.5\n")
    (d / "cmd.txt").write_text("python -m mgrpo_verl.main_ppo x=1")
    (d / "log.txt").write_text(log)
    (d / "smi.csv").write_text(smi)
    (d / "smi_total.csv").write_text(total)
    (d / "smi_procs.txt").write_text(procs)
    env = {"date_utc": "2026-11-25 10:00:00", "torch": {"cuda_available": cuda_seen}, "gpus": [{"name": "H100"}] if cuda_seen else []}
    (d / "env.json").write_text(json.dumps(env))
    _write_metrics(d / "metrics.jsonl", list(records))
    return d


# single-model trainer keys (verl's): timing_s/<phase>
SINGLE = [
    (1, {"timing_s/step": 10.0, "timing_s/gen": 6.0, "timing_s/old_log_prob": 1.0, "timing_s/update_actor": 2.0,
         "timing_s/update_weights": 0.5, "perf/throughput": 100.0, "perf/max_memory_allocated_gb": 3.0}),
    (2, {"timing_s/step": 4.0, "timing_s/gen": 2.0, "timing_s/old_log_prob": 0.5, "timing_s/update_actor": 1.0,
         "timing_s/update_weights": 0.25, "perf/throughput": 400.0, "perf/max_memory_allocated_gb": 3.5}),
    (3, {"timing_s/step": 6.0, "timing_s/gen": 3.0, "timing_s/old_log_prob": 0.7, "timing_s/update_actor": 1.5,
         "timing_s/update_weights": 0.35, "perf/throughput": 300.0, "perf/max_memory_allocated_gb": 3.25}),
]
# per-agent trainer keys (ours): gen once, the others per agent under timing_s/agent/<name>/
MULTI = [
    (1, {"timing_s/step": 20.0, "timing_s/gen": 9.0,
         "timing_s/agent/main/old_log_prob": 1.0, "timing_s/agent/sub/old_log_prob": 2.0,
         "timing_s/agent/main/update_actor": 3.0, "timing_s/agent/sub/update_actor": 4.0,
         "timing_s/agent/main/update_weights": 0.5, "timing_s/agent/sub/update_weights": 0.25,
         "agent/main/actor/perf/max_memory_allocated_gb": 2.0, "agent/sub/actor/perf/max_memory_allocated_gb": 1.0}),
    (2, {"timing_s/step": 9.0, "timing_s/gen": 4.0,
         "timing_s/agent/main/old_log_prob": 0.5, "timing_s/agent/sub/old_log_prob": 0.25,
         "timing_s/agent/main/update_actor": 1.0, "timing_s/agent/sub/update_actor": 2.0,
         "timing_s/agent/main/update_weights": 0.125, "timing_s/agent/sub/update_weights": 0.125,
         "perf/throughput": 50.0, "agent/main/actor/perf/max_memory_allocated_gb": 2.5}),
    (2, {"val-core/x/acc/mean@1": 0.5}),  # a validation-only record: not a step
]


def test_phase_seconds_single_and_per_agent():
    assert gs.phase_seconds(SINGLE[0][1]) == {"gen": 6.0, "old_log_prob": 1.0, "update_actor": 2.0, "update_weights": 0.5}
    assert gs.phase_seconds(MULTI[0][1]) == {"gen": 9.0, "old_log_prob": 3.0, "update_actor": 7.0, "update_weights": 0.75}
    assert gs.phase_seconds({"timing_s/step": 1.0}) == dict.fromkeys(gs.PHASES)
    assert gs.agent_phases(MULTI[1][1]) == {
        "main": {"old_log_prob": 0.5, "update_actor": 1.0, "update_weights": 0.125},
        "sub": {"old_log_prob": 0.25, "update_actor": 2.0, "update_weights": 0.125},
    }


def test_summary_excludes_the_warmup_step(tmp_path):
    _write_metrics(tmp_path / "m.jsonl", SINGLE)
    rows = gs.step_rows(gs.read_metrics(tmp_path / "m.jsonl"))
    s = gs.summarize_steps(rows)
    # steps 2 and 3 measured: medians of (4, 6), (2, 3), (0.5, 0.7), (1, 1.5), (0.25, 0.35), (400, 300)
    assert s["steps"] == 3 and s["measured_steps"] == [2, 3] and s["warmup_excluded"]
    assert s["step_s"] == pytest.approx(5.0) and s["gen"] == pytest.approx(2.5)
    assert s["old_log_prob"] == pytest.approx(0.6) and s["update_actor"] == pytest.approx(1.25)
    assert s["update_weights"] == pytest.approx(0.3) and s["tokens_per_s"] == pytest.approx(350.0)
    one = gs.summarize_steps(rows[:1])
    assert one["measured_steps"] == [1] and not one["warmup_excluded"] and one["step_s"] == 10.0


def test_read_metrics_skips_broken_lines(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1, "data": {"timing_s/step": 2}}\nnot json\n{"step": 2}\n')
    assert [r["step"] for r in gs.read_metrics(p)] == [1]
    assert gs.read_metrics(tmp_path / "missing.jsonl") == []


def test_allocated_peaks():
    records = [{"step": s, "data": d} for s, d in MULTI]
    assert gs.allocated_peaks(records) == {
        "agent/main/actor/perf/max_memory_allocated_gb": 2.5, "agent/sub/actor/perf/max_memory_allocated_gb": 1.0,
    }


SMI = """\
100.0,4242, ray::WorkerDict, 1000 MiB
100.0,4343, /usr/bin/python3, 500 MiB
100.5,4242, ray::WorkerDict, 3000 MiB
100.5,4343, /usr/bin/python3, 200 MiB
101.0,4242, ray::WorkerDict, 2000 MiB
101.0,4343, /usr/bin/python3, 1500 MiB
101.0,4444, VLLM::EngineCore, [N/A]
garbage
"""


def test_memory_peaks_per_process_and_total():
    samples = gs.parse_smi(SMI)
    assert len(samples) == 6  # the [N/A] and garbage lines are skipped
    mem = gs.memory_peaks(samples, {4242: "ray::WorkerDict.actor_rollout_compute_log_prob"})
    # per pid: max(1000, 3000, 2000) = 3000, max(500, 200, 1500) = 1500; per sample totals 1500, 3200, 3500
    assert [(p["pid"], p["peak_mib"]) for p in mem["per_process"]] == [(4242, 3000.0), (4343, 1500.0)]
    assert mem["per_process"][0]["cmd"] == "ray::WorkerDict.actor_rollout_compute_log_prob"
    assert mem["peak_total_mib"] == 3500.0 and mem["samples"] == 3
    assert gs.memory_peaks([]) == {"samples": 0, "per_process": [], "peak_total_mib": None}


def test_parse_smi_total_and_procs():
    assert gs.parse_smi_total("1.0,1200 MiB\n1.5,4100 MiB\n2.0,\n2.5,3000 MiB\n") == 4100.0
    assert gs.parse_smi_total("") is None
    assert gs.parse_procs("12 python -m x\n13 \nbad line\n") == {12: "python -m x"}


def test_report_ratio_and_table(tmp_path):
    _stage(tmp_path, "A1", records=SINGLE, smi=SMI, total="100.0,5000 MiB\n100.5,7000 MiB\n")
    # A2: measured step 2 only -> 9.0 s; A1 median 5.0 s -> ratio 1.8 (pass)
    _stage(tmp_path, "A2", records=MULTI)
    _stage(tmp_path, "B1", records=SINGLE)
    _stage(tmp_path, "B2", records=[(1, {"timing_s/step": 30.0}), (2, {"timing_s/step": 12.0})])  # 12 / 5 = 2.4
    rep = gs.build_report(tmp_path)
    assert rep["device"] == "cuda" and rep["gpu_results"]
    by = {r["pair"]: r for r in rep["ratios"]}
    assert by["A2/A1"]["ratio"] == pytest.approx(1.8) and by["A2/A1"]["verdict"] == "pass"
    assert by["B2/B1"]["ratio"] == pytest.approx(2.4) and by["B2/B1"]["verdict"] == "fail"
    a2 = next(s for s in rep["stages"] if s["stage"] == "A2")
    assert a2["summary"]["old_log_prob"] == pytest.approx(0.75) and a2["summary"]["update_actor"] == pytest.approx(3.0)
    assert a2["summary"]["agents"]["sub"]["update_actor"] == pytest.approx(2.0)
    a1 = rep["stages"][0]
    assert a1["gpu_memory"]["peak_gpu_used_mib"] == 7000.0 and a1["status"] == "ok" and "log_tail" not in a1
    md = gs.render_markdown(rep)
    assert md.startswith("# GPU smoke results: ")
    assert "| A1 | cuda | ok | 0 | 3 | 5.00 | 2.50 | 0.60 | 1.25 | 0.30 | 350 | 3000 | 3500 | 7000 | 3.50 |" in md
    assert "| A2/A1 | 1.80 | ≤ 2.2 | pass |" in md and "| B2/B1 | 2.40 | ≤ 2.2 | fail |" in md


def test_failure_carries_exit_code_error_lines_and_tail(tmp_path):
    log = "\n".join([f"line {i}" for i in range(100)] + ["Traceback (most recent call last):",
                                                         "torch.OutOfMemoryError: CUDA out of memory."])
    _stage(tmp_path, "A1", rc=1, log=log)
    _stage(tmp_path, "A2", rc=124, records=SINGLE[:1])
    rep = gs.build_report(tmp_path)
    a1, a2 = rep["stages"]
    assert (a1["status"], a1["exit_code"]) == ("failed", 1)
    assert a1["error_lines"] == ["Traceback (most recent call last):", "torch.OutOfMemoryError: CUDA out of memory."]
    assert a1["log_tail"].splitlines()[0] == "line 22" and len(a1["log_tail"].splitlines()) == 80
    assert a2["status"] == "timeout"
    assert rep["ratios"][0]["ratio"] is None and rep["ratios"][0]["why"] == "A2: timeout, A1: failed"
    assert "## A1: failed (exit 1)" in gs.render_markdown(rep)


def test_cpu_stages_are_never_gpu_results(tmp_path):
    _stage(tmp_path, "A1", device="cpu", records=SINGLE, cuda_seen=False)
    rep = gs.build_report(tmp_path)
    assert rep["device"] == "cpu" and not rep["gpu_results"]
    assert gs.render_markdown(rep).startswith("# GPU smoke kit, device cpu: NOT GPU results")


def test_mixed_devices_no_ratio(tmp_path):
    _stage(tmp_path, "A1", device="cpu", records=SINGLE, cuda_seen=False)
    _stage(tmp_path, "A2", device="cuda", records=MULTI)
    rep = gs.build_report(tmp_path)
    assert rep["device"] == "mixed" and not rep["gpu_results"]
    assert rep["ratios"][0]["ratio"] is None and "different devices" in rep["ratios"][0]["why"]


def test_refuses_cuda_label_without_a_gpu(tmp_path):
    _stage(tmp_path, "A1", device="cuda", records=SINGLE, cuda_seen=False)
    with pytest.raises(gs.RefusedLabel, match="saw no CUDA device"):
        gs.build_report(tmp_path)
    assert gs.main(["report", "--work", str(tmp_path)]) == gs.EXIT_REFUSED
    assert not (tmp_path / "gpu_smoke.json").exists()


def test_refuses_cuda_label_when_the_hf_rollout_ran_on_cpu(tmp_path):
    log = "(HFRolloutServer pid=1) hf_server_0_0 ready: model=/m device=cpu dtype=torch.float32 threads=1\n"
    _stage(tmp_path, "A1", records=SINGLE, log=log)
    with pytest.raises(gs.RefusedLabel, match="HF rollout ran on"):
        gs.build_report(tmp_path)


def test_precheck_failure_is_not_a_gpu_result(tmp_path):
    _stage(tmp_path, "A1", rc=gs.EXIT_PRECHECK, cuda_seen=False)
    rep = gs.build_report(tmp_path)
    assert rep["stages"][0]["status"] == "precheck_failed" and not rep["gpu_results"]
    assert "No stage ran on a GPU" in gs.render_markdown(rep)


def _env(cuda: bool) -> dict:
    return {"torch": {"cuda_available": cuda, "version": "2.11"}, "gpus": [{"name": "H100"}] if cuda else []}


LISTENER = """
import socket, sys, time
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


def test_the_socket_sampler_tells_a_stage_s_open_doors_from_loopback_ones(tmp_path):
    """The kit's ``sockets`` step (one per stage, beside nvidia-smi's sampler) records every listening socket of the
    processes started after it and marks those bound beyond loopback: here one child listens on 127.0.0.1 (closed),
    one on 0.0.0.0 (every interface: open), one on ``::`` (every interface, IPv6 and IPv4: open)."""
    import signal
    import time

    sampler = subprocess.Popen([sys.executable, "-m", "mgrpo_verl.experiments.gpu_smoke", "sockets", "--dir", str(tmp_path)])
    children = []
    try:
        time.sleep(0.5)
        ports = {}
        for ip in ("127.0.0.1", "0.0.0.0", "::"):
            child = subprocess.Popen([sys.executable, "-c", LISTENER, ip], stdout=subprocess.PIPE, text=True)
            children.append(child)
            ports[ip] = int(child.stdout.readline())
        pids = {child.pid for child in children}  # only theirs: under xdist the other worker starts Ray processes too
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # the sampler looks every second
            text = (tmp_path / gs.SOCKETS_FILE).read_text() if (tmp_path / gs.SOCKETS_FILE).exists() else ""
            if {json.loads(line)["pid"] for line in text.splitlines()} >= pids:
                break
            time.sleep(0.5)
        sampler.send_signal(signal.SIGTERM)
        assert sampler.wait(10) == 0
    finally:
        for child in children:
            child.kill()
        sampler.kill()
    lines = (tmp_path / gs.SOCKETS_FILE).read_text().splitlines()
    summary = gs.socket_summary("\n".join(line for line in lines if json.loads(line)["pid"] in pids))
    assert summary["sampled"] and summary["listening"] == 3, summary
    assert sorted((o["ip"], o["port"]) for o in summary["beyond_loopback"]) == sorted(
        [("0.0.0.0", ports["0.0.0.0"]), ("::", ports["::"])]), summary


def test_problems():
    have_all = lambda name: True  # noqa: E731
    assert gs.problems("A1", "cuda", _env(True), have_all, True) == []
    assert gs.problems("A1", "cpu", _env(False), have_all, True) == []
    no_vllm = lambda name: name != "vllm"  # noqa: E731
    assert gs.problems("A2", "cuda", _env(True), no_vllm, True) == []
    [p] = gs.problems("B1", "cuda", _env(True), no_vllm, True)
    assert p.startswith("missing package(s) vllm") and "recipes/gpu_install.sh" in p
    found = gs.problems("A1", "cuda", _env(False), have_all, False)
    assert len(found) == 3 and "pip install --no-index" in found[0] and "refusing to run" in found[1]
    assert gs.problems("B2", "cpu", _env(False), have_all, True) == []  # vLLM's CPU build
    [p] = gs.problems("B3", "cuda", _env(True), no_vllm, True)  # LoRA agents on one vLLM engine: vLLM too
    assert p.startswith("missing package(s) vllm")
    [p] = gs.problems("B2", "cpu", _env(False), no_vllm, True)
    assert p.startswith("missing package(s) vllm") and "recipes/vllm_cpu_env.sh" in p
    assert "unknown stage" in gs.problems("C1", "cuda", _env(True), have_all, True)[0]


def test_kit_knows_the_stages_of_the_report_and_refuses_others(tmp_path):
    """recipes/gpu_smoke.sh lists its stages once (ALL_STAGES); they are the report's STAGES, and an unknown stage
    is refused before anything runs."""
    import re

    text = (ROOT / "recipes" / "gpu_smoke.sh").read_text()
    [listed] = re.findall(r"^ALL_STAGES=\((.*?)\)", text, flags=re.M)
    assert listed.split() == list(gs.STAGES)
    env = {**os.environ, "SMOKE_WORK": str(tmp_path / "work"), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_smoke.sh"), "A1", "C7"], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and f"unknown argument 'C7' (stages: {' '.join(gs.STAGES)};" in proc.stderr
    assert not (tmp_path / "work" / "A1").exists()


@pytest.mark.slow
@pytest.mark.full  # the kit's stage harness runs for real in CI through the campaign's dry run (T2, T3, in .venv-vllm)
def test_kit_runs_stage_a1_on_cpu_labelled_cpu(tmp_path):
    """The real kit, stage A1, one training step on the CPU path: a results file labelled cpu."""
    work, out = tmp_path / "work", tmp_path / "out"
    env = {**os.environ, "MGRPO_SMOKE_DEVICE": "cpu", "SMOKE_STEPS": "1", "SMOKE_WORK": str(work), "OUT": str(out),
           "PYTHON": sys.executable, "SMOKE_TIMEOUT_S": "900"}
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "gpu_smoke.sh"), "A1"], env=env, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rep = json.loads((out / "gpu_smoke.json").read_text())
    assert rep["device"] == "cpu" and rep["gpu_results"] is False
    [a1] = rep["stages"]
    assert (a1["stage"], a1["status"], a1["exit_code"], a1["device"]) == ("A1", "ok", 0, "cpu")
    assert a1["hf_rollout_devices"] == ["cpu"]
    row = a1["per_step"][0]
    assert row["step"] == 1 and row["step_s"] > 0
    assert all(row[ph] is not None and row[ph] > 0 for ph in gs.PHASES), row
    assert set(row["agents"]) == {"main"}  # the sub-agent shares main's model
    assert (out / "gpu_smoke.md").read_text().startswith("# GPU smoke kit, device cpu: NOT GPU results")
    # the device tool brings back at most 8 files from $OUT: the two results files and one raw archive
    assert sorted(p.name for p in out.iterdir()) == ["gpu_smoke.json", "gpu_smoke.md", "gpu_smoke_raw.tar.gz"]
    with tarfile.open(out / "gpu_smoke_raw.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"env.json", "A1/metrics.jsonl", "A1/log.txt", "A1/rc", "A1/cmd.txt"} <= names
