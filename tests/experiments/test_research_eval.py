"""The research evaluation command: system / benchmark specs, the evaluation command line, and the report
from a validation dump in verl's format (written here by hand, as verl's ``_write_generations`` writes it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mgrpo_verl.experiments import logged_run, research_eval
from mgrpo_verl.experiments.research_eval import System


def _dump_line(uid: str, gts: list[str], answer: str, source: str, level: str, **stats) -> dict:
    """One row of verl's validation dump: input/output/gts/score/step plus the query's reward_extra_info."""
    info = {"acc": 0.0, "calls": 1, "failed_calls": 0, "main_tokens": 10, "sub_tokens": 20, **stats}
    return {"input": "q", "output": "o", "gts": json.dumps(gts), "score": 0.0, "step": 3, "reward": 0.0,
            **info, "answer": answer, "source": source, "level": level, "id": "", "uid": uid}  # fmt: skip


def _write_dump(directory, lines):
    directory.mkdir(parents=True)
    (directory / "3.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_system_specs(tmp_path):
    step = tmp_path / "ckpt" / "global_step_7"
    step.mkdir(parents=True)
    assert System.parse(f"joint={step}") == System("joint", "joint", step.resolve())
    assert System.parse(f"mine:frozen={step}") == System("mine", "frozen", step.resolve())
    assert System.parse("single=untrained") == System("single", "single", None)
    for bad, message in [("joint", "NAME=PATH"), ("=x", "NAME=PATH"), ("other=untrained", "unknown variant"),
                         (f"joint={tmp_path}", "global_step_N"), ("joint=/no/such/global_step_1", "global_step_N")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            System.parse(bad)


def test_benchmark_specs(tmp_path):
    assert research_eval.parse_benchmark("builtin") is None
    f = tmp_path / "b.parquet"
    f.write_bytes(b"x")
    assert research_eval.parse_benchmark(str(f)) == f.resolve()
    with pytest.raises(ValueError, match="no such file"):
        research_eval.parse_benchmark(str(tmp_path / "missing.parquet"))


def test_eval_command_is_a_val_only_run_of_the_checkpoint_with_the_variant(tmp_path):
    step = tmp_path / "global_step_5"
    step.mkdir()
    cmd = research_eval.eval_command(System.parse(f"single={step}"), ["/d/a.parquet", "/d/b.parquet"], tmp_path / "out",
                                     "cpu", ["x.y=1"])  # fmt: skip
    assert cmd[1:5] == ["-m", "mgrpo_verl.main_ppo", "research=cpu", "task=relay"]
    assert "trainer.val_only=true" in cmd and 'data.val_files=["/d/a.parquet","/d/b.parquet"]' in cmd
    assert f"trainer.resume_from_path={step.resolve()}" in cmd and "trainer.resume_mode=resume_path" in cmd
    assert f"trainer.validation_data_dir={tmp_path / 'out' / 'generations'}" in cmd
    assert f"mgrpo_verl.metrics_file={tmp_path / 'out' / 'metrics.jsonl'}" in cmd  # verl's val metrics kept too
    assert "multi_agent.agents.sub.share_model_with=main" in cmd and cmd[-1] == "x.y=1"
    untrained = research_eval.eval_command(System.parse("joint=untrained"), ["/d/a.parquet"], tmp_path, "c", [])
    assert "trainer.resume_mode=disable" in untrained


def test_report_rescores_answers_and_groups_by_source_and_level(tmp_path):
    runs = tmp_path / "runs"
    # system A: gaia L1 "Paris" right (EM 1), gaia L2 wrong, wiki right with an extra word (EM 0, F1 2/3:
    # prediction "river seine" vs "seine": precision 1/2, recall 1/1 -> F1 = 2 * .5 * 1 / 1.5 = 2/3)
    _write_dump(runs / "A" / "generations", [
        _dump_line("u1_0_0", ["Paris"], "Answer: Paris", "gaia", "1", calls=2, **{"tool/search": 3}),
        _dump_line("u1_0_1", ["Paris"], "Answer: Paris", "gaia", "1", calls=2, **{"tool/search": 3}),  # same query
        _dump_line("u2_0_0", ["Rome"], "Answer: Milan", "gaia", "2", calls=0),
        _dump_line("u3_0_0", ["Seine"], "Answer: river Seine", "wiki_multihop", "2", calls=1, **{"tool/search": 1}),
    ])  # fmt: skip
    (runs / "A" / "done").write_text("1\n")
    _write_dump(runs / "B" / "generations", [_dump_line("v1_0_0", ["Paris"], "no idea", "gaia", "1")])
    (runs / "B" / "done").write_text("1\n")
    (runs / "C").mkdir()  # not finished: ignored

    text = research_eval.report(runs, tmp_path / "out", metric="em")
    summary = json.loads((tmp_path / "out" / "research_eval.json").read_text())
    a = summary["A"]
    assert a["accuracy"]["gaia"] == {"1": [1.0, 1], "2": [0.0, 1], "all": [0.5, 2]}
    assert a["accuracy"]["wiki_multihop"] == {"2": [0.0, 1], "all": [0.0, 1]}
    # per query (3 queries): calls (2 + 0 + 1) / 3 = 1; search (3 + 0 + 1) / 3 (a query without the key counts 0)
    assert a["stats"]["calls"] == pytest.approx(1.0) and a["stats"]["tool/search"] == pytest.approx(4 / 3)
    assert summary["B"]["accuracy"]["gaia"]["all"] == [0.0, 1] and "C" not in summary
    assert "| A | 100.0 | 0.0 | 50.0 | 0.0 | 0.0 |" in text and "| n | 1 | 1 | 2 | 1 | 1 |" in text
    f1 = json.loads(json.dumps(research_eval.summarize(
        {"A": [research_eval.score_query(q) for q in research_eval.read_queries(runs / "A" / "generations")]}, "f1")))
    assert f1["A"]["accuracy"]["wiki_multihop"]["all"][0] == pytest.approx(2 / 3)  # fmt: skip


def test_report_errors(tmp_path):
    with pytest.raises(SystemExit, match="no evaluated system"):
        research_eval.report(tmp_path, tmp_path / "out")
    (tmp_path / "X" / "generations").mkdir(parents=True)
    (tmp_path / "X" / "done").write_text("1")
    with pytest.raises(FileNotFoundError, match="no validation dump"):
        research_eval.report(tmp_path, tmp_path / "out")
    (tmp_path / "X" / "generations" / "0.jsonl").write_text(json.dumps({"uid": "a_0_0", "gts": "x"}) + "\n")
    with pytest.raises(ValueError, match="research rollout's statistics"):
        research_eval.report(tmp_path, tmp_path / "out")
    assert math.isnan(research_eval._mean([]))


def test_train_runs_each_variant_once_with_its_switches(tmp_path, monkeypatch):
    """``train``: one main_ppo process per variant with the variant's overrides; a finished variant is
    skipped on a second call; a run that leaves no checkpoint is an error."""
    calls = []

    def fake_run(args, log_path, label, **kwargs):
        calls.append(args)
        out = next(a.split("=", 1)[1] for a in args if a.startswith("trainer.default_local_dir="))
        (Path(out) / "global_step_3").mkdir(parents=True)
        return 0

    monkeypatch.setattr(logged_run, "run_streamed", fake_run)
    got = research_eval.train_all(tmp_path, ["joint", "single"], 3, "cpu", ["x=1"])
    assert got == {"joint": tmp_path / "joint" / "global_step_3", "single": tmp_path / "single" / "global_step_3"}
    assert [c[3] for c in calls] == ["research=cpu", "research=cpu"]
    assert "multi_agent.agents.sub.share_model_with=main" in calls[1] and calls[1][-1] == "x=1"
    assert "multi_agent.agents.sub.share_model_with=main" not in calls[0]
    research_eval.train_all(tmp_path, ["joint", "single"], 3, "cpu", [])
    assert len(calls) == 2  # both trained already

    monkeypatch.setattr(logged_run, "run_streamed", lambda args, log_path, label, **kw: 1)
    with pytest.raises(SystemExit, match="frozen training failed"):
        research_eval.train_all(tmp_path, ["frozen"], 3, "cpu", [])


def test_read_queries_takes_the_latest_step_of_the_dump(tmp_path):
    """verl names each validation dump by its step; the latest is 10.jsonl, not 2.jsonl (which sorts last)."""
    (tmp_path / "2.jsonl").write_text(json.dumps(_dump_line("a_0_0", ["x"], "Answer: old", "gaia", "1")) + "\n")
    (tmp_path / "10.jsonl").write_text(json.dumps(_dump_line("b_0_0", ["x"], "Answer: new", "gaia", "1")) + "\n")
    assert [q["answer"] for q in research_eval.read_queries(tmp_path)] == ["Answer: new"]
