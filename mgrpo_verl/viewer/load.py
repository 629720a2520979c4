"""Reading a run's rollout dumps: every ``*.jsonl`` under a folder whose rows have our schema (docs/rollouts.md);
verl's own validation dump, which lies beside ours, and any other JSON lines are left out."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Keys every row of our dumps has (verl's own dumps have none of the first three).
REQUIRED = ("split", "traj_id", "parent_traj_id", "agent", "step", "key")


@dataclass
class Dump:
    """The rows of a run's dumps, the files they came from, and the lines that could not be read."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def steps(self, split: str) -> list[int]:
        return sorted({r["step"] for r in self.rows if r["split"] == split})

    def rows_of(self, split: str, step: int) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["split"] == split and r["step"] == step]

    def agents(self) -> list[str]:
        """Every agent, those with main rows first, each group by name."""
        mains = {r["agent"] for r in self.rows if not r["parent_traj_id"]}
        return sorted({r["agent"] for r in self.rows}, key=lambda a: (a not in mains, a))

    def by_step(self, split: str) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for row in self.rows:
            if row["split"] == split:
                out[row["step"]].append(row)
        return dict(sorted(out.items()))


def _is_ours(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    return isinstance(row, dict) and all(k in row for k in REQUIRED)
    except (OSError, ValueError):
        return False
    return False


def _valid(row: Any) -> str | None:
    """Why ``row`` cannot be shown, or None."""
    if not isinstance(row, dict):
        return "not an object"
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        return f"lacks {missing}"
    if not isinstance(row["step"], int) or isinstance(row["step"], bool):
        return f"step {row['step']!r} is not an integer"
    if not all(isinstance(row[k], str) for k in ("split", "traj_id", "parent_traj_id", "agent", "key")):
        return "split, traj_id, parent_traj_id, agent or key is not a string"
    if not isinstance(row.get("turns", []), list):
        return "turns is not a list"
    return None


def load_dump(run_dir: Path) -> Dump:
    """Every row of our dumps under ``run_dir`` (recursively, files in name order); a line that is not JSON or
    not a row of ours is skipped and named in :attr:`Dump.skipped`, never an error."""
    dump = Dump()
    for path in sorted(Path(run_dir).rglob("*.jsonl")):
        if not path.is_file() or not _is_ours(path):
            continue
        dump.files.append(path)
        with path.open(encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as err:
                    dump.skipped.append(f"{path.name}:{number}: not JSON ({err})")
                    continue
                reason = _valid(row)
                if reason:
                    dump.skipped.append(f"{path.name}:{number}: {reason}")
                    continue
                dump.rows.append(row)
    return dump
