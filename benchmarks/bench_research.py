"""The deep-research environment's hot paths against references measured in the same run.

Everything runs on the real corpus: the 10,033 Wikipedia summaries of the installed package
(``Corpus.default()``, the corpus the tools and ``sub_messages_with_evidence`` use). Queries are the texts
of the built-in questions, ``build_questions(load_articles(), --queries, seed=0)``. Each part is timed best
of ``--repeats`` with the functions interleaved in every round (``best_times``) and printed as a Markdown
table.

1. **Search.** Reference: ``rank_bm25.BM25Okapi`` built over the same tokenised documents (the same
   ``tokenize`` of title, description and extract), queried the library's plain way: ``tokenize(query)``,
   ``get_scores`` (a score for every document), top-k by ``numpy.argpartition`` then ``argsort``, titles
   only. Ours: ``Corpus.search(query, k)`` (tokenising, scoring only the documents that contain a query
   term, ranking with a title tie-break, building the hits with their snippets). Ratio = ours / reference.
   For context also ``sub_messages_with_evidence`` (the CPU recipe's sub-agent prompt: one search, k=3).

   Agreement is checked two ways. Against the plain reference, whose idf differs from ours (rank_bm25
   floors only negative idfs, ours floors every idf at ``max(epsilon * average idf, MIN_IDF)``), the
   top-k titles may differ; the script reports how often they are identical and the mean overlap
   |ours ∩ reference| / k. Against the reference with our idf floor applied to a copy of its idf table,
   scored over every document and ranked with our tie-break, the results must be identical (titles and
   scores): this checks that scoring only the candidate documents loses nothing.

2. **Index build.** Reference: ``BM25Okapi(tokenised documents)``; ours: ``Corpus(articles).build_index()``
   (title maps, BM25, an inverted index, the idf floor). Tokenising the 10k documents is included in both
   and is also timed alone, for scale.

3. **Tool calls end to end.** ``SearchTool`` / ``VisitTool`` as verl's ``ToolAgentLoop`` drives them, per
   call ``create`` + ``execute`` + ``release`` in one asyncio event loop, one call at a time and in
   batches of ``--concurrency`` calls under ``asyncio.gather``. Reference: the same work without the tool
   layer, ``format_hits(q, corpus.search(q, k))`` and ``format_page(corpus.page(title, 1))`` in a plain
   loop. Ratio = tool / bare: the tool layer's overhead (argument checks, async calls, instance ids). The
   visited documents are the questions' evidence titles; the script checks every tool text equals the
   bare text.

4. **Rewards.** ``extract_answer``, ``exact_match``, ``f1``, ``score`` (extract + F1) and verl's entry point
   ``compute_score`` on ``--pairs`` (reply, answers) pairs built from the questions: the correct answer
   after reasoning, the answer wrapped in Markdown and a think block, a partly right answer, another
   question's answer, an ``<answer>`` tag. No reference: no installed package computes these (SQuAD's
   script is not a package here), so this part reports µs per sample; ``normalize_answer`` of both sides
   is our own floor, for scale. Checked: EM <= F1 on every pair, and EM = F1 = 1 on the correct replies.

    python benchmarks/bench_research.py [--parts search build tools rewards] [--repeats 3]
        [--queries 200] [--k 5] [--build-repeats 2] [--concurrency 1 32] [--pairs 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import io
import os
import sys
import time

import numpy as np
from timing import best_times, fmt_s

PARTS = ("search", "build", "tools", "rewards")


def doc_text(article) -> str:
    """What the index tokenises of an article (as ``Corpus.build_index`` does)."""
    return f"{article.title} {article.description} {article.extract}"


def reference_index(articles):
    """The reference BM25: ``BM25Okapi`` over the same tokenised documents, default parameters."""
    from rank_bm25 import BM25Okapi

    from mgrpo_verl.envs.research.corpus import tokenize

    return BM25Okapi([tokenize(doc_text(a)) for a in articles])


def reference_top_k(bm25, titles: list[str], query: str, k: int) -> list[str]:
    """rank_bm25's plain path: score every document, top-k by argpartition, then argsort of those k."""
    from mgrpo_verl.envs.research.corpus import tokenize

    scores = bm25.get_scores(tokenize(query))
    top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    top = top[np.argsort(-scores[top], kind="stable")]
    return [titles[i] for i in top]


def floored_copy(bm25):
    """A copy of the reference BM25 whose idf table is floored the way ``Corpus.build_index`` floors it."""
    from mgrpo_verl.envs.research.corpus import MIN_IDF

    floor = max(bm25.epsilon * bm25.average_idf, MIN_IDF)
    same = copy.copy(bm25)
    same.idf = {term: max(idf, floor) for term, idf in bm25.idf.items()}
    return same


def exhaustive_hits(bm25, titles: list[str], query: str, k: int) -> list[tuple[str, float]]:
    """Top-k (title, score) over every document, scores > 0, ties by title then position (ours)."""
    from mgrpo_verl.envs.research.corpus import tokenize

    scores = bm25.get_scores(tokenize(query))
    positive = ((s, i) for i, s in enumerate(scores.tolist()) if s > 0)
    ranked = sorted(positive, key=lambda si: (-si[0], titles[si[1]], si[1]))
    return [(titles[i], s) for s, i in ranked[:k]]


# ----------------------------------------------------------------------------------------------------
# 1. search


def bench_search(args, corpus, articles, queries) -> None:
    from mgrpo_verl.envs.research.prompts import EVIDENCE_HITS, sub_messages_with_evidence

    k, n = args.k, len(queries)
    titles = [a.title for a in articles]
    corpus.build_index()
    reference = reference_index(articles)
    best = best_times(args.repeats, {
        "ref": lambda: [reference_top_k(reference, titles, q, k) for q in queries],
        "ours": lambda: [corpus.search(q, k) for q in queries],
        "prompt": lambda: [sub_messages_with_evidence("sub", q) for q in queries],
    })
    print(f"## 1. Search: `Corpus.search` vs rank_bm25 (best of {args.repeats})\n")
    print(f"{len(corpus):,} documents, {n} queries (built-in question texts, "
          f"{np.mean([len(q) for q in queries]):.0f} characters on average), k={k}.\n")
    print("| method | time | ms / query | ratio to reference |")
    print("|---|---:|---:|---:|")
    rows = [
        ("rank_bm25 `get_scores` + argpartition (reference)", "ref"),
        (f"ours `Corpus.search(q, k={k})` (with snippets)", "ours"),
        (f"`sub_messages_with_evidence` (one search, k={EVIDENCE_HITS}, + prompt), context", "prompt"),
    ]
    for label, key in rows:
        s = best[key]
        print(f"| {label} | {fmt_s(s)} | {1000 * s / n:.3f} | {s / best['ref']:.2f}× |")

    ours = [[h.title for h in corpus.search(q, k)] for q in queries]
    plain = [reference_top_k(reference, titles, q, k) for q in queries]
    same = floored_copy(reference)
    exact_ok = 0
    for q in queries:
        mine = [(h.title, h.score) for h in corpus.search(q, k)]
        theirs = exhaustive_hits(same, titles, q, k)
        exact_ok += [t for t, _ in mine] == [t for t, _ in theirs] and np.allclose(
            [s for _, s in mine], [s for _, s in theirs], rtol=1e-12, atol=0.0)
    identical = sum(a == b for a, b in zip(ours, plain))
    same_set = sum(set(a) == set(b) for a, b in zip(ours, plain))
    overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ours, plain)]))
    short = sum(len(a) < k for a in ours)
    print(f"\n| our top-{k} compared with | identical (ordered) | same set | mean overlap (∣∩∣/{k}) |")
    print("|---|---:|---:|---:|")
    print(f"| plain reference (rank_bm25's idf, arbitrary tie order) | {identical}/{n} | {same_set}/{n} "
          f"| {overlap:.3f} |")
    print(f"| reference with our idf floor, every document scored, our tie-break | {exact_ok}/{n} | - | - |")
    verdict = "identical" if exact_ok == n else "DIFFERENT"
    print(f"\ncandidate filtering vs scoring every document: {verdict} on {exact_ok}/{n} queries (titles and scores); "
          f"queries with fewer than {k} hits: {short}\n")


# ----------------------------------------------------------------------------------------------------
# 2. index build


def bench_build(args, articles) -> None:
    from mgrpo_verl.envs.research.corpus import Corpus, tokenize

    best = best_times(args.build_repeats, {
        "tok": lambda: [tokenize(doc_text(a)) for a in articles],
        "ref": lambda: reference_index(articles),
        "ours": lambda: Corpus(articles).build_index(),
    })
    print(f"## 2. Index build (best of {args.build_repeats})\n")
    print(f"{len(articles):,} documents; tokenising (title, description, extract) is included in both builds.\n")
    print("| method | time | ratio to reference |")
    print("|---|---:|---:|")
    rows = [
        ("tokenise only (`tokenize` of every document), for scale", "tok"),
        ("rank_bm25 `BM25Okapi(tokenised docs)` (reference)", "ref"),
        ("ours `Corpus(articles).build_index()`", "ours"),
    ]
    for label, key in rows:
        print(f"| {label} | {fmt_s(best[key])} | {best[key] / best['ref']:.2f}× |")
    print()


# ----------------------------------------------------------------------------------------------------
# 3. tool calls


async def tool_call(tool, parameters: dict) -> str:
    """One call as verl's ToolAgentLoop makes it: create, execute, release; the response text."""
    instance_id, _ = await tool.create(create_kwargs={})
    try:
        response, _, _ = await tool.execute(instance_id, parameters)
    finally:
        await tool.release(instance_id)
    return response.text


async def tool_calls(tool, params: list[dict], concurrency: int) -> list[str]:
    """Every call, ``concurrency`` at a time under ``asyncio.gather`` (1: one after another)."""
    texts: list[str] = []
    for start in range(0, len(params), concurrency):
        chunk = params[start : start + concurrency]
        if concurrency == 1:
            texts.append(await tool_call(tool, chunk[0]))
        else:
            texts.extend(await asyncio.gather(*(tool_call(tool, p) for p in chunk)))
    return texts


def bench_tools(args, corpus, questions) -> None:
    from mgrpo_verl.envs.research.corpus import format_hits, format_page
    from mgrpo_verl.envs.research.tools import SearchTool, VisitTool

    k = args.k
    queries = [q.question for q in questions]
    docs = list(dict.fromkeys(t for q in questions for t in q.evidence))[: len(queries)]
    with contextlib.redirect_stdout(io.StringIO()):  # verl's BaseTool prints its schema when built
        search, visit = SearchTool({"top_k": k}), VisitTool({})
    search_params = [{"query": q} for q in queries]
    visit_params = [{"doc": d} for d in docs]
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(tool_calls(search, search_params[:1], 1))  # loads the corpus off the timing
        loop.run_until_complete(tool_calls(visit, visit_params[:1], 1))
        texts: dict[str, list[str]] = {}

        def run(name, tool, params, c):
            def fn():
                texts[name] = loop.run_until_complete(tool_calls(tool, params, c))
            return fn

        def search_bare():
            texts["search bare"] = [format_hits(q, corpus.search(q, k)) for q in queries]

        def visit_bare():
            texts["visit bare"] = [format_page(corpus.page(d, 1, visit.page_chars)) for d in docs]

        fns = {"search bare": search_bare, "visit bare": visit_bare}
        for c in args.concurrency:
            fns[f"search {c}"] = run(f"search {c}", search, search_params, c)
            fns[f"visit {c}"] = run(f"visit {c}", visit, visit_params, c)
        best = best_times(args.repeats, fns)
    finally:
        loop.close()

    print(f"## 3. Tool calls end to end: tool layer vs bare corpus calls (best of {args.repeats})\n")
    print(f"{len(queries)} `search` calls (the question texts, top_k={k}) and {len(docs)} `visit` calls (the "
          "questions' evidence titles, page 1). A tool call = `create` + `execute` + `release` in one asyncio "
          "event loop; concurrency c = batches of c calls under `asyncio.gather`. Ratio = tool / bare.\n")
    head = "| tool | calls | bare corpus + format, ms / call |"
    rule = "|---|---:|---:|"
    for c in args.concurrency:
        head += f" tool, c={c}, ms / call | ratio |"
        rule += "---:|---:|"
    print(head + " same text as bare |")
    print(rule + "---:|")
    for tool, n in (("search", len(queries)), ("visit", len(docs))):
        bare = best[f"{tool} bare"]
        line = f"| `{tool}` | {n} | {1000 * bare / n:.3f} |"
        for c in args.concurrency:
            s = best[f"{tool} {c}"]
            line += f" {1000 * s / n:.3f} | {s / bare:.2f}× |"
        agree = all(texts[f"{tool} {c}"] == texts[f"{tool} bare"] for c in args.concurrency)
        print(line + f" {'yes' if agree else 'NO'} |")
    print()


# ----------------------------------------------------------------------------------------------------
# 4. rewards


def reward_pairs(questions, n: int) -> tuple[list[str], list[list[str]], list[bool]]:
    """``n`` (reply, answers) pairs, five kinds of reply in turn; also which replies are exactly right."""
    replies, answers, correct = [], [], []
    for i in range(n):
        q = questions[i % len(questions)]
        other = questions[(i + 7) % len(questions)].answers[0]
        gold = q.answers[0]
        kind = i % 5
        if kind == 0:
            reply = f"I searched the encyclopedia for the question and read the summary.\nAnswer: {gold}"
        elif kind == 1:
            reply = (f"<think>The summary names {gold}; check it once more.</think>"
                     f"<tool_call>{{\"name\": \"search\"}}</tool_call>It is this one.\n**Answer:** *{gold}*.")
        elif kind == 2:
            reply = f"From the article, the answer seems to be the following.\nAnswer: {gold} or maybe {other}"
        elif kind == 3:
            reply = f"I could not find it; my best guess.\nAnswer: {other}"
        else:
            reply = f"Reading the page gives it.\n<answer>{gold}</answer>"
        replies.append(reply)
        answers.append(list(q.answers))
        correct.append(kind in (0, 1, 4))
    return replies, answers, correct


def bench_rewards(args, questions) -> None:
    from mgrpo_verl.envs.research import dataset
    from mgrpo_verl.envs.research.rewards import compute_score, exact_match, extract_answer, f1, normalize_answer, score

    n = args.pairs
    replies, answers, correct = reward_pairs(questions, n)
    truths = [dataset.encode_answers(a) for a in answers]
    source = dataset.data_source("bench")
    preds = [extract_answer(r) for r in replies]
    pairs = list(zip(preds, answers))
    best = best_times(args.repeats, {  # results dropped at once: no list of N results for the GC to scan
        "norm": lambda: all((normalize_answer(p), [normalize_answer(a) for a in ans]) is not None for p, ans in pairs),
        "extract": lambda: all(extract_answer(r) is not None for r in replies),
        "em": lambda: all(exact_match(p, ans) is not None for p, ans in pairs),
        "f1": lambda: all(f1(p, ans) is not None for p, ans in pairs),
        "score": lambda: all(score(r, ans, "f1") is not None for r, ans in zip(replies, answers)),
        "verl": lambda: all(compute_score(source, r, t) is not None for r, t in zip(replies, truths)),
    })
    em_values = [exact_match(p, a) for p, a in pairs]
    f1_values = [f1(p, a) for p, a in pairs]
    em_le_f1 = sum(e <= f + 1e-12 for e, f in zip(em_values, f1_values))
    right = [i for i in range(n) if correct[i]]
    full = sum(em_values[i] == 1.0 and f1_values[i] == 1.0 for i in right)
    print(f"## 4. Rewards (best of {args.repeats})\n")
    print(f"{n:,} (reply, answers) pairs from {min(n, len(questions)):,} questions, five kinds of reply in turn. "
          "No reference: no installed package computes these metrics (SQuAD's evaluation script is not a "
          "package here), so this part reports throughput; `normalize_answer` of both sides is our own floor, "
          "for scale.\n")
    print("| function | time | µs / sample | samples/s |")
    print("|---|---:|---:|---:|")
    rows = [
        ("`normalize_answer` of prediction and answers (floor)", "norm"),
        ("`extract_answer(reply)`", "extract"),
        ("`exact_match(prediction, answers)`", "em"),
        ("`f1(prediction, answers)`", "f1"),
        ("`score(reply, answers, \"f1\")` (extract + F1)", "score"),
        ("`compute_score` (verl entry: decode, extract, F1 and EM)", "verl"),
    ]
    for label, key in rows:
        s = best[key]
        print(f"| {label} | {fmt_s(s)} | {1e6 * s / n:.1f} | {n / s:,.0f} |")
    ok = em_le_f1 == n and full == len(right)
    print(f"\nchecks: EM <= F1 on {em_le_f1}/{n} pairs; EM = F1 = 1 on {full}/{len(right)} correct replies: "
          f"{'ok' if ok else 'FAILED'}; mean F1 {np.mean(f1_values):.3f}, mean EM {np.mean(em_values):.3f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--repeats", type=int, default=3, help="rounds of parts 1, 3 and 4")
    parser.add_argument("--queries", type=int, default=200, help="question texts used as queries (parts 1, 3)")
    parser.add_argument("--k", type=int, default=5, help="hits per search (parts 1, 3)")
    parser.add_argument("--build-repeats", type=int, default=2, help="rounds of part 2 (about 1 s a build)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32], help="calls per asyncio.gather (part 3)")
    parser.add_argument("--pairs", type=int, default=10_000, help="(reply, answers) pairs (part 4)")
    args = parser.parse_args()
    if min(args.repeats, args.queries, args.build_repeats, args.pairs, *args.concurrency) < 1 or not 1 <= args.k <= 10:
        parser.error("--repeats, --queries, --build-repeats, --concurrency and --pairs must be >= 1, --k in [1, 10]")

    start = time.perf_counter()
    print(f"# bench_research: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}\n")
    try:
        from mgrpo_verl.envs.research.articles import load_articles
        from mgrpo_verl.envs.research.corpus import Corpus
        from mgrpo_verl.envs.research.questions import build_questions

        articles = load_articles()
        corpus = Corpus.default()
    except FileNotFoundError as e:
        print(f"skipped: {e}")
        return
    questions = build_questions(articles, args.queries, seed=0)
    queries = [q.question for q in questions]
    if "search" in args.parts:
        bench_search(args, corpus, articles, queries)
    if "build" in args.parts:
        bench_build(args, articles)
    if "tools" in args.parts:
        bench_tools(args, corpus, questions)
    if "rewards" in args.parts:
        pool = build_questions(articles, min(args.pairs, 10_000), seed=1)
        bench_rewards(args, pool)
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
