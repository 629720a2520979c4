"""A line per training step on the driver's terminal, read from verl's metrics file while the run lasts.

verl's console logger prints every metric of a step (a few hundred) and its progress bar lives in the TaskRunner
actor, whose output Ray forwards line by line; a newcomer finds neither the step count nor the figure that matters.
:func:`watch_steps` follows the JSON-lines file verl's file logger writes (``VERL_FILE_LOGGER_PATH``) in a thread
and prints, per step, the headline figures (train reward, held-out exact accuracy when validated), the time per
step and an ETA; and once, before the first record, what is starting.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, TextIO

from mgrpo_verl.progress import JsonlFollower, Progress

#: Prefix of every line (the summary line's).
LABEL = "mgrpo_verl:"

#: Held-out exact accuracy: the delegation loops' ``exact`` (the main agent's answer is the ground truth,
#: ``mgrpo_verl.agent_loops.common.exact_match``), averaged by verl's validation as ``val-aux/<source>/exact/mean@n``.
EXACT_PREFIX, EXACT_INFIX = "val-aux/", "/exact/mean@"


def is_exact_key(key: str) -> bool:
    """Whether the metric ``key`` is held-out exact accuracy (:data:`EXACT_PREFIX` ... :data:`EXACT_INFIX`)."""
    return key.startswith(EXACT_PREFIX) and EXACT_INFIX in key


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of verl's ``file`` logger output (one ``{"step": n, "data": {...}}`` per line); blank or bad
    lines (a run cut while writing) are skipped; ``[]`` when the file is missing."""
    records = []
    if not path.is_file():
        return records
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("data"), dict):
            records.append(record)
    return records


def metrics_by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """step -> every metric logged at that step (a step may be logged in several records)."""
    merged: dict[int, dict[str, Any]] = {}
    for record in records:
        merged.setdefault(record["step"], {}).update(record["data"])
    return merged


def read_series(metrics_file: Path, key: Optional[str] = None) -> dict[int, float]:
    """step -> value of ``key`` in verl's JSON-lines metrics file (``None``: held-out exact accuracy, the first
    :func:`is_exact_key` key of each record; step 0 is the validation before training); ``{}`` when the file is
    missing."""
    series: dict[int, float] = {}
    for record in read_metrics(metrics_file):
        data = record["data"]
        name = key if key is not None else next((k for k in data if is_exact_key(k)), None)
        if name is not None and name in data:
            series[record["step"]] = float(data[name])
    return series


def headline(record: dict[str, Any], reward_key: str) -> dict[str, Any]:
    """The figures of one metrics record worth a line: ``reward`` (``reward_key``) and ``held-out exact`` (the
    first :func:`is_exact_key` key), each only when the record has it and it is finite."""
    data = record.get("data") if isinstance(record.get("data"), dict) else {}
    out: dict[str, Any] = {}
    reward = data.get(reward_key)
    if isinstance(reward, (int, float)) and math.isfinite(reward):
        out["reward"] = float(reward)
    exact = next((v for k, v in data.items() if is_exact_key(k)), None)
    if isinstance(exact, (int, float)) and math.isfinite(exact):
        out["held-out exact"] = float(exact)
    return out


class StepWatcher:
    """Prints the steps appended to ``metrics_file`` (:meth:`poll`); :func:`watch_steps` polls it in a thread."""

    def __init__(self, metrics_file: Path, total_steps: int, reward_key: str, stream: Optional[TextIO] = None,
                 clock=None):
        self.follower = JsonlFollower(metrics_file)
        self.reward_key = reward_key
        self.stream = stream if stream is not None else sys.stdout
        kwargs = {} if clock is None else {"clock": clock}
        self.bar = Progress(f"{LABEL} step", total_steps, stream=self.stream, every_s=0.0, live=False, **kwargs)

    def poll(self) -> None:
        for record in self.follower.new_records():
            step = record.get("step")
            if not isinstance(step, int):
                continue
            figures = headline(record, self.reward_key)
            if step == 0:  # verl's validation before training
                if "held-out exact" in figures:
                    self.stream.write(f"{LABEL} before training: held-out exact {figures['held-out exact']:.3f}\n")
                    self.stream.flush()
                continue
            if "held-out exact" in figures:  # measured at validation steps only: shown with its step from then on
                figures["held-out exact"] = f"{figures['held-out exact']:.3f} (step {step})"
            self.bar.update(step, **figures)


@contextmanager
def watch_steps(metrics_file: Path, total_steps: int, reward_key: str, poll_s: float = 1.0,
                stream: Optional[TextIO] = None) -> Iterator[StepWatcher]:
    """Print a line per step of the run inside the block (and what is starting before the first). An earlier run's
    ``metrics_file`` is removed first: verl's file logger truncates it when it starts anyway (it opens it ``wb``),
    and its steps are not this run's."""
    Path(metrics_file).unlink(missing_ok=True)
    watcher = StepWatcher(metrics_file, total_steps, reward_key, stream)
    watcher.stream.write(f"{LABEL} starting Ray, every agent's workers and rollout servers; a line per step "
                         f"follows ({total_steps} steps)\n")
    watcher.stream.flush()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(poll_s):
            watcher.poll()

    thread = threading.Thread(target=loop, name="mgrpo-step-progress", daemon=True)
    thread.start()
    try:
        yield watcher
    finally:
        stop.set()
        thread.join()
        watcher.poll()  # what the last step wrote
