#!/usr/bin/env bash
# Sets everything up, then runs the main job on the embedded default: `python -m mgrpo_verl.main_ppo`
# (verl's trainer on CPU with a tiny model built locally and the built-in echo task; a few minutes on
# 2 cores). Extra arguments are Hydra overrides, e.g. `trainer.total_training_steps=10`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
python -m mgrpo_verl.main_ppo "$@"
