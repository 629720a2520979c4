#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite, slow tests included. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../recipes/setup_env.sh"
cd "$MGRPO_ROOT"
python -m pytest tests "$@"
