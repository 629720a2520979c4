"""``python -m mgrpo_verl.viewer RUN_DIR [--out page.html]``: the rollout dumps of a run (``trainer.rollout_data_dir``,
``trainer.validation_data_dir``; docs/rollouts.md) as one static HTML page that works offline (inline CSS and
script, no network): per step a few main rollouts as trees (each agent's turns and tool calls, the sub-agents'
calls under the main turn that made them, scores, advantages, alignment fates) and per-agent curves (inline SVG).

The page's top layer: it reads JSON lines and imports nothing of the package (the standard library only), so it
runs wherever the dump is copied. Model text is hostile: every text is escaped, the script reads no dumped data.
"""

from mgrpo_verl.viewer.load import Dump, load_dump
from mgrpo_verl.viewer.page import render_page, write_page

__all__ = ["Dump", "load_dump", "render_page", "write_page"]
