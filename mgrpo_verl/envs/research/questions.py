"""Multi-hop questions built from the research corpus's summaries (:mod:`.articles`).

Three kinds, answerable only by searching and reading the offline corpus, each from the fields its pages show
(title, description, extract): ``description`` (1 hop), ``bridge`` and ``compare`` (2 hops); train and
validation are split by the first document. verl has no such data set. The templates, what each rejects, real
examples and the split: ``docs/research.md``, "The questions".
"""

from __future__ import annotations

import functools
import random
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from mgrpo_verl.envs.research.articles import Article

#: ``data_source`` suffix of the rows written by :func:`write_dataset` (``mgrpo_verl/research/wiki_multihop``).
SOURCE = "wiki_multihop"

#: The kinds of question, and how many hops (documents read in sequence) each needs.
HOPS: dict[str, int] = {"description": 1, "bridge": 2, "compare": 2}
KINDS: tuple[str, ...] = tuple(HOPS)

#: Default share of each kind in :func:`build_questions`.
DEFAULT_MIX: dict[str, float] = {"description": 0.25, "bridge": 0.5, "compare": 0.25}

SPLITS = ("train", "val")

#: Descriptions that say nothing about the article (disambiguation pages, lists, indexes).
GENERIC_DESCRIPTION = re.compile(
    r"same term|disambiguation|wikimedia|^index of|^list of|^lists of|same common name", re.IGNORECASE
)

#: Words of a description that name a group or an event, not one person (see the ``compare`` kind).
NON_PERSON_WORDS = frozenset(
    "band bands dynasty empire team school movement association confederation union republic group duo "
    "trio orchestra company club kingdom war wars period state era revolution depression conflict "
    "caliphate sultanate party science series film family".split()
)

_WORD = re.compile(r"\w+")
_LIFESPAN = re.compile(
    r"^(?P<head>.*?)\s*\((?:born (?P<born>\d{1,4})|(?P<start>\d{1,4})\s*[–-]\s*(?P<end>\d{1,4}))"
    r"(?P<bc>\s*BCE?)?\)$"
)
_TRAILING_PARENTHETICAL = re.compile(r"\s*\([^()]*\)\s*$")


@dataclass(frozen=True)
class Question:
    """One question: its text, the accepted answers (first: the canonical one), its kind, its number of
    hops and the titles of the documents needed to answer it (``evidence[0]`` decides the split)."""

    question: str
    answers: tuple[str, ...]
    kind: str
    hops: int
    evidence: tuple[str, ...]

    @property
    def level(self) -> str:
        """The evaluation table's level: ``"1"`` for 1-hop questions, ``"2"`` for 2-hop ones."""
        return str(self.hops)


# ----------------------------------------------------------------------------------------------------
# small rules


def split_of(title: str) -> str:
    """The split of questions starting from the article ``title``: ``"val"`` when the CRC-32 of its UTF-8
    bytes is 0 mod 10, else ``"train"`` (stable across processes, unlike :func:`hash`)."""
    return "val" if zlib.crc32(title.encode("utf-8")) % 10 == 0 else "train"


def title_alias(title: str) -> str:
    """``title`` without a trailing parenthetical (``"Mercury (planet)"`` -> ``"Mercury"``); the title
    itself when it has none or nothing would be left."""
    alias = _TRAILING_PARENTHETICAL.sub("", title).strip()
    return alias or title


def title_answers(title: str) -> tuple[str, ...]:
    """The accepted answers naming an article: its title, then its alias when different."""
    return tuple(dict.fromkeys((title, title_alias(title))))


def informative_description(description: str) -> bool:
    """Whether a description identifies its article: at least 2 words and not generic."""
    return len(description.split()) >= 2 and not GENERIC_DESCRIPTION.search(description)


def mentionable_title(title: str) -> bool:
    """Whether a title is specific enough to count as a mention: 2+ words or 5+ characters (``Art``,
    ``Song`` or ``Bell`` would match ordinary words)."""
    return len(title.split()) >= 2 or len(title) >= 5


def _contains_phrase(haystack: str, phrase: str) -> bool:
    """Whether the words of ``phrase`` occur in a row among the words of ``haystack``, ignoring case and
    punctuation (used to reject questions that hold their answer)."""
    words = _WORD.findall(phrase.lower())
    return bool(words) and f" {' '.join(words)} " in f" {' '.join(_WORD.findall(haystack.lower()))} "


def birth_year(article: Article) -> Optional[int]:
    """The birth year in a person's description (negative for BC), or ``None`` if the description does not
    end with a plain lifespan (``(1775–1817)``, ``(born 1939)``, ``(106–43 BC)``) spanning 15 to 110
    years, or names a group (:data:`NON_PERSON_WORDS`). The topic is not checked here."""
    match = _LIFESPAN.match(article.description)
    if match is None:
        return None
    head_words = {w.lower() for w in _WORD.findall(match["head"])}
    if not head_words or head_words & NON_PERSON_WORDS:
        return None
    sign = -1 if match["bc"] else 1
    if match["born"] is not None:
        return sign * int(match["born"])
    start, end = sign * int(match["start"]), sign * int(match["end"])
    return start if 15 <= end - start <= 110 else None


def _head_last_word(description: str) -> str:
    """The last word of a description before its lifespan, lowercased ("" if none)."""
    match = _LIFESPAN.match(description)
    words = _WORD.findall(match["head"]) if match else []
    return words[-1].lower() if words else ""


# ----------------------------------------------------------------------------------------------------
# mentions


class MentionIndex:
    """Finds which titles a text mentions in one pass over its words.

    Titles are grouped by their first word (``\\w+``); at each word of the text, the titles starting
    with that word are tried longest first, and a match must end on a word boundary. Matches are
    leftmost-longest and do not overlap, like a regex alternation of all titles sorted by length, but
    without the 10k-alternative regex (which Python would try title by title at every position). A
    match that is part of a longer capitalised name is no mention (:func:`_inside_longer_name`), but its
    span stays consumed.
    """

    def __init__(self, titles: Iterable[str]) -> None:
        by_first: dict[str, list[str]] = defaultdict(list)
        for title in titles:
            first = _WORD.match(title)
            if first is not None:
                by_first[first.group()].append(title)
        self._by_first = {word: sorted(set(group), key=len, reverse=True) for word, group in by_first.items()}
        # only words starting with a character that starts some title are looked up: the regex engine
        # skips the others (most words are lowercase), which makes the scan several times faster
        starts = "".join(sorted({word[0] for word in self._by_first}))
        self._candidate_words = re.compile(r"(?<!\w)[" + re.escape(starts) + r"]\w*") if starts else None

    def mentions(self, text: str) -> list[str]:
        """The titles mentioned in ``text``, in order of first occurrence, without repeats."""
        found: dict[str, None] = {}
        if self._candidate_words is None:
            return []
        covered = 0
        for word in self._candidate_words.finditer(text):
            start = word.start()
            if start < covered:
                continue
            for title in self._by_first.get(word.group(), ()):
                end = start + len(title)
                if not text.startswith(title, start):
                    continue
                if end < len(text) and _is_word_char(title[-1]) and _is_word_char(text[end]):
                    continue  # "Paris" inside "Parisian"
                if not _inside_longer_name(text, start, end):
                    found[title] = None
                covered = end
                break
        return list(found)


def _inside_longer_name(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is part of a longer capitalised name that is no title: the word right
    after it (one space between) is capitalised (``New York`` in ``New York University``), or the word
    right before it is capitalised and does not start a sentence (``University`` in ``Harvard
    University``, but ``France`` in ``In France, ...`` is a mention)."""
    after = _NEXT_WORD.match(text, end)
    if after is not None and after.group(1)[0].isupper():
        return True
    if start < 2 or text[start - 1] != " " or not _is_word_char(text[start - 2]):
        return False
    i = start - 2
    while i > 0 and _is_word_char(text[i - 1]):
        i -= 1
    if not text[i].isupper():
        return False
    i -= 1  # the previous word starts a sentence when what precedes it (spaces aside) ends one
    while i >= 0 and text[i].isspace():
        i -= 1
    return i >= 0 and text[i] not in _SENTENCE_END


_NEXT_WORD = re.compile(r" (\w+)")
_SENTENCE_END = frozenset(".!?:;\"'(\u201c\u2018")


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


# ----------------------------------------------------------------------------------------------------
# candidates


class _Builder:
    """Every candidate question of one list of articles (built once, see :func:`candidate_questions`)."""

    def __init__(self, articles: Sequence[Article]) -> None:
        self.articles = tuple(articles)
        self.by_title = {a.title: a for a in self.articles}
        index = MentionIndex(self.by_title)
        self.mentions = {a.title: [t for t in index.mentions(a.extract) if t != a.title] for a in self.articles}
        self._lowercase_words = self._case_votes()

    def _case_votes(self) -> set[str]:
        """Capitalised words that the corpus writes in lowercase more often than capitalised (see the
        ``bridge`` template: how a description's first word reads mid-sentence)."""
        firsts = {_leading_letters(d) for d in (a.description for a in self.articles)}
        wanted = {w for w in firsts if w[:1].isupper() and (len(w) == 1 or w[1:].islower())}
        lower = {w.lower(): w for w in wanted}
        counts: Counter[str] = Counter()
        for article in self.articles:
            # a description's own first word is capitalised by convention: it does not vote
            for words in (_WORD.findall(article.extract), _WORD.findall(article.description)[1:]):
                counts.update(w for w in words if w in wanted or w in lower)
        # ties (e.g. a word seen nowhere else) keep the capital: better "Which Fearsome being" than
        # "which english novelist"
        return {w for w in wanted if counts[w.lower()] > counts[w]}

    def phrase(self, description: str) -> str:
        """``description`` as it reads after "Which": trailing period dropped, first word lowercased when
        the corpus mostly writes it so."""
        text = description.strip().rstrip(".")
        first = _leading_letters(text)
        if first in self._lowercase_words:
            text = first.lower() + text[len(first) :]
        return text

    def description_questions(self) -> list[Question]:
        out = []
        for a in self.articles:
            if informative_description(a.description):
                text = f'What short description does the encyclopedia give for "{a.title}"?'
                out.append(Question(text, (a.description,), "description", HOPS["description"], (a.title,)))
        return out

    def bridge_questions(self) -> list[Question]:
        out = []
        for a in self.articles:
            mentioned = [self.by_title[t] for t in self.mentions[a.title]]
            same_description = Counter(_description_key(b.description) for b in mentioned if b.description)
            for b in mentioned:
                if not (mentionable_title(b.title) and informative_description(b.description)):
                    continue
                if same_description[_description_key(b.description)] > 1 or _contains_phrase(a.title, b.title):
                    continue
                text = f'Which {self.phrase(b.description)} is mentioned in the encyclopedia summary of "{a.title}"?'
                answers = title_answers(b.title)
                if any(_contains_phrase(text, answer) for answer in answers):
                    continue
                out.append(Question(text, answers, "bridge", HOPS["bridge"], (a.title, b.title)))
        return out

    def people(self) -> dict[str, int]:
        """Birth year of every person that a ``compare`` question may name (``docs/research.md``)."""
        people = {
            a.title: year
            for a in self.articles
            if a.topic == "People" and mentionable_title(a.title) and (year := birth_year(a)) is not None
        }
        roles = {_head_last_word(self.by_title[t].description) for t in people}
        for a in self.articles:
            if (
                a.topic == "Uncategorized"
                and mentionable_title(a.title)
                and _head_last_word(a.description) in roles
                and (year := birth_year(a)) is not None
            ):
                people[a.title] = year
        return people

    def compare_questions(self) -> list[Question]:
        people = self.people()
        pairs: dict[frozenset[str], None] = {}  # related pairs, in order of discovery
        for a in self.articles:
            named = [t for t in self.mentions[a.title] if t in people]
            if a.title in people:
                named.insert(0, a.title)
            for i, x in enumerate(named):
                for y in named[i + 1 :]:
                    pairs.setdefault(frozenset((x, y)), None)
        out = []
        for pair in pairs:
            x, y = sorted(pair)
            if people[x] == people[y]:
                continue
            if zlib.crc32(f"{x}\n{y}".encode("utf-8")) % 2:
                x, y = y, x
            earlier = x if people[x] < people[y] else y
            text = f"Who was born first, {x} or {y}?"
            out.append(Question(text, title_answers(earlier), "compare", HOPS["compare"], (x, y)))
        return out

    def all_questions(self) -> dict[str, dict[str, tuple[Question, ...]]]:
        """kind -> split -> questions (deduplicated by text, first kept), in a deterministic order."""
        built = {
            "description": self.description_questions(),
            "bridge": self.bridge_questions(),
            "compare": self.compare_questions(),
        }
        seen: set[str] = set()
        out: dict[str, dict[str, tuple[Question, ...]]] = {}
        for kind in KINDS:
            by_split: dict[str, list[Question]] = {s: [] for s in SPLITS}
            for q in built[kind]:
                if q.question not in seen:
                    seen.add(q.question)
                    by_split[split_of(q.evidence[0])].append(q)
            out[kind] = {s: tuple(v) for s, v in by_split.items()}
        return out


def _leading_letters(text: str) -> str:
    """The letters a text starts with (``"Second-largest city"`` -> ``"Second"``; "" if none)."""
    match = re.match(r"[^\W\d_]+", text)
    return match.group() if match else ""


def _description_key(description: str) -> str:
    """Descriptions compared for ambiguity: case and surrounding spaces ignored."""
    return " ".join(description.lower().split())


@functools.lru_cache(maxsize=4)
def _all_candidates(articles: tuple[Article, ...]) -> dict[str, dict[str, tuple[Question, ...]]]:
    return _Builder(articles).all_questions()


def candidate_questions(articles: Sequence[Article], kind: str, split: str) -> tuple[Question, ...]:
    """Every question of ``kind`` whose first document falls in ``split``, in a deterministic order
    (articles' order). Built once per list of articles and cached.

    Raises:
        ValueError: an unknown kind or split.
    """
    if kind not in HOPS:
        raise ValueError(f"unknown question kind {kind!r}; known: {', '.join(KINDS)}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return _all_candidates(tuple(articles))[kind][split]


def available_counts(articles: Sequence[Article]) -> dict[str, dict[str, int]]:
    """split -> kind -> number of candidate questions (how many :func:`build_questions` can draw)."""
    return {s: {k: len(candidate_questions(articles, k, s)) for k in KINDS} for s in SPLITS}


# ----------------------------------------------------------------------------------------------------
# sampling


def _mix_of(kinds: Union[Sequence[str], Mapping[str, float]]) -> dict[str, float]:
    """Weights of the requested kinds: a mapping as given, or names weighted as in :data:`DEFAULT_MIX`."""
    if isinstance(kinds, str):
        kinds = (kinds,)
    weights = dict(kinds) if isinstance(kinds, Mapping) else {k: DEFAULT_MIX.get(k, 0.0) for k in kinds}
    for kind, weight in weights.items():
        if kind not in HOPS:
            raise ValueError(f"unknown question kind {kind!r}; known: {', '.join(KINDS)}")
        if weight < 0:
            raise ValueError(f"the weight of {kind!r} must be >= 0, got {weight}")
    if not weights or sum(weights.values()) <= 0:
        raise ValueError(f"kinds must name at least one kind with a positive weight, got {kinds!r}")
    return weights


def _quotas(n: int, weights: Mapping[str, float], available: Mapping[str, int]) -> dict[str, int]:
    """How many questions of each kind: largest-remainder shares of ``n``, then any kind's shortfall
    (fewer candidates than its share) moved to the kinds that still have candidates, by weight."""
    quotas = {k: 0 for k in weights}
    remaining = n
    open_kinds = [k for k in weights if weights[k] > 0 and available[k] > 0]
    while remaining > 0 and open_kinds:
        total = sum(weights[k] for k in open_kinds)
        exact = {k: remaining * weights[k] / total for k in open_kinds}
        share = {k: int(exact[k]) for k in open_kinds}
        by_remainder = sorted(open_kinds, key=lambda k: (-(exact[k] - share[k]), KINDS.index(k)))
        for k in by_remainder[: remaining - sum(share.values())]:
            share[k] += 1
        for k in open_kinds:
            take = min(share[k], available[k] - quotas[k])
            quotas[k] += take
            remaining -= take
        open_kinds = [k for k in open_kinds if quotas[k] < available[k]]
    return quotas


def build_questions(
    articles: Sequence[Article],
    n: int,
    seed: int = 0,
    kinds: Union[Sequence[str], Mapping[str, float]] = KINDS,
    split: str = "train",
) -> list[Question]:
    """``n`` distinct questions of ``split``, mixed by kind (``kinds``: names weighted as in
    :data:`DEFAULT_MIX`, or a mapping kind -> weight), in a shuffled order. The same arguments give the
    same questions; a kind with too few candidates leaves its share to the others.

    Raises:
        ValueError: an unknown kind or split, ``n < 0``, or fewer candidates than ``n`` in all.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    weights = _mix_of(kinds)
    pools = {k: candidate_questions(articles, k, split) for k in weights}
    available = {k: len(v) for k, v in pools.items()}
    if sum(available[k] for k in weights if weights[k] > 0) < n:
        raise ValueError(f"asked for {n} {split} questions of kinds {dict(weights)}, only {available} exist")
    quotas = _quotas(n, weights, available)
    chosen: list[Question] = []
    for kind in weights:
        rng = random.Random(f"mgrpo-wiki-multihop:{seed}:{split}:{kind}")
        chosen.extend(rng.sample(pools[kind], quotas[kind]))
    random.Random(f"mgrpo-wiki-multihop:{seed}:{split}").shuffle(chosen)
    return chosen


# ----------------------------------------------------------------------------------------------------
# dataset


def question_row(q: Question, index: int, split: str, sub: str = "sub") -> dict[str, Any]:
    """One verl dataset row of a question (:func:`mgrpo_verl.envs.research.dataset.make_row`)."""
    from mgrpo_verl.envs.research import dataset

    return dataset.make_row(
        q.question,
        q.answers,
        source=SOURCE,
        index=index,
        split=split,
        level=q.level,
        sub=sub,
        extra={"kind": q.kind, "hops": q.hops, "evidence": list(q.evidence)},
    )


def write_dataset(
    directory: Union[str, Path],
    n_train: int = 256,
    n_val: int = 64,
    seed: int = 0,
    sub: str = "sub",
    articles: Optional[Sequence[Article]] = None,
) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of multi-hop questions into ``directory`` (created);
    returns their paths. ``articles``: the installed corpus's summaries when ``None``; ``sub`` is the
    sub-agent the main prompt names."""
    from mgrpo_verl.envs.research.articles import load_articles
    from mgrpo_verl.envs.splits import write_splits

    source = load_articles() if articles is None else articles

    def rows_of(split: str, n: int) -> list[dict[str, Any]]:
        return [question_row(q, i, split, sub) for i, q in enumerate(build_questions(source, n, seed, split=split))]

    return write_splits(directory, rows_of, n_train, n_val)
