"""verl's log-probabilities on CPU: its row loop (``logprobs_from_logits_v2``) vs the patch
``verl-0.9.1-cpu-logprobs`` (:func:`mgrpo_verl.platform.verl_cpu_logprobs.chunked_logprobs`), same logits, same run.

1. The function, forward + backward, on logits shaped as verl's FSDP engine hands them over on CPU (remove-padding
   off: ``(tokens, vocab)``): a warm-start SFT micro-batch (16 x 448 tokens, the tiny model's 1,030 tokens) and a
   SmolLM2-sized vocabulary (49,152). Best of ``--repeats``, interleaved.
2. ``--sft-steps N`` (0: skip): verl's SFT trainer end to end, the default warm start's main-agent run
   (``mgrpo_verl.warmstart.sft``: 16 demonstrations of the ``relay_tools`` task per step, ``data.max_length``
   448, the tiny model at std 0.1) for N steps, once with verl's function and once with the patch, one after the
   other. Seconds per step: from the time verl's first step record appears to the last one's, over the steps
   between (process start-up and the first step excluded). Both runs must log the same losses.

    python benchmarks/bench_cpu_logprobs.py [--repeats 5] [--sft-steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from timing import best_times, fmt_s

from mgrpo_verl.progress import JsonlFollower

#: run in the SFT child instead of ``-m mgrpo_verl.warmstart.sft``: verl's function put back (our plugin applied the
#: patch on ``import verl``) and the patch marked applied, so that the child's own registration leaves it out
UNPATCHED_CHILD = ("import runpy, verl.utils.torch_functional as f, mgrpo_verl.platform.verl_cpu_logprobs as p; "
                   "p.revert(); p._original['logprobs_from_logits_v2'] = f.logprobs_from_logits_v2; "
                   "runpy.run_module('mgrpo_verl.warmstart.sft', run_name='__main__')")


def bench_function(repeats: int) -> None:
    from verl.utils.torch_functional import logprobs_from_logits_v2

    from mgrpo_verl.platform import verl_cpu_logprobs as patch

    verl_fn = patch._original.get("logprobs_from_logits_v2", logprobs_from_logits_v2)
    print(f"{'logits (tokens x vocab)':>24} {'verl (row loop)':>16} {'patch':>10} {'ratio':>7} {'max |diff|':>11}"
          f"   forward + backward")
    for tokens, vocab in ((16 * 448, 1030), (2048, 49152)):
        torch.manual_seed(0)
        logits = torch.randn(tokens, vocab, requires_grad=True)
        labels = torch.randint(0, vocab, (tokens,))

        def step(fn):
            logits.grad = None
            fn(logits, labels).sum().backward()

        best = best_times(repeats, {"verl": lambda: step(verl_fn), "patch": lambda: step(patch.chunked_logprobs)})
        with torch.no_grad():
            diff = (verl_fn(logits, labels) - patch.chunked_logprobs(logits, labels)).abs().max().item()
        print(f"{f'{tokens} x {vocab}':>24} {fmt_s(best['verl']):>16} {fmt_s(best['patch']):>10} "
              f"{best['patch'] / best['verl']:>6.3f}x {diff:>11.2e}")


def sft_run(steps: int, patched: bool, root: Path, data: Path) -> tuple[float, list[float]]:
    from mgrpo_verl.envs.builtin import model_paths
    from mgrpo_verl.warmstart import sft

    paths = model_paths("tiny_init01")
    out = root / ("patched" if patched else "verl")
    out.mkdir()
    metrics = out / "metrics.jsonl"
    args = sft.overrides(paths.model_dir, paths.tokenizer_dir, data, None, out, sft.SFTSettings(steps=steps),
                         "cpu", 448)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VERL_FILE_LOGGER_PATH": str(metrics), "MGRPO_VERL_DEVICE": "cpu",
           **sft.single_process_env(out / "store", os.environ)}
    head = ["-m", "mgrpo_verl.warmstart.sft"] if patched else ["-c", UNPATCHED_CHILD]
    seen: dict[int, float] = {}
    follower = JsonlFollower(metrics)
    proc = subprocess.Popen([sys.executable, *head, *args], env=env, cwd=out, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    while proc.poll() is None:  # the time each step's record appears
        time.sleep(0.05)
        for record in follower.new_records():
            seen.setdefault(record["step"], time.monotonic())
    if proc.returncode != 0:
        sys.exit(f"verl's SFT trainer failed (exit {proc.returncode}) in {out}")
    losses = [json.loads(line)["data"]["train/loss"] for line in metrics.read_text().splitlines()]
    return (seen[max(seen)] - seen[min(seen)]) / (max(seen) - min(seen)), losses


def bench_sft(steps: int) -> None:
    from mgrpo_verl.warmstart import demos

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = demos.write_sft_datasets(root / "data", "relay_tools", 256, 32, 0, 0.4)["main"]["train"]
        verl_s, verl_losses = sft_run(steps, False, root, data)
        ours_s, our_losses = sft_run(steps, True, root, data)
    same = "the same losses" if verl_losses == our_losses else "DIFFERENT losses"
    print(f"verl's SFT trainer, {steps} steps of the warm start's main agent (16 x 448 tokens): "
          f"verl {verl_s:.3f} s/step, patch {ours_s:.3f} s/step, ratio {ours_s / verl_s:.3f}x, {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sft-steps", type=int, default=30)
    args = parser.parse_args()
    from mgrpo_verl.platform import register_cpu_platform

    os.environ.setdefault("MGRPO_VERL_DEVICE", "cpu")
    register_cpu_platform()
    bench_function(args.repeats)
    if args.sft_steps:
        bench_sft(args.sft_steps)


if __name__ == "__main__":
    main()
