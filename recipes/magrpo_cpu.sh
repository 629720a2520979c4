#!/usr/bin/env bash
# MAGRPO on CPU with the built-in tiny models: two agents, each its own model, trained on a joint reward.
#
#   bash recipes/magrpo_cpu.sh                      # writing collaboration (Wikipedia summaries), 20 steps
#   TASK=code bash recipes/magrpo_cpu.sh            # HumanEval coding collaboration (helper + main)
#   TASK=code bash recipes/magrpo_cpu.sh multi_agent.cooperation.num_turns=2   # with test feedback
#
# Then the no-training baselines (single model, parallel, sequential, one-round discussion) on the same
# task: python -m mgrpo_verl.experiments.coop_baselines --task coop_$TASK
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
TASK="${TASK:-writing}"
python -m mgrpo_verl.main_ppo --config-name magrpo_trainer coop_task="$TASK" \
  trainer.total_training_steps="${STEPS:-20}" trainer.default_local_dir="runs/magrpo_$TASK" "$@"
