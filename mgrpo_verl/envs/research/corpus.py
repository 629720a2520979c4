"""The offline research corpus: Wikipedia summaries with a BM25 index and paged page text.

The deep-research sub-agent works on this corpus through two tools (:mod:`.tools`): ``search`` (BM25 over
the articles, answers a numbered list of titles and snippets) and ``visit`` (one page of an article's text).
Everything here is deterministic and offline, so rollouts and tests are reproducible.

* :class:`Corpus`: documents keyed by title; :meth:`Corpus.search`, :meth:`Corpus.lookup`, :meth:`Corpus.page`.
  :meth:`Corpus.default` is the process-wide corpus of the installed package's 10,033 summaries.
* :func:`tokenize`: the one tokenizer of the index and of queries.
* :func:`split_pages`: cuts a text into pages at word boundaries.
* :func:`format_hits`, :func:`format_page`: what the tools show the model.

BM25 is ``rank_bm25.BM25Okapi`` (k1=1.5, b=0.75; idf floored, see :meth:`Corpus.build_index`) over the
tokens of title, description and extract. The scores of a query are computed only for the documents that
contain at least one query term (an inverted index built next to BM25's own tables); the others would score
0 and are never hits anyway.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

from rank_bm25 import BM25Okapi

from mgrpo_verl.envs.research.articles import Article, load_articles

#: Words dropped by :func:`tokenize`: the commonest English function words. They occur in most articles,
#: so they add nothing to BM25 but make every query match (and be scored over) the whole corpus.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a an and are as at be been but by can did do does for from had has have he her his how i if in into is it
    its me my no not of on or our she so than that the their them then there these they this those to was we
    were what when where which who whom why will with you your
    """.split()
)

#: Characters of an extract shown in a search hit's snippet (cut back to a word boundary).
SNIPPET_CHARS = 200

#: The least idf a term gets (see :meth:`Corpus.build_index`).
MIN_IDF = 0.01

#: The hint that follows an empty result list.
NO_RESULTS_HINT = "Rephrase: try fewer or different keywords, e.g. a name, a place or a key term of the question."

_WORD = re.compile(r"[^\W_]+")  # runs of Unicode letters and digits

# The combining marks of the Basic Multilingual Plane, deleted by ``str.translate`` (per-character Python
# would make indexing the 10k articles several times slower).
_COMBINING: dict[int, None] = dict.fromkeys(cp for cp in range(0x10000) if unicodedata.combining(chr(cp)))


def tokenize(text: str) -> list[str]:
    """The index's (and every query's) tokens of ``text``.

    Lower-cased (``casefold``), accents stripped (NFKD, combining marks dropped, so "Godel" finds
    "Gödel"), split into runs of letters and digits (punctuation and ``_`` separate words, so
    "2001: A Space Odyssey" gives ``["2001", "space", "odyssey"]``), and :data:`STOP_WORDS` dropped.
    """
    folded = text.casefold()
    if not folded.isascii():
        folded = unicodedata.normalize("NFKD", folded).translate(_COMBINING)
    return [w for w in _WORD.findall(folded) if w not in STOP_WORDS]


def normalize_whitespace(text: str) -> str:
    """``text`` with every run of whitespace turned into one space and the ends stripped."""
    return " ".join(text.split())


def _title_key(title: str) -> str:
    """The case- and whitespace-insensitive form of a title :meth:`Corpus.lookup` falls back on."""
    return normalize_whitespace(title).casefold()


def shorten(text: str, limit: int = SNIPPET_CHARS) -> str:
    """``text`` (whitespace normalised) cut to at most ``limit`` characters at a word boundary, plus
    ``"..."`` when anything was cut. A first word longer than ``limit`` is cut inside the word."""
    text = normalize_whitespace(text)
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit + 1)
    head = text[:cut] if cut > 0 else text[:limit]
    return head.rstrip(" ,;:.-") + "..."


def split_pages(text: str, page_chars: int) -> list[str]:
    """``text`` cut into pages of at most ``page_chars`` characters, at word boundaries.

    Why this shape: the model reads a long article a page at a time (the tool response budget is small),
    and a page that ends mid-word is harder to read than a slightly shorter one.

    Guarantees: at least one page (``[""]`` for a blank text); no page is empty (unless the text is blank)
    or starts or ends with whitespace; whitespace inside a page is kept as is (line breaks included); only
    the whitespace at a cut is dropped, so ``normalize_whitespace(" ".join(pages)) ==
    normalize_whitespace(text)``. A single word longer than ``page_chars`` is the one exception: it is cut
    inside the word (joining then adds a space into it).

    Raises:
        ValueError: ``page_chars < 1``.
    """
    if page_chars < 1:
        raise ValueError(f"page_chars must be at least 1, got {page_chars}")
    n = len(text)
    pages: list[str] = []
    pos = 0
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            break
        end = pos + page_chars
        if end >= n:
            pages.append(text[pos:].rstrip())
            break
        if text[end].isspace():
            cut = end  # the page is full and a word ends exactly at its end
        else:
            cut = max((i for i in range(end - 1, pos, -1) if text[i].isspace()), default=-1)
            if cut < 0:
                cut = end  # one word fills the page: cut inside it
        pages.append(text[pos:cut].rstrip())
        pos = cut
    return pages or [""]


@dataclass(frozen=True)
class SearchHit:
    """One search result: the document's ``title`` (what ``visit`` takes), a ``snippet`` of its extract and
    its BM25 ``score`` (> 0)."""

    title: str
    snippet: str
    score: float


@dataclass(frozen=True)
class Page:
    """Page ``page`` (1-based) of ``pages`` of the document ``title``; ``text`` is that page's text."""

    title: str
    page: int
    pages: int
    text: str


class UnknownDocument(KeyError):
    """No document has the title ``doc``; ``suggestions`` are the titles BM25 ranks best for it (up to 3).

    A ``KeyError`` (a missing key of the corpus), with a readable message instead of KeyError's repr.
    """

    def __init__(self, doc: str, suggestions: Sequence[str] = ()) -> None:
        super().__init__(doc)
        self.doc = doc
        self.suggestions: list[str] = list(suggestions)

    def __str__(self) -> str:
        message = f"no document titled {self.doc!r}"
        if self.suggestions:
            message += "; did you mean: " + "; ".join(self.suggestions)
        return message


def page_text(article: Article) -> str:
    """The full text ``visit`` pages through: title, description (line skipped when empty), blank line, extract."""
    head = f"{article.title}\n{article.description}" if article.description else article.title
    return f"{head}\n\n{article.extract}"


class Corpus:
    """Documents keyed by title, searchable with BM25 and readable page by page.

    The BM25 index is built on first use (:meth:`search`, or :meth:`page` of an unknown title), once,
    under a lock, so :meth:`lookup` and :meth:`page` are cheap on a fresh corpus and threads share one
    index. Call :meth:`build_index` to pay the cost up front (the tools do, outside the event loop's
    critical path of a rollout).

    Raises:
        ValueError: no articles, or two articles with the same title.
    """

    _cache: dict[Optional[str], Corpus] = {}
    _cache_lock = threading.Lock()

    def __init__(self, articles: Sequence[Article]) -> None:
        if not articles:
            raise ValueError("a corpus needs at least one article")
        self._articles: tuple[Article, ...] = tuple(articles)
        self._by_title: dict[str, int] = {}
        self._by_key: dict[str, int] = {}
        for i, article in enumerate(self._articles):
            if article.title in self._by_title:
                raise ValueError(f"two articles are titled {article.title!r}")
            self._by_title[article.title] = i
            self._by_key.setdefault(_title_key(article.title), i)  # first wins if only case differs
        self._index_lock = threading.Lock()
        self._bm25: Optional[BM25Okapi] = None
        self._postings: dict[str, list[int]] = {}

    # -- construction -------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Optional[str] = None) -> Corpus:
        """The process-wide corpus of the summaries file ``path`` (``None``: the installed package's),
        built once per path and shared (the index of the 10k summaries takes about a second)."""
        with cls._cache_lock:
            corpus = cls._cache.get(path)
            if corpus is None:
                corpus = cls._cache[path] = cls(load_articles(path))
            return corpus

    @classmethod
    def default(cls) -> Corpus:
        """The process-wide corpus of the installed package's 10,033 summaries (see :meth:`load`)."""
        return cls.load(None)

    def build_index(self) -> None:
        """Build the BM25 index now if it is not built yet (idempotent, thread-safe)."""
        if self._bm25 is not None:
            return
        with self._index_lock:
            if self._bm25 is not None:
                return
            docs = [tokenize(f"{a.title} {a.description} {a.extract}") for a in self._articles]
            # articles of stop words only have no tokens; BM25 needs at least one token in the corpus
            if not any(docs):
                docs = [["\0"]] * len(docs)
            bm25 = BM25Okapi(docs)  # tokenized already: no tokenizer, so no multiprocessing pool
            postings: dict[str, list[int]] = {}
            for i, freqs in enumerate(bm25.doc_freqs):
                for term in freqs:
                    postings.setdefault(term, []).append(i)
            # rank_bm25 floors only negative idfs (at epsilon * average idf): a term in exactly half the
            # documents keeps idf 0 and could never make a hit, and in a tiny corpus the average itself can
            # be <= 0. Floor every idf at max(that, MIN_IDF) so any shared term counts a little.
            floor = max(bm25.epsilon * bm25.average_idf, MIN_IDF)
            for term, idf in bm25.idf.items():
                if idf < floor:
                    bm25.idf[term] = floor
            self._postings = postings
            self._bm25 = bm25

    # -- access ---------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._articles)

    def __contains__(self, title: object) -> bool:
        return isinstance(title, str) and title in self._by_title

    @property
    def titles(self) -> list[str]:
        """Every title, in the articles' order."""
        return [a.title for a in self._articles]

    def article(self, title: str) -> Article:
        """The article titled exactly ``title``. Raises :class:`UnknownDocument` (no suggestions)."""
        try:
            return self._articles[self._by_title[title]]
        except KeyError:
            raise UnknownDocument(title) from None

    def lookup(self, doc: str) -> Optional[str]:
        """The title ``doc`` names: the exact title, else the title equal to it ignoring case and runs of
        whitespace, else ``None``."""
        if doc in self._by_title:
            return doc
        i = self._by_key.get(_title_key(doc))
        return None if i is None else self._articles[i].title

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """The ``k`` best documents for ``query`` by BM25, best first; only those scoring > 0.

        Ties (equal scores) are broken by title, then by position, so results never depend on hash or
        sort-stability accidents. A query of stop words only has no hits.

        Raises:
            ValueError: ``query`` is empty or whitespace, or ``k < 1``.
        """
        if not isinstance(query, str) or not query.strip():
            raise ValueError("the search query is empty")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.build_index()
        assert self._bm25 is not None
        terms = tokenize(query)
        candidates = sorted({i for t in terms for i in self._postings.get(t, ())})
        if not candidates:
            return []
        scores = self._bm25.get_batch_scores(terms, candidates)
        ranked = sorted(
            ((s, i) for s, i in zip(scores, candidates, strict=True) if s > 0),
            key=lambda si: (-si[0], self._articles[si[1]].title, si[1]),
        )
        return [
            SearchHit(self._articles[i].title, shorten(self._articles[i].extract), float(s)) for s, i in ranked[:k]
        ]

    def suggest(self, doc: str, k: int = 3) -> list[str]:
        """Up to ``k`` titles BM25 ranks best for ``doc`` (what an unknown title probably meant)."""
        if not isinstance(doc, str) or not doc.strip():
            return []
        return [hit.title for hit in self.search(doc, k)]

    def page(self, doc: str, page: int = 1, page_chars: int = 600) -> Page:
        """Page ``page`` (1-based) of the document ``doc`` names (see :meth:`lookup`), its text cut into pages
        of at most ``page_chars`` characters (:func:`split_pages`).

        Raises:
            UnknownDocument: no title matches ``doc``; carries up to 3 suggested titles.
            ValueError: ``page`` is out of range (the message says how many pages there are), or
                ``page_chars < 1``.
        """
        title = self.lookup(doc) if isinstance(doc, str) else None
        if title is None:
            raise UnknownDocument(str(doc), self.suggest(str(doc)))
        pages = split_pages(page_text(self.article(title)), page_chars)
        if not 1 <= page < len(pages) + 1:
            raise ValueError(
                f"page {page} is out of range: {title!r} has {len(pages)} page{'s' if len(pages) != 1 else ''}"
                f" (1-{len(pages)})"
            )
        return Page(title, page, len(pages), pages[page - 1])


def format_hits(query: str, hits: Iterable[SearchHit]) -> str:
    """The model's view of search results: ``1. <title> — <snippet>`` per hit, or a "no results" line and
    a hint to rephrase."""
    lines = [f"{n}. {hit.title} — {hit.snippet}" for n, hit in enumerate(hits, 1)]
    if not lines:
        return f"No results for '{query}'. {NO_RESULTS_HINT}"
    return "\n".join(lines)


def format_page(page: Page) -> str:
    """The model's view of a page: ``[<title>] page i of n``, the text, and when more pages follow a hint
    how to read the next one."""
    text = f"[{page.title}] page {page.page} of {page.pages}\n{page.text}"
    if page.page < page.pages:
        text += f"\n(visit with page={page.page + 1} for more)"
    return text
