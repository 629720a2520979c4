#!/usr/bin/env bash
# GPU smoke kit: a few real `python -m mgrpo_verl.main_ppo` steps per stage on one CUDA GPU, no download
# (the built-in tiny models, or SMOKE_MODEL=<local model dir>), then one results file.
#
#   bash recipes/gpu_smoke.sh                 # A1 A2 B1 B2 B3 (A1 A2 ran on an H200; B stages never on a GPU)
#   bash recipes/gpu_smoke.sh A1 A2           # some stages (one call of the device tool each, if needed)
#   bash recipes/gpu_smoke.sh --model /models/Qwen2.5-0.5B-Instruct B1
#   MGRPO_SMOKE_DEVICE=cpu SMOKE_STEPS=1 bash recipes/gpu_smoke.sh A1   # the plumbing on CPU, labelled cpu
#   MGRPO_SMOKE_DEVICE=cpu PYTHON=.venv-vllm/bin/python bash recipes/gpu_smoke.sh B1 B2 B3   # vLLM's CPU build
#                                             # (recipes/vllm_cpu_env.sh; +preset=vllm_cpu), labelled cpu
#   bash recipes/gpu_smoke.sh --report-only   # no stage: the report (and $OUT files) from the stage folders
#   python benchmarks/bench_gpu_throughput.py run --preset qwen2.5-0.5b   # stages T2 T3 T1 at a real size + ratios
#
# Stages (relay task of the multi-agent trainer, main + sub agent, same rows per step in every stage):
#   A1  verl's FSDP actor on CUDA + our HF rollout replica on the GPU, one model (sub shares main's model)
#   A2  the same with two models on one GPU ($SMOKE_SHARED_PLACEMENT)
#   B1  verl's FSDP actor + vLLM rollout, one model        B2  the same with two models on one GPU
#   B3  B2 with both agents as LoRA adapters on one base: one vLLM engine serves both (docs/lora.md)
#   T1  throughput, stock: `python -m verl.trainer.main_ppo` GRPO, one model, vLLM, B prompts x n rollouts of R tokens
#   T2  throughput, ours: our M-GRPO trainer, two models of T1's size on one GPU (shared placement), vLLM each; each
#       model generates exactly T1's rows (same prompt tokens, n, R; T2's agent loop mgrpo_twin, gpu_smoke.py)
#   T3  throughput, stock with 2n rollouts: T1 with twice the rows, as many tokens per step as T2
#       (T1-T3: benchmarks/bench_gpu_throughput.py sets the model and lengths and writes the ratio report)
# A1/A2, B1/B2 and T1/T2 differ only in the number of models: the report gives their step-time ratio (bar: 2.2);
# bench_gpu_throughput.py adds T2/T3's throughput ratio at equal tokens per step (goal >= 0.9).
#
# Results: $OUT/gpu_smoke.json and $OUT/gpu_smoke.md (OUT defaults to ./gpu_smoke_out), made by
# `python -m mgrpo_verl.experiments.gpu_smoke report` from every stage folder of $SMOKE_WORK
# (./gpu_smoke_out, kept between calls on a warm machine, so stages run in separate calls share a report).
# Per stage: exit code, log tail and error lines on failure, step-time split (gen / old_log_prob /
# update_actor / update_weights), tokens/s, peak GPU memory per process (nvidia-smi every 0.5 s) and
# torch's peaks from the metrics; the listening sockets of its processes (sockets.jsonl, every 1 s) and those
# bound beyond loopback; GPU, driver, versions, date.
#
# Settings (environment):
#   MGRPO_SMOKE_DEVICE     cuda (default; refuses to run without a CUDA device) | cpu (plumbing check)
#   SMOKE_MODEL            local model dir with its tokenizer (default: built-in tiny / tiny_sub); or --model
#   SMOKE_TOKENIZER        tokenizer dir when it is not SMOKE_MODEL's (the real-size presets: SmolLM2's)
#   SMOKE_BATCH, SMOKE_ROLLOUTS, SMOKE_RESPONSE_TOKENS, SMOKE_PROMPT_TOKENS   T stages: prompts per step (4),
#                          rollouts per prompt (4; T3 twice that), tokens each model generates per rollout (16), prompt cap (256)
#   SMOKE_STEPS            training steps per stage (default 4; step 1 is the warm-up and not measured)
#   SMOKE_TIMEOUT_S        per-stage limit in seconds (default 170 for A, 240 for B, 270 for T: A1 A2, B1 B2 or
#                          two T stages fit one 10-minute call); a stage past it is stopped and reported "timeout"
#   SMOKE_ATTN             actor attention (default sdpa: flash-attn is usually not installed; empty: the config's)
#   SMOKE_HF_ROLLOUT       rollout name of our HF replica (default hf)
#   SMOKE_SHARED_PLACEMENT overrides that put two agents on one GPU (default multi_agent.placement=shared)
#   SMOKE_VLLM_MEM         vLLM gpu_memory_utilization per agent (default 0.2)
#   SMOKE_VLLM_EAGER       vLLM enforce_eager (default true: no graph capture, faster start)
#   SMOKE_EXTRA            more Hydra overrides for every stage (space-separated)
#   PYTHON                 interpreter (default: .venv-gpu/bin/python, made by recipes/gpu_install.sh, when it
#                          exists; else python, else python3). The working tree's mgrpo_verl is put first on
#                          PYTHONPATH, so the driver and every Ray worker run this checkout's code.
set -uo pipefail  # no -e: a failing stage must not stop the others or the report
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ALL_STAGES=(A1 A2 B1 B2 B3 T1 T2 T3)  # = STAGES of mgrpo_verl/experiments/gpu_smoke.py (tests/experiments/test_gpu_smoke.py)
MODEL="${SMOKE_MODEL:-}"
TOKENIZER="${SMOKE_TOKENIZER:-}"
STAGES=()
REPORT_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --model=*) MODEL="${1#--model=}"; shift ;;
    --report-only) REPORT_ONLY=1; shift ;;
    -h|--help) sed -n '2,/^set /{/^set /!p}' "$0"; exit 0 ;;
    *) if [[ " ${ALL_STAGES[*]} " == *" $1 "* ]]; then STAGES+=("$1"); shift
       else echo "gpu_smoke: unknown argument '$1' (stages: ${ALL_STAGES[*]}; --model DIR)" >&2; exit 2; fi ;;
  esac
done
[ ${#STAGES[@]} -eq 0 ] && [ "$REPORT_ONLY" = 0 ] && STAGES=("${ALL_STAGES[@]}")

DEVICE="${MGRPO_SMOKE_DEVICE:-cuda}"
WORK="${SMOKE_WORK:-gpu_smoke_out}"
mkdir -p "$WORK" && WORK="$(cd "$WORK" && pwd)"
RESULTS="${OUT:-$WORK}"
mkdir -p "$RESULTS" && RESULTS="$(cd "$RESULTS" && pwd)"
STEPS="${SMOKE_STEPS:-4}"
ATTN="${SMOKE_ATTN-sdpa}"
HF_ROLLOUT="${SMOKE_HF_ROLLOUT:-hf}"
SHARED_PLACEMENT="${SMOKE_SHARED_PLACEMENT:-multi_agent.placement=shared}"
VLLM_MEM="${SMOKE_VLLM_MEM:-0.2}"
VLLM_EAGER="${SMOKE_VLLM_EAGER:-true}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv-gpu/bin/python ]; then PYTHON=.venv-gpu/bin/python
  elif command -v python >/dev/null 2>&1; then PYTHON=python
  else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$MODEL" ]; then
  [ -d "$MODEL" ] || { echo "gpu_smoke: SMOKE_MODEL / --model '$MODEL' is not a directory" >&2; exit 2; }
  MODEL="$(cd "$MODEL" && pwd)"
fi
if [ -n "$TOKENIZER" ]; then
  [ -d "$TOKENIZER" ] || { echo "gpu_smoke: SMOKE_TOKENIZER '$TOKENIZER' is not a directory" >&2; exit 2; }
  TOKENIZER="$(cd "$TOKENIZER" && pwd)"
fi
case "$DEVICE" in
  cuda) DEVMODE=accelerator ;;
  cpu) DEVMODE=cpu ;;
  *) echo "gpu_smoke: MGRPO_SMOKE_DEVICE must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;;
esac
export MGRPO_VERL_DEVICE="$DEVMODE" PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1 RAY_DEDUP_LOGS=0

# nvidia-smi every 0.5 s: per-process memory (+ each new process's command line) and the GPU's total
sample_gpu() {
  local dir="$1" t line pid
  while :; do
    t="$(date +%s.%N)"
    while IFS= read -r line; do
      [ -n "$line" ] || continue
      echo "$t,$line" >> "$dir/smi.csv"
      pid="${line%%,*}"
      if ! grep -q "^$pid " "$dir/smi_procs.txt" 2>/dev/null; then
        echo "$pid $(ps -o args= -p "$pid" 2>/dev/null | cut -c1-200)" >> "$dir/smi_procs.txt"
      fi
    done < <(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null)
    echo "$t,$(nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | head -1)" >> "$dir/smi_total.csv"
    sleep 0.5
  done
}

stage_args() {  # the Hydra overrides of stage $1 writing into folder $2
  local stage="$1" dir="$2"
  ARGS=(-m mgrpo_verl.main_ppo task=relay
    "mgrpo_verl.device=$DEVMODE"
    "trainer.total_training_steps=$STEPS" trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1
    trainer.resume_mode=disable "trainer.default_local_dir=$dir/ckpt" "mgrpo_verl.metrics_file=$dir/metrics.jsonl"
    "trainer.experiment_name=gpu_smoke_$stage" trainer.n_gpus_per_node=1)
  [ "${stage:0:1}" = T ] && ARGS=("${ARGS[0]}" "${ARGS[1]}" "${ARGS[@]:3}")  # T1/T3 are verl's GRPO, T2 sets its task below
  if [ "$DEVICE" = cuda ] && [ -n "$ATTN" ]; then
    ARGS+=("actor_rollout_ref.model.override_config.attn_implementation=$ATTN")
  fi
  if [ -n "$MODEL" ]; then
    ARGS+=("actor_rollout_ref.model.path=$MODEL" "actor_rollout_ref.model.tokenizer_path=${TOKENIZER:-$MODEL}")
    [ "$stage" = T1 ] || [ "$stage" = T3 ] || ARGS+=("multi_agent.agents.sub.actor_rollout_ref.model.path=$MODEL"
      "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${TOKENIZER:-$MODEL}")
  fi
  case "$stage" in
    A*) ARGS+=("actor_rollout_ref.rollout.name=$HF_ROLLOUT") ;;
    T*) local b="${SMOKE_BATCH:-4}" n="${SMOKE_ROLLOUTS:-4}" r="${SMOKE_RESPONSE_TOKENS:-16}" m=16
      [ "$stage" = T3 ] && n=$((2 * n))  # stock with twice the rows: T2's two models' tokens per step
      (( (b * n) % m )) && m=$((b * n))  # verl splits each model's b x n rows into micro-batches of m
      # the same prompts (the relay's main-agent prompts without agent_name: bench_gpu_throughput.py), n rows per
      # prompt per model and exactly r generated tokens per row (verl's ignore_eos reaches vLLM's SamplingParams)
      ARGS+=("data.train_batch_size=$b" "actor_rollout_ref.rollout.n=$n" "actor_rollout_ref.actor.ppo_mini_batch_size=$b"
        actor_rollout_ref.rollout.ignore_eos=true "data.max_prompt_length=${SMOKE_PROMPT_TOKENS:-256}"
        "data.max_response_length=$r"
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$m" "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$m"
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$m")
      if [ "$stage" = T2 ]; then  # ours: those prompts through T2's agent loop, both models on each (?2 below: shared placement)
        "$PYTHON" benchmarks/bench_gpu_throughput.py twin-files --out-dir "$dir/twin" > "$dir/twin_files.log" 2>&1 \
          || { cat "$dir/twin_files.log" >&2; return 1; }
        ARGS=("${ARGS[0]}" "${ARGS[1]}" task=relay "${ARGS[@]:2}" "data.train_files=$dir/twin/data/train.parquet"
          "data.val_files=$dir/twin/data/val.parquet" "actor_rollout_ref.rollout.agent.agent_loop_config_path=$dir/twin/agent_loops.yaml"
          actor_rollout_ref.rollout.agent.default_agent_loop=mgrpo_twin)
      fi ;;&
    T*|B*) if [ "$DEVICE" = cpu ]; then ARGS+=(+preset=vllm_cpu)  # vLLM's CPU build (docs/cpu.md "vLLM on CPU")
      else ARGS+=(actor_rollout_ref.rollout.name=vllm "actor_rollout_ref.rollout.gpu_memory_utilization=$VLLM_MEM"
        "actor_rollout_ref.rollout.enforce_eager=$VLLM_EAGER"); fi ;;
  esac
  case "$stage" in
    ?1) [ "$stage" = T1 ] || ARGS+=(multi_agent.agents.sub.share_model_with=main) ;;
    # shellcheck disable=SC2206  # word splitting intended: several overrides
    ?2) ARGS+=($SHARED_PLACEMENT) ;;
    # shellcheck disable=SC2206,SC2016  # the ${...} are Hydra interpolations
    B3) ARGS+=($SHARED_PLACEMENT actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.model.lora_alpha=16
          'multi_agent.agents.sub.actor_rollout_ref.model.path=${actor_rollout_ref.model.path}'
          'multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}') ;;
  esac
  # shellcheck disable=SC2206
  [ -n "${SMOKE_EXTRA:-}" ] && ARGS+=($SMOKE_EXTRA)
  if [ "$stage" = T1 ] || [ "$stage" = T3 ]; then  # stock verl: its own entry point on our composed, resolved config
    "$PYTHON" benchmarks/bench_gpu_throughput.py stock-config --out-dir "$dir/stock" -- "${ARGS[@]:2}" > "$dir/stock_config.log" 2>&1 \
      || { cat "$dir/stock_config.log" >&2; return 1; }
    ARGS=(-m verl.trainer.main_ppo --config-path "$dir/stock" --config-name stock)
  fi
  return 0
}

run_stage() {
  local stage="$1" dir="$WORK/$1" rc start limit sampler="" sockets
  rm -rf "$dir" && mkdir -p "$dir"
  echo "$DEVICE" > "$dir/device"
  echo "=== gpu_smoke $stage ($DEVICE): $(date -u +%H:%M:%S)" >&2
  "$PYTHON" -m mgrpo_verl.experiments.gpu_smoke check --stage "$stage" --device "$DEVICE" --work "$WORK" > "$dir/log.txt" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$rc" > "$dir/rc"; echo 0 > "$dir/seconds"
    echo "(check) $PYTHON -m mgrpo_verl.experiments.gpu_smoke check --stage $stage --device $DEVICE" > "$dir/cmd.txt"
    cat "$dir/log.txt" >&2
    return $rc
  fi
  stage_args "$stage" "$dir" || { echo 1 > "$dir/rc"; echo 0 > "$dir/seconds"; return 1; }
  printf '%q ' "$PYTHON" "${ARGS[@]}" > "$dir/cmd.txt"
  if [ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null 2>&1; then
    sample_gpu "$dir" & sampler=$!
  fi
  # every listening socket of the stage's processes, and which are bound beyond loopback (docs/security.md)
  "$PYTHON" -m mgrpo_verl.experiments.gpu_smoke sockets --dir "$dir" 2> "$dir/sockets.err" & sockets=$!
  case "$stage" in A*) limit="${SMOKE_TIMEOUT_S:-170}" ;; T*) limit="${SMOKE_TIMEOUT_S:-270}" ;; *) limit="${SMOKE_TIMEOUT_S:-240}" ;; esac
  # verl's own main_ppo (T1, T3) writes its metrics where VERL_FILE_LOGGER_PATH says (ours sets it from
  # mgrpo_verl.metrics_file); on CPU it also gets the environment our main_ppo gives a CPU run (a private Ray
  # temp dir, no auth token in $HOME, vLLM's CPU linear weights kept reloadable: ray_session.ray_cpu_env)
  local envs=("VERL_FILE_LOGGER_PATH=$dir/metrics.jsonl") ray_tmp=""
  if { [ "$stage" = T1 ] || [ "$stage" = T3 ]; } && [ "$DEVICE" = cpu ]; then
    ray_tmp="$(mktemp -d /tmp/mgrpo_stock_XXXXXX)"  # short: Ray's socket paths have a length limit
    mapfile -t -O 1 envs < <("$PYTHON" -c 'import sys; from mgrpo_verl.platform.ray_session import ray_cpu_env
print("\n".join(f"{k}={v}" for k, v in ray_cpu_env(sys.argv[1]).items()))' "$ray_tmp")
  fi
  start="$(date +%s.%N)"
  # SIGINT first: main_ppo shuts Ray (and the GPU processes it started) down on KeyboardInterrupt
  env "${envs[@]}" timeout -s INT --kill-after=30 "$limit" "$PYTHON" "${ARGS[@]}" > "$dir/log.txt" 2>&1
  rc=$?
  [ -n "$ray_tmp" ] && rm -rf "$ray_tmp"
  echo "$(date +%s.%N) $start" | awk '{printf "%.1f\n", $1 - $2}' > "$dir/seconds"
  echo "$rc" > "$dir/rc"
  [ -n "$sampler" ] && { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; }
  kill "$sockets" 2>/dev/null; wait "$sockets" 2>/dev/null
  if [ $rc -ne 0 ] && [ -s "$dir/smi_procs.txt" ]; then
    # GPU processes of this stage that outlived it (e.g. killed at the time limit) would skew the next stage
    # (only a pid whose command line is still the one recorded: pids may be reused or from another namespace)
    while read -r pid cmd; do
      [ -n "$cmd" ] && [ "$(ps -o args= -p "$pid" 2>/dev/null | cut -c1-200)" = "$cmd" ] || continue
      kill -9 "$pid" 2>/dev/null && echo "gpu_smoke: killed leftover GPU process $pid ($cmd)" >&2
    done < "$dir/smi_procs.txt"
  fi
  if [ $rc -ne 0 ]; then
    echo "--- $stage failed (exit $rc, $(cat "$dir/seconds") s); last lines of $dir/log.txt:" >&2
    tail -n 30 "$dir/log.txt" >&2
  else
    echo "--- $stage ok ($(cat "$dir/seconds") s)" >&2
  fi
  return $rc
}

failed=0
for stage in "${STAGES[@]+"${STAGES[@]}"}"; do
  run_stage "$stage" || failed=1
  # the results so far, after every stage: a call stopped at its limit still brings back what finished
  [ "$stage" != "${STAGES[-1]}" ] && "$PYTHON" -m mgrpo_verl.experiments.gpu_smoke report --work "$WORK" --out "$RESULTS" > /dev/null 2>&1
done

"$PYTHON" -m mgrpo_verl.experiments.gpu_smoke report --work "$WORK" --out "$RESULTS"
report_rc=$?
if [ "$RESULTS" != "$WORK" ]; then
  # the raw files (logs, metrics, nvidia-smi samples) of every stage as one archive: the device tool brings
  # back at most 8 files from $OUT, so $OUT holds gpu_smoke.json, gpu_smoke.md and this
  done_stages=()
  for s in "${ALL_STAGES[@]}"; do [ -d "$WORK/$s" ] && done_stages+=("$s"); done
  [ ${#done_stages[@]} -gt 0 ] && tar czf "$RESULTS/gpu_smoke_raw.tar.gz" -C "$WORK" --exclude=ckpt env.json "${done_stages[@]}"
fi
[ $report_rc -ne 0 ] && exit $report_rc
exit $failed
