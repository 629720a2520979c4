#!/usr/bin/env bash
# M-GRPO's claim on CPU: joint M-GRPO vs frozen sub-agent vs shared-reward-only sub-agent vs single-agent
# GRPO (on relay_tools also single_both: the single agent warm-started on both roles), every variant from the
# same warm start (task relay_tools: delegation by tool call, docs/warmstart.md), several seeds, then a table and a plot of held-out exact accuracy against step and training time in
# docs/results/relay_tools_baselines.{md,png}.
#
#   bash recipes/relay_baselines.sh                          # 5 variants x 3 seeds x 20 steps, validation every 5 (about 1 h 15 on 2 cores)
#   SEEDS="0 1" STEPS=30 bash recipes/relay_baselines.sh
#   TASK=relay bash recipes/relay_baselines.sh               # the forced relay with random tiny models (dense score)
#
# Runs are kept in $RUNS (default runs/<task>_baselines); finished ones are skipped when re-run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
TASK="${TASK:-relay_tools}"
RUNS="${RUNS:-runs/${TASK}_baselines}"
# shellcheck disable=SC2086
python -m mgrpo_verl.experiments.baselines run --task "$TASK" --out "$RUNS" --seeds ${SEEDS:-0 1 2} --steps "${STEPS:-20}" --test-freq "${TEST_FREQ:-5}" "$@"
python -m mgrpo_verl.experiments.baselines report --task "$TASK" --runs "$RUNS" --out docs/results
