"""The relay comparison's table and plot (mgrpo_verl/experiments/baselines.py) from hand-written metrics."""

import json

import pytest

from mgrpo_verl.experiments.baselines import SUB_KEY, TRAIN_KEY, VAL_KEY, VARIANTS, collect, main, summary_rows


def _write(run_dir, records, done=True):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records))
    if done:
        (run_dir / "done").write_text("1\n")


def _runs(tmp_path):
    # joint, two seeds: val 0.0 -> 0.5 and 0.0 -> 0.3; main reward at steps 1..4
    for seed, last in ((0, 0.5), (1, 0.3)):
        _write(tmp_path / "joint" / f"seed{seed}", [
            (0, {VAL_KEY: 0.0}),
            *[(s, {TRAIN_KEY: 0.1 * s, SUB_KEY: 0.2}) for s in (1, 2, 3, 4)],
            (4, {VAL_KEY: last}),
        ])
    _write(tmp_path / "frozen" / "seed0", [(0, {VAL_KEY: 0.0}), (4, {VAL_KEY: 0.25}), (4, {TRAIN_KEY: 0.2, SUB_KEY: 0.0})])
    _write(tmp_path / "single" / "seed0", [(0, {VAL_KEY: 0.1})], done=False)  # unfinished: ignored
    return tmp_path


def test_summary_by_hand(tmp_path):
    rows = {r["variant"]: r for r in summary_rows(collect(_runs(tmp_path)))}
    assert set(rows) == {"joint", "frozen"}
    j = rows["joint"]
    # last val: mean(0.5, 0.3) = 0.4, unbiased std = sqrt(2 * 0.1**2 / 1) = 0.1414
    assert j["val_first"] == 0.0 and j["val_last"] == pytest.approx(0.4) and j["val_last_std"] == pytest.approx(0.14142, abs=1e-4)
    assert j["val_best"] == pytest.approx(0.4)
    # last quarter of 4 steps = step 4 only: main reward 0.4, sub 0.2
    assert j["train_main"] == pytest.approx(0.4) and j["train_sub"] == pytest.approx(0.2) and j["steps"] == 4
    assert rows["frozen"]["val_last"] == 0.25 and rows["frozen"]["seeds"] == 1


def test_report_writes_table_and_plot(tmp_path, capsys):
    out = tmp_path / "docs"
    main(["report", "--runs", str(_runs(tmp_path / "runs")), "--out", str(out)])
    table = (out / "relay_baselines.md").read_text()
    assert "| joint | 2 | 4 | 0.000 | 0.400 ± 0.141 |" in table
    assert (out / "relay_baselines.png").stat().st_size > 1000
    assert "joint" in capsys.readouterr().out


def test_report_without_runs_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no finished run"):
        main(["report", "--runs", str(tmp_path), "--out", str(tmp_path / "o")])


def test_every_variant_is_one_switch_of_the_same_config():
    assert VARIANTS["joint"] == ()
    assert "multi_agent.agents.sub.trainable=false" in VARIANTS["frozen"]
    assert "multi_agent.agents.sub.share_model_with=main" in VARIANTS["single"]
