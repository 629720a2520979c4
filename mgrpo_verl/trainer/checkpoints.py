"""All-or-nothing multi-agent checkpoints: a ``global_step_N`` folder counts only when it is complete.

What differs from verl, and why: verl's trainer saves one actor, lets the worker's checkpoint manager
delete older actor folders (``max_ckpt_to_keep``) right after that actor is saved, and trusts
``latest_checkpointed_iteration.txt``. With one actor per agent that leaves a window (agent A saved and
its old folder deleted, agent B not yet) where a kill loses the only usable checkpoint, and resume then
silently starts from base weights. Here:

- the save writes every trainable agent's actor, ``data.pt``, ``agents.json``, then a completion marker
  (:data:`MARKER`) last in the step folder, then the tracker, both atomically (temp file + ``os.replace``);
- durable against an OS crash or power loss, not only a kill: the marker is written only once every file and
  folder of the step is on disk (:func:`write_marker`: ``fsync`` of the tree verl and we wrote), and each atomic
  write also flushes its folder, so the rename that publishes it survives too; verl's own save fsyncs nothing;
- verl's per-worker pruning is off (``max_ckpt_to_keep=None``); :func:`prune` removes whole older
  *complete* step folders once the tracker names the new one, keeping the newest ``keep``;
- resume considers complete folders only (:func:`missing_parts`); folders from before the marker existed
  count as complete when every trainable agent's actor folder, ``data.pt`` and ``agents.json`` are there.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile

logger = logging.getLogger(__name__)

MARKER = "checkpoint_complete.json"
"""Written last in a step folder: ``{"global_step": N, "agents": [trainable agents saved]}``."""
TRACKER = "latest_checkpointed_iteration.txt"
MANIFEST = "agents.json"
DATA = "data.pt"
_STEP = re.compile(r"^global_step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint to resume from is incomplete or missing, and no complete one may replace it."""


def actor_subdir(agent: str) -> str:
    return os.path.join("agents", agent, "actor")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def step_of(folder: str) -> int | None:
    """N of a ``global_step_N`` folder (path or name), else None."""
    m = _STEP.match(os.path.basename(os.path.normpath(folder)))
    return int(m.group(1)) if m else None


def write_atomic(path: str, text: str) -> None:
    """``path`` holds either its old content or ``text``, never a part, also after an OS crash: temp file in
    the same folder, fsync, ``os.replace``, fsync of the folder (the rename itself)."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_path(folder)


def fsync_path(path: str | os.PathLike) -> None:
    """``fsync`` a file or a folder (a folder's entries: the names created or renamed in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str | os.PathLike) -> None:
    """Flush everything under ``folder`` to disk: each file, then each folder deepest first, then ``folder``'s
    own entry in its parent."""
    dirs = []
    for here, _subdirs, files in os.walk(folder):
        for name in files:
            fsync_path(os.path.join(here, name))
        dirs.append(here)
    for here in reversed(dirs):  # os.walk lists a folder before its subfolders
        fsync_path(here)
    fsync_path(os.path.dirname(os.path.abspath(folder)))


def write_marker(folder: str, step: int, agents: list[str]) -> None:
    """The completion marker of ``folder``, written only after everything already in it is on disk
    (:func:`fsync_tree`): after a power loss the marker never vouches for files that did not reach the disk."""
    fsync_tree(folder)
    write_atomic(os.path.join(folder, MARKER), json.dumps({"global_step": step, "agents": agents}))


def read_marker(folder: str) -> dict | None:
    """The marker's content; None when there is none or it is unreadable."""
    try:
        with open(os.path.join(folder, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("agents"), list) else None


def missing_parts(folder: str, trainable: list[str]) -> list[str]:
    """What keeps ``folder`` from being a complete checkpoint (empty list: complete).

    With a marker: the parts it vouches for (``agents.json``, ``data.pt``, each saved agent's actor).
    Without one (folders saved before the marker existed, or a save cut short): ``agents.json``, ``data.pt``
    and the actor folder of each of ``trainable`` that ``agents.json`` does not list as frozen (the old save
    wrote ``agents.json`` last)."""
    if not os.path.isdir(folder):
        return ["the folder itself"]
    if os.path.exists(os.path.join(folder, MARKER)):
        marker = read_marker(folder)
        if marker is None:
            return [f"a readable {MARKER}"]
        parts = [MANIFEST, DATA, *(actor_subdir(a) for a in marker["agents"])]
        return [p for p in parts if not os.path.exists(os.path.join(folder, p))]
    # the old format wrote the actors, data.pt, agents.json in that order: all there means complete
    frozen = frozen_when_saved(folder)
    parts = [MANIFEST, DATA, *(actor_subdir(a) for a in trainable if a not in frozen)]
    missing = [p for p in parts if not os.path.exists(os.path.join(folder, p))]
    return missing and [MARKER, *missing]


def frozen_when_saved(folder: str) -> set[str]:
    """Agents that ``folder``'s ``agents.json`` lists as not trainable (their weights were the model path's)."""
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return set()
    if not isinstance(manifest, dict):
        return set()
    return {name for name, entry in manifest.items() if isinstance(entry, dict) and entry.get("trainable") is False}


def step_folders(root: str) -> dict[int, str]:
    """step -> folder of every ``global_step_N`` folder directly under ``root``."""
    if not os.path.isdir(root):
        return {}
    out = {}
    for name in os.listdir(root):
        step = step_of(name)
        if step is not None and os.path.isdir(os.path.join(root, name)):
            out[step] = os.path.join(root, name)
    return dict(sorted(out.items()))


def read_tracker(root: str) -> tuple[int | None, str | None]:
    """(step, None) from ``root``'s tracker, or (None, why not): ``"missing"`` or a description."""
    path = os.path.join(root, TRACKER)
    if not os.path.exists(path):
        return None, "missing"
    try:
        with open(path) as f:
            text = f.read()
    except OSError as err:
        return None, f"unreadable ({err})"
    try:
        return int(text.strip()), None
    except ValueError:
        return None, f"holds {text[:40]!r}, not a step number"


def choose_auto(root: str, trainable: list[str]) -> str | None:
    """The folder ``resume_mode=auto`` resumes from: the tracker's step when complete; otherwise the newest
    complete one, with a WARNING naming what was passed over. None only when there is no ``global_step_N``
    folder and no tracker. Raises :class:`CheckpointError` when folders or a tracker exist but none is complete
    (resuming from base weights would silently contradict them)."""
    folders = step_folders(root)
    step, problem = read_tracker(root)
    if step is None and problem == "missing" and not folders:
        return None
    complete = {s: f for s, f in folders.items() if not missing_parts(f, trainable)}
    tracker = os.path.join(root, TRACKER)
    if step is not None:
        wanted = step_dir(root, step)
        missing = missing_parts(wanted, trainable)
        if not missing:
            return wanted
        reason = f"{tracker} names {wanted}, which lacks {', '.join(missing)}"
    elif problem == "missing":
        reason = f"{tracker} is missing"
    else:
        reason = f"{tracker} {problem}"
    if not complete:
        incomplete = "; ".join(f"{f} lacks {', '.join(missing_parts(f, trainable))}" for f in folders.values())
        raise CheckpointError(
            f"resume_mode=auto: {reason}, and no complete checkpoint is in {root}"
            + (f" ({incomplete})" if incomplete else "")
            + ". Set trainer.resume_mode=disable to train from the base models, or trainer.resume_mode=resume_path "
            "with trainer.resume_from_path naming a complete global_step_N folder."
        )
    chosen = complete[max(complete)]
    logger.warning("resume_mode=auto: %s; resuming from the newest complete checkpoint %s instead", reason, chosen)
    return chosen


def check_resume_path(folder: str, trainable: list[str]) -> str:
    """``folder`` itself when complete, else :class:`CheckpointError` naming it and what it lacks."""
    missing = missing_parts(folder, trainable)
    if missing:
        raise CheckpointError(
            f"trainer.resume_from_path={folder} is not a complete checkpoint: it lacks {', '.join(missing)} "
            "(a save cut short). Name a complete global_step_N folder, or set trainer.resume_mode=auto to "
            "take the newest complete one."
        )
    return folder


def resume_folder(resume_mode: str, resume_from_path, default_local_dir: str, trainable: list[str]) -> str | None:
    """The complete step folder a run resumes from (``trainer.resume_mode`` / ``resume_from_path`` /
    ``default_local_dir``, relative paths against the current directory), or None for ``disable`` / nothing saved
    yet: the trainer's rule (``MultiAgentTrainer._resume_folder``), which the launcher's pre-flight applies too.
    ``auto``: :func:`choose_auto`; ``resume_path``: :func:`check_resume_path`. Raises ``ValueError`` for a bad mode
    or path, :class:`CheckpointError` for an incomplete checkpoint."""
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        if not isinstance(resume_from_path, str) or step_of(resume_from_path) is None:
            raise ValueError(f"trainer.resume_from_path must name a global_step_N folder, got {resume_from_path!r}")
        return check_resume_path(os.path.abspath(resume_from_path), trainable)
    if resume_mode != "auto":
        raise ValueError(f"trainer.resume_mode must be auto, disable or resume_path, got {resume_mode!r}")
    return choose_auto(os.path.abspath(default_local_dir), trainable)


def remove_folder(folder: str) -> None:
    """Rename out of the ``global_step_N`` namespace (atomic), then delete: a kill midway never leaves a
    half-deleted folder that looks like a checkpoint."""
    doomed = os.path.join(os.path.dirname(folder), f".deleting.{os.path.basename(folder)}")
    if os.path.exists(doomed):
        shutil.rmtree(doomed)
    os.rename(folder, doomed)
    shutil.rmtree(doomed)


def prune(root: str, current: int, keep: int | None, trainable: list[str]) -> list[str]:
    """Delete complete step folders older than the newest ``keep`` complete ones up to ``current`` (the step
    just saved, which the tracker names). Never deletes an incomplete folder, nor one after ``current`` (left
    by a run that resumed from an earlier step; replaced when training reaches it). ``keep`` None or < 1:
    keep all. Returns the folders deleted."""
    if not keep or keep < 1:
        return []
    for name in os.listdir(root):  # leftovers of a deletion that was killed
        if name.startswith(".deleting.global_step_"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    complete = [f for s, f in step_folders(root).items() if s <= current and not missing_parts(f, trainable)]
    doomed = complete[:-keep]
    for folder in doomed:
        remove_folder(folder)
        logger.info("pruned checkpoint %s (trainer.max_actor_ckpt_to_keep=%d)", folder, keep)
    return doomed
