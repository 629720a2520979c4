"""Multi-agent checkpoints are all or nothing: a save cut short between two agents never costs the last
complete checkpoint, and resume never trains on from base weights while a checkpoint folder exists.

Drives the real ``MultiAgentTrainer._save_checkpoint`` / ``_resume_folder`` / ``_load_checkpoint`` on a
trainer built without Ray (``object.__new__``), with fake worker groups whose ``save_checkpoint`` behaves
like verl's FSDP checkpoint manager (writes the actor folder, then deletes this worker's earlier actor
folders beyond ``max_ckpt_to_keep``: ``BaseCheckpointManager.register_checkpoint``), and whose
``load_checkpoint`` records the folder and the weights it found there.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from mgrpo_verl.trainer import checkpoints as ckpt
from mgrpo_verl.trainer.agents import AgentRuntime
from mgrpo_verl.trainer.per_agent import MultiAgentTrainer


class Killed(BaseException):
    """A simulated kill: not an Exception, so nothing in the save path handles it."""


class FakeWorkerGroup:
    def __init__(self, name: str):
        self.name = name
        self.saved: list[str] = []  # verl's previous_saved_paths, per worker (rank 0)
        self.keeps: list = []
        self.loaded: list[tuple[str, str]] = []
        self.fail_at: int | None = None  # raise at the save of this step

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self.keeps.append(max_ckpt_to_keep)
        if global_step == self.fail_at:
            os.makedirs(local_path, exist_ok=True)
            Path(local_path, "model.pt.partial").write_text("half")
            raise Killed(f"killed while saving {self.name} at step {global_step}")
        os.makedirs(local_path, exist_ok=True)
        Path(local_path, "model.pt").write_text(f"{self.name}@{global_step}")
        self.saved.append(local_path)
        # what verl's FSDP manager does with max_ckpt_to_keep once this actor is saved
        if max_ckpt_to_keep and max_ckpt_to_keep > 0 and len(self.saved) > max_ckpt_to_keep:
            for old in self.saved[: len(self.saved) - max_ckpt_to_keep]:
                shutil.rmtree(old, ignore_errors=True)
            self.saved = self.saved[len(self.saved) - max_ckpt_to_keep:]

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        self.loaded.append((local_path, Path(local_path, "model.pt").read_text()))


class FakeDataloader:
    def __init__(self):
        self.position = 0
        self.restored = None

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.restored = state


class Callback:
    def __init__(self):
        self.saves: list[int] = []

    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        self.saves.append(global_step)


def make_trainer(root: Path, agents=("main", "sub"), frozen=(), keep=None, resume_mode="auto", resume_from_path=None,
                 groups: dict | None = None) -> MultiAgentTrainer:
    trainer = object.__new__(MultiAgentTrainer)
    trainer.config = OmegaConf.create({"trainer": {
        "default_local_dir": str(root), "default_hdfs_dir": None, "max_actor_ckpt_to_keep": keep,
        "resume_mode": resume_mode, "resume_from_path": resume_from_path, "del_local_ckpt_after_load": False,
    }})
    groups = groups if groups is not None else {name: FakeWorkerGroup(name) for name in agents}
    trainer.agents = {
        name: AgentRuntime(
            name=name, trainable=name not in frozen, plays=(name,), worker_group=groups[name],
            config=OmegaConf.create({"actor_rollout_ref": {"model": {"path": f"/models/{name}"}}}),
        )
        for name in agents
    }
    trainer.train_dataloader = FakeDataloader()
    trainer.checkpoint_callback = Callback()
    trainer.global_steps = 0
    return trainer


def save_steps(trainer: MultiAgentTrainer, steps) -> None:
    for step in steps:
        trainer.global_steps = step
        trainer.train_dataloader.position = 10 * step
        trainer._save_checkpoint()


def resume(root: Path, **kwargs) -> MultiAgentTrainer:
    """A fresh trainer (new worker groups, as after a restart) that loads from ``root``."""
    trainer = make_trainer(root, **kwargs)
    trainer._load_checkpoint()
    return trainer


def loaded(trainer: MultiAgentTrainer) -> dict[str, list[tuple[str, str]]]:
    return {name: rt.worker_group.loaded for name, rt in trainer.agents.items()}


def expect_loaded(root: Path, step: int, agents=("main", "sub")) -> dict:
    return {a: [(str(root / f"global_step_{step}" / "agents" / a / "actor"), f"{a}@{step}")] for a in agents}


def steps_on_disk(root: Path) -> list[int]:
    return sorted(int(p.name.split("_")[-1]) for p in root.glob("global_step_*"))


# ------------------------------------------------------------------------------------------------ save


def test_save_writes_marker_then_tracker_and_turns_off_verls_pruning(tmp_path):
    trainer = make_trainer(tmp_path, keep=1)
    save_steps(trainer, [1])
    folder = tmp_path / "global_step_1"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        "agents.json", "agents/main/actor/model.pt", "agents/sub/actor/model.pt", "checkpoint_complete.json", "data.pt",
    ]
    assert json.loads((folder / "checkpoint_complete.json").read_text()) == {"global_step": 1, "agents": ["main", "sub"]}
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    # no temp files left behind by the atomic writes
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]
    for rt in trainer.agents.values():
        assert rt.worker_group.keeps == [None]  # verl's own deletion, per actor, is off
    assert trainer.checkpoint_callback.saves == [1]


class DiskJournal:
    """What reaches the disk, in order: ``("fsync", path)`` for every ``os.fsync`` (the path its descriptor
    names), ``("replace", dst)`` for every ``os.replace``, ``("rename", src)`` for every ``os.rename`` (how
    :func:`ckpt.remove_folder` starts a deletion)."""

    def __init__(self, monkeypatch):
        self.events: list[tuple[str, str]] = []
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

        def fsync(fd):
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            return real_fsync(fd)

        def replace(src, dst, **kwargs):
            real_replace(src, dst, **kwargs)
            self.events.append(("replace", str(dst)))

        def rename(src, dst, **kwargs):
            self.events.append(("rename", str(src)))
            return real_rename(src, dst, **kwargs)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "rename", rename)

    def index(self, event: tuple[str, str]) -> int:
        assert event in self.events, (event, self.events)
        return self.events.index(event)

    def synced_before(self, position: int) -> set[str]:
        return {path for kind, path in self.events[:position] if kind == "fsync"}


def test_every_file_is_on_disk_before_the_marker_and_the_old_step_goes_after_the_tracker(tmp_path, monkeypatch):
    """Issue 29, item 9: an OS crash or power loss, not only a kill. The marker may vouch only for files that
    reached the disk (verl's save fsyncs nothing), and with keep=1 the previous step may go only once the new
    one, marker and tracker included, is durable. On the code before this fix no actor file nor ``data.pt``
    was fsynced before the marker (only the marker's and agents.json's own temp files were)."""
    trainer = make_trainer(tmp_path, keep=1)
    save_steps(trainer, [1])
    journal = DiskJournal(monkeypatch)
    save_steps(trainer, [2])
    folder = tmp_path / "global_step_2"
    marker = journal.index(("replace", str(folder / ckpt.MARKER)))
    synced = journal.synced_before(marker)
    # every file of the step and every folder holding them (their entries), and the step folder's own entry
    files = {str(p) for p in folder.rglob("*") if p.is_file() and p.name != ckpt.MARKER}
    assert files == {str(folder / n) for n in ("agents.json", "data.pt", "agents/main/actor/model.pt", "agents/sub/actor/model.pt")}
    folders = {str(p) for p in folder.rglob("*") if p.is_dir()} | {str(folder), str(tmp_path)}
    assert files <= synced, sorted(files - synced)
    assert folders <= synced, sorted(folders - synced)
    # the marker's and the tracker's renames are made durable (their folders fsynced after them) ...
    assert ("fsync", str(folder)) in journal.events[marker + 1:]
    tracker = journal.index(("replace", str(tmp_path / ckpt.TRACKER)))
    assert tracker > marker
    tracker_durable = journal.events.index(("fsync", str(tmp_path)), tracker)
    # ... and only then does the previous step start to go (keep=1)
    pruned = journal.index(("rename", str(tmp_path / "global_step_1")))
    assert pruned > tracker_durable
    assert steps_on_disk(tmp_path) == [2]


def test_frozen_agent_is_neither_saved_nor_required(tmp_path):
    trainer = make_trainer(tmp_path, frozen=("sub",))
    save_steps(trainer, [1])
    assert not (tmp_path / "global_step_1" / "agents" / "sub").exists()
    assert json.loads((tmp_path / "global_step_1" / "checkpoint_complete.json").read_text())["agents"] == ["main"]
    again = resume(tmp_path, frozen=("sub",))
    assert loaded(again) == {**expect_loaded(tmp_path, 1, ("main",)), "sub": []}


# ------------------------------------------------------------------------------- a save cut short, keep=1


@pytest.mark.parametrize("failure", [Killed, RuntimeError])
def test_save_cut_between_agents_keeps_the_last_complete_checkpoint(tmp_path, failure, caplog):
    groups = {name: FakeWorkerGroup(name) for name in ("main", "sub")}
    trainer = make_trainer(tmp_path, keep=1, groups=groups)
    save_steps(trainer, [1, 2])
    assert steps_on_disk(tmp_path) == [2]  # keep=1 pruned step 1 once step 2 was complete

    # step 3: main's actor is saved, then sub's save dies (a kill, or an exception)
    def die(*args, **kwargs):
        raise failure("sub's save died")

    groups["sub"].save_checkpoint = die
    with pytest.raises(failure):
        save_steps(trainer, [3])
    assert (tmp_path / "global_step_3" / "agents" / "main" / "actor" / "model.pt").read_text() == "main@3"
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    # step 2 is whole: neither verl (max_ckpt_to_keep=None) nor our pruning (not reached) touched it
    assert (tmp_path / "global_step_2" / "agents" / "main" / "actor" / "model.pt").read_text() == "main@2"

    # auto: tracker names step 2, which is complete
    auto = resume(tmp_path)
    assert loaded(auto) == expect_loaded(tmp_path, 2)
    assert auto.global_steps == 2 and auto.train_dataloader.restored == {"position": 20}

    # resume_path to the partial step 3: a clear error naming the folder and what it lacks
    with pytest.raises(ckpt.CheckpointError, match=r"global_step_3 is not a complete checkpoint: it lacks "
                                                   r"checkpoint_complete\.json, agents\.json, data\.pt, agents/sub/actor"):
        resume(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_3"))
    # resume_path to the last complete one loads its weights
    explicit = resume(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_2"))
    assert loaded(explicit) == expect_loaded(tmp_path, 2)

    # the tracker pointing at the partial step (as a writer without the marker would leave it): auto falls back
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
        fallback = resume(tmp_path)
    assert loaded(fallback) == expect_loaded(tmp_path, 2) and fallback.global_steps == 2
    warning = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert str(tmp_path / "global_step_3") in warning and str(tmp_path / "global_step_2") in warning


def test_a_kill_after_the_first_agent_save_with_verls_own_pruning_would_lose_the_checkpoint(tmp_path):
    """The failure this module fixes, shown with the fake's verl semantics: passing keep=1 to the worker
    deletes main's step-1 actor as soon as main's step-2 actor is saved."""
    group = FakeWorkerGroup("main")
    group.save_checkpoint(str(tmp_path / "global_step_1" / "agents" / "main" / "actor"), None, 1, max_ckpt_to_keep=1)
    group.save_checkpoint(str(tmp_path / "global_step_2" / "agents" / "main" / "actor"), None, 2, max_ckpt_to_keep=1)
    assert not (tmp_path / "global_step_1" / "agents" / "main" / "actor").exists()


def test_resumed_run_replaces_the_partial_folder_and_prunes_after_the_tracker(tmp_path):
    groups = {name: FakeWorkerGroup(name) for name in ("main", "sub")}
    trainer = make_trainer(tmp_path, keep=1, groups=groups)
    save_steps(trainer, [1])
    groups["sub"].fail_at = 2
    with pytest.raises(Killed):
        save_steps(trainer, [2])
    assert (tmp_path / "global_step_2" / "agents" / "sub" / "actor" / "model.pt.partial").exists()

    again = resume(tmp_path, keep=1)
    assert loaded(again) == expect_loaded(tmp_path, 1)
    save_steps(again, [2])
    assert steps_on_disk(tmp_path) == [2]
    assert not (tmp_path / "global_step_2" / "agents" / "sub" / "actor" / "model.pt.partial").exists()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert loaded(resume(tmp_path)) == expect_loaded(tmp_path, 2)


# --------------------------------------------------------------------------------------------- tracker


@pytest.mark.parametrize("content", ["", "\n", "two", "3x", None])
def test_empty_garbage_or_missing_tracker_falls_back_to_the_newest_complete_step(tmp_path, content, caplog):
    save_steps(make_trainer(tmp_path), [1, 2])
    if content is None:
        (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    else:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(content)
    with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
        trainer = resume(tmp_path)
    assert loaded(trainer) == expect_loaded(tmp_path, 2) and trainer.global_steps == 2
    assert any("latest_checkpointed_iteration.txt" in r.getMessage() and "global_step_2" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_tracker_naming_a_missing_step_falls_back(tmp_path, caplog):
    save_steps(make_trainer(tmp_path), [1, 2])
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
        trainer = resume(tmp_path)
    assert loaded(trainer) == expect_loaded(tmp_path, 2) and trainer.global_steps == 2
    assert any("global_step_7" in r.getMessage() and "the folder itself" in r.getMessage() for r in caplog.records)


def test_tracker_is_followed_when_it_names_an_older_complete_step(tmp_path):
    save_steps(make_trainer(tmp_path), [1, 2])
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")  # a user rolling back
    assert loaded(resume(tmp_path)) == expect_loaded(tmp_path, 1)


@pytest.mark.parametrize("tracker", [None, "", "2"])
def test_only_incomplete_folders_raise_instead_of_base_weights(tmp_path, tracker):
    groups = {name: FakeWorkerGroup(name) for name in ("main", "sub")}
    groups["sub"].fail_at = 1
    with pytest.raises(Killed):
        save_steps(make_trainer(tmp_path, groups=groups), [1])
    if tracker is not None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(tracker)
    with pytest.raises(ckpt.CheckpointError, match=r"no complete checkpoint.*global_step_1 lacks.*resume_mode=disable"):
        resume(tmp_path)
    # the user's way out: disable trains from the base models
    fresh = resume(tmp_path, resume_mode="disable")
    assert fresh.global_steps == 0 and loaded(fresh) == {"main": [], "sub": []}


def test_tracker_without_any_folder_raises(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")
    with pytest.raises(ckpt.CheckpointError, match=r"names .*global_step_4, which lacks the folder itself"):
        resume(tmp_path)


def test_nothing_saved_yet_trains_from_scratch(tmp_path):
    assert resume(tmp_path).global_steps == 0
    assert resume(tmp_path / "absent").global_steps == 0


def test_resume_path_to_a_missing_folder_names_it(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match=r"global_step_5 is not a complete checkpoint: it lacks the folder itself"):
        resume(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_5"))


# -------------------------------------------------------------------------------------------- pruning


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_pruning_keeps_exactly_the_newest_complete_ones(tmp_path, keep):
    trainer = make_trainer(tmp_path, keep=keep)
    save_steps(trainer, [1, 2, 3, 4, 5])
    assert steps_on_disk(tmp_path) == [1, 2, 3, 4, 5][-keep:]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_pruning_off_keeps_everything(tmp_path):
    save_steps(make_trainer(tmp_path, keep=None), [1, 2, 3])
    assert steps_on_disk(tmp_path) == [1, 2, 3]


def test_pruning_never_counts_nor_deletes_an_incomplete_folder(tmp_path):
    trainer = make_trainer(tmp_path, keep=2)
    save_steps(trainer, [1, 2])
    # an incomplete folder between complete ones (a cut-short save whose run went on from an earlier step)
    partial = tmp_path / "global_step_3" / "agents" / "main" / "actor"
    partial.mkdir(parents=True)
    (partial / "model.pt").write_text("main@3")
    save_steps(trainer, [4])
    # keep=2 counts complete folders only: 2 and 4 stay (3 does not take 2's place); 3 is left alone
    assert steps_on_disk(tmp_path) == [2, 3, 4]
    save_steps(trainer, [5])
    assert steps_on_disk(tmp_path) == [3, 4, 5]


def test_pruning_leaves_folders_after_the_current_step(tmp_path):
    trainer = make_trainer(tmp_path, keep=1)
    save_steps(trainer, [1, 2, 3])
    save_steps(make_trainer(tmp_path, keep=None), [1, 2])  # steps 1 and 2 again, without pruning
    # a run that resumed from step 1 and saves step 2 again: step 3 (after it) stays, step 1 goes
    again = resume(tmp_path, keep=1, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_1"))
    save_steps(again, [2])
    assert steps_on_disk(tmp_path) == [2, 3]
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"


# ------------------------------------------------------------------------------- old folders, no marker


def _old_format(root: Path, step: int, agents) -> None:
    """A step folder as saved before the marker existed (actors, data.pt, agents.json)."""
    (root / f"global_step_{step}").mkdir(parents=True)
    torch.save({"position": 10 * step}, root / f"global_step_{step}" / "data.pt")
    (root / f"global_step_{step}" / "agents.json").write_text("{}")
    for a in agents:
        (root / f"global_step_{step}" / "agents" / a / "actor").mkdir(parents=True)
        (root / f"global_step_{step}" / "agents" / a / "actor" / "model.pt").write_text(f"{a}@{step}")


def test_folders_without_marker_count_when_every_trainable_actor_is_there(tmp_path, caplog):
    _old_format(tmp_path, 1, ("main", "sub"))
    _old_format(tmp_path, 2, ("main",))  # cut short: sub missing
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    with caplog.at_level(logging.WARNING, logger=ckpt.__name__):
        trainer = resume(tmp_path)
    assert loaded(trainer) == expect_loaded(tmp_path, 1) and trainer.train_dataloader.restored == {"position": 10}
    assert any("global_step_2" in r.getMessage() and "agents/sub/actor" in r.getMessage() for r in caplog.records)
    # the same folder is complete for a run in which sub is frozen
    frozen = resume(tmp_path, frozen=("sub",))
    assert loaded(frozen) == {**expect_loaded(tmp_path, 2, ("main",)), "sub": []}
    # and for any run when its agents.json says sub was frozen then
    (tmp_path / "global_step_2" / "agents.json").write_text(json.dumps({"main": {"trainable": True}, "sub": {"trainable": False}}))
    assert loaded(resume(tmp_path)) == {**expect_loaded(tmp_path, 2, ("main",)), "sub": []}


def test_agent_frozen_when_saved_and_trainable_now_starts_from_its_model(tmp_path, caplog):
    save_steps(make_trainer(tmp_path, frozen=("sub",)), [1])
    with caplog.at_level(logging.WARNING, logger="mgrpo_verl.trainer.per_agent"):
        trainer = resume(tmp_path)
    assert loaded(trainer) == {**expect_loaded(tmp_path, 1, ("main",)), "sub": []} and trainer.global_steps == 1
    assert any("'sub' was frozen" in r.getMessage() and "/models/sub" in r.getMessage() for r in caplog.records)


def test_agent_unknown_to_the_checkpoint_raises(tmp_path):
    save_steps(make_trainer(tmp_path, agents=("main",)), [1])
    with pytest.raises(ckpt.CheckpointError, match=r"no weights of agent 'sub'.*saved: \['main'\]"):
        resume(tmp_path)
    assert resume(tmp_path, resume_mode="disable").global_steps == 0
