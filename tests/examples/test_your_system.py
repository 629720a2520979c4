"""docs/your_system.md's commands, run as a user runs them, at a small size; and three models end to end from a
folder outside the package.

``examples/specialists`` is copied to a temporary directory, and every command of the guide's ``bash`` blocks runs
there in order (the test asserts the list, so the guide cannot change without this test seeing it):

- ``bash recipes/setup_env.sh && source .venv/bin/activate`` is skipped (this test runs in that environment) and
  ``cd examples/specialists`` is the copy;
- at a small size: every ``./run.sh`` gets :data:`SMALL` before its own arguments (a shorter warm start than the
  example's, 4 prompts x 4 rollouts, 2 steps, a checkpoint per step); ``compare.py run --seeds 0 1 2`` runs seed 0 of
  the ``single`` variant for 1 step (``joint`` is what the ``./run.sh`` commands ran); ``compare.py report`` writes into
  the copy.

So the first ``./run.sh`` builds the warm start from the copied folder's demonstrations (verl's SFT trainer) and
trains 2 steps with validation; the guide's second ``./run.sh`` (``total_training_steps=5``, rollouts dumped)
resumes from its ``global_step_2`` and trains steps 3-5; the viewer writes the page; ``compare.py`` trains
``single`` (one model in all three roles, from a copy of the warm start's main checkpoint) and tabulates it. Checked
on these runs: every agent trained on rows of its own in every step; each model's rollout server received new
weights from its own actor after every step (three servers, all fingerprints different); the resumed servers start
from the weights the first run ended with; each agent's dumped rows are its own (alice's prompts offer ``read_a``
only, bob's ``read_b`` only, main's the two ``ask_*`` tools); the checkpoint holds the three agents.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))  # the e2e helpers of the trainer tests

from e2e import MainPPO, by_step, read_metrics, synced  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "your_system.md"
EXAMPLE = REPO / "examples" / "specialists"
AGENTS = ("main", "alice", "bob")
#: the guide's commands, in order (continuation lines joined)
COMMANDS = [
    "bash recipes/setup_env.sh && source .venv/bin/activate",
    "cd examples/specialists",
    "./run.sh",
    "./run.sh trainer.total_training_steps=5 trainer.rollout_data_dir=$PWD/outputs/run/rollouts "
    "trainer.validation_data_dir=$PWD/outputs/run/validation",
    "python -m mgrpo_verl.viewer outputs/run",
    "python compare.py run --seeds 0 1 2",
    "python compare.py report --out ../../docs/results",
]
#: the small size: a warm start that teaches main to write both calls (not the example's 250 + 500 and 300 steps,
#: which are what learns: docs/results/specialists_baselines.md), small batches, 2 steps, a checkpoint per step
SMALL = (
    "mgrpo_verl.warmstart.agents.main.steps=120", "mgrpo_verl.warmstart.agents.main.restart_steps=0",
    "mgrpo_verl.warmstart.agents.alice.steps=10", "mgrpo_verl.warmstart.agents.bob.steps=10",
    "mgrpo_verl.warmstart.n_train=64", "mgrpo_verl.warmstart.n_val=16",
    "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.test_freq=2",
    "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true",
)


#: the tests of the guide's runs (~10 min on 2 cores): marked full; CI keeps the command-list test and
#: tests/examples/test_specialists_parts.py
guide_at_its_size = pytest.mark.full


def guide_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [" ".join(line.split("#")[0].split()) for line in lines if line.split("#")[0].strip()]


def small(command: str) -> str:
    words = shlex.split(command)
    if words[0] == "./run.sh":  # the guide's own arguments as written (the shell expands $PWD), after SMALL
        return f"./run.sh {shlex.join(SMALL)}{command[len('./run.sh'):]}"
    if words[:3] == ["python", "compare.py", "run"]:
        assert words[3:] == ["--seeds", "0", "1", "2"], words
        sized = [o for o in SMALL if not o.startswith(("trainer.total_training_steps=", "trainer.save_freq="))]
        return shlex.join(["python", "compare.py", "run", *sized, "trainer.val_before_train=false",
                           "--seeds", "0", "--steps", "1", "--variants", "single"])
    if words[:3] == ["python", "compare.py", "report"]:
        return "python compare.py report --out report"
    return command


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    root = tmp_path_factory.mktemp("guide")
    folder = root / "specialists"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("data", "outputs", "__pycache__"))
    env = MainPPO(root).env({"PYTHON": sys.executable, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    results = []
    for command in guide_commands()[2:]:
        run = small(command)
        proc = subprocess.run(["bash", "-c", run], cwd=folder, env=env, capture_output=True, text=True, timeout=1500)
        results.append((command, proc))
        assert proc.returncode == 0, (run, (proc.stdout + proc.stderr)[-6000:])
    return folder, results


def test_the_guide_lists_these_commands():
    assert guide_commands() == COMMANDS


def _metrics(folder: Path, first: int) -> dict[int, dict]:
    """The merged metrics of the run whose first training step is ``first`` (one metrics file per run; a resumed
    run also logs its validation before training, at the step it resumes from)."""
    for path in sorted((folder / "outputs" / "checkpoints").glob("metrics-*.jsonl")):
        steps = by_step(read_metrics(path))
        if min(_trained(steps), default=None) == first:
            return steps
    raise AssertionError(f"no run starting at step {first}")


def _trained(steps: dict[int, dict]) -> list[int]:
    return sorted(s for s, m in steps.items() if "agent/main/update_rows" in m)


@guide_at_its_size
def test_three_models_train_checkpoint_and_resume(guide):
    folder, results = guide
    (_, first), (_, resumed) = results[0], results[1]
    log, log2 = first.stdout + first.stderr, resumed.stdout + resumed.stderr
    assert "mgrpo_warmstart: " in log  # built here, from the copied folder's demonstrations
    summary = [line for line in log.splitlines() if line.startswith("mgrpo_verl: ") and " steps (" in line]
    assert summary and "never trained" not in summary[-1], summary
    steps = _metrics(folder, 1)
    assert _trained(steps) == [1, 2]
    assert "val-aux/specialists/exact/mean@1" in steps[0] and "val-aux/specialists/exact/mean@1" in steps[2]
    for step in (1, 2):
        m = steps[step]
        for agent in AGENTS:
            assert m[f"agent/{agent}/update_rows"] > 0, (step, agent)
            assert math.isfinite(m[f"agent/{agent}/actor/pg_loss"]), (step, agent)
        for sub in ("alice", "bob"):
            assert m[f"mgrpo/align/{sub}/d_max"] >= 1  # trajectory alignment per sub-agent
    # three rollout servers, one per model; after every step each received new weights, all different
    fingerprints = {replica: synced(log, replica) for replica in range(3)}
    for replica, syncs in fingerprints.items():
        assert [s for s, _ in syncs] == [0, 1, 2], (replica, syncs)
    assert len({fp for syncs in fingerprints.values() for _, fp in syncs}) == 9
    ckpt = folder / "outputs" / "checkpoints" / "global_step_2"
    manifest = json.loads((ckpt / "agents.json").read_text())
    assert set(manifest) == set(AGENTS) and all(manifest[a]["trainable"] for a in AGENTS)
    for agent in AGENTS:
        assert (ckpt / "agents" / agent / "actor").is_dir()
    # the guide's second run resumes at step 3 from the weights the first one ended with
    assert _trained(_metrics(folder, 3)) == [3, 4, 5]
    for replica in range(3):
        assert synced(log2, replica)[0][1] == fingerprints[replica][-1][1]


@guide_at_its_size
def test_each_agents_rows_are_its_own_and_the_page_is_written(guide):
    folder, results = guide
    rows = [json.loads(line) for path in sorted((folder / "outputs" / "run" / "rollouts").glob("*.jsonl"))
            for line in path.read_text().splitlines()]
    by_agent = {agent: [r for r in rows if r["agent"] == agent] for agent in AGENTS}
    assert all(by_agent.values()), {a: len(r) for a, r in by_agent.items()}
    offered = {"main": {"ask_alice", "ask_bob"}, "alice": {"read_a"}, "bob": {"read_b"}}
    for agent, names in offered.items():
        for row in by_agent[agent]:
            present = {n for n in ("ask_alice", "ask_bob", "read_a", "read_b") if f'"name": "{n}"' in row["prompt"]}
            assert present == names, (agent, present)
    for sub in ("alice", "bob"):
        assert all(r["parent_traj_id"].endswith("/main") for r in by_agent[sub])
    page = (folder / "outputs" / "run" / "rollouts.html").read_text()
    assert "ask_alice" in page and "read_b" in page


@guide_at_its_size
def test_compare_trains_the_single_model_baseline_and_tabulates_it(guide):
    folder, results = guide
    command, report = results[-1]
    table = (folder / "report" / "specialists_baselines.md").read_text()
    assert (folder / "outputs" / "compare" / "single" / "seed0" / "done").is_file()
    assert re.search(r"^\| single \| 1 \|", table, re.M), table
    assert report.stdout.strip() in table  # what it printed is what it wrote
