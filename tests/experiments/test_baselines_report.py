"""The relay comparison's table and plot (mgrpo_verl/experiments/baselines.py) from hand-written metrics."""

import json

import pytest

from mgrpo_verl.experiments.baselines import (
    STEP_TIME_KEY,
    SUB_KEY,
    TRAIN_KEY,
    VAL_KEYS,
    VARIANTS,
    collect,
    main,
    summary_rows,
    task_variants,
    wall_times,
)

EXACT = VAL_KEYS["relay_tools"][0]


def _write(run_dir, records, done=True):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records))
    if done:
        (run_dir / "done").write_text("1\n")


def _runs(tmp_path, key=EXACT):
    # joint, two seeds: val 0.0 -> 0.5 and 0.0 -> 0.3; main reward at steps 1..4, 10 s per step
    for seed, last in ((0, 0.5), (1, 0.3)):
        _write(tmp_path / "joint" / f"seed{seed}", [
            (0, {key: 0.0}),
            *[(s, {TRAIN_KEY: 0.1 * s, SUB_KEY: 0.2, STEP_TIME_KEY: 10.0}) for s in (1, 2, 3, 4)],
            (4, {key: last}),
        ])
    _write(tmp_path / "frozen" / "seed0", [(0, {key: 0.0}), (4, {key: 0.25}), (4, {TRAIN_KEY: 0.2, SUB_KEY: 0.0})])
    _write(tmp_path / "single" / "seed0", [(0, {key: 0.1})], done=False)  # unfinished: ignored
    return tmp_path


def test_summary_by_hand(tmp_path):
    rows = {r["variant"]: r for r in summary_rows(collect(_runs(tmp_path)))}
    assert set(rows) == {"joint", "frozen"}
    j = rows["joint"]
    # last val: mean(0.5, 0.3) = 0.4, unbiased std = sqrt(2 * 0.1**2 / 1) = 0.1414
    assert j["val_first"] == 0.0 and j["val_last"] == pytest.approx(0.4) and j["val_last_std"] == pytest.approx(0.14142, abs=1e-4)
    assert j["val_best"] == pytest.approx(0.4)
    # last quarter of 4 steps = step 4 only: main reward 0.4, sub 0.2; 4 steps x 10 s = 40 s of training
    assert j["train_main"] == pytest.approx(0.4) and j["train_sub"] == pytest.approx(0.2) and j["steps"] == 4
    assert j["train_seconds"] == pytest.approx(40.0)
    assert rows["frozen"]["val_last"] == 0.25 and rows["frozen"]["seeds"] == 1


def test_the_task_picks_the_held_out_metric(tmp_path):
    # runs that logged the relay's dense score only: read under task=relay, nothing under relay_tools' exact key
    runs = _runs(tmp_path, key=VAL_KEYS["relay"][0])
    assert summary_rows(collect(runs, "relay"))[0]["val_last"] == pytest.approx(0.4)
    assert all(not seed["val"] for variant in collect(runs, "relay_tools").values() for seed in variant.values())


def test_wall_time_sums_the_step_times():
    # steps 1, 2, 3 take 2, 3, 5 s: trained for 2, 5, 10 s at their ends; step 0 (before training) 0 s
    assert wall_times({STEP_TIME_KEY: {2: 3.0, 1: 2.0, 3: 5.0}}) == {0: 0.0, 1: 2.0, 2: 5.0, 3: 10.0}


def test_report_writes_table_and_plot(tmp_path, capsys):
    out = tmp_path / "docs"
    main(["report", "--task", "relay_tools", "--runs", str(_runs(tmp_path / "runs")), "--out", str(out)])
    table = (out / "relay_tools_baselines.md").read_text()
    assert "held-out exact accuracy" in table
    assert "| joint | 2 | 4 | 40 | 0.000 | 0.400 ± 0.141 |" in table
    assert (out / "relay_tools_baselines.png").stat().st_size > 1000
    assert "joint" in capsys.readouterr().out


def test_report_without_runs_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="no finished run"):
        main(["report", "--runs", str(tmp_path), "--out", str(tmp_path / "o")])


def test_every_variant_is_one_switch_of_the_same_config():
    assert VARIANTS["joint"] == ()
    assert "multi_agent.agents.sub.trainable=false" in VARIANTS["frozen"]
    assert "multi_agent.agents.sub.share_model_with=main" in VARIANTS["single"]
    assert "single_both" not in VARIANTS  # relay_tools' own variant: its warm start is the task's (below)
    # shared reward: the sub-agent's effective score is the main agent's score alone (no local term)
    assert set(VARIANTS["shared_reward"]) == {
        "multi_agent.mgrpo.sub_reward_local_weight=0", "multi_agent.mgrpo.sub_reward_main_weight=1"
    }


def test_single_agent_on_relay_tools_has_the_sub_agents_tool():
    """On relay_tools the one shared model plays the sub role with its own (main) config: the variant gives that
    config the read_secret tool, or no role could read the secret."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from mgrpo_verl.launcher.resolvers import register_resolvers

    register_resolvers()
    overrides = ["task=relay_tools", *task_variants("relay_tools")["single"]]
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        cfg = compose("mgrpo_trainer", overrides=overrides)
    path = OmegaConf.select(cfg, "actor_rollout_ref.rollout.multi_turn.tool_config_path")  # resolves this node only
    assert path.endswith("relay_sub_tools.yaml") and OmegaConf.select(cfg, "multi_agent.agents.sub.share_model_with") == "main"


def test_single_both_starts_from_the_checkpoint_warm_started_on_both_roles():
    """relay_tools' warm start fine-tunes the sub-agent from the main agent's checkpoint (sub_model: main), so the
    sub-agent's checkpoint has seen both roles' demonstrations: single_both plays both roles from it, with the tool."""
    from hydra import compose, initialize_config_module

    from mgrpo_verl.warmstart.build import FROM_MAIN, WarmStartSpec

    assert WarmStartSpec().sub_model == FROM_MAIN
    overrides = ["task=relay_tools", *task_variants("relay_tools")["single_both"]]
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        cfg = compose("mgrpo_trainer", overrides=overrides)
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(cfg.actor_rollout_ref.model, resolve=False)  # unresolved: no warm start built
    assert model["path"] == "${multi_agent.agents.sub.actor_rollout_ref.model.path}"
    assert set(task_variants("relay_tools")["single"]) < set(task_variants("relay_tools")["single_both"])
    assert "single_both" not in task_variants("relay")  # no warm start there: it would repeat single


def test_run_refuses_a_variant_the_task_does_not_have(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", "--task", "relay", "--out", str(tmp_path), "--variants", "joint", "single_both"])
    assert "['single_both'] are not variants of task 'relay'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before any run started


def test_run_starts_each_variant_with_its_task_overrides_and_skips_finished_runs(tmp_path, monkeypatch):
    """``run`` launches main_ppo once per (variant, seed) with the task's overrides of that variant and the extra
    ones last, and skips a run that finished before (a re-run of a cut-short sweep)."""
    import mgrpo_verl.experiments.baselines as baselines

    launched = []
    monkeypatch.setattr(baselines, "run_logged", lambda args, log, label: launched.append(args) or 7.0)
    (tmp_path / "joint" / "seed1").mkdir(parents=True)
    (tmp_path / "joint" / "seed1" / "done").write_text("5\n")
    main(["run", "--task", "relay_tools", "--out", str(tmp_path), "--seeds", "0", "1", "--steps", "3",
          "--variants", "joint", "single_both", "--", "x.extra=1"])  # fmt: skip
    assert [(a[a.index("-m") + 1], a[3]) for a in launched] == [("mgrpo_verl.main_ppo", "task=relay_tools")] * 3
    names = [next(o for o in a if o.startswith("trainer.experiment_name=")) for a in launched]
    assert names == [f"trainer.experiment_name=relay_tools_{v}" for v in ("joint_seed0", "single_both_seed0", "single_both_seed1")]
    single_both = launched[1]
    assert single_both[-3:] == [*task_variants("relay_tools")["single_both"][-2:], "x.extra=1"]
    assert "multi_agent.agents.sub.share_model_with=main" in single_both and "data.seed=0" in single_both
    assert (tmp_path / "single_both" / "seed1" / "done").read_text() == "7\n"
