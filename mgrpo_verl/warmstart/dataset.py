"""verl's ``MultiTurnSFTDataset`` reading the ``tools`` column as JSON text.

Parquet cannot store an empty struct, and a tool without parameters has ``"properties": {}`` in its schema
(the relay_tools task's ``read_secret``), so the demonstration files keep each row's tool list as a JSON
string. verl's SFT trainer loads a dataset class of ours through its own switch,
``data.custom_cls.path=pkg://mgrpo_verl.warmstart.dataset`` and ``data.custom_cls.name=JsonToolsSFTDataset``;
everything else (tokenisation turn by turn, loss on assistant turns only, its check that the turns
concatenate to the whole conversation's chat template) is verl's.
"""

from __future__ import annotations

import json

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset


class JsonToolsSFTDataset(MultiTurnSFTDataset):
    """``MultiTurnSFTDataset`` whose ``tools`` entries may be JSON strings (decoded once, at load)."""

    def _read_files_and_process(self):
        super()._read_files_and_process()
        if self.tools is not None:
            self.tools = [json.loads(tools) if isinstance(tools, str) else tools for tools in self.tools]
