"""The MAGRPO comparison's report: from coop_baselines records (written here by hand, in the format
``coop_baselines.main`` writes) and a training metrics file, the table and the plot."""

from __future__ import annotations

import json

import pytest

from mgrpo_verl.experiments import magrpo_comparison


def _records(path, rewards: dict[str, list[float]]):
    """Records of the writing task: one per (protocol, sample), reward parts all equal to the reward."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for protocol, values in rewards.items():
        for s, r in enumerate(values):
            lines.append({"protocol": protocol, "item": "Perth", "sample": s, "reward": r, "structure": r,
                          "style": r, "coherence": r, "outputs": {}})  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_report_table_and_plot(tmp_path):
    task = "coop_writing"
    runs = tmp_path / "runs"
    _records(runs / "untrained" / f"{task}_records.jsonl", {p: [0.1, 0.3] for p in ("single", "parallel", "sequential", "discussion")})
    # seed 0: parallel 0.4 at step 10, all protocols at step 20 (parallel 0.6); seed 1: parallel 0.8 at step 20
    _records(runs / "seed0" / "step10" / f"{task}_records.jsonl", {"parallel": [0.4, 0.4]})
    _records(runs / "seed0" / "step20" / f"{task}_records.jsonl", {"parallel": [0.5, 0.7], "single": [0.0, 0.0]})
    _records(runs / "seed1" / "step20" / f"{task}_records.jsonl", {"parallel": [0.8, 0.8]})
    (runs / "seed0" / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "data": {"agent/summary/score/mean": 0.05}}) + "\n"
        + json.dumps({"step": 2, "data": {"agent/summary/score/mean": 0.25, "other": 1}}) + "\n"
    )
    models = {"summary": {"model": "/c/models/smollm2-135m-instruct-2c2f09d24caaf529", "tokenizer": "/c/t"},
              "details": {"model": "/c/models/smollm2-135m-instruct-2c2f09d24caaf529", "tokenizer": "/c/t"}}
    (runs / magrpo_comparison.MODELS_FILE).write_text(json.dumps({"models": models, "overrides": []}))
    result = magrpo_comparison.collect(runs, task)
    assert result["models"] == "smollm2-135m-instruct"  # the hash dropped, one name for two agents
    assert result["untrained"]["parallel"]["reward"] == pytest.approx(0.2)
    assert sorted(result["seeds"]) == [0, 1] and sorted(result["seeds"][0]) == [10, 20]
    assert result["train"][0] == {1: 0.05, 2: 0.25}
    table = magrpo_comparison.report(runs, tmp_path / "out", task)
    # trained parallel at the last step: seeds 0.6 and 0.8 -> mean 0.7, (population) std 0.1
    assert "| parallel | before RL | 0.200 |" in table and "| parallel | MAGRPO | 0.700 ± 0.100 |" in table
    assert "| single | MAGRPO | 0.000 ± 0.000 |" in table  # only seed 0 evaluated single
    assert "Models: smollm2-135m-instruct." in table
    assert (tmp_path / "out" / f"magrpo_{task}.png").stat().st_size > 1000
    assert (tmp_path / "out" / f"magrpo_{task}.md").read_text() == table


def test_report_of_runs_without_a_models_record_says_so(tmp_path):
    _records(tmp_path / "untrained" / "coop_writing_records.jsonl", {"parallel": [0.1]})
    assert magrpo_comparison.collect(tmp_path, "coop_writing")["models"] == "models not recorded"
    # a run with extra overrides says so; a warm start's folders (no content key) keep their names
    models = {"a": {"model": "/c/warmstart/writing-0123456789abcdef/a", "tokenizer": "/t"},
              "b": {"model": "/c/models/tiny-qwen2-0123456789abcdef", "tokenizer": "/t"}}
    (tmp_path / magrpo_comparison.MODELS_FILE).write_text(
        json.dumps({"models": models, "overrides": ["trainer.total_training_steps=5", "data.seed=2"]}))
    assert magrpo_comparison.collect(tmp_path, "coop_writing")["models"] == (
        "a / tiny-qwen2 (overrides: `trainer.total_training_steps=5` `data.seed=2`)")


def test_report_needs_the_untrained_baselines(tmp_path):
    with pytest.raises(SystemExit, match="no untrained baselines"):
        magrpo_comparison.collect(tmp_path, "coop_writing")


def test_before_rl_evaluates_the_models_the_runs_train():
    """'Before RL' must be the models the training starts from: with ``mgrpo_verl.model=tiny_small`` the first
    agent is tiny_small, not coop_baselines' default tiny (a run on smollm2 was compared with tiny models before),
    and each agent's tokenizer is its own folder (the built-in models keep it apart from the weights)."""
    from mgrpo_verl.envs.builtin import model_paths

    models = magrpo_comparison.initial_models("coop_writing", ["mgrpo_verl.model=tiny_small"])
    small, sub = model_paths("tiny_small"), model_paths("tiny_sub")
    assert list(models.values()) == [
        {"model": str(small.model_dir), "tokenizer": str(small.tokenizer_dir)},
        {"model": str(sub.model_dir), "tokenizer": str(sub.tokenizer_dir)},
    ]
