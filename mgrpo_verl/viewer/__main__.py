"""``python -m mgrpo_verl.viewer RUN_DIR [--out page.html] [--rollouts N]`` (see :mod:`mgrpo_verl.viewer`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mgrpo_verl.viewer.load import load_dump
from mgrpo_verl.viewer.page import ROLLOUTS_PER_STEP, write_page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgrpo_verl.viewer", description=(
        "Write one static, offline HTML page of a run's rollout dumps (trainer.rollout_data_dir and "
        "trainer.validation_data_dir, found under RUN_DIR)."))
    parser.add_argument("run_dir", type=Path, help="a folder holding the dumps (searched recursively)")
    parser.add_argument("--out", type=Path, default=None, help="the page to write (default: RUN_DIR/rollouts.html)")
    parser.add_argument("--rollouts", type=int, default=ROLLOUTS_PER_STEP,
                        help=f"main rollouts shown per step, spread from the best score to the worst "
                             f"(default {ROLLOUTS_PER_STEP})")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        parser.error(f"{args.run_dir} is not a folder")
    if args.rollouts < 1:
        parser.error("--rollouts must be at least 1")
    dump = load_dump(args.run_dir)
    if not dump.rows:
        print(f"no rollout dump under {args.run_dir}: set trainer.rollout_data_dir and/or trainer.validation_data_dir "
              "(docs/rollouts.md)", file=sys.stderr)
        return 1
    out = args.out or args.run_dir / "rollouts.html"
    write_page(dump, out, title=f"rollouts · {args.run_dir.resolve().name}", rollouts_per_step=args.rollouts)
    print(f"wrote {out}: {len(dump.rows)} rows, {len(dump.steps('train'))} training and {len(dump.steps('val'))} "
          f"validation steps from {len(dump.files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
