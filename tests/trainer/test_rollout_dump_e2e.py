"""End to end on CPU: the rollout dumps of a short run of the real entry point, and the viewer's page of them in a
headless browser (docs/rollouts.md).

The run of ``python -m mgrpo_verl.main_ppo`` that test_multi_agent_e2e.py checks (conftest.py's ``two_agent_job``:
tiny main and sub models, dense scorer, a simulated two-node cluster), 2 steps, validation before training and after
step 2, with ``trainer.rollout_data_dir``, ``trainer.validation_data_dir`` and verl's tensorboard logger on. What the
dump must say is checked against what the run logged itself (its metrics file):

- every training row of a step is in ``<rollout_data_dir>/<step>.jsonl``: ``agent/<name>/rows`` rows per agent,
  their mean score and advantage ``agent/<name>/score/mean`` / ``advantages/mean``;
- every sub row's parent is a main row of the same file, and each main row has as many sub rows as its calls;
- the alignment fates add up to the sub-agent's update: one slot per kept row, plus its duplicates, plus its
  borrowed copies, plus the main rows' padding slots = ``agent/sub/update_rows`` (``n_main * D_max``);
- each main row's turns are the relay's plan (model), observation (env: "Helper ..."), answer (model);
- validation rows (``<validation_data_dir>/agents/<step>.jsonl``) beside verl's own ``<step>.jsonl``;
- a table of sample trajectories per agent in tensorboard (``rollouts/train/<agent>``);
- the page (``python -m mgrpo_verl.viewer``) in Chromium: no script error, and every row of the run in the tree
  under its own parent.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from e2e import MAIN_ROWS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "viewer"))

from browser import dump_dom, parse  # noqa: E402

pytestmark = pytest.mark.slow


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def dumped(two_agent_job):
    run = two_agent_job.run
    assert run.returncode == 0, run.log[-6000:]
    assert run.steps() == [1, 2]
    return run, two_agent_job.dumps


def test_training_dump_matches_the_step(dumped):
    run, out = dumped
    for step in (1, 2):
        rows, m = read(out / "rollouts" / f"{step}.jsonl"), run.at(step)
        assert {r["step"] for r in rows} == {step} and {r["split"] for r in rows} == {"train"}
        by_agent = defaultdict(list)
        for r in rows:
            by_agent[r["agent"]].append(r)
        assert sorted(by_agent) == ["main", "sub"] and len(by_agent["main"]) == MAIN_ROWS
        for agent, mine in by_agent.items():
            assert len(mine) == m[f"agent/{agent}/rows"]
            assert math.isclose(sum(r["score"] for r in mine) / len(mine), m[f"agent/{agent}/score/mean"], abs_tol=1e-6)
            assert math.isclose(sum(r["advantage"] for r in mine) / len(mine), m[f"agent/{agent}/advantages/mean"], abs_tol=1e-6)
            assert all(r["trainable"] for r in mine)
        # parents resolve within the step, and each main row has one sub row per call
        mains = {r["traj_id"]: r for r in by_agent["main"]}
        children = defaultdict(list)
        for r in by_agent["sub"]:
            assert r["parent_traj_id"] in mains and r["uid"] == mains[r["parent_traj_id"]]["uid"]
            children[r["parent_traj_id"]].append(r)
        for traj, r in mains.items():
            assert r["parent_traj_id"] == "" and len(children[traj]) == r["calls"] - r["failed_calls"]
            assert [t["role"] for t in r["turns"]] == ["model", "env", "model"]
            assert "Helper" in r["turns"][1]["text"]
        # the fates add up to the sub-agent's update: D_max slots per main rollout
        d_max = int(m["mgrpo/align/sub/d_max"])
        slots = sum((r["fate"]["kind"] != "dropped") + r["fate"]["copies"] + r["fate"]["borrowed"] for r in by_agent["sub"])
        slots += sum(r["fate"].get("padding", {}).get("sub", 0) for r in by_agent["main"])
        assert slots == m["agent/sub/update_rows"] == MAIN_ROWS * d_max
        assert sum(r["fate"]["kind"] == "dropped" for r in by_agent["sub"]) == m["mgrpo/align/sub/dropped"]
        assert sum(r["fate"]["copies"] for r in by_agent["sub"]) == m["mgrpo/align/sub/duplicated"]
        assert sum(r["fate"]["borrowed"] for r in by_agent["sub"]) == m["mgrpo/align/sub/borrowed"]
        assert all(r["fate"]["kind"] == "kept" for r in by_agent["main"])


def test_validation_dump_beside_verls(dumped):
    _, out = dumped
    for step in (0, 2):
        ours, verls = read(out / "validation" / "agents" / f"{step}.jsonl"), read(out / "validation" / f"{step}.jsonl")
        assert len(ours) == len(verls) and {r["split"] for r in ours} == {"val"}  # every row, as verl's dump
        assert all(r["advantage"] is None and r["fate"] is None for r in ours)
        mains = {r["traj_id"] for r in ours if r["agent"] == "main"}
        assert mains and all(r["parent_traj_id"] in mains for r in ours if r["agent"] != "main")
        assert {r["key"] for r in ours} == {r["uid"] for r in verls}  # verl's "uid" column is the key
    assert any(r["agent"] == "sub" for step in (0, 2) for r in read(out / "validation" / "agents" / f"{step}.jsonl"))


def test_sample_tables_in_tensorboard(dumped):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, out = dumped
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {f"rollouts/{split}/{agent}/text_summary" for split in ("train", "val") for agent in ("main", "sub")} <= tags
    assert sorted(e.step for e in events.Tensors("rollouts/train/sub/text_summary")) == [1, 2]


def test_page_of_the_run_in_a_headless_browser(dumped, tmp_path):
    _, out = dumped
    page = tmp_path / "page.html"
    # every main rollout of a step shown (validation has 32 per step), so that every row of the run is in the page
    cli = subprocess.run([sys.executable, "-m", "mgrpo_verl.viewer", str(out), "--out", str(page), "--rollouts", "100"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    rows = [r for path in sorted(out.rglob("*.jsonl")) if "traj_id" in path.read_text()[:2000] for r in read(path)]
    nodes = parse(dump_dom(page, tmp_path / "profile"))
    assert nodes.root.get("data-js-errors") == "0" and nodes.body.get("data-ready") == "1"
    assert nodes.parent == {r["traj_id"]: r["parent_traj_id"] or None for r in rows}
    assert {nodes.agent[r["traj_id"]] for r in rows} == {"main", "sub"}
