"""Orchestration overhead of the hierarchical rollout (``RelayDelegationLoop``) with a fixed-cost generator.

Everything a rollout does that is not model generation (building the loop object, chat templates and
tokenisation of the prompts, merging generated tokens and observations, the sub-agent fan-out, rows and
scores) is "orchestration". The generation backend here is fake: every ``generate`` call sleeps
``--cost`` seconds (a small model's generation) and returns a fixed number of seeded random token ids with
log-probs, so the wall time of a batch minus its critical path of generation waits is the orchestration.

* ours: ``B`` rollouts of the relay loop (verl agent loop ``mgrpo_relay``) run concurrently on one event
  loop, one loop object per rollout built inside its task by hydra ``instantiate`` (as verl's
  ``AgentLoopWorker._run_agent_loop`` does), dataset-row kwargs as verl passes them. The main agent and
  the sub-agent (``for_agent("sub")``) are two fake backends. Delegation settings as in
  ``mgrpo_trainer.yaml``: 0-3 calls, plan / answer / sub answer of at most 8 tokens, main
  ``response_length`` 64. A rollout waits for plan + (one parallel wave of its ``d`` sub calls when
  ``d > 0``) + answer, so its ideal time is (number of main generations + [d > 0]) × cost, read off its
  main row; the ideal wall time of the batch is the longest of these.
* reference, same run, same backend: verl's ``SingleTurnAgentLoop`` (one generation, ideal = cost).

Reported per B (median over ``--repeats``, runs of the two loops interleaved): wall time, ideal, overhead
share ``(wall - ideal) / wall`` (goal: <= 2% for ours), orchestration CPU time per rollout
(``time.process_time`` over the batch, executor threads included, / B) and the ratio ours / verl of CPU time
per generation (our CPU per rollout / our generations per rollout, over verl's CPU per rollout).

    .venv/bin/python benchmarks/bench_orchestration.py [--cost 0.5] [--rollouts 64 256] [--repeats 3]
    .venv/bin/python benchmarks/bench_orchestration.py --profile   # + cProfile of one batch of ours
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import random
import statistics
import time
from typing import Any

GOAL = 0.02  # overhead share of the rollout wall time (issue)
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
RESPONSE_TOKENS = 8  # tokens per generation (capped by the request's max_tokens)


class FixedCostBackend:
    """A rollout server whose every generation takes ``cost_s`` seconds and returns ``n_tokens`` seeded random
    ids (at most ``sampling_params["max_tokens"]``) with log-probs; ``for_agent`` gives the sub-agent's."""

    def __init__(self, cost_s: float, vocab: list[int], seed: int, n_tokens: int = RESPONSE_TOKENS,
                 sub: FixedCostBackend | None = None, config: Any = None):
        self.cost_s = cost_s
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.n_tokens = n_tokens
        self.sub = sub
        self.calls = 0
        if config is not None:
            self.config = config  # like an LLMServerClient: the agent's full config

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        await asyncio.sleep(self.cost_s)
        n = min(self.n_tokens, int(sampling_params.get("max_tokens", self.n_tokens)))
        token_ids = [self.rng.choice(self.vocab) for _ in range(n)]
        return TokenOutput(
            token_ids=token_ids,
            log_probs=[-0.5] * n,
            extra_fields={"min_global_steps": 0, "max_global_steps": 0},
        )

    def for_agent(self, name: str) -> FixedCostBackend:
        if self.sub is None or name != "sub":
            raise ValueError(f"unknown agent {name!r}")
        return self.sub


def trainer_config(tokenizer_dir: str):
    from omegaconf import OmegaConf

    model = {"path": "/models/main", "tokenizer_path": tokenizer_dir}
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"model": model, "rollout": {"prompt_length": 256, "response_length": 64}},
            "data": {},
            "multi_agent": {
                "main": "main",
                "delegation": {"sub_agent": "sub", "min_calls": 0, "max_calls": 3, "plan_tokens": 8,
                               "answer_tokens": 8, "sub_response_tokens": 8, "timeout_s": 120},
            },
        }
    )


def sub_config(tokenizer_dir: str):
    """The sub-agent client's ``config`` (its own model path, same tokenizer), as ``MultiAgentLLMClient`` gives."""
    from omegaconf import OmegaConf

    model = {"path": "/models/sub", "tokenizer_path": tokenizer_dir}
    return OmegaConf.create({"actor_rollout_ref": {"model": model, "rollout": {"prompt_length": 256,
                                                                               "response_length": 64}}})


def dataset_row(i: int, rollout_n: int = 8) -> dict[str, Any]:
    """kwargs of ``loop.run`` for rollout ``i``: a relay dataset row plus what verl adds (``uid``, ``session_id``)."""
    from mgrpo_verl.envs import relay

    digit = str(i * 7 % 10)
    return {
        "raw_prompt": relay.main_messages(),
        "data_source": relay.DATA_SOURCE,
        "ability": "relay",
        "reward_model": {"style": "rule", "ground_truth": digit},
        "extra_info": {"split": "train", "index": i // rollout_n},
        "index": i // rollout_n,
        "uid": f"uid-{i // rollout_n}",
        "session_id": i % rollout_n,
    }


def construction_ms(agent_name: str, setup: dict, n: int = 200, repeats: int = 3) -> float:
    """CPU ms to build one loop object (best of ``repeats`` rounds of ``n``)."""
    from mgrpo_verl.agent_loops.testing import build_agent_loop

    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(n):
            build_agent_loop(agent_name, setup["config"], None, setup["tokenizer"])
        best = min(best, (time.process_time() - start) / n)
    return 1000 * best


async def run_batch(agent_name: str, config, manager, tokenizer, rollouts: int) -> tuple[list[Any], float, float]:
    """``rollouts`` concurrent runs of agent loop ``agent_name``; (outputs, wall s, CPU s)."""
    from mgrpo_verl.agent_loops.testing import build_agent_loop

    async def one(i: int):
        loop = build_agent_loop(agent_name, config, manager, tokenizer)
        return await loop.run(dict(SAMPLING), **dataset_row(i))

    cpu, wall = time.process_time(), time.perf_counter()
    outputs = await asyncio.gather(*(one(i) for i in range(rollouts)))
    return outputs, time.perf_counter() - wall, time.process_time() - cpu


def relay_stats(outputs: list[list[Any]], cost_s: float) -> dict[str, float]:
    """Mean d, generations per rollout and ideal wall time of a batch of relay rollouts."""
    from mgrpo_verl.rowmeta import RowMeta

    mains = [RowMeta.read(rows[-1].extra_fields, f"rollout {i} main") for i, rows in enumerate(outputs)]
    calls = [meta.calls for meta in mains]
    main_gens = [rows[-1].num_turns - 2 for rows in outputs]  # plan (+ answer when there was room)
    waves = [g + (d > 0) for g, d in zip(main_gens, calls, strict=True)]
    return {
        "d": statistics.fmean(calls),
        "gens": statistics.fmean(g + d for g, d in zip(main_gens, calls, strict=True)),
        "ideal": max(waves) * cost_s,
        "truncated": sum(meta.observation_truncated for meta in mains),
    }


def measure(args, rollouts: int, loop: asyncio.AbstractEventLoop, setup: dict) -> dict[str, dict[str, float]]:
    """Median over ``args.repeats`` of each loop's batch, ours and verl's interleaved."""
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "verl": []}
    for rep in range(args.repeats):
        sub = FixedCostBackend(args.cost, setup["vocab"], seed=2 * rep + 1, config=setup["sub_config"])
        main = FixedCostBackend(args.cost, setup["vocab"], seed=2 * rep, sub=sub)
        outputs, wall, cpu = loop.run_until_complete(
            run_batch("mgrpo_relay", setup["config"], main, setup["tokenizer"], rollouts)
        )
        stats = relay_stats(outputs, args.cost)
        assert main.calls + sub.calls == round(stats["gens"] * rollouts), "a generation was not counted"
        runs["ours"].append({**stats, "wall": wall, "cpu": cpu})

        single = FixedCostBackend(args.cost, setup["vocab"], seed=2 * rep)
        outputs, wall, cpu = loop.run_until_complete(
            run_batch("single_turn_agent", setup["config"], single, setup["tokenizer"], rollouts)
        )
        assert len(outputs) == rollouts and single.calls == rollouts
        runs["verl"].append({"d": 0.0, "gens": 1.0, "ideal": args.cost, "truncated": 0, "wall": wall, "cpu": cpu})
    result = {}
    for name, reps in runs.items():
        # the repeat with the median wall time, so that its columns stay consistent with each other
        mid = sorted(reps, key=lambda r: r["wall"])[(len(reps) - 1) // 2]
        result[name] = {
            **mid,
            "overhead": (mid["wall"] - mid["ideal"]) / mid["wall"],
            "cpu_ms": 1000 * statistics.median(r["cpu"] for r in reps) / rollouts,
        }
    return result


def profile_ours(args, rollouts: int, loop: asyncio.AbstractEventLoop, setup: dict) -> None:
    """cProfile of one batch of ours, zero-cost backend (only orchestration is left), top functions."""
    sub = FixedCostBackend(0.0, setup["vocab"], seed=1, config=setup["sub_config"])
    main = FixedCostBackend(0.0, setup["vocab"], seed=0, sub=sub)
    profiler = cProfile.Profile()
    profiler.enable()
    loop.run_until_complete(run_batch("mgrpo_relay", setup["config"], main, setup["tokenizer"], rollouts))
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(35)
    print(f"\ncProfile of {rollouts} relay rollouts, generation cost 0 (event-loop thread only):")
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost", type=float, default=0.5, help="seconds per generation (default 0.5)")
    parser.add_argument("--rollouts", type=int, nargs="+", default=[64, 256], help="concurrent rollouts B")
    parser.add_argument("--repeats", type=int, default=3, help="batches per loop and B; the median is reported")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test): cost 0.02, B 4, 1 repeat")
    parser.add_argument("--profile", action="store_true", help="also cProfile one batch of ours at the largest B")
    args = parser.parse_args()
    if args.quick:
        args.cost, args.rollouts, args.repeats = 0.02, [4], 1

    from transformers import AutoTokenizer

    # importing the modules registers the two agent loops
    import verl.experimental.agent_loop.single_turn_agent_loop  # noqa: F401

    import mgrpo_verl.agent_loops.delegation  # noqa: F401
    from mgrpo_verl.models.tiny import build_tiny_tokenizer

    tokenizer_dir = build_tiny_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    special = set(tokenizer.all_special_ids)
    # word pieces that decode and re-encode to themselves (no stray bytes, no tool tags), like a trained
    # model's text; random picks make d = sum(plan ids) % 4 vary between rollouts
    vocab = [i for i in range(len(tokenizer)) if i not in special and "<" not in tokenizer.decode([i])
             and tokenizer.encode(tokenizer.decode([i]), add_special_tokens=False) == [i]]
    setup = {
        "tokenizer": tokenizer,
        "vocab": vocab,
        "config": trainer_config(tokenizer_dir),
        "sub_config": sub_config(tokenizer_dir),
    }
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        # warm-up: imports, the executor's threads, tokenizer caches
        warm = argparse.Namespace(**{**vars(args), "repeats": 1, "cost": 0.0})
        measure(warm, 8, loop, setup)

        print(f"generation cost {args.cost:g} s per call, {RESPONSE_TOKENS} tokens; relay: 0-3 sub calls, "
              f"plan/answer/sub <= 8 tokens, response_length 64; median of {args.repeats}")
        header = (f"{'loop':<18} {'rollouts':>8} {'mean d':>7} {'gens':>5} {'wall s':>8} {'ideal s':>8} "
                  f"{'overhead %':>10} {'CPU ms/rollout':>14}")
        print(header)
        print("-" * len(header))
        results = {}
        for rollouts in args.rollouts:
            res = results[rollouts] = measure(args, rollouts, loop, setup)
            for name, label in (("ours", "ours (relay)"), ("verl", "verl single-turn")):
                r = res[name]
                print(f"{label:<18} {rollouts:>8} {r['d']:>7.2f} {r['gens']:>5.2f} {r['wall']:>8.3f} "
                      f"{r['ideal']:>8.3f} {100 * r['overhead']:>10.2f} {r['cpu_ms']:>14.2f}")
        print()
        for rollouts, res in results.items():
            ours, verl = res["ours"], res["verl"]
            ratio = (ours["cpu_ms"] / ours["gens"]) / verl["cpu_ms"]
            print(f"B={rollouts}: CPU per generation ours / verl = {ratio:.2f}x "
                  f"({ours['cpu_ms'] / ours['gens']:.2f} ms vs {verl['cpu_ms']:.2f} ms); "
                  f"B x CPU per rollout = {rollouts * ours['cpu_ms'] / 1000:.3f} s ours, "
                  f"{rollouts * verl['cpu_ms'] / 1000:.3f} s verl; "
                  f"observations shortened: {ours['truncated']}/{rollouts}")
        n_build = 20 if args.quick else 200
        build = {name: construction_ms(name, setup, n_build) for name in ("mgrpo_relay", "single_turn_agent")}
        print(f"of the CPU per rollout, building the loop object (verl's hydra instantiate, once per rollout): "
              f"ours {build['mgrpo_relay']:.2f} ms, verl {build['single_turn_agent']:.2f} ms")
        verdict = ", ".join(
            f"B={b} {100 * res['ours']['overhead']:.2f}% {'met' if res['ours']['overhead'] <= GOAL else 'missed'}"
            for b, res in results.items()
        )
        met = all(res["ours"]["overhead"] <= GOAL for res in results.values())
        print(f"goal <= 2%: {'met' if met else 'missed'} ({verdict})")
        if args.profile:
            profile_ours(args, max(args.rollouts), loop, setup)
    finally:
        loop.close()


if __name__ == "__main__":
    main()
