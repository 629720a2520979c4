#!/usr/bin/env bash
# Sets everything up, then runs the main job on the embedded CPU default.
# Until the trainer lands, the main job is the algorithm demo (python -m mgrpo_verl.demo).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
python -m mgrpo_verl.demo "$@"
