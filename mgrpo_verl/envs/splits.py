"""Writing a built-in task's train / validation parquet files (verl's RL dataset layout)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_splits(
    directory: str | Path, rows_of: Callable[[str, int], list[dict[str, Any]]], n_train: int, n_val: int
) -> tuple[Path, Path]:
    """Write ``rows_of("train", n_train)`` and ``rows_of("val", n_val)`` to ``train.parquet`` and
    ``val.parquet`` in ``directory`` (created); returns their paths."""
    import pandas as pd

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", n_train), ("val", n_val)):
        path = out / f"{split}.parquet"
        pd.DataFrame(rows_of(split, n)).to_parquet(path)
        paths.append(path)
    return paths[0], paths[1]
