#!/usr/bin/env bash
# Evaluate deep-research systems (joint M-GRPO, frozen sub-agent, single agent) on benchmarks and write the
# paper-style table plus per-agent statistics to $OUT (default docs/results).
#
#   SYSTEMS="joint=runs/research_cpu/global_step_20 single=untrained" bash recipes/research_eval.sh
#   BENCHMARKS="builtin data/gaia.parquet data/xbench.parquet data/webwalkerqa.parquet" SYSTEMS=... \
#     bash recipes/research_eval.sh -- <Hydra overrides of the training recipe, e.g. the GPU one's>
#
# Convert a benchmark first: python -m mgrpo_verl.envs.research.loaders gaia PATH --out data/gaia.parquet
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
RUNS="${RUNS:-runs/research_eval}"
ARGS=()
for s in ${SYSTEMS:-joint=untrained}; do ARGS+=(--system "$s"); done
for b in ${BENCHMARKS:-builtin}; do ARGS+=(--benchmark "$b"); done
python -m mgrpo_verl.experiments.research_eval run --out "$RUNS" "${ARGS[@]}" "$@"
python -m mgrpo_verl.experiments.research_eval report --runs "$RUNS" --out "${OUT:-docs/results}"
