#!/usr/bin/env bash
# MAGRPO's claim on CPU: agents trained with MAGRPO vs the no-training baselines (single model, parallel,
# sequential, one-round discussion), several seeds, evaluated every 10 steps; table and plot in docs/results/.
#
#   bash recipes/magrpo_comparison.sh                        # writing task, 3 seeds x 40 steps (about 25 min)
#   TASK=coop_code SEEDS="0" bash recipes/magrpo_comparison.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
TASK="${TASK:-coop_writing}"
RUNS="${RUNS:-runs/magrpo_comparison_$TASK}"
python -m mgrpo_verl.experiments.magrpo_comparison run --out "$RUNS" --task "$TASK" --seeds ${SEEDS:-0 1 2} \
  --steps "${STEPS:-40}" "$@"
python -m mgrpo_verl.experiments.magrpo_comparison report --runs "$RUNS" --task "$TASK" --out docs/results
