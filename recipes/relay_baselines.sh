#!/usr/bin/env bash
# M-GRPO's claim on CPU: joint M-GRPO vs frozen sub-agent vs shared-reward-only sub-agent vs single-agent
# GRPO (on relay_tools also single_both: the single agent warm-started on both roles), every variant from the
# same warm start (task relay_tools: delegation by tool call, docs/warmstart.md), several seeds, then a table
# and a plot of held-out exact accuracy against step and training time in $RESULTS (default docs/results)/
# relay_tools_baselines.{md,png}.
#
#   bash recipes/relay_baselines.sh                          # 5 variants x 3 seeds x 20 steps, validation every 5 (31 min on 2 idle cores, 2026-12-07)
#   SEEDS="0 1" STEPS=30 bash recipes/relay_baselines.sh --variants joint frozen
#   SUB_REPORT_ACCURACY=0.3 RESULTS=docs/results/relay_tools_q030 bash recipes/relay_baselines.sh   # the default warm start's
#   TASK=relay bash recipes/relay_baselines.sh               # the forced relay with random tiny models (dense score)
#
# Arguments: options of `python -m mgrpo_verl.experiments.baselines run`; Hydra overrides of every run: OVERRIDES="a=1 b=2".
# relay_tools' warm start: SUB_REPORT_ACCURACY (default 0.45) is the share of the sub-agent's demonstrations that call
# read_secret (version 3 warm starts: that report the secret). On version 6, at 0.45 as at 0.3, the frozen sub-agent never
# calls it greedily: held-out exact 0.125 before RL, frozen 0.125, joint 1.000 (docs/multi_agent.md, 2026-12-07; on
# version 3, 0.45 made the frozen sub-agent partly competent: 0.49).
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
