"""Statistics store of decoupled M-GRPO: main and sub-agent trainers exchange per-trajectory records.

- :class:`TrajectoryStat`: one trajectory's record (ids, own score, step, policy version).
- :class:`StatStore`: the interface (exactly-once ``put``, ``get``, ``main_scores``,
  ``wait_for_parents``, consumption marks); :func:`open_store` opens a backend from a url:
  ``sqlite:///abs/path.db`` (:mod:`mgrpo_verl.store.sqlite`) or ``redis://host:port/db``
  (:mod:`mgrpo_verl.store.redis`, needs the ``redis`` package).
- :class:`DecoupledConfig`: url, wait time-out, polling interval, staleness and missing-parent policy.
- :func:`sub_advantages` (:mod:`mgrpo_verl.store.grouping`): the sub side's M-GRPO advantages from
  the parents' main scores, identical to the synchronous mode when every parent is present.

See docs/decoupled.md.
"""

from mgrpo_verl.store.base import (
    MAX_EXTRA_BYTES,
    MISSING_POLICIES,
    ConflictError,
    DecoupledConfig,
    StatStore,
    StoreClosedError,
    TrajectoryStat,
    WaitResult,
)
from mgrpo_verl.store.factory import check_store_reachable, open_store
from mgrpo_verl.store.grouping import SubAdvantages, SubRows, sub_advantages

__all__ = [
    "MAX_EXTRA_BYTES",
    "MISSING_POLICIES",
    "ConflictError",
    "DecoupledConfig",
    "StatStore",
    "StoreClosedError",
    "SubAdvantages",
    "SubRows",
    "TrajectoryStat",
    "WaitResult",
    "open_store",
    "sub_advantages",
]
