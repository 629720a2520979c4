"""Multi-hop questions built from the research corpus (mgrpo_verl/envs/research/questions.py).

The first half works on a hand-made corpus of 11 articles whose every question is worked out by hand
below; the second half builds questions from the real 10,033 summaries.
"""

from __future__ import annotations

import collections
import re
import time

import pandas as pd
import pytest

from mgrpo_verl.envs.research import questions as Q
from mgrpo_verl.envs.research.articles import Article

# ----------------------------------------------------------------------------------------------------
# hand-made corpus

MINI = (
    Article(
        "Alpha Valley",
        "Alpha Valley lies in Freedonia. The Bravo River crosses Delta Lake and Echo Lake on its way to the sea.",
        "Valley in Freedonia",
        "Geography",
    ),
    Article("Freedonia", "Freedonia is a small country with a long river.", "Country in Europe", "Geography"),
    Article(
        "Bravo River",
        "The Bravo River is the longest river, a river named after Mercury.",
        "River of Freedonia",
        "Geography",
    ),
    Article("Delta Lake", "Delta Lake reflects Mercury (planet), the first planet.", "Lake in Freedonia", "Geography"),
    Article("Echo Lake", "Echo Lake is a lake near Delta Lake.", "Lake in Freedonia", "Geography"),
    Article(
        "History of Freedonia",
        "The history of Freedonia: Ada Byron and Carl Weber lived there. Art was popular.",
        "Past of Freedonia",
        "History",
    ),
    Article(
        "Ada Byron",
        "Ada Byron was an English mathematician who admired Carl Weber.",
        "English mathematician (1815–1852)",
        "People",
    ),
    Article("Carl Weber", "Carl Weber was a German composer.", "German composer (1786–1826)", "People"),
    Article(
        "Mercury",
        "Mercury may refer to a planet or an element.",
        "Topics referred to by the same term",
        "Uncategorized",
    ),
    Article("Mercury (planet)", "Mercury is the smallest planet.", "First planet from the Sun", "Physical sciences"),
    Article("Art", "Art is a creative activity.", "Creative activity", "Arts"),
)

# crc32(title) % 10 of the titles: only "Alpha Valley" and "Art" give 0, so they start the val questions.
MINI_VAL_STARTS = {"Alpha Valley", "Art"}


def all_candidates(articles, kind: str) -> list[Q.Question]:
    """Candidates of both splits (train first)."""
    return [q for split in Q.SPLITS for q in Q.candidate_questions(articles, kind, split)]


def summary_question(title: str) -> str:
    return f'What short description does the encyclopedia give for "{title}"?'


def bridge_question(phrase: str, start: str) -> str:
    return f'Which {phrase} is mentioned in the encyclopedia summary of "{start}"?'


def test_split_rule_on_the_hand_made_titles():
    assert {a.title for a in MINI if Q.split_of(a.title) == "val"} == MINI_VAL_STARTS
    for kind in Q.KINDS:
        for split in Q.SPLITS:
            assert all(Q.split_of(q.evidence[0]) == split for q in Q.candidate_questions(MINI, kind, split))


def test_mentions_are_leftmost_longest_on_word_boundaries():
    index = Q.MentionIndex(["New York", "University", "France", "Holy Roman Empire", "Roman Empire", "Paris"])
    text = "He studied at New York University. In France, the Holy Roman Empire met Paris. Parisians left."
    # "New York University": "New York" is followed by a capitalised word, and "University" follows the
    # capitalised "York" mid-sentence: both are parts of a longer name. "France" follows "In", which starts
    # its sentence. "Roman Empire" is inside the longer "Holy Roman Empire". "Parisians" is not "Paris".
    assert index.mentions(text) == ["France", "Holy Roman Empire", "Paris"]
    assert index.mentions("") == [] and Q.MentionIndex([]).mentions("Paris") == []


def test_description_questions_by_hand():
    # 11 articles; "Mercury" has a generic description: 10 questions, answers = the description
    expected = {a.title: a.description for a in MINI if a.title != "Mercury"}
    got = all_candidates(MINI, "description")
    assert {q.evidence[0]: q.answers[0] for q in got} == expected
    for q in got:
        assert q.question == summary_question(q.evidence[0])
        assert (q.kind, q.hops, q.level, len(q.answers), len(q.evidence)) == ("description", 1, "1", 1, 1)


def test_bridge_questions_by_hand():
    # Alpha Valley mentions Freedonia, Bravo River, Delta Lake, Echo Lake; the two lakes share the
    # description "Lake in Freedonia": both rejected as ambiguous.
    # Bravo River mentions Mercury, whose description is generic: rejected.
    # Delta Lake mentions "Mercury (planet)": answers are the title and its alias "Mercury".
    # Echo Lake mentions Delta Lake only (itself excluded): no ambiguity there.
    # History of Freedonia mentions Freedonia (inside its own title: rejected), Ada Byron, Carl Weber,
    # and Art (a one-word title under 5 characters: never an answer).
    # Ada Byron mentions Carl Weber.
    # Case of the description's first word (lowercase count vs capitalised count, description first words
    # not voting): country 1 vs 0 -> lowercased; river 3 ("long river", "longest river", "a river") vs 2
    # ("Bravo River" twice) -> lowercased; first 1 vs 0 -> lowercased; Lake: lake 1 vs 5 -> kept;
    # English 0 vs 1 and German 0 vs 1 -> kept.
    expected = {
        (bridge_question("country in Europe", "Alpha Valley"), ("Freedonia",), ("Alpha Valley", "Freedonia")),
        (bridge_question("river of Freedonia", "Alpha Valley"), ("Bravo River",), ("Alpha Valley", "Bravo River")),
        (
            bridge_question("first planet from the Sun", "Delta Lake"),
            ("Mercury (planet)", "Mercury"),
            ("Delta Lake", "Mercury (planet)"),
        ),
        (bridge_question("Lake in Freedonia", "Echo Lake"), ("Delta Lake",), ("Echo Lake", "Delta Lake")),
        (
            bridge_question("English mathematician (1815–1852)", "History of Freedonia"),
            ("Ada Byron",),
            ("History of Freedonia", "Ada Byron"),
        ),
        (
            bridge_question("German composer (1786–1826)", "History of Freedonia"),
            ("Carl Weber",),
            ("History of Freedonia", "Carl Weber"),
        ),
        (bridge_question("German composer (1786–1826)", "Ada Byron"), ("Carl Weber",), ("Ada Byron", "Carl Weber")),
    }
    got = all_candidates(MINI, "bridge")
    assert {(q.question, q.answers, q.evidence) for q in got} == expected
    assert len(got) == len(expected)
    assert all((q.kind, q.hops, q.level) == ("bridge", 2, "2") for q in got)
    # the two val ones start from Alpha Valley
    assert {q.answers[0] for q in Q.candidate_questions(MINI, "bridge", "val")} == {"Freedonia", "Bravo River"}


def test_bridge_rejections_by_hand():
    answers = {q.answers[0] for q in all_candidates(MINI, "bridge")}
    assert "Echo Lake" not in answers  # ambiguous with Delta Lake in Alpha Valley
    assert "Mercury" not in answers  # generic description
    assert "Art" not in answers  # too short a title
    assert ("History of Freedonia", "Freedonia") not in {q.evidence for q in all_candidates(MINI, "bridge")}
    # Delta Lake IS an answer, but only from Echo Lake (unambiguous there)
    assert [q.evidence[0] for q in all_candidates(MINI, "bridge") if q.answers[0] == "Delta Lake"] == ["Echo Lake"]


def test_compare_questions_by_hand():
    # People: Ada Byron (1815) and Carl Weber (1786), related (History of Freedonia names both; Ada Byron
    # names Carl Weber): one pair. crc32("Ada Byron\nCarl Weber") is odd, so Carl Weber is named first.
    got = all_candidates(MINI, "compare")
    assert got == [
        Q.Question(
            "Who was born first, Carl Weber or Ada Byron?", ("Carl Weber",), "compare", 2, ("Carl Weber", "Ada Byron")
        )
    ]


@pytest.mark.parametrize(
    "description, year",
    [
        ("English novelist (1775–1817)", 1775),
        ("Canadian writer (born 1939)", 1939),
        ("Roman statesman and lawyer (106–43 BC)", -106),  # 106 BC to 43 BC: 63 years
        ("Italian architect and author (1404-1472)", 1404),  # ASCII hyphen
        ("English rock band (1960–1990)", None),  # a group
        ("President of a country (1861–1865)", None),  # 4 years: a term in office, not a life
        ("Design movement (c. 1880–1920)", None),  # circa
        ("Emperor of Brazil (1822–31)", None),  # two-digit end: 31 - 1822 < 15
        ("Country in Europe", None),
    ],
)
def test_birth_year(description, year):
    assert Q.birth_year(Article("X Y", "x", description, "People")) == year


def test_small_rules():
    assert Q.title_alias("Mercury (planet)") == "Mercury"
    assert Q.title_alias("Casablanca (1942 film)") == "Casablanca"
    assert Q.title_alias("Paris") == "Paris" and Q.title_alias("(1)") == "(1)"
    assert Q.title_answers("Paris") == ("Paris",)
    assert Q.informative_description("Country in Europe")
    assert not Q.informative_description("Vegetable")  # one word
    assert not Q.informative_description("Topics referred to by the same term")
    assert Q.mentionable_title("Paris") and Q.mentionable_title("Li Bai") and not Q.mentionable_title("Art")


def test_quotas():
    # 10 with 25/50/25: exact shares 2.5, 5, 2.5 -> floors 2, 5, 2 (9); the one left goes to the largest
    # remainder, a tie between description and compare broken by KINDS order -> description
    assert Q._quotas(10, Q.DEFAULT_MIX, {"description": 99, "bridge": 99, "compare": 99}) == {
        "description": 3,
        "bridge": 5,
        "compare": 2,
    }
    # 8 with only 1 compare: shares 2, 4, 2; compare takes its 1; the 1 left is shared 1/3 : 2/3 between
    # description and bridge -> floors 0, 0, largest remainder bridge
    assert Q._quotas(8, Q.DEFAULT_MIX, {"description": 10, "bridge": 7, "compare": 1}) == {
        "description": 2,
        "bridge": 5,
        "compare": 1,
    }


def test_build_on_the_hand_made_corpus():
    # train has 8 description, 5 bridge, 1 compare candidates
    qs = Q.build_questions(MINI, 8, seed=3)
    assert collections.Counter(q.kind for q in qs) == {"description": 2, "bridge": 5, "compare": 1}
    assert len({q.question for q in qs}) == 8
    assert all(q.evidence[0] not in MINI_VAL_STARTS for q in qs)
    assert Q.build_questions(MINI, 8, seed=3) == qs
    # kinds as names (weights from DEFAULT_MIX) or as a mapping
    assert {q.kind for q in Q.build_questions(MINI, 3, kinds=("bridge",))} == {"bridge"}
    only = Q.build_questions(MINI, 2, kinds={"description": 1.0}, split="val")
    assert sorted(q.evidence[0] for q in only) == ["Alpha Valley", "Art"]
    val = Q.build_questions(MINI, 4, split="val")  # 2 description + 2 bridge exist in val
    assert collections.Counter(q.kind for q in val) == {"description": 2, "bridge": 2}
    with pytest.raises(ValueError, match="only"):
        Q.build_questions(MINI, 5, split="val")
    with pytest.raises(ValueError, match="unknown question kind"):
        Q.build_questions(MINI, 1, kinds=("topic",))
    with pytest.raises(ValueError, match="split"):
        Q.build_questions(MINI, 1, split="test")


def test_write_dataset_on_the_hand_made_corpus(tmp_path):
    train_path, val_path = Q.write_dataset(tmp_path, n_train=6, n_val=3, seed=1, sub="helper", articles=MINI)
    train, val = pd.read_parquet(train_path), pd.read_parquet(val_path)
    assert len(train) == 6 and len(val) == 3
    assert set(train["data_source"]) == {"mgrpo_verl/research/wiki_multihop"}
    row = train.iloc[0]
    info = row["extra_info"]
    assert info["split"] == "train" and info["index"] == 0 and info["source"] == "wiki_multihop"
    assert info["kind"] in Q.KINDS and info["level"] == str(info["hops"])
    assert len(info["evidence"]) == info["hops"]
    assert "ask_helper" in row["prompt"][0]["content"] and info["question"] in row["prompt"][0]["content"]
    assert list(val["extra_info"].map(lambda e: e["evidence"][0] in MINI_VAL_STARTS)) == [True] * 3


# ----------------------------------------------------------------------------------------------------
# the real corpus


@pytest.fixture(scope="module")
def articles():
    from mgrpo_verl.envs.research.articles import load_articles

    return load_articles()


@pytest.fixture(scope="module")
def built(articles):
    return Q.build_questions(articles, 300, seed=0), Q.build_questions(articles, 60, seed=0, split="val")


def test_real_build_is_fast(articles):
    start = time.process_time()
    Q._Builder(articles).all_questions()  # uncached
    assert time.process_time() - start < 10


def test_real_counts_and_mix(articles, built):
    counts = Q.available_counts(articles)
    for split in Q.SPLITS:
        assert counts[split]["description"] > 500 and counts[split]["bridge"] > 500 and counts[split]["compare"] >= 15
    train, val = built
    # 300 * (25, 50, 25)% and 60 * (25, 50, 25)%
    assert collections.Counter(q.kind for q in train) == {"description": 75, "bridge": 150, "compare": 75}
    assert collections.Counter(q.kind for q in val) == {"description": 15, "bridge": 30, "compare": 15}


def test_real_splits_are_disjoint_by_first_document(built):
    train, val = built
    assert all(Q.split_of(q.evidence[0]) == "train" for q in train)
    assert all(Q.split_of(q.evidence[0]) == "val" for q in val)
    assert not {q.evidence[0] for q in train} & {q.evidence[0] for q in val}
    texts = [q.question for q in train + val]
    assert len(texts) == len(set(texts))


def test_real_questions_are_well_formed(articles, built):
    by_title = {a.title: a for a in articles}
    for q in built[0] + built[1]:
        assert q.answers and all(a.strip() for a in q.answers)
        assert q.hops == Q.HOPS[q.kind] == len(q.evidence) and q.level == str(q.hops)
        assert all(t in by_title for t in q.evidence)
        if q.kind == "description":
            assert q.answers == (by_title[q.evidence[0]].description,)
        elif q.kind == "bridge":
            start, answer = q.evidence
            assert q.answers[0] == answer and answer in by_title[start].extract
            assert by_title[answer].description.rstrip(".").lower() in q.question.lower()
            assert not re.search(r"(?<!\w)" + re.escape(answer.lower()) + r"(?!\w)", q.question.lower())
        else:
            x, y = q.evidence
            assert q.answers[0] in (x, y) and f"{x} or {y}?" in q.question


def test_real_build_is_deterministic(articles, built):
    assert Q.build_questions(articles, 300, seed=0) == built[0]
    other = Q.build_questions(articles, 300, seed=1)
    assert other != built[0] and collections.Counter(q.kind for q in other) == {
        "description": 75,
        "bridge": 150,
        "compare": 75,
    }


def test_real_write_dataset(tmp_path):
    train_path, val_path = Q.write_dataset(tmp_path, n_train=8, n_val=4)
    train, val = pd.read_parquet(train_path), pd.read_parquet(val_path)
    assert (len(train), len(val)) == (8, 4)
    assert set(train["extra_info"].map(lambda e: e["level"])) <= {"1", "2"}
