"""Statistics store of decoupled M-GRPO: main and sub-agent trainers exchange per-trajectory records.

- :class:`TrajectoryStat`: one trajectory's record (ids, own score, step, policy version).
- :class:`StatStore`: the interface (exactly-once ``put``, ``get``, ``main_scores``, consumption
  marks); :func:`open_store` opens a backend from a url: ``sqlite:///abs/path.db``
  (:mod:`mgrpo_verl.store.sqlite`) or ``redis://host:port/db`` (:mod:`mgrpo_verl.store.redis`, needs
  the ``redis`` package); :func:`check_store_reachable` probes one before a run starts.

The decoupled trainer that uses it is :mod:`mgrpo_verl.trainer.decoupled` (settings:
``DecoupledConfig`` in :mod:`mgrpo_verl.config.schema`). See docs/decoupled.md.
"""

from mgrpo_verl.store.base import (
    MAX_EXTRA_BYTES,
    ConflictError,
    StatStore,
    StoreClosedError,
    TrajectoryStat,
)
from mgrpo_verl.store.factory import check_store_reachable, open_store

__all__ = [
    "MAX_EXTRA_BYTES",
    "ConflictError",
    "StatStore",
    "StoreClosedError",
    "TrajectoryStat",
    "check_store_reachable",
    "open_store",
]
