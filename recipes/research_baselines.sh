#!/usr/bin/env bash
# M-GRPO's comparison on the offline deep-research task on CPU: train joint M-GRPO, the frozen-sub-agent
# baseline and single-agent GRPO (research=cpu, tiny models), then evaluate them and the untrained
# models on the built-in validation questions (plus any BENCHMARKS="a.parquet ...") and write the table
# with per-agent statistics to docs/results/research_eval.md.
#
#   bash recipes/research_baselines.sh                      # 30 steps per variant (about 30 min on 2 cores)
#   STEPS=60 BENCHMARKS="builtin data/gaia.parquet" bash recipes/research_baselines.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
RUNS="${RUNS:-runs/research}"
STEPS="${STEPS:-30}"
python -m mgrpo_verl.experiments.research_eval train --out "$RUNS" --steps "$STEPS" "$@"
ARGS=(--system untrained:joint=untrained)
for v in joint frozen single; do ARGS+=(--system "$v=$RUNS/$v/global_step_$STEPS"); done
for b in ${BENCHMARKS:-builtin}; do ARGS+=(--benchmark "$b"); done
python -m mgrpo_verl.experiments.research_eval run --out "$RUNS/eval" "${ARGS[@]}"
python -m mgrpo_verl.experiments.research_eval report --runs "$RUNS/eval" --out "${OUT:-docs/results}" --metric "${METRIC:-f1}"
