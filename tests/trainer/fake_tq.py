"""A dict-backed, in-process ``transfer_queue`` for unit tests of ``mgrpo_verl/trainer/rows.py``'s I/O.

It is the benchmark's :class:`FakeTransferQueue` (``benchmarks/fake_step.py``, also used by
``tests/trainer/test_concurrent_updates.py``), not a second fake, plus the argument checks and errors of
the real client's ``kv_batch_put`` / ``kv_batch_get`` (transfer_queue 0.1.x ``interface.py``), so a call
the real client refuses fails here too. ``tests/trainer/test_rows_io.py`` checks that its two methods
have the real functions' signatures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import transfer_queue

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fake_step import FakeTransferQueue  # noqa: E402

#: The client calls rows.py makes (through ``import transfer_queue as tq``, looked up at call time).
FAKED_CALLS = ("kv_batch_get", "kv_batch_put")


class CheckedFakeTransferQueue(FakeTransferQueue):
    """:class:`FakeTransferQueue` that refuses what the real client refuses, with its messages."""

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None, data_parser=None):
        if fields is None and tags is None:
            raise ValueError("Please provide at least one parameter of `fields` or `tags`.")
        if fields is not None and fields.batch_size[0] != len(keys):
            raise ValueError(f"`keys` with length {len(keys)} does not match the `fields` TensorDict with "
                             f"batch_size {fields.batch_size[0]}")
        if tags is not None and len(tags) != len(keys):
            raise ValueError(f"keys with length {len(keys)} does not match length of tags {len(tags)}")
        return super().kv_batch_put(keys, partition_id, fields=fields, tags=tags, data_parser=data_parser)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        wanted = [keys] if isinstance(keys, str) else list(keys)
        with self.lock:
            rows = [self.rows.get((partition_id, k)) for k in wanted]
        if not wanted or any(r is None for r in rows):
            raise ValueError("keys or partition were not found!")
        names = None if select_fields is None else [select_fields] if isinstance(select_fields, str) else select_fields
        if names is not None and any(n not in r for r in rows for n in names):
            raise ValueError("Some fields are not ready in all the requested keys!")
        return super().kv_batch_get(keys, partition_id, select_fields=select_fields)


def install(monkeypatch) -> CheckedFakeTransferQueue:
    """A fresh fake behind ``transfer_queue.kv_batch_get`` / ``kv_batch_put`` for the test."""
    store = CheckedFakeTransferQueue()
    for name in FAKED_CALLS:
        monkeypatch.setattr(transfer_queue, name, getattr(store, name))
    return store
