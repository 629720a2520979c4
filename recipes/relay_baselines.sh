#!/usr/bin/env bash
# M-GRPO's claim on CPU: joint M-GRPO vs frozen sub-agent vs single-agent GRPO on the built-in relay task,
# several seeds, then a results table and a plot of held-out accuracy against step in docs/results/.
#
#   bash recipes/relay_baselines.sh                 # 3 variants x 2 seeds x 30 steps (about 1 h on 2 cores)
#   SEEDS="0 1 2" STEPS=60 bash recipes/relay_baselines.sh
#
# Runs are kept in $RUNS (default runs/relay_baselines); finished ones are skipped when re-run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
RUNS="${RUNS:-runs/relay_baselines}"
python -m mgrpo_verl.experiments.baselines run --out "$RUNS" --seeds ${SEEDS:-0 1} --steps "${STEPS:-30}" "$@"
python -m mgrpo_verl.experiments.baselines report --runs "$RUNS" --out docs/results
