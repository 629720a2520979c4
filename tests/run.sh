#!/usr/bin/env bash
# Sets everything up, lints (ruff, configured in pyproject.toml), then runs the whole test suite, slow tests
# included. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../recipes/setup_env.sh"
cd "$MGRPO_ROOT"
python -m ruff check mgrpo_verl tests benchmarks recipes examples  # lint first: seconds, and it names the line
python -m pytest tests --durations=25 "$@"  # the 25 slowest at the end: where the time goes
