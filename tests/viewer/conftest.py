"""Puts this folder on ``sys.path`` for the browser helper (``browser.py``), which the e2e dump test of
``tests/trainer`` imports too."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
