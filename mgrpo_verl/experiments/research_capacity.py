"""Can a model of a given shape learn the deep-research sub-agent's last step on 2 CPU cores?

The research task's CPU recipe hands the sub-agent the corpus's top BM25 hits for its task
(:func:`mgrpo_verl.envs.research.prompts.sub_messages_with_evidence`). For a ``description`` question
(1 hop: ``What short description does the encyclopedia give for "<A>"?``) the answer is then on the
screen: the hit titled ``<A>`` shows its description. This probe trains a fresh model of each shape on
exactly that step, supervised (prompt rendered by the tiny tokenizer's chat template, target
``Answer: <description>``, loss on the target only), with plain PyTorch for a fixed time, and reports
held-out greedy token F1 and exact match as it trains. It is an upper bound on what a warm start could
teach the sub-agent before RL: no tool call, no search, the evidence given. What it measured, and what
it means for deep research on CPU: ``docs/results/research_capacity.md``.

    python -m mgrpo_verl.experiments.research_capacity --shapes 2x64 4x128 --seconds 600
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

#: The built-in tiny model's shape (layers x hidden), :func:`mgrpo_verl.models.tiny.tiny_qwen2_config`.
TINY_SHAPE = "2x64"


#: What the sub-agent sees before it answers: ``hits``, the CPU recipe's prompt (the top BM25 hits for the
#: question, :func:`~mgrpo_verl.envs.research.prompts.sub_messages_with_evidence`); ``page``, the research
#: prompt followed by the ``visit`` call of the right document and its first page (what a correct
#: search-then-visit trace reads; the page's second line is the description).
EVIDENCE = ("hits", "page")


def _messages(question: Any, evidence: str) -> list[dict[str, Any]]:
    from mgrpo_verl.envs.research import prompts
    from mgrpo_verl.envs.research.corpus import Corpus, format_page
    from mgrpo_verl.warmstart.demos import tool_call_message

    if evidence == "hits":
        return prompts.sub_messages_with_evidence("sub", question.question)
    doc = question.evidence[0]
    return [*prompts.sub_messages("sub", question.question), tool_call_message("visit", {"doc": doc, "page": 1}),
            {"role": "tool", "content": format_page(Corpus.default().page(doc, 1))}]  # fmt: skip


def examples(n_train: int, n_val: int, seed: int, evidence: str = "page") -> dict[str, list[dict[str, Any]]]:
    """``description`` questions of each split with what the sub-agent sees (:data:`EVIDENCE`), the target
    and whether the canonical answer is in that context at all (the ceiling of a reader)."""
    from mgrpo_verl.envs.research import prompts, questions
    from mgrpo_verl.envs.research.articles import load_articles

    if evidence not in EVIDENCE:
        raise ValueError(f"evidence must be one of {EVIDENCE}, got {evidence!r}")
    articles = load_articles()
    out: dict[str, list[dict[str, Any]]] = {}
    for split, n in (("train", n_train), ("val", n_val)):
        rows = []
        for q in questions.build_questions(articles, n, seed=seed, kinds=["description"], split=split):
            messages = _messages(q, evidence)
            answer = q.answers[0]
            rows.append({"messages": messages, "answers": list(q.answers),
                         "target": f"{prompts.ANSWER_PREFIX} {answer}",
                         "answer_in_prompt": answer in messages[-1]["content"]})  # fmt: skip
        out[split] = rows
    return out


def parse_shape(shape: str) -> dict[str, int]:
    """``"LxH"`` -> the Qwen2 overrides of that shape (heads of 16 dimensions, 4x MLP, half as many KV heads)."""
    try:
        layers, hidden = (int(x) for x in shape.lower().split("x"))
    except ValueError:
        raise ValueError(f"a shape is LAYERSxHIDDEN, e.g. 2x64, got {shape!r}") from None
    if layers < 1 or hidden < 32 or hidden % 32:
        raise ValueError(f"shape {shape!r}: at least 1 layer and a hidden size that is a multiple of 32")
    heads = hidden // 16
    return {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": 4 * hidden,
            "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2)}  # fmt: skip


def encode(tok: Any, row: dict[str, Any]) -> tuple[list[int], list[int]]:
    """A row's prompt ids (the chat template with the generation prompt) and target ids (ending with ``<|im_end|>``)."""
    from mgrpo_verl.models.tiny import IM_END

    prompt = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
    target = tok(row["target"], add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(IM_END)]
    return tok(prompt, add_special_tokens=False)["input_ids"], target


def run_shape(shape: str, tok: Any, data: dict[str, list[dict[str, Any]]], seconds: float, max_steps: int,
              eval_every: int, batch: int, lr: float, seed: int, log=print) -> dict[str, Any]:  # fmt: skip
    """Train a fresh model of ``shape`` for ``seconds`` (evaluation not counted) or ``max_steps`` updates,
    whichever ends first; the curve of held-out
    greedy token F1 / exact match (:mod:`mgrpo_verl.envs.research.rewards`) against training time."""
    import torch
    from transformers import Qwen2ForCausalLM

    from mgrpo_verl.envs.research import rewards
    from mgrpo_verl.models.tiny import ENDOFTEXT, IM_END, tiny_qwen2_config

    eos, pad = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)
    train = [encode(tok, r) for r in data["train"]]
    val = [(encode(tok, r)[0], r["answers"]) for r in data["val"]]
    torch.manual_seed(seed)
    config = tiny_qwen2_config(len(tok), bos_token_id=None, eos_token_id=eos, pad_token_id=pad, **parse_shape(shape))
    model = Qwen2ForCausalLM(config).float()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)

    def evaluate() -> dict[str, float]:
        model.eval()
        f1s, ems = [], []
        with torch.no_grad():
            for prompt, answers in val:
                out = model.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False, eos_token_id=eos,
                                     pad_token_id=pad)  # fmt: skip
                text = tok.decode(out[0, len(prompt) :], skip_special_tokens=True)
                f1s.append(rewards.score(text, answers, "f1"))
                ems.append(rewards.score(text, answers, "em"))
        model.train()
        return {"f1": sum(f1s) / len(f1s), "em": sum(ems) / len(ems)}

    curve = [{"step": 0, "train_seconds": 0.0, "loss": None, **evaluate()}]
    log(f"{shape} ({params / 1e6:.2f} M parameters): step 0 held-out F1 {curve[0]['f1']:.3f}, EM {curve[0]['em']:.3f}")
    step, trained, losses = 0, 0.0, []
    model.train()
    while trained < seconds and step < max_steps:
        t0 = time.monotonic()
        rows = [train[rng.randrange(len(train))] for _ in range(batch)]
        length = max(len(p) + len(t) for p, t in rows)
        ids = torch.full((batch, length), pad)
        labels = torch.full((batch, length), -100)
        mask = torch.zeros((batch, length), dtype=torch.long)
        for i, (p, t) in enumerate(rows):
            seq = p + t
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, len(p) : len(seq)] = torch.tensor(t)
            mask[i, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step += 1
        trained += time.monotonic() - t0
        if step % eval_every == 0 or trained >= seconds or step == max_steps:
            point = {"step": step, "train_seconds": round(trained, 1), "loss": sum(losses) / len(losses), **evaluate()}
            losses = []
            curve.append(point)
            log(f"{shape}: step {step} ({trained:.0f} s) loss {point['loss']:.3f}, held-out F1 {point['f1']:.3f}, "
                f"EM {point['em']:.3f}")  # fmt: skip
    return {"shape": shape, "parameters": params, "steps": step, "curve": curve}


def report(results: dict[str, Any]) -> str:
    """Markdown: the setting, one row per shape (final and best held-out F1 / EM), the reader's ceiling."""
    s = results["setting"]
    lines = [
        f"Setting: {s['n_train']} training / {s['n_val']} held-out `description` questions (seed {s['seed']}), "
        f"evidence `{s['evidence']}`, "
        f"batch {s['batch']}, AdamW lr {s['lr']}, {s['seconds']:.0f} s of training per shape on this machine; "
        f"the canonical answer appears verbatim in {s['answer_in_prompt_val']:.0%} of the held-out prompts "
        f"(median prompt {s['median_prompt_tokens']} tokens, median target {s['median_target_tokens']} tokens).",
        "",
        "| shape (layers x hidden) | parameters | steps | held-out F1 at 0 / end (best) | held-out EM at end (best) |",
        "|---|---:|---:|---|---|",
    ]
    for r in results["shapes"]:
        c = r["curve"]
        best_f1, best_em = max(p["f1"] for p in c), max(p["em"] for p in c)
        lines.append(f"| {r['shape']} | {r['parameters'] / 1e6:.2f} M | {r['steps']} | {c[0]['f1']:.3f} / "
                     f"{c[-1]['f1']:.3f} ({best_f1:.3f}) | {c[-1]['em']:.3f} ({best_em:.3f}) |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=[TINY_SHAPE],
                    help="LAYERSxHIDDEN, e.g. 2x64 (the built-in tiny) 4x128")
    ap.add_argument("--seconds", type=float, default=300.0, help="training time per shape (evaluation excluded)")
    ap.add_argument("--steps", type=int, default=10**9, help="at most this many updates per shape")
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-val", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--evidence", choices=EVIDENCE, default="page", help="what the sub-agent sees (EVIDENCE)")
    ap.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    args = ap.parse_args(argv)
    for shape in args.shapes:
        parse_shape(shape)  # refuse a bad shape before minutes of work
    data = examples(args.n_train, args.n_val, args.seed, args.evidence)
    from transformers import AutoTokenizer

    from mgrpo_verl.models.tiny import build_tiny_tokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_tokenizer())
    encoded = [encode(tok, r) for r in data["val"]]
    # the target's length counts its text, not the end token encode() appends
    prompt_lens, target_lens = sorted(len(p) for p, _ in encoded), sorted(len(t) - 1 for _, t in encoded)
    setting = {**{k: getattr(args, k) for k in ("n_train", "n_val", "batch", "lr", "seconds", "seed", "evidence")},
               "answer_in_prompt_val": sum(r["answer_in_prompt"] for r in data["val"]) / len(data["val"]),
               "median_prompt_tokens": prompt_lens[len(prompt_lens) // 2],
               "median_target_tokens": target_lens[len(target_lens) // 2]}  # fmt: skip
    print(f"research capacity probe: {json.dumps(setting)}")
    shapes = [run_shape(s, tok, data, args.seconds, args.steps, args.eval_every, args.batch, args.lr, args.seed)
              for s in args.shapes]
    results = {"setting": setting, "shapes": shapes}
    print(report(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(report(results))


if __name__ == "__main__":
    main()
