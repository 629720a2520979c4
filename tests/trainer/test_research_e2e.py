"""Deep research end to end on CPU, through the real entry points:

1. ``python -m mgrpo_verl.main_ppo research=cpu`` trains the tiny main agent and the tiny
   sub-agent (each its own model) on the built-in multi-hop questions for 2 steps: forced delegation, the
   sub-agent's prompt holding BM25 hits from the offline corpus, token-F1 rewards; validation before and
   after, a checkpoint at step 2.
2. ``mgrpo_verl.envs.research.loaders.convert`` turns the GAIA fixture (published layout) into a parquet.
3. ``mgrpo_verl.experiments.research_eval run`` evaluates the step-2 checkpoint (joint) and the untrained
   single-agent baseline on the built-in validation questions plus that GAIA file, each a val-only run of
   the trainer, and ``report`` writes the paper-style table with per-agent statistics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from e2e import MainPPO

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "envs" / "research" / "fixtures"
VAL = "val-core/mgrpo_verl/research/wiki_multihop/acc/mean@1"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Step 1 of the module docstring: the training run (its ``MainPPO``, for the checkpoint and the private home)."""
    main_ppo = MainPPO(tmp_path_factory.mktemp("research"))
    run = main_ppo("train", "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=2",
                   "data.val_max_samples=16", "research=cpu")  # fmt: skip
    return main_ppo, run


def test_train_on_builtin_questions(trained):
    main_ppo, run = trained
    assert run.returncode == 0, run.log[-4000:]
    for step in (1, 2):
        m = run.at(step)
        # B = 4 questions x n = 4 rollouts; forced delegation calls the sub-agent 1 or 2 times per rollout
        assert m["agent/main/rows"] == 16 and 16 <= m["agent/sub/rows"] <= 32
        for agent in ("main", "sub"):
            assert math.isfinite(m[f"agent/{agent}/actor/pg_loss"])
        assert 0.0 <= m["agent/main/score/mean"] <= 1.0
    for step in (0, 2):  # validation: F1 in [0, 1], at least one sub-agent call per query, tokens counted
        m = run.at(step)
        assert 0.0 <= m[VAL] <= 1.0
        assert m["val-aux/mgrpo_verl/research/wiki_multihop/calls/mean@1"] >= 1
        assert m["val-aux/mgrpo_verl/research/wiki_multihop/sub_tokens/mean@1"] > 0
    checkpoint = main_ppo.checkpoints / "global_step_2"
    assert (checkpoint / "agents" / "sub" / "actor").is_dir()


# full: two more trainer runs (val-only), ~3 min on 2 cores; the training above and the evaluation's parts
# (tests/experiments, tests/envs/research) stay in CI
@pytest.mark.full
def test_evaluate_the_checkpoint_and_the_untrained_baseline_on_builtin_questions_and_gaia(trained, tmp_path, monkeypatch):
    main_ppo, run = trained
    assert run.returncode == 0, run.log[-4000:]
    checkpoint = main_ppo.checkpoints / "global_step_2"
    from mgrpo_verl.envs.research import loaders
    from mgrpo_verl.experiments import research_eval

    gaia = loaders.convert("gaia", FIXTURES / "gaia" / "2023" / "validation", tmp_path / "gaia.parquet", report=lambda *_: None)
    # the evaluation's trainer processes get the same private home and cache as the training run
    monkeypatch.setenv("HOME", str(main_ppo.home))
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(main_ppo.cache))
    monkeypatch.setenv("RAY_DEDUP_LOGS", "0")
    for key in ("VERL_PLATFORM", "MGRPO_VERL_DEVICE", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    out = tmp_path / "eval"
    research_eval.main(["run", "--out", str(out), "--system", f"joint={checkpoint}", "--system", "single=untrained",
                        "--benchmark", "builtin", "--benchmark", str(gaia)])  # fmt: skip
    for system in ("joint", "single"):
        log = (out / system / "log.txt").read_text()
        assert (out / system / "done").is_file(), log[-3000:]
    # verl names the dump by the global step: the joint system resumed step 2, the untrained one starts at 0
    assert [p.name for p in (out / "joint" / "generations").glob("*.jsonl")] == ["2.jsonl"]
    assert [p.name for p in (out / "single" / "generations").glob("*.jsonl")] == ["0.jsonl"]

    text = research_eval.report(out, tmp_path / "table")
    summary = json.loads((tmp_path / "table" / "research_eval.json").read_text())
    n_gaia = len(loaders.load_gaia(FIXTURES / "gaia" / "2023" / "validation"))
    for system in ("joint", "single"):
        accuracy = summary[system]["accuracy"]
        assert accuracy["gaia"]["all"][1] == n_gaia  # every text-only GAIA question evaluated once
        assert accuracy["wiki_multihop"]["all"][1] == 64  # the built-in validation split
        assert set(accuracy["wiki_multihop"]) == {"1", "2", "all"}
        stats = summary[system]["stats"]
        assert stats["calls"] >= 1 and stats["main_tokens"] > 0 and stats["sub_tokens"] > 0
    assert "| joint |" in text and "| single |" in text and "gaia L1" in text
