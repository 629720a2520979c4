#!/usr/bin/env bash
# Sets everything up, lints (ruff, configured in pyproject.toml), then runs the whole test suite, slow tests
# included, except those marked `full` (a second end-to-end run of a path that another test runs end to end, or a
# guide at its size: pyproject.toml) unless the first argument is --full. Other arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../recipes/setup_env.sh"
cd "$MGRPO_ROOT"
python -m ruff check mgrpo_verl tests benchmarks recipes examples  # lint first: seconds, and it names the line
tier=(-m "not full"); if [ "${1:-}" = --full ]; then tier=(); shift; fi
python -m pytest tests "${tier[@]}" --durations=25 "$@"  # the 25 slowest at the end: where the time goes
