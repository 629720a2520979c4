"""Generation throughput of the HF rollout server vs plain ``model.generate`` on the same prompts.

    .venv/bin/python benchmarks/bench_hf_rollout.py [--num-prompts 32] [--max-tokens 64] [--threads 1]

* replica: N concurrent ``generate`` calls to the :class:`HFRolloutServer` Ray actor, as verl's agent loop
  sends them (one request per sample, token ids in, token ids + log-probs out); timed from the first
  submission to the last answer, so Ray round trips and request batching are included.
* engine: the same batch through :class:`HFGenerationEngine` in this process (no Ray).
* engine, seeded: the same, every request with a seed of its own, as the server now gives requests that name none
  (``HFRolloutServer._request_seed``): a generator per row instead of one draw for the batch; printed as a ratio to
  the engine's.
* generate: ``model.generate`` on the same prompts, left-padded into one batch, same sampling.

Every sequence is forced to exactly ``--max-tokens`` tokens (``ignore_eos`` / ``min_new_tokens``) so all
three produce the same number of tokens; both sides use ``--threads`` torch threads. Prints tokens/s (median
of ``--repeats`` runs) and the replica / generate ratio (goal: >= 0.8).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.model == "tiny":
        from mgrpo_verl.models import build_tiny_model

        paths = build_tiny_model()
    else:
        from mgrpo_verl.models import build_smollm2

        paths = build_smollm2()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths.tokenizer_dir)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Question {i}: what is {i} + {3 * i}? Explain step by step."}],
            add_generation_prompt=True,
            tokenize=True,
        )["input_ids"]
        for i in range(args.num_prompts)
    ]
    n_tokens = args.num_prompts * args.max_tokens
    params = dict(
        temperature=args.temperature,
        top_p=1.0,
        top_k=-1,
        repetition_penalty=1.0,
        logprobs=True,
        max_tokens=args.max_tokens,
        ignore_eos=True,
    )

    # ---------------------------------------------------------------- plain model.generate
    model = AutoModelForCausalLM.from_pretrained(paths.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    tok.padding_side = "left"
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    gen_kwargs = dict(max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, pad_token_id=tok.pad_token_id)
    if args.temperature > 0:
        gen_kwargs.update(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0)
    else:
        gen_kwargs.update(do_sample=False)

    def run_generate() -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**batch, **gen_kwargs)
        assert out.shape[1] - batch["input_ids"].shape[1] == args.max_tokens
        return time.perf_counter() - t

    # ---------------------------------------------------------------- in-process engine
    from mgrpo_verl.hf_rollout.engine import GenerationRequest, HFGenerationEngine
    from mgrpo_verl.hf_rollout.sampling import parse_sampling_params

    engine = HFGenerationEngine(model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)

    def run_engine(seeded: bool = False) -> float:
        reqs = [
            GenerationRequest(
                p,
                parse_sampling_params(
                    {**params, "seed": 1000 + i} if seeded else params,
                    prompt_len=len(p),
                    max_model_len=4096,
                    default_max_tokens=args.max_tokens,
                    vocab_size=engine.vocab_size,
                ),
            )
            for i, p in enumerate(prompts)
        ]
        t = time.perf_counter()
        out = engine.generate_batch(reqs)
        assert all(len(r.token_ids) == args.max_tokens for r in out)
        return time.perf_counter() - t

    # ---------------------------------------------------------------- the replica's server actor
    import ray
    from verl.workers.config import HFModelConfig, RolloutConfig

    from mgrpo_verl.hf_rollout.server import HFRolloutServer
    from mgrpo_verl.platform.ray_session import ray_cpu_session

    # a Ray closed to the network (token authentication, loopback) in a private temp dir, as the trainer's
    with ray_cpu_session(num_cpus=8, log_to_driver=False):
        rollout = RolloutConfig(
            name="hf",
            tensor_model_parallel_size=1,
            dtype="float32",
            prompt_length=256,
            response_length=args.max_tokens,
            engine_kwargs={"hf": {"num_threads": args.threads}},
        )
        server = (
            ray.remote(HFRolloutServer)
            .options(max_concurrency=1000, num_cpus=0)
            .remote(rollout, HFModelConfig(path=paths.model_dir, tokenizer_path=paths.tokenizer_dir))
        )
        ray.get(server.launch_server.remote())

        async def one_round() -> float:
            t = time.perf_counter()
            outs = await asyncio.gather(
                *[
                    server.generate.remote(prompt_ids=p, sampling_params=dict(params), request_id=f"b{i}")
                    for i, p in enumerate(prompts)
                ]
            )
            assert all(len(o.token_ids) == args.max_tokens for o in outs)
            return time.perf_counter() - t

        def run_replica() -> float:
            return asyncio.run(one_round())

        results = {}
        runs = (("generate", run_generate), ("engine", run_engine), ("engine_seeded", lambda: run_engine(seeded=True)),
                ("replica", run_replica))
        for name, fn in runs:
            fn()  # warm-up
            times = [fn() for _ in range(args.repeats)]
            results[name] = n_tokens / statistics.median(times)
        stats = ray.get(server.get_stats.remote())

    print(
        f"model={args.model} prompts={args.num_prompts} max_tokens={args.max_tokens} threads={args.threads} "
        f"temperature={args.temperature} (median of {args.repeats})"
    )
    print(f"  model.generate (batched, in process) : {results['generate']:9.0f} tok/s")
    print(f"  HF engine      (batched, in process) : {results['engine']:9.0f} tok/s")
    print(f"  HF engine, a seed per request        : {results['engine_seeded']:9.0f} tok/s "
          f"(ratio to one draw per batch {results['engine_seeded'] / results['engine']:.2f})")
    print(
        f"  HF replica     (Ray, {args.num_prompts} concurrent requests): {results['replica']:9.0f} tok/s "
        f"(batch sizes seen: {sorted(set(stats['batch_sizes']))})"
    )
    ratio = results["replica"] / results["generate"]
    print(f"  ratio replica / generate = {ratio:.2f}  (goal >= 0.8: {'met' if ratio >= 0.8 else 'NOT met'})")


if __name__ == "__main__":
    main()
