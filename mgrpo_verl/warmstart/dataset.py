"""verl's ``MultiTurnSFTDataset`` reading the ``tools`` column as JSON text, each demonstration tokenised once.

Parquet cannot store an empty struct, and a tool without parameters has ``"properties": {}`` in its schema
(the relay_tools task's ``read_secret``), so the demonstration files keep each row's tool list as a JSON
string. verl's SFT trainer loads a dataset class of ours through its own switch,
``data.custom_cls.path=pkg://mgrpo_verl.warmstart.dataset`` and ``data.custom_cls.name=JsonToolsSFTDataset``;
everything else (tokenisation turn by turn, loss on assistant turns only, its check that the turns
concatenate to the whole conversation's chat template) is verl's.

verl's ``__getitem__`` renders and tokenises a conversation turn by turn on every call (~6 ms for a ``relay_tools``
demonstration on 2 cores, in the training loop's thread with ``num_workers=0``), and a warm start reads each of
its 256 demonstrations ~15 times. What it returns depends on the row alone, so the first result is kept and
later calls get copies of its tensors.
"""

from __future__ import annotations

import json

import torch
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset


class JsonToolsSFTDataset(MultiTurnSFTDataset):
    """``MultiTurnSFTDataset`` whose ``tools`` entries may be JSON strings (decoded once, at load), each item
    built once."""

    def _read_files_and_process(self):
        super()._read_files_and_process()
        if self.tools is not None:
            self.tools = [json.loads(tools) if isinstance(tools, str) else tools for tools in self.tools]
        self._built: dict[int, dict] = {}

    def __getitem__(self, item):
        key = int(item)
        if key not in self._built:
            self._built[key] = super().__getitem__(key)
        return {name: value.clone() if isinstance(value, torch.Tensor) else value
                for name, value in self._built[key].items()}
