#!/usr/bin/env bash
# Sets everything up, lints (ruff, configured in pyproject.toml), then runs the whole test suite, slow tests
# included, except those marked `full` (a second end-to-end run of a path that another test runs end to end, or a
# guide at its size: pyproject.toml) unless the first argument is --full. Other arguments go to pytest.
# The suite runs on MGRPO_TEST_WORKERS pytest-xdist workers (default 2; 0: in this process, as plain pytest), one test
# file at a time per worker, the files of the trainer's shared end-to-end runs on one worker together and the slow
# files first (tests/conftest.py). More workers on a bigger machine: each end-to-end run takes ~5 GB.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../recipes/setup_env.sh"
cd "$MGRPO_ROOT"
python -m ruff check mgrpo_verl tests benchmarks recipes examples  # lint first: seconds, and it names the line
tier=(-m "not full"); if [ "${1:-}" = --full ]; then tier=(); shift; fi
workers=(-n "${MGRPO_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder)
python -m pytest tests "${tier[@]}" "${workers[@]}" --durations=25 "$@"  # the 25 slowest at the end: where the time goes
