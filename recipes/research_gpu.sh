#!/usr/bin/env bash
# M-GRPO deep research as in the paper's setting (preset research=gpu, mgrpo_verl/config/research/gpu.yaml):
# a Qwen3 main agent and a Qwen3 sub-agent on one 8-GPU node, vLLM (ROLLOUT=sglang for SGLang), K = 8,
# each agent on its own GPUs, delegation and tools by tool call. Not run in CI (no GPU there). Needs
# `pip install -e ".[vllm]"` (or ".[sglang]"; README "Install on GPUs"); models from the hub or local paths.
#
#   bash recipes/research_gpu.sh
#   MAIN_MODEL=/models/Qwen3-8B SUB_MODEL=/models/Qwen3-4B MAIN_GPUS=4 SUB_GPUS=4 bash recipes/research_gpu.sh
#   RESEARCH_TOOLS=web bash recipes/research_gpu.sh              # + web_search (SearXNG on localhost:8888)
#   bash recipes/research_gpu.sh multi_agent.agents.sub.trainable=false          # frozen sub-agent baseline
#   bash recipes/research_gpu.sh data.train_files=data/my_train.parquet          # your own training data
# Memory: research=gpu's micro-batches fit 80 GB GPUs; the pre-flight estimate (mgrpo_verl/trainer/memory.py)
# refuses, before Ray starts, a layout that cannot fit (e.g. larger models or micro-batches), naming what to
# change. Both agents on all 8 GPUs instead of 4 + 4 (one resource pool, engines at 0.3 each):
#   bash recipes/research_gpu.sh multi_agent.placement=shared multi_agent.agents.main.n_gpus_per_node=8 \
#     multi_agent.agents.sub.n_gpus_per_node=8 actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
#     +multi_agent.agents.sub.actor_rollout_ref.rollout.gpu_memory_utilization=0.3
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MAIN_MODEL="${MAIN_MODEL:-Qwen/Qwen3-4B}"
SUB_MODEL="${SUB_MODEL:-Qwen/Qwen3-1.7B}"
MAIN_GPUS="${MAIN_GPUS:-4}"
SUB_GPUS="${SUB_GPUS:-4}"
if [ "${RESEARCH_TOOLS:-offline}" = web ]; then SUB_TOOLS=research_web_tools.yaml; else SUB_TOOLS=research_sub_tools.yaml; fi
python -m mgrpo_verl.main_ppo task=relay research=gpu \
  actor_rollout_ref.model.path="$MAIN_MODEL" actor_rollout_ref.model.tokenizer_path="$MAIN_MODEL" \
  "multi_agent.agents.sub.actor_rollout_ref.model.path=$SUB_MODEL" \
  "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=$SUB_MODEL" \
  "multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path=\${mgrpo_config_file:tools/$SUB_TOOLS}" \
  multi_agent.agents.main.n_gpus_per_node="$MAIN_GPUS" multi_agent.agents.sub.n_gpus_per_node="$SUB_GPUS" \
  trainer.n_gpus_per_node=$((MAIN_GPUS + SUB_GPUS)) actor_rollout_ref.rollout.name="${ROLLOUT:-vllm}" \
  trainer.default_local_dir=runs/research_gpu "$@"
