"""MAGRPO's writing collaboration on offline Wikipedia summaries (mgrpo_verl/envs/coop_writing.py).

Reward values are worked out in the comment beside each assertion, with the module's constants: gate
MIN_WORDS 5 and type-token ratio 0.3; words ratio trapezoid 1 / 2 / 5 / 8; unique-word ratio ramp 1.2 -> 2.0;
style = min(1, Jaccard / 0.15); coherence = min(1, distinct transitions / 3);
reward = .5 structure + .25 style + .25 coherence. Stopwords used below: is, the, of, also, in, however,
because, along, and, a, its, each, every.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl.envs import coop_writing as cw

SUMMARY = "Paris is the capital of France."  # 6 words; content {paris, capital, france}
# 18 words; content {paris, largest, city, france, grew, trade, moved, seine}; markers also, however, because
DETAILS = "Paris is also the largest city in France. However, the city grew because trade moved along the Seine."


@pytest.fixture(scope="module")
def articles():
    return cw.load_wiki_summaries()


# ------------------------------------------------------------------------------------------- corpus


def test_loader_count_and_fields(articles):
    # the shipped JSON: 10,033 entries, none with an empty extract -> none skipped
    assert len(articles) == cw.SHIPPED_ARTICLES == 10_033
    assert all(isinstance(a, cw.WikiArticle) for a in articles)
    assert len({a.title for a in articles}) == len(articles)  # titles are unique
    for a in articles:
        assert a.title and a.extract and a.topic
        assert a.extract == a.extract.strip() and isinstance(a.description, str)
    assert sum(not a.description for a in articles) == 171
    assert len({a.topic for a in articles}) == 12
    odyssey = next(a for a in articles if a.title == "2001: A Space Odyssey")
    assert odyssey.description == "1968 film by Stanley Kubrick" and odyssey.topic == "Arts"
    assert odyssey.extract.startswith("2001: A Space Odyssey is a 1968 epic science fiction film")


def test_loader_skips_empty_extracts_and_checks_layout(tmp_path):
    path = tmp_path / "wiki.json"
    data = {
        "A": {"title": "A", "extract": "  Alpha text.  ", "description": "first", "topic": "T"},
        "B": {"title": "B", "extract": "   ", "description": "blank extract", "topic": "T"},
        "C": {"title": "C", "extract": "", "description": "", "topic": "T"},
        "D": {"title": "D", "extract": "Delta.", "description": None, "topic": "U"},
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    got = cw.load_wiki_summaries(path)
    # B (whitespace) and C (empty) are skipped; strings are stripped; a null description becomes ""
    assert got == [cw.WikiArticle("A", "Alpha text.", "first", "T"), cw.WikiArticle("D", "Delta.", "", "U")]
    path.write_text(json.dumps({"A": {"title": "A", "extract": 3}}), encoding="utf-8")
    with pytest.raises(ValueError, match="entry 'A' field 'extract'"):
        cw.load_wiki_summaries(path)
    path.write_text(json.dumps([1, 2]), encoding="utf-8")
    with pytest.raises(ValueError, match="JSON object keyed by title"):
        cw.load_wiki_summaries(path)


def test_splits_are_deterministic_and_disjoint(articles):
    train, val = cw.writing_splits(0, 200, 50)
    assert (len(train), len(val)) == (200, 50)
    assert cw.writing_splits(0, 200, 50) == (train, val)  # same seed, same split
    assert not {a.title for a in train} & {a.title for a in val}
    other_train, _ = cw.writing_splits(1, 200, 50)
    assert [a.title for a in other_train] != [a.title for a in train]
    # independent of the pool's order
    assert cw.writing_splits(0, 200, 50, articles=list(reversed(articles))) == (train, val)
    # a larger split with the same seed extends the smaller one's shuffle
    assert cw.writing_splits(0, 250, 0)[0] == train + val
    # everything can be split, disjointly
    tr, va = cw.writing_splits(3, len(articles) - 10, 10)
    assert len({a.title for a in tr} | {a.title for a in va}) == len(articles)


@pytest.mark.parametrize(
    "args, match",
    [((0, -1, 5), "n_train must be an int >= 0"), ((0, 5, 1.5), "n_val must be an int >= 0"),
     ((0, 10_000, 34), "exceeds the 10033 articles")],
)
def test_splits_bad_sizes(args, match):
    with pytest.raises(ValueError, match=match):
        cw.writing_splits(*args)


# ------------------------------------------------------------------------------------------ prompts


def test_agent_prompts(articles):
    a = next(x for x in articles if x.title == "2001: A Space Odyssey")
    for agent in cw.AGENTS:
        (msg,) = cw.agent_messages(a, agent)
        assert msg["role"] == "user"
        assert '"2001: A Space Odyssey" (1968 film by Stanley Kubrick; topic: Arts)' in msg["content"]
        assert a.extract[:40] not in msg["content"]  # the reference is never shown
    assert "short summary" in cw.agent_messages(a, "summary")[0]["content"]
    assert "detailed paragraph that follows" in cw.agent_messages(a, "details")[0]["content"]
    with pytest.raises(ValueError, match="agent must be one of"):
        cw.agent_messages(a, "main")
    bare = cw.WikiArticle("X", "X is a thing.", "", "Uncategorized")
    assert '"X" (topic: Uncategorized)' in cw.agent_messages(bare, "summary")[0]["content"]
    assert "blank line" in cw.single_messages(a)[0]["content"]


def test_single_response_split():
    assert cw.split_single_response(f"{SUMMARY}\n\n{DETAILS}\n") == (SUMMARY, DETAILS)
    assert cw.split_single_response(f"  {SUMMARY}\n \t\n{DETAILS}\n\nMore.") == (SUMMARY, f"{DETAILS}\n\nMore.")
    assert cw.split_single_response(f"{SUMMARY} {DETAILS}") == (f"{SUMMARY} {DETAILS}", "")
    with pytest.raises(TypeError, match="must be a str"):
        cw.split_single_response(None)


def test_with_peer():
    a = cw.WikiArticle("Paris", "Paris is the capital of France.", "capital of France", "Geography")
    base = cw.agent_messages(a, "details")
    out = cw.with_peer(base, "summary", f"  {SUMMARY}\n")
    assert base == cw.agent_messages(a, "details")  # input untouched
    assert len(out) == 1 and out[0]["content"].startswith(base[0]["content"])
    assert f'Your partner wrote the summary part:\n"""\n{SUMMARY}\n"""' in out[0]["content"]
    # the agent's own earlier draft (multi-turn / discussion)
    own = cw.with_peer(out, cw.SELF_ROLE, "My draft.")
    assert own[0]["content"].startswith(out[0]["content"])
    assert own[0]["content"].endswith('Your previous draft:\n"""\nMy draft.\n"""\nRevise it so that it fits your partner\'s part.')
    with pytest.raises(ValueError, match="peer_role"):
        cw.with_peer(base, "critic", "x")
    with pytest.raises(TypeError, match="peer_text"):
        cw.with_peer(base, "summary", None)
    with pytest.raises(ValueError, match="end with a user message"):
        cw.with_peer([*base, {"role": "assistant", "content": "x"}], "summary", "x")


# ------------------------------------------------------------------------------------ reward parts


def test_word_helpers():
    # letters/digits of any script; inner apostrophes kept; "_" splits; case folded
    want = ["zürich", "l’homme", "don't", "42", "ok", "go", "été"]
    assert cw.words("Zürich l’homme don't 42 ok_go ÉTÉ") == want
    assert cw.content_vocabulary("The city of Paris, the CITY.") == {"city", "paris"}
    assert cw.jaccard({"a", "b", "c"}, {"b", "c", "d", "e", "f"}) == pytest.approx(2 / 6)  # |{b,c}| / |{a..f}|
    assert cw.jaccard(set(), set()) == 0.0


def test_transitions_whole_words():
    text = "Although it rained, the match went on; in\n  addition, fans stayed. BUT butter Alsogaray nevertheless"
    # "in addition" across a line break; "BUT" case-insensitive; "butter"/"Alsogaray" are not markers;
    # "though" inside "although" does not count
    assert cw.transitions_in(text) == {"although", "in addition", "but", "nevertheless"}
    assert cw.transitions_in("Thoughtful alsoran") == set()


@pytest.mark.parametrize(
    "ratio, want",
    [(0.5, 0.0), (1.0, 0.0), (1.5, 0.5), (2.0, 1.0), (3.0, 1.0), (5.0, 1.0), (6.5, 0.5), (8.0, 0.0), (20.0, 0.0)],
)
def test_length_ratio_score(ratio, want):
    # trapezoid: rho - 1 on [1, 2]; 1 on [2, 5]; (8 - rho) / 3 on [5, 8]: 1.5 -> .5, 6.5 -> 1.5/3 = .5
    assert cw.length_ratio_score(ratio) == pytest.approx(want)


@pytest.mark.parametrize("ratio, want", [(0.0, 0.0), (1.2, 0.0), (1.6, 0.5), (2.0, 1.0), (9.0, 1.0)])
def test_unique_ratio_score(ratio, want):
    # (u - 1.2) / 0.8 clipped: 1.6 -> .4 / .8 = .5
    assert cw.unique_ratio_score(ratio) == pytest.approx(want)


def test_full_reward_example():
    s = cw.score_writing(SUMMARY, DETAILS)
    # rho = 18 / 6 = 3 -> L = 1; u = 8 / 3 = 2.67 -> U = 1; structure = 1
    assert (s.summary_words, s.details_words, s.length_ratio) == (6, 18, 3.0)
    assert s.unique_ratio == pytest.approx(8 / 3) and s.structure == 1.0
    # V(s) ∩ V(d) = {paris, france}; |V(s) ∪ V(d)| = 3 + 8 - 2 = 9 -> J = 2/9 = .222 >= .15 -> style 1
    assert s.jaccard == pytest.approx(2 / 9) and s.style == 1.0
    # markers also, however, because -> 3/3 = 1 ("along", "in" are not markers)
    assert s.transitions == ("also", "because", "however") and s.coherence == 1.0
    # reward = .5 + .25 + .25 = 1
    assert s.valid and s.reward == pytest.approx(1.0) and s.reference_overlap is None


def test_structure_component():
    s = cw.score_writing(SUMMARY, "Paris is the capital of France and a city.")
    # details: 9 words -> rho = 9/6 = 1.5 -> L = .5; V(d) = {paris, capital, france, city} -> u = 4/3
    # -> U = (1.333 - 1.2) / .8 = .1667; structure = (.5 + .1667) / 2 = .3333
    assert s.length_score == pytest.approx(0.5) and s.unique_score == pytest.approx(1 / 6)
    assert s.structure == pytest.approx(1 / 3)
    # J = 3 / 4 = .75 -> style 1; no marker -> coherence 0
    # reward = .5 * .3333 + .25 * 1 + .25 * 0 = .41667
    assert s.style == 1.0 and s.coherence == 0.0
    assert s.reward == pytest.approx(0.5 / 3 + 0.25)


def test_style_component():
    d = "Its museums attract millions of visitors each year, and its cafes line every boulevard."
    s = cw.score_writing(SUMMARY, d)
    # 14 words -> rho = 2.33 -> L = 1; V(d) = {museums, attract, millions, visitors, year, cafes, line,
    # boulevard} = 8 -> u = 8/3 -> U = 1; no shared word -> J = 0 -> style 0; reward = .5 * 1 = .5
    assert (s.structure, s.jaccard, s.style, s.coherence) == (1.0, 0.0, 0.0, 0.0)
    assert s.reward == pytest.approx(0.5)
    s = cw.score_writing(SUMMARY, d.replace("every boulevard", "every Paris boulevard"))
    # + "paris": 15 words, rho 2.5, u = 9/3 = 3 -> structure 1; J = 1 / (3 + 9 - 1) = 1/11 = .0909
    # -> style = .0909 / .15 = .6061; reward = .5 + .25 * .6061 = .6515
    assert s.jaccard == pytest.approx(1 / 11) and s.style == pytest.approx((1 / 11) / 0.15)
    assert s.reward == pytest.approx(0.5 + 0.25 * (1 / 11) / 0.15)


def test_coherence_component():
    d = "Its museums attract millions of visitors each year, and its cafes line every boulevard."
    # one marker ("however") in the summary counts too: coherence 1/3; reward = .5 + 0 + .25/3 = .5833
    s = cw.score_writing("However, Paris is the capital of France.", d)
    assert s.transitions == ("however",) and s.coherence == pytest.approx(1 / 3)
    assert s.reward == pytest.approx(0.5 + 0.25 / 3)
    # four distinct markers saturate at 1; repeating one marker does not add
    s4 = cw.score_writing(SUMMARY, "Moreover, " + d + " Thus, visitors stay; however, prices rise; in short, busy.")
    assert len(s4.transitions) == 4 and s4.coherence == 1.0
    s_rep = cw.score_writing(SUMMARY, "However, " + d + " However, however.")
    assert s_rep.coherence == pytest.approx(1 / 3)


def test_reference_overlap_and_flag():
    # content words: text {paris, capital, france, city}, reference {paris, france, river}; overlap 2
    # -> P = 2/4, R = 2/3, F1 = 2 * .5 * .667 / 1.1667 = 4/7
    assert cw.reference_overlap("paris capital france city", "paris france river") == pytest.approx(4 / 7)
    ref = f"{SUMMARY}\n{DETAILS}"
    s = cw.score_writing(SUMMARY, DETAILS, reference=ref)
    assert s.reference_overlap == pytest.approx(1.0) and s.reward == pytest.approx(1.0)  # reported only
    s = cw.score_writing(SUMMARY, DETAILS, reference="paris france river", use_reference=True)
    # joint text's content words: summary 3 (paris, capital, france) + details 9 (paris, largest, city,
    # france, city, grew, trade, moved, seine) = 12; overlap with {paris, france, river} = 1 + 1 = 2
    # -> P = 2/12, R = 2/3, F1 = 2 * (1/6) * (2/3) / (1/6 + 2/3) = (2/9) / (5/6) = 4/15
    # reward = .75 * 1 + .25 * 4/15
    assert s.reference_overlap == pytest.approx(4 / 15)
    assert s.reward == pytest.approx(0.75 + 0.25 * 4 / 15)
    with pytest.raises(ValueError, match="use_reference=True needs a reference"):
        cw.score_writing(SUMMARY, DETAILS, use_reference=True)


def test_reward_on_the_corpus_itself(articles):
    a = next(x for x in articles if x.title == "2001: A Space Odyssey")
    s = cw.score_article_split(a)
    assert s.valid and 0.0 < s.reward <= 1.0 and s.reference_overlap == pytest.approx(1.0)


# ------------------------------------------------------------------------- topical relevance (issue 29 item 7)

#: Off-topic nonsense tuned to the reward's features. Summary 5 words, content {zorblax, quenfit, mivorra, plenth,
#: daxil}; details 15 words, content {moreover, zorblax, quenfit, glimmerbox, tranquo, vexilat, snorfle,
#: therefore, mivorra, plenth, krendal, finally, wumbrat, yorple, fizzgig} (15: the three markers are not
#: stopwords). rho = 15/5 = 3 -> L = 1; u = 15/5 = 3 -> U = 1; J = 4 shared / (5 + 15 - 4) = .25 -> style 1;
#: markers moreover, therefore, finally -> coherence 1: the surface reward is 1.0.
NONSENSE = (
    "Zorblax quenfit mivorra plenth daxil.",
    "Moreover, zorblax quenfit glimmerbox tranquo vexilat snorfle. Therefore, mivorra plenth krendal. Finally, "
    "wumbrat yorple fizzgig.",
)

#: Off-topic but fluent: a recipe written to the features (two parts, new words, three markers).
CARBONARA = (
    "Pasta carbonara is a Roman dish of eggs, cheese, cured pork and black pepper.",
    "It is made by boiling spaghetti and mixing it with beaten eggs and grated pecorino off the heat. Moreover, "
    "guanciale is fried until crisp, because its fat flavours the sauce. However, cream is not traditional. "
    "Finally, the dish is served at once, so that the sauce stays silky and the pasta stays warm.",
)

#: A lead written from general knowledge (not from the extract) for the corpus's "Albert Einstein".
EINSTEIN = (
    "Albert Einstein was a German-born theoretical physicist who developed the theory of relativity, one of the "
    "two pillars of modern physics.",
    "Einstein was born in Ulm in 1879 and later studied in Zurich. While working at the Swiss patent office, he "
    "published his 1905 papers on the photoelectric effect, Brownian motion and special relativity. Subsequently, "
    "he developed general relativity, which describes gravity as the curvature of spacetime. He received the Nobel "
    "Prize in Physics in 1921, notably for his explanation of the photoelectric effect. However, he left Germany "
    "in 1933 because of the rise of the Nazis and settled in the United States, where he worked at Princeton. "
    "His equation E = mc2 is famous worldwide, and he died in 1955.",
)


def test_off_topic_nonsense_tuned_to_the_features_scores_zero(articles):
    # the attack: it earned the full joint reward 1.0 from the task (coop_tasks.WritingTask.reward) for any
    # article; it shares no content word with "Jazz", so p = 0 -> relevance 0 -> reward 0
    from mgrpo_verl.envs.coop_tasks import WRITING_SOURCE, task_for

    summary, details = NONSENSE
    assert cw.score_writing(summary, details).reward == pytest.approx(1.0)  # the surface features alone
    jazz = next(a for a in articles if a.title == "Jazz")
    s = cw.score_writing(summary, details, article=jazz)
    assert (s.structure, s.style, s.coherence, s.relevance, s.reward) == (1.0, 1.0, 1.0, 0.0, 0.0)
    outcome = task_for(WRITING_SOURCE).reward("Jazz", {"summary": summary, "details": details})
    assert outcome.reward == 0.0 and outcome.info["relevance"] == 0.0
    # fluent English about another subject, tuned the same way: 14 and 53 words -> rho 3.79 -> L = 1; V(s) 10,
    # V(d) 25 -> u = 2.5 -> U = 1; structure 1; 3 shared (dish, eggs, pasta) -> J = 3 / 32 = .09375 -> style
    # .625; 5 markers -> coherence 1; surface reward .5 + .25 * .625 + .25 = .90625. It shares 1 of its 32
    # content words with "Albert Einstein" ("made"): p = 1/32 = .031 < .05 -> relevance 0
    einstein = next(a for a in articles if a.title == "Albert Einstein")
    recipe = cw.score_writing(*CARBONARA, article=einstein)
    assert cw.score_writing(*CARBONARA).reward == pytest.approx(0.90625)
    assert (recipe.relevance, recipe.reward) == (0.0, 0.0)


def test_a_lead_about_the_article_keeps_its_reward(articles):
    # p = 22 shared / 60 distinct content words = .367 >= RELEVANCE_FULL .15 -> relevance 1: reward unchanged
    einstein = next(a for a in articles if a.title == "Albert Einstein")
    summary, details = EINSTEIN
    vocabulary = cw.content_vocabulary(f"{summary}\n{details}")
    assert (len(vocabulary), len(vocabulary & cw.article_vocabulary(einstein))) == (60, 22)
    s = cw.score_writing(summary, details, article=einstein)
    assert s.relevance == 1.0 and s.reward == pytest.approx(cw.score_writing(summary, details).reward) and s.reward > 0.8
    # the same lead scored against another article is off-topic: it shares no content word with "Jazz" -> 0
    jazz = next(a for a in articles if a.title == "Jazz")
    assert cw.score_writing(summary, details, article=jazz).relevance == 0.0


def test_topical_relevance_ramp():
    article = cw.WikiArticle(title="Paris", extract="Paris is the capital of France on the Seine.", description="City", topic="Geography")
    # V(article) = {paris, capital, france, seine, city}; each text has 10 content words
    others = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    assert cw.topical_relevance(" ".join(others), article) == 0.0  # p = 0
    # p = 1/10 = .1 -> (.1 - .05) / (.15 - .05) = .5
    assert cw.topical_relevance(" ".join(["paris", *others[:9]]), article) == pytest.approx(0.5)
    # p = 2/10 = .2 >= .15 -> 1
    assert cw.topical_relevance(" ".join(["paris", "seine", *others[:8]]), article) == 1.0
    assert cw.topical_relevance("the of and", article) == 0.0  # no content word
    with pytest.raises(TypeError, match="article must be a WikiArticle"):
        cw.score_writing(SUMMARY, DETAILS, article="Paris")


# ----------------------------------------------------------------------------------- robustness


@pytest.mark.parametrize(
    "summary, details",
    [
        ("", ""),
        ("", DETAILS),
        (SUMMARY, ""),
        ("   \n\t ", DETAILS),
        ("!!! ... ??? --- ***", DETAILS),  # punctuation only: 0 words
        ("Paris is in France.", DETAILS),  # 4 words < MIN_WORDS = 5
        (SUMMARY, "the " * 40),  # type-token ratio 1/40 < .3: a repetition loop
        (SUMMARY, "1 2 3 4 5 6 7 8 9 1 2 3 4 5 6 7 8 9 1 2 3 4 5 6 7 8 9 1 2 3 4 5 6"),  # ttr 9/33 = .27
    ],
)
def test_empty_and_garbage_score_zero(summary, details):
    s = cw.score_writing(summary, details)
    assert not s.valid
    assert (s.reward, s.structure, s.style, s.coherence, s.length_score, s.unique_score) == (0, 0, 0, 0, 0, 0)


def test_non_ascii_text():
    s = cw.score_writing(
        "Zürich est la plus grande ville de Suisse.",
        "Située au bord du lac de Zurich, la ville compte environ 420 000 habitants; elle est aussi le principal "
        "centre économique du pays, avec la bourse suisse et de nombreuses banques. "
        "L’université fut fondée en 1833.",
    )
    assert s.valid and 0.0 <= s.reward <= 1.0 and s.summary_words == 8
    odd = [("東京は日本の首都です。", "東京都は人口が最も多い都市です。"), ("🙂🙂🙂", "😀 " * 50), ("\ud800", "\x00\x01")]
    for summary, details in odd:
        s = cw.score_writing(summary, details)  # CJK runs without spaces count as one word each: gated out
        assert s.reward == 0.0 and not s.valid


def test_very_long_inputs():
    start = time.perf_counter()
    # 90,000 words of repetition: ttr 11/90000 -> gated out
    s = cw.score_writing(SUMMARY, DETAILS * 5000)
    assert not s.valid and s.reward == 0.0
    # 200,000 distinct words: rho = 200000 / 6 >> 8 -> L = 0, U = 1 -> structure .5; J = 0; no marker
    long_details = " ".join(f"w{i}" for i in range(200_000))
    s = cw.score_writing(SUMMARY, long_details)
    assert s.valid and s.length_score == 0.0 and s.structure == pytest.approx(0.5)
    assert s.reward == pytest.approx(0.25)
    # both huge: rho = 1 -> L = 0; u = 1 -> U = 0; J = 1 -> style 1 -> reward .25
    s = cw.score_writing(long_details, long_details)
    assert s.structure == 0.0 and s.style == 1.0 and s.reward == pytest.approx(0.25)
    assert time.perf_counter() - start < 10.0


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((None, DETAILS), {}, "summary_text must be a str, got NoneType"),
        ((SUMMARY, b"bytes"), {}, "details_text must be a str, got bytes"),
        ((SUMMARY, 3), {}, "details_text must be a str, got int"),
        ((SUMMARY, DETAILS), {"reference": 5}, "reference must be a str or None, got int"),
    ],
)
def test_non_strings_raise_type_error(args, kwargs, match):
    with pytest.raises(TypeError, match=match):
        cw.score_writing(*args, **kwargs)


# ----------------------------------------------------------------------------------- properties

# Words that make the valid path likely: content words, stopwords and transition markers.
_VOCAB = ["paris", "france", "city", "river", "museum", "history", "the", "of", "is", "however", "also",
          "because", "for example", "in addition", "Zürich", "東京", "42", "...", "\n"]
_texts = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(_VOCAB), max_size=120).map(" ".join),
)


_ARTICLE = cw.WikiArticle(title="Paris", extract="Paris is a city in France, on a river.", description="", topic="Geography")


@settings(max_examples=400, deadline=None)
@given(_texts, _texts, st.one_of(st.none(), _texts), st.booleans(), st.booleans())
def test_every_component_stays_in_unit_interval(summary, details, reference, use_reference, with_article):
    if use_reference and reference is None:
        reference = ""
    article = _ARTICLE if with_article else None
    s = cw.score_writing(summary, details, reference, use_reference=use_reference, article=article)
    for name in ("reward", "structure", "style", "coherence", "length_score", "unique_score", "jaccard"):
        assert 0.0 <= getattr(s, name) <= 1.0, name
    if reference is not None:
        assert 0.0 <= s.reference_overlap <= 1.0
    # the reward is the documented combination of its parts
    base = 0.5 * s.structure + 0.25 * s.style + 0.25 * s.coherence
    want = 0.75 * base + 0.25 * s.reference_overlap if use_reference else base
    if with_article:
        assert 0.0 <= s.relevance <= 1.0
        want *= s.relevance
    assert s.reward == pytest.approx(want if s.valid else 0.0, abs=1e-12)


# ------------------------------------------------------------------------------------------- demonstrations


def test_a_demonstration_is_each_agent_s_prompt_and_its_part_of_the_lead():
    article = cw.WikiArticle(
        title="Paris", description="capital of France", topic="Geography",
        extract="Paris is the capital and largest city of France. It lies on the Seine in the north of the country, "
                "and it has been a centre of finance, diplomacy, commerce, fashion and science for centuries. Third.",
    )  # fmt: skip
    episode = cw.demonstration(article)
    # the summary from the prompt's words: "<title> is <description>."
    assert episode["summary"] == [*cw.agent_messages(article, "summary"),
                                  {"role": "assistant", "content": "Paris is capital of France."}]
    # the details: the first 15 words after the first sentence: It(1) lies on the Seine(5) in the north of the(10)
    # country, and it has been(15)
    assert episode["details"] == [*cw.agent_messages(article, "details"), {
        "role": "assistant", "content": "It lies on the Seine in the north of the country, and it has been"}]
    # no description: the summary is the first 6 words of the lead; one sentence only: the details repeat its start
    short = cw.WikiArticle(title="X", description="", topic="T", extract="One two three four five six seven eight.")
    assert [m[-1]["content"] for m in cw.demonstration(short).values()] == [
        "One two three four five six", "One two three four five six seven eight."]


def test_demonstrations_keep_the_rl_validation_articles_out_of_training(tmp_path):
    import pandas as pd

    from mgrpo_verl.envs.coop_tasks import write_writing_dataset

    _, val_file = write_writing_dataset(tmp_path)  # the RL dataset: its item is the article's title
    rl_val_titles = {row["reward_model"]["ground_truth"] for _, row in pd.read_parquet(val_file).iterrows()}
    val = cw.demonstrations(32, 0, "val")
    assert len(val) == 32
    val_titles = {_title(e) for e in val}
    assert val_titles == rl_val_titles
    train = cw.demonstrations(512, 0, "train")
    assert len(train) == 512 and not {_title(e) for e in train} & val_titles
    assert train == cw.demonstrations(512, 0, "train")  # the same for the same seed
    assert [_title(e) for e in train[:8]] != [_title(e) for e in cw.demonstrations(8, 1, "train")]
    with pytest.raises(ValueError, match="split must be 'train' or 'val', got 'test'"):
        cw.demonstrations(1, 0, "test")
    with pytest.raises(ValueError, match="33 val demonstrations asked for, 32 articles"):
        cw.demonstrations(33, 0, "val")


def _title(episode) -> str:
    prompt = episode["summary"][0]["content"]
    return prompt.split('about "', 1)[1].split('" (', 1)[0]


def test_demonstrations_score_what_the_docstring_says(articles):
    by_title = {a.title: a for a in articles}
    scores = [cw.score_writing(e["summary"][-1]["content"], e["details"][-1]["content"], article=by_title[_title(e)])
              for e in cw.demonstrations(256, 0, "train")]  # fmt: skip
    mean = {k: sum(getattr(s, k) for s in scores) / len(scores) for k in ("reward", "coherence", "relevance")}
    # demonstration()'s docstring, measured on the RL training articles: 0.42, coherence 0.08, relevance 1.0; here on
    # 256 demonstration articles drawn from the whole pool
    assert mean["reward"] == pytest.approx(0.42, abs=0.04)
    assert mean["coherence"] < 0.15 and mean["relevance"] > 0.95
