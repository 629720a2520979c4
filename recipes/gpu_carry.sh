#!/usr/bin/env bash
# The smallest install that runs mgrpo_verl on the device tool's GPU machine (Python 3.12, torch 2.11 +
# CUDA 13, transformers 5.17 and pandas/pyarrow/peft preinstalled; no ray, verl or network), carried in ONE
# call (64 MiB a call). The first GPU runs (docs/results/gpu.md, 2026-11-26) used exactly this.
#
#   bash recipes/gpu_carry.sh pack [--warmstart]    # here: fills .gpu_carry/ (git-ignored), about 42 MB
#   # then, with the device tool: carry [".gpu_carry"], command:
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_smoke.sh A1 A2
#   bash recipes/gpu_carry.sh run -- python3 -m mgrpo_verl.main_ppo mgrpo_verl.device=accelerator ...
#
# pack: the wheels the image lacks (PACKAGES below, no dependencies resolved: the image has the rest), for
# cp312 manylinux; ray's wheel (79 MB) trimmed of its Java jars, dashboard web client and RLlib and
# recompressed with xz (29 MB), since no call can carry it whole; antlr4 (source only on PyPI) and our own
# wheel built here (verl finds our plugin through its entry point). --warmstart also copies the tiny
# models and the default relay_tools warm start from this machine's cache, so the preset needs no SFT
# there (run with MGRPO_VERL_CACHE pointing at .gpu_carry/cache; `run` sets it).
# run: installs into /tmp/site once per machine (about 5 s), then runs the command with PYTHONPATH =
# this checkout, /tmp/site. transformers is NOT carried: verl 0.9.1 declares <5.11, but 5.10.4 refuses the
# image's tokenizers 0.23.2 at import, and the image's 5.17 ran stages A1/A2 and a 5-step learning run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR=.gpu_carry
PACKAGES=(ray==2.60.0 verl==0.9.1 hydra-core==1.3.8 omegaconf==2.3.1 codetiming==1.4.0 datasets==5.2.0
  dill==0.4.1 multiprocess==0.70.19 tensordict==0.10.0 pyvers==0.1.0 orjson==3.13.0 importlib-metadata==10.2.0
  torchdata==0.11.0 pylatexenc==2.11 cachetools==8.0.2 uvicorn==0.54.0 fastapi==0.165.0 starlette==1.10.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 sniffio==1.3.1
  opentelemetry-api==1.45.2 pyzmq==27.3.0 msgspec==0.22.0 transferqueue==0.1.11 rank-bm25==0.2.2
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 termcolor==3.3.0)

pack() {
  local py="${PYTHON:-.venv/bin/python}" warm=0
  [ "${1:-}" = --warmstart ] && warm=1
  grep -qx "/$DIR/" .git/info/exclude 2>/dev/null || echo "/$DIR/" >> .git/info/exclude
  rm -rf "$DIR" && mkdir -p "$DIR"
  local tmp; tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' RETURN
  local plat=(); for p in manylinux_2_{35,34,31,28,27,26,24,17}_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
  echo "gpu_carry: downloading ${#PACKAGES[@]} wheels for cp312"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d "$tmp" "${PACKAGES[@]}"
  "$py" -m pip wheel -q --no-deps -w "$tmp" antlr4-python3-runtime==4.9.3 .
  echo "gpu_carry: trimming and recompressing ray (about a minute)"
  mkdir "$tmp/ray" && (cd "$tmp/ray" && unzip -q "$tmp"/ray-*.whl && rm -rf ray/jars ray/dashboard/client/build ray/rllib \
    && find . -name '*.map' -delete && tar cf - . | xz -T0 -7 > "$OLDPWD/$DIR/ray.tar.xz")
  rm -rf "$tmp/ray" "$tmp"/ray-*.whl && mv "$tmp"/*.whl "$DIR/"
  if [ "$warm" = 1 ]; then
    local ws; ws="$("$py" -c 'from mgrpo_verl.warmstart import build; w = build.cached(build.WarmStartSpec()); print(w.directory if w else "")')"
    [ -n "$ws" ] || { echo "gpu_carry: no default warm start built here: run bash recipes/warmstart.sh first" >&2; exit 1; }
    local cache; cache="$(dirname "$(dirname "$ws")")"
    mkdir -p "$DIR/cache/warmstart" "$DIR/cache/models"
    cp -r "$cache/tokenizers" "$cache/data" "$DIR/cache/"
    cp -r "$ws" "$DIR/cache/warmstart/"
    # the tiny base models the warm start's cache key names (1 MB each), not every model of the cache
    for m in $("$py" -c 'import json, sys; m = json.load(open(sys.argv[1])); print(" ".join({a["base_model"] for a in m["agents"].values()}))' "$ws/manifest.json"); do
      case "$m" in "$cache"/models/*) cp -r "$m" "$DIR/cache/models/" ;; esac
    done
  fi
  local mb; mb=$(du -sm "$DIR" | cut -f1)
  echo "gpu_carry: $DIR holds $(ls "$DIR" | wc -l) entries, $mb MB"
  [ "$mb" -le 60 ] || { echo "gpu_carry: over 60 MB: one device call carries 64 MiB with the working tree" >&2; exit 1; }
}

run() {
  [ "${1:-}" = -- ] && shift
  [ -d "$DIR" ] || { echo "gpu_carry: no $DIR here: pack it, and name it in the call's carry" >&2; exit 2; }
  if [ ! -f /tmp/site/.installed ]; then
    local t0=$SECONDS
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$DIR"/*.whl
    tar xJf "$DIR/ray.tar.xz" -C /tmp/site
    touch /tmp/site/.installed && echo "gpu_carry: installed into /tmp/site in $((SECONDS - t0)) s"
  fi
  export PYTHONPATH="$PWD:/tmp/site" PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1 PYTHON=python3
  [ -d "$DIR/cache" ] && export MGRPO_VERL_CACHE="$PWD/$DIR/cache"
  python3 -c 'import ray, torch, transformers, verl; print(f"gpu_carry: torch {torch.__version__} (CUDA {torch.cuda.is_available()}), ray {ray.__version__}, verl {verl.__version__}, transformers {transformers.__version__}")'
  "$@"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
