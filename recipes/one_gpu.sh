#!/usr/bin/env bash
# Two agents, each with its own model, on ONE GPU (preset mgrpo_verl/config/preset/one_gpu.yaml:
# multi_agent.placement=shared, two Qwen2.5-0.5B-Instruct, vLLM, M-GRPO on the relay task). The pre-flight
# memory estimate refuses, before Ray starts, a layout that cannot fit the GPU. Not run in CI (no GPU there).
# Needs `pip install -e ".[vllm]"` (CUDA torch 2.11.0, vLLM 0.24.0: README "Install on GPUs"); models from the hub or local paths.
#
#   bash recipes/one_gpu.sh
#   MODEL=/models/Qwen2.5-0.5B-Instruct SUB_MODEL=/models/Qwen2.5-0.5B-Instruct bash recipes/one_gpu.sh
#   bash recipes/one_gpu.sh multi_agent.agents.sub.trainable=false        # frozen sub-agent (its actor goes to CPU)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
SUB_MODEL="${SUB_MODEL:-$MODEL}"
python -m mgrpo_verl.main_ppo task=relay +preset=one_gpu \
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.tokenizer_path="$MODEL" \
  "multi_agent.agents.sub.actor_rollout_ref.model.path=$SUB_MODEL" \
  "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=$SUB_MODEL" \
  trainer.default_local_dir=runs/one_gpu "$@"
