"""MAGRPO's baselines without training: single model, parallel, sequential, one-round discussion.

``python -m mgrpo_verl.experiments.coop_baselines --task coop_code --problems 16 --samples 4`` runs every
protocol on the first problems of the task's validation split, k samples each, with the agents' models
(built-in ``tiny`` / ``tiny_sub`` by default, or ``--model AGENT=PATH`` for Hugging Face directories, e.g.
trained ones), and writes a Markdown table (and the per-sample records as JSON lines) to ``--out``:

- ``single``: the first agent's model writes the whole answer (``single_messages``; the task splits it
  into the agents' parts);
- ``parallel``: every agent writes its part from its own prompt, no communication;
- ``sequential``: the agents write in order, each seeing the parts written before it;
- ``discussion``: a parallel round, then each agent sees the others' first drafts (and its own) and
  writes its final part (one round of discussion).

Columns: the mean joint reward and its parts; for coding also pass@k (unbiased), acc@k and coop@k
(:mod:`mgrpo_verl.algorithms.coop_metrics`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PROTOCOLS = ("single", "parallel", "sequential", "discussion")

#: ``generate(agent, [messages, ...]) -> [text, ...]``: one completion per prompt, by that agent's model.
Generate = Callable[[str, Sequence[list[dict[str, str]]]], list[str]]


def run_protocol(task: Any, item: Any, protocol: str, generate: Generate, samples: int) -> list[dict[str, str]]:
    """``samples`` joint answers of one item under one protocol: a list of ``{agent: text}``."""
    agents = task.agents
    if protocol == "single":
        texts = generate(agents[0], [task.single_messages(item)] * samples)
        return [task.split_single(item, t) for t in texts]
    first = {a: task.first_messages(item, a) for a in agents}
    if protocol == "parallel":
        drafts = {a: generate(a, [first[a]] * samples) for a in agents}
        return [{a: drafts[a][s] for a in agents} for s in range(samples)]
    if protocol == "sequential":
        outputs: list[dict[str, str]] = [{} for _ in range(samples)]
        for a in agents:
            prompts = []
            for out in outputs:
                messages = first[a]
                for earlier, text in out.items():
                    messages = task.with_peer(messages, earlier, text)
                prompts.append(messages)
            for out, text in zip(outputs, generate(a, prompts)):
                out[a] = text
        return outputs
    if protocol == "discussion":
        drafts = run_protocol(task, item, "parallel", generate, samples)
        final: list[dict[str, str]] = [{} for _ in range(samples)]
        for a in agents:
            prompts = []
            for draft in drafts:
                messages = task.with_peer(first[a], task.self_role, draft[a])
                for other in agents:
                    if other != a:
                        messages = task.with_peer(messages, other, draft[other])
                prompts.append(messages)
            for out, text in zip(final, generate(a, prompts)):
                out[a] = text
        return final
    raise ValueError(f"unknown protocol {protocol!r}; protocols are {PROTOCOLS}")


def evaluate(task: Any, items: Sequence[Any], protocols: Sequence[str], generate: Generate, samples: int,
             progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """One record per (protocol, item, sample): the joint reward, its parts, and the outputs."""
    records = []
    for protocol in protocols:
        for i, item in enumerate(items):
            for s, outputs in enumerate(run_protocol(task, item, protocol, generate, samples)):
                outcome = task.reward(item, outputs)
                records.append({"protocol": protocol, "item": str(item), "sample": s, "reward": outcome.reward,
                                **{k: float(v) for k, v in outcome.info.items()}, "outputs": outputs})
            progress(f"{protocol}: {i + 1}/{len(items)}")
    return records


def summarize(records: list[dict[str, Any]], info_keys: Sequence[str],
              ks: Sequence[int] = (1, 5, 10)) -> dict[str, dict[str, float]]:
    """Per protocol: mean reward and parts; with ``tests_passed`` / ``cooperation`` parts (coding), pass@k,
    acc@k, coop@k for every k up to the samples per item."""
    from mgrpo_verl.algorithms.coop_metrics import summarize_samples

    by_protocol: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_protocol[r["protocol"]].append(r)
    out = {}
    for protocol, rows in by_protocol.items():
        row = {"samples": float(len(rows)), "reward": sum(r["reward"] for r in rows) / len(rows)}
        row.update({k: sum(r[k] for r in rows) / len(rows) for k in info_keys})
        if "tests_passed" in info_keys and "cooperation" in info_keys:
            samples = [{"problem_id": r["item"], "passed": bool(r["tests_passed"]),
                        "test_fraction": float(r.get("test_fraction", r["tests_passed"])),
                        "cooperated": bool(r["cooperation"]), "returns": {"joint": r["reward"]}} for r in rows]
            summary = summarize_samples(samples, ks=ks)
            row.update({k: float(v) for k, v in summary.items() if k.startswith(("pass@", "acc@", "coop@"))})
        out[protocol] = row
    return out


def markdown(summary: dict[str, dict[str, float]], title: str) -> str:
    columns = sorted({k for row in summary.values() for k in row if k != "samples"}, key=lambda k: (k != "reward", k))
    lines = [f"### {title}", "", "| protocol | samples | " + " | ".join(columns) + " |",
             "|---|---:|" + "---:|" * len(columns)]
    for protocol, row in summary.items():
        lines.append(f"| {protocol} | {int(row['samples'])} | "
                     + " | ".join(f"{row.get(c, float('nan')):.3f}" for c in columns) + " |")
    return "\n".join(lines) + "\n"


def hf_generate(model_paths: dict[str, str], max_tokens: int, temperature: float, seed: int) -> Generate:
    """A :data:`Generate` over Hugging Face models on CPU (our batched engine), one per agent."""
    from transformers import AutoTokenizer

    from mgrpo_verl.hf_rollout.engine import GenerationRequest, HFGenerationEngine
    from mgrpo_verl.hf_rollout.sampling import SamplingParams

    engines, tokenizers = {}, {}
    for agent, path in model_paths.items():
        engines[agent] = HFGenerationEngine.from_pretrained(path["model"], seed=seed)
        tokenizers[agent] = AutoTokenizer.from_pretrained(path["tokenizer"])

    def generate(agent: str, prompts: Sequence[list[dict[str, str]]]) -> list[str]:
        tok, engine = tokenizers[agent], engines[agent]
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
        requests = [GenerationRequest(list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                                   return_dict=False)), params)
                    for m in prompts]
        return [tok.decode(r.token_ids, skip_special_tokens=True) for r in engine.generate_batch(requests)]

    return generate


def main(argv: Sequence[str] | None = None) -> None:
    import pandas as pd

    from mgrpo_verl.envs.builtin import model_paths, task_files
    from mgrpo_verl.envs.coop_tasks import TASK_SOURCES, task_for

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASK_SOURCES), default="coop_code")
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    parser.add_argument("--problems", type=int, default=16, help="first items of the validation split")
    parser.add_argument("--samples", type=int, default=4, help="joint samples per item and protocol (k)")
    parser.add_argument("--model", action="append", default=[], metavar="AGENT=PATH",
                        help="a Hugging Face model directory for an agent (default: built-in tiny, tiny_sub)")
    parser.add_argument("--tokenizer", action="append", default=[], metavar="AGENT=PATH",
                        help="that agent's tokenizer directory, where it is not the model's (a built-in smollm2)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/coop_baselines"))
    args = parser.parse_args(argv)

    task = task_for(TASK_SOURCES[args.task])
    _, val = task_files(args.task)  # the validation split's items (reward_model.ground_truth)
    items = [str(rm["ground_truth"]) for rm in pd.read_parquet(val)["reward_model"]][: args.problems]
    builtin = dict(zip(task.agents, ("tiny", "tiny_sub")))
    paths = {a: {"model": str(model_paths(m).model_dir), "tokenizer": str(model_paths(m).tokenizer_dir)}
             for a, m in builtin.items()}
    for spec in args.model:
        agent, _, path = spec.partition("=")
        if agent not in task.agents or not path:
            parser.error(f"--model wants AGENT=PATH with AGENT one of {task.agents}, got {spec!r}")
        paths[agent] = {"model": path, "tokenizer": path}
    for spec in args.tokenizer:
        agent, _, path = spec.partition("=")
        if agent not in task.agents or not path:
            parser.error(f"--tokenizer wants AGENT=PATH with AGENT one of {task.agents}, got {spec!r}")
        paths[agent]["tokenizer"] = path
    generate = hf_generate(paths, args.max_tokens, args.temperature, args.seed)
    start = time.monotonic()
    records = evaluate(task, items, args.protocols, generate, args.samples, progress=lambda m: print(m, flush=True))
    summary = summarize(records, task.info_keys, ks=tuple(k for k in (1, 5, 10) if k <= args.samples))
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{args.task}_records.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    models = ", ".join(f"{a}: {p['model']}" for a, p in paths.items())
    table = markdown(summary, f"{args.task}: {len(items)} items x {args.samples} samples, no training ({models})")
    (args.out / f"{args.task}_baselines.md").write_text(table)
    print(table)
    print(f"coop_baselines: {len(records)} joint samples in {time.monotonic() - start:.0f} s; {args.out}")


if __name__ == "__main__":
    main()
