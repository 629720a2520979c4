#!/usr/bin/env bash
# M-GRPO's claim on CPU: joint M-GRPO vs frozen sub-agent vs shared-reward-only sub-agent vs single-agent
# GRPO (on relay_tools also single_both: the single agent warm-started on both roles), every variant from the
# same warm start (task relay_tools: delegation by tool call, docs/warmstart.md), several seeds, then a table
# and a plot of held-out exact accuracy against step and training time in $RESULTS (default docs/results)/
# relay_tools_baselines.{md,png}.
#
#   bash recipes/relay_baselines.sh                          # 5 variants x 3 seeds x 20 steps, validation every 5 (about 1 h 15 on 2 cores)
#   SEEDS="0 1" STEPS=30 bash recipes/relay_baselines.sh --variants joint frozen
#   SUB_REPORT_ACCURACY=0.3 RESULTS=docs/results/relay_tools_q030 bash recipes/relay_baselines.sh   # the default warm start's
#   TASK=relay bash recipes/relay_baselines.sh               # the forced relay with random tiny models (dense score)
#
# Arguments: options of `python -m mgrpo_verl.experiments.baselines run`; Hydra overrides of every run: OVERRIDES="a=1 b=2".
# relay_tools' warm start: SUB_REPORT_ACCURACY (default 0.45) is the share of the sub-agent's demonstrations that report
# the secret. At 0.45 the frozen sub-agent is partly competent (held-out exact 0.47 greedy before RL); at the default warm
# start's 0.3 it answers `?` greedily and a frozen sub-agent is no help at all (docs/multi_agent.md, both tables).
# Runs are kept in $RUNS (default runs/<task>_baselines[_q<accuracy>]); finished ones are skipped when re-run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
TASK="${TASK:-relay_tools}"
EXTRA=()
SUFFIX=""
if [ "$TASK" = relay_tools ]; then
  Q="${SUB_REPORT_ACCURACY:-0.45}"
  EXTRA=("mgrpo_verl.warmstart.sub_report_accuracy=$Q")
  SUFFIX="_q$Q"
fi
RUNS="${RUNS:-runs/${TASK}_baselines$SUFFIX}"
# shellcheck disable=SC2206  # OVERRIDES: space-separated Hydra overrides
EXTRA+=(${OVERRIDES:-})
# shellcheck disable=SC2086
python -m mgrpo_verl.experiments.baselines run --task "$TASK" --out "$RUNS" --seeds ${SEEDS:-0 1 2} --steps "${STEPS:-20}" \
  --test-freq "${TEST_FREQ:-5}" "$@" -- "${EXTRA[@]+"${EXTRA[@]}"}"
python -m mgrpo_verl.experiments.baselines report --task "$TASK" --runs "$RUNS" --out "${RESULTS:-docs/results}"
