#!/usr/bin/env bash
# MAGRPO as in the paper, on GPUs with vLLM (preset mgrpo_verl/config/preset/magrpo_gpu.yaml): two
# Qwen2.5-Coder-3B agents (coding, HumanEval) or two Qwen3-1.7B agents (writing), one model and one GPU
# each, G = 4 joint actions per node. The pre-flight memory estimate checks the layout before Ray starts.
# Not run in CI (no GPU there). Needs `pip install -e ".[vllm]"` (CUDA torch 2.11.0, vLLM 0.24.0: README "Install on GPUs"); models from the hub
# or a local path (MODEL=...).
#
#   TASK=code bash recipes/magrpo_gpu.sh
#   TASK=writing MODEL=/models/Qwen3-1.7B bash recipes/magrpo_gpu.sh trainer.total_training_steps=200
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TASK="${TASK:-code}"
if [ "$TASK" = code ]; then DEFAULT_MODEL=Qwen/Qwen2.5-Coder-3B-Instruct; else DEFAULT_MODEL=Qwen/Qwen3-1.7B; fi
MODEL="${MODEL:-$DEFAULT_MODEL}"
if [ "$TASK" = code ]; then B=main; else B=details; fi
python -m mgrpo_verl.main_ppo --config-name magrpo_trainer +preset=magrpo_gpu coop_task="$TASK" \
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.tokenizer_path="$MODEL" \
  "multi_agent.agents.$B.actor_rollout_ref.model.path=$MODEL" \
  "multi_agent.agents.$B.actor_rollout_ref.model.tokenizer_path=$MODEL" \
  trainer.default_local_dir="runs/magrpo_gpu_$TASK" "$@"
