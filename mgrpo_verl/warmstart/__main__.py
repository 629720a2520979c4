"""``python -m mgrpo_verl.warmstart --task relay_tools [--out ROOT] [...]``: build (or find in the cache) the
warm start of a task's agents and print the ``main_ppo`` command that starts RL from it."""

from __future__ import annotations

import argparse
import json
import sys

from mgrpo_verl.warmstart.build import FROM_MAIN, WarmStartSpec, default_root, warm_start
from mgrpo_verl.warmstart.demos import TASKS
from mgrpo_verl.warmstart.sft import SFTSettings


def parse_args(argv=None) -> tuple[WarmStartSpec, argparse.Namespace]:
    defaults, sft_defaults = WarmStartSpec(), SFTSettings()
    p = argparse.ArgumentParser(prog="python -m mgrpo_verl.warmstart", description=__doc__.splitlines()[0])
    p.add_argument("--task", default=defaults.task, choices=sorted(TASKS))
    p.add_argument("--out", default=None, help=f"root of the cached results (default {default_root()})")
    p.add_argument("--main-model", default=defaults.main_model, help="built-in model name or model directory")
    p.add_argument("--sub-model", default=defaults.sub_model,
                   help=f"built-in model name, model directory, or {FROM_MAIN!r}: the main agent's fine-tuned "
                        "checkpoint")
    p.add_argument("--n-train", type=int, default=defaults.n_train, help="demonstrations per agent")
    p.add_argument("--n-val", type=int, default=defaults.n_val, help="SFT validation demonstrations per agent")
    p.add_argument("--data-seed", type=int, default=defaults.data_seed)
    p.add_argument("--steps", type=int, default=sft_defaults.steps,
                   help="SFT steps of the main agent (0: none, its base model as it is; the sub-agent's too with "
                        "--sub-steps 0)")
    p.add_argument("--sub-steps", type=int, default=defaults.sub_steps, help="SFT steps of the sub-agent (0: --steps)")
    p.add_argument("--main-restart-steps", type=int, default=defaults.main_restart_steps,
                   help="SFT steps of the main agent after a warm restart (a second run from its checkpoint; 0: none)")
    p.add_argument("--sub-report-accuracy", type=float, default=defaults.sub_report_accuracy,
                   help="fraction of the sub-agent's demonstrations that report the secret (the others a stock digit)")
    p.add_argument("--batch-size", type=int, default=sft_defaults.batch_size)
    p.add_argument("--lr", type=float, default=sft_defaults.lr)
    p.add_argument("--seed", type=int, default=sft_defaults.seed, help="SFT seed")
    p.add_argument("--save-every", type=int, default=0, help="also keep checkpoints every N steps (sweeps)")
    p.add_argument("--n-eval", type=int, default=defaults.n_eval, help="held-out episodes per temperature (0: none)")
    p.add_argument("--device", default=defaults.device, choices=["cpu", "cuda"])
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.add_argument("--overrides", action="store_true", help="print only the main_ppo overrides, one per line")
    args = p.parse_args(argv)
    spec = WarmStartSpec(
        task=args.task,
        main_model=args.main_model,
        sub_model=args.sub_model,
        sub_steps=args.sub_steps or None,
        sub_report_accuracy=args.sub_report_accuracy,
        main_restart_steps=args.main_restart_steps,
        n_train=args.n_train,
        n_val=args.n_val,
        data_seed=args.data_seed,
        sft=SFTSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                        save_every=args.save_every),
        n_eval=args.n_eval,
        device=args.device,
    )
    return spec, args


def main(argv=None) -> None:
    spec, args = parse_args(argv)
    quiet = args.json or args.overrides
    result = warm_start(spec, args.out,
                        log=lambda msg: print(msg, flush=True, file=sys.stderr if quiet else sys.stdout))
    if args.overrides:
        print("\n".join(result.main_ppo_overrides()))
        return
    if args.json:
        print(json.dumps(result.manifest, indent=2))
        return
    print(f"main agent: {result.main}\nsub-agent:  {result.sub}")
    for r in result.manifest.get("evaluation", []):
        print(
            f"held-out (T={r['temperature']}, {r['episodes']} episodes): exact {r['exact']:.3f}, "
            f"main parse {r['main_parse']:.3f}, sub parse {r['sub_parse']:.3f}, sub exact {r['sub_exact']:.3f}; "
            f"p(right digit) main {r['main_digit_prob']:.3f}, sub {r['sub_digit_prob']:.3f}"
        )
    print("start RL from it:\n" + result.main_ppo_command())


if __name__ == "__main__":
    main()
