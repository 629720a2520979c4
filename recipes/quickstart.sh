#!/usr/bin/env bash
# Sets everything up, then runs the main job on the embedded default: `python -m mgrpo_verl.main_ppo`
# (verl's trainer on CPU: M-GRPO on the relay_tools task, a main agent that delegates by a tool call to a
# tool-using sub-agent, both tiny Qwen2 models built locally and warm-started by verl's SFT trainer; the
# warm start is built on the first run (about 2 min on 2 idle cores, version 6) and cached, then Ray's start-up and
# 15 steps take about 2 min; 4 min 42 s in all from a fresh clone with empty caches, 2026-12-05). Extra arguments are Hydra overrides, e.g. `trainer.total_training_steps=30`; `task=relay` runs
# the forced relay with random models instead.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
python -m mgrpo_verl.main_ppo "$@"
