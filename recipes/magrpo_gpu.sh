#!/usr/bin/env bash
# MAGRPO as in the paper, on GPUs with vLLM: two Qwen2.5-Coder-3B agents (coding, HumanEval) or two
# Qwen3-1.7B agents (writing), one model and one GPU share each, G = 4 joint actions per node.
# Not run in CI (no GPU there). Needs a CUDA torch 2.13.0 and `pip install -e .[vllm]`; models from the hub
# or a local path (MODEL=...).
#
#   TASK=code bash recipes/magrpo_gpu.sh
#   TASK=writing MODEL=/models/Qwen3-1.7B bash recipes/magrpo_gpu.sh trainer.total_training_steps=200
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TASK="${TASK:-code}"
if [ "$TASK" = code ]; then DEFAULT_MODEL=Qwen/Qwen2.5-Coder-3B-Instruct; else DEFAULT_MODEL=Qwen/Qwen3-1.7B; fi
MODEL="${MODEL:-$DEFAULT_MODEL}"
if [ "$TASK" = code ]; then A=helper; B=main; else A=summary; B=details; fi
python -m mgrpo_verl.main_ppo --config-name magrpo_trainer coop_task="$TASK" \
  mgrpo_verl.device=accelerator \
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.tokenizer_path="$MODEL" \
  "multi_agent.agents.$B.actor_rollout_ref.model.path=$MODEL" \
  "multi_agent.agents.$B.actor_rollout_ref.model.tokenizer_path=$MODEL" \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  multi_agent.magrpo.num_generations=4 multi_agent.cooperation.response_tokens=512 \
  data.max_prompt_length=1024 data.max_response_length=512 \
  trainer.n_gpus_per_node=2 trainer.total_training_steps=100 trainer.default_local_dir="runs/magrpo_gpu_$TASK" \
  "$@"
