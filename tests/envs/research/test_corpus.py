"""The research corpus: tokenizer, BM25 search, title lookup, paging and the model-facing formats.

Hand-checked expectations on a tiny corpus, a hypothesis property of the paging, and a check on the real
10k-article corpus of the installed package.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl.envs.research.articles import Article
from mgrpo_verl.envs.research.corpus import (
    NO_RESULTS_HINT,
    Corpus,
    Page,
    SearchHit,
    UnknownDocument,
    format_hits,
    format_page,
    normalize_whitespace,
    page_text,
    shorten,
    split_pages,
    tokenize,
)

#: 249 five-letter words and one six-letter word: with the title line "Long" and the blank line the page
#: text is exactly 1,500 characters (4 + 2 + 249 * 6 - 1 + 1).
LONG_EXTRACT = " ".join(["abcde"] * 249) + "f"


def tiny_articles() -> list[Article]:
    """Five hand-made articles; each has a word only it contains (proxima, potassium, zeppelin, abcde)."""
    return [
        Article(
            "Alpha Centauri",
            "Alpha Centauri is the closest star system to the Sun. Its faintest member, Proxima Centauri, "
            "is a red dwarf with at least one planet orbiting it.",
            "Star system",
            "Science",
        ),
        Article(
            "Banana",
            "A banana is an elongated, edible fruit. Bananas are rich in potassium and grow in clusters.",
            "Tropical fruit",
            "Biology",
        ),
        Article("Airship", "An airship, such as the Zeppelin, is a lighter-than-air aircraft.", "", "Technology"),
        Article("Long", LONG_EXTRACT, "", "Test"),
        Article("Sun", "The Sun is the star at the centre of the Solar System.", "Star", "Science"),
    ]


@pytest.fixture(scope="module")
def tiny() -> Corpus:
    return Corpus(tiny_articles())


# -- tokenizer, snippets ---------------------------------------------------------------------------------------


def test_tokenize_lowercases_splits_drops_stop_words_and_accents():
    assert tokenize("2001: A Space Odyssey") == ["2001", "space", "odyssey"]
    assert tokenize("The Gödel's THEOREM, e=mc2_x") == ["godel", "s", "theorem", "e", "mc2", "x"]
    assert tokenize("the of and") == []
    assert tokenize("") == []


def test_shorten_cuts_at_a_word_boundary():
    assert shorten("short text") == "short text"
    assert shorten("one two three four", 9) == "one two..."
    assert shorten("one two, three", 8) == "one two..."  # trailing punctuation before "..." dropped
    assert shorten("abcdefghij", 4) == "abcd..."  # a first word longer than the limit is cut inside
    assert shorten("  a \n b  ") == "a b"


# -- construction -----------------------------------------------------------------------------------------------


def test_construction_errors():
    with pytest.raises(ValueError, match="at least one article"):
        Corpus([])
    a = tiny_articles()[0]
    with pytest.raises(ValueError, match="two articles are titled 'Alpha Centauri'"):
        Corpus([a, a])


def test_page_text_layout():
    alpha, _, airship, *_ = tiny_articles()
    assert page_text(alpha) == f"Alpha Centauri\nStar system\n\n{alpha.extract}"
    assert page_text(airship) == f"Airship\n\n{airship.extract}"  # no empty description line


# -- search -----------------------------------------------------------------------------------------------------


def test_a_word_only_one_doc_contains_ranks_it_first(tiny):
    for word, title in [("proxima", "Alpha Centauri"), ("POTASSIUM", "Banana"), ("zeppelin", "Airship")]:
        hits = tiny.search(word)
        assert [h.title for h in hits] == [title]
        assert hits[0].score > 0
    # a query mixing a unique word with a shared one: the unique word's doc first, others after
    hits = tiny.search("proxima star")
    assert hits[0].title == "Alpha Centauri" and {h.title for h in hits} == {"Alpha Centauri", "Sun"}
    assert hits[0].score > hits[1].score


def test_search_k_stop_words_and_no_match(tiny):
    assert len(tiny.search("star sun", k=1)) == 1
    assert tiny.search("the of a") == []  # stop words only: nothing to match
    assert tiny.search("quasar") == []
    assert tiny.search("Zeppelin!!") == tiny.search("zeppelin")


def test_search_errors(tiny):
    for query in ("", "   \n"):
        with pytest.raises(ValueError, match="empty"):
            tiny.search(query)
    with pytest.raises(ValueError, match="k must be at least 1"):
        tiny.search("star", k=0)


def test_snippet_is_the_extracts_head():
    (hit,) = Corpus([Article("X", "word " * 100, "", "")]).search("word")
    assert hit.snippet.endswith("...") and len(hit.snippet) <= 203
    assert hit.snippet == ("word " * 40).strip() + "..."  # 40 words = 199 chars, the 41st would pass 200
    (short,) = Corpus(tiny_articles()).search("zeppelin")
    assert short.snippet == tiny_articles()[2].extract  # short extracts are whole, no "..."


def test_ties_are_broken_by_title():
    same = "Identical text about comets."
    corpus = Corpus([Article(t, same, "", "") for t in ("Zeta", "Alpha", "Mu")])
    hits = corpus.search("comets")
    assert [h.title for h in hits] == ["Alpha", "Mu", "Zeta"]
    assert len({h.score for h in hits}) == 1


def test_a_term_in_half_the_docs_still_matches():
    # rank_bm25 would give idf 0 to a term in exactly half the documents; our floor keeps it a hit
    pairs = [("A", "red apple"), ("B", "red cherry"), ("C", "blue"), ("D", "green")]
    corpus = Corpus([Article(t, e, "", "") for t, e in pairs])
    assert {h.title for h in corpus.search("red")} == {"A", "B"}
    two = Corpus([Article("A", "same words", "", ""), Article("B", "same words", "", "")])
    assert [h.title for h in two.search("same")] == ["A", "B"]


# -- lookup, page -----------------------------------------------------------------------------------------------


def test_lookup(tiny):
    assert tiny.lookup("Alpha Centauri") == "Alpha Centauri"
    assert tiny.lookup("  alpha   CENTAURI\n") == "Alpha Centauri"
    assert tiny.lookup("Alpha Centaur") is None
    assert tiny.lookup("") is None
    assert "Banana" in tiny and "banana" not in tiny and len(tiny) == 5


def test_a_1500_char_doc_at_600_has_3_pages(tiny):
    text = page_text(tiny.article("Long"))
    assert len(text) == 1500
    pages = [tiny.page("Long", i) for i in (1, 2, 3)]
    assert [p.pages for p in pages] == [3, 3, 3] and [p.page for p in pages] == [1, 2, 3]
    # word starts at 6 + 6j: position 600 starts a word, so page 1 ends at the space at 599 (hand-checked)
    assert [len(p.text) for p in pages] == [599, 599, 300]
    assert pages[0].text == text[:599] and pages[1].text == text[600:1199] and pages[2].text == text[1200:]
    assert pages[0].text.startswith("Long\n\nabcde")  # whitespace inside a page is kept
    assert tiny.page("long", 2, page_chars=600) == pages[1]  # titles are case-insensitive here too
    assert tiny.page("Long", 1, page_chars=2000).pages == 1


def test_page_errors(tiny):
    with pytest.raises(ValueError, match=r"page 4 is out of range: 'Long' has 3 pages \(1-3\)"):
        tiny.page("Long", 4)
    with pytest.raises(ValueError, match="has 1 page "):
        tiny.page("Sun", 0)
    with pytest.raises(UnknownDocument) as info:
        tiny.page("Alpha Centaur")
    assert isinstance(info.value, KeyError)
    assert info.value.doc == "Alpha Centaur" and info.value.suggestions[0] == "Alpha Centauri"
    assert len(info.value.suggestions) <= 3
    assert str(info.value).startswith("no document titled 'Alpha Centaur'; did you mean: Alpha Centauri")
    with pytest.raises(UnknownDocument) as nothing:
        tiny.page("the")  # no searchable words: no suggestions, still a clear error
    assert nothing.value.suggestions == [] and str(nothing.value) == "no document titled 'the'"


# -- formats ----------------------------------------------------------------------------------------------------


def test_format_hits():
    hits = [SearchHit("A", "first", 2.0), SearchHit("B", "second...", 1.0)]
    assert format_hits("q", hits) == "1. A — first\n2. B — second..."
    assert format_hits("quasar", []) == f"No results for 'quasar'. {NO_RESULTS_HINT}"
    assert "Rephrase" in NO_RESULTS_HINT


def test_format_page():
    assert format_page(Page("T", 1, 3, "text")) == "[T] page 1 of 3\ntext\n(visit with page=2 for more)"
    assert format_page(Page("T", 3, 3, "end")) == "[T] page 3 of 3\nend"


# -- paging property --------------------------------------------------------------------------------------------

WORDS = st.text(alphabet=string.ascii_letters + string.digits + ".,'-é", min_size=1, max_size=12)
SEPARATORS = st.sampled_from([" ", "  ", "\n", "\n\n", "\t", " \n "])


@st.composite
def texts_and_widths(draw) -> tuple[str, int]:
    """A text of words and assorted whitespace (maybe leading/trailing), and a page width its words fit."""
    words = draw(st.lists(WORDS, min_size=0, max_size=60))
    seps = draw(st.lists(SEPARATORS, min_size=len(words) + 1, max_size=len(words) + 1))
    body = "".join(w + s for w, s in zip(words, seps[1:], strict=True)).rstrip()
    text = seps[0] * draw(st.booleans()) + body + seps[-1] * draw(st.booleans())
    width = draw(st.integers(min_value=max([12, *map(len, words)]), max_value=80))
    return text, width


@settings(max_examples=200, deadline=None)
@given(texts_and_widths())
def test_paging_loses_and_duplicates_nothing(case):
    text, width = case
    pages = split_pages(text, width)
    assert pages and all(len(p) <= width for p in pages)
    assert normalize_whitespace(" ".join(pages)) == normalize_whitespace(text)
    if normalize_whitespace(text):
        assert all(p and p == p.strip() for p in pages)
    else:
        assert pages == [""]


@settings(max_examples=100, deadline=None)
@given(st.lists(WORDS, min_size=1, max_size=60), st.integers(min_value=12, max_value=80))
def test_paging_is_greedy_on_single_spaced_text(words, width):
    # every page is as full as it can be: it plus the next page's first word would not have fitted
    pages = split_pages(" ".join(words), width)
    assert " ".join(pages) == " ".join(words)
    for a, b in zip(pages, pages[1:]):
        assert len(a) + 1 + len(b.split(" ")[0]) > width


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=1, max_value=40))
def test_paging_of_any_text_keeps_every_non_space_character(text, width):
    # with words longer than the page (cut inside the word) only whitespace may differ
    pages = split_pages(text, width)
    assert all(len(p) <= width for p in pages)
    assert "".join("".join(pages).split()) == "".join(text.split())


def test_split_pages_rejects_a_zero_width():
    with pytest.raises(ValueError, match="page_chars must be at least 1"):
        split_pages("text", 0)


# -- the real corpus --------------------------------------------------------------------------------------------


def test_the_real_corpus():
    corpus = Corpus.default()
    assert corpus is Corpus.default() and corpus is Corpus.load(None)  # cached process-wide
    assert len(corpus) == 10033
    corpus.build_index()
    titles = [h.title for h in corpus.search("Stanley Kubrick film", k=5)]
    assert "2001: A Space Odyssey" in titles and "Stanley Kubrick" in titles
    assert corpus.search("Godel incompleteness", k=1)[0].title == "Gödel's incompleteness theorems"
    assert corpus.lookup("2001: a space odyssey") == "2001: A Space Odyssey"
    first = corpus.page("Stanley Kubrick")
    assert first.text.startswith("Stanley Kubrick\nAmerican filmmaker") and first.pages == 1
    with pytest.raises(UnknownDocument) as info:
        corpus.page("Stanley Kubrik")
    assert info.value.suggestions[0] == "Stanley Kubrick"
    # every article pages cleanly at the tools' default width
    for title in corpus.titles:
        text = page_text(corpus.article(title))
        pages = split_pages(text, 600)
        assert normalize_whitespace(" ".join(pages)) == normalize_whitespace(text)
