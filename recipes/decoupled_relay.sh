#!/usr/bin/env bash
# Decoupled M-GRPO on one machine (CPU): the sub side and the main side of the relay task as two separate
# `python -m mgrpo_verl.main_ppo` processes, each with its own Ray cluster, sharing only a statistics store.
# The sub side trains the sub-agent's model and serves it over HTTP; the main side trains the main agent's
# model, calls the sub side for every delegation and publishes one record per main trajectory.
#
#   bash recipes/decoupled_relay.sh                          # 10 steps, SQLite store in $RUN
#   STEPS=30 STORE=redis://127.0.0.1:6379/0 MGRPO_REDIS_PASSWORD=... bash recipes/decoupled_relay.sh
#   bash recipes/decoupled_relay.sh multi_agent.d_max=2     # extra Hydra overrides go to both sides
#
# Both sides share a secret that the sub side's HTTP service requires of every request: the recipe makes one
# for the run unless MGRPO_DECOUPLED_SECRET is exported already. A Redis store needs a password (redis-server
# --requirepass, the same in MGRPO_REDIS_PASSWORD), on loopback too: other users of the machine reach loopback.
#
# On two machines: see docs/multinode.md ("Decoupled M-GRPO across machines"): the same secret on both, the
# sub side reached through an SSH tunnel (or a TLS proxy), and a store both reach (Redis with requirepass and
# MGRPO_REDIS_PASSWORD; SQLite on a local disk of one machine is not enough).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
cd "$MGRPO_ROOT"
RUN="$(realpath -m "${RUN:-runs/decoupled_relay}")"
STEPS="${STEPS:-10}"
PORT="${PORT:-8470}"
STORE="${STORE:-sqlite:///$RUN/stats.db}"
case "$STORE" in
  redis://*|rediss://*)
    if [ -z "${MGRPO_REDIS_PASSWORD:-}" ] && [[ "$STORE" != *@* ]] && [[ "$STORE" != *allow_no_password=* ]]; then
      echo "decoupled_relay.sh: STORE=$STORE has no password: start redis-server with --requirepass and export" \
        "MGRPO_REDIS_PASSWORD (a loopback server without one: add ?allow_no_password=1 to STORE)" >&2
      exit 2
    fi;;
esac
mkdir -p "$RUN"
if [ -z "${MGRPO_DECOUPLED_SECRET:-}" ]; then
  MGRPO_DECOUPLED_SECRET="$(python -c 'import secrets; print(secrets.token_hex(32))')"
fi
export MGRPO_DECOUPLED_SECRET
common=(task=relay multi_agent.decoupled.store="$STORE" trainer.total_training_steps="$STEPS" trainer.n_gpus_per_node=1 "$@")

python -m mgrpo_verl.main_ppo multi_agent.decoupled.role=sub multi_agent.decoupled.serve_port="$PORT" \
  trainer.val_before_train=false trainer.test_freq=-1 \
  trainer.default_local_dir="$RUN/sub" mgrpo_verl.metrics_file="$RUN/sub/metrics.jsonl" "${common[@]}" \
  > "$RUN/sub.log" 2>&1 &
sub_pid=$!
trap 'kill $sub_pid 2>/dev/null || true' EXIT
echo "sub side: pid $sub_pid, log $RUN/sub.log"

echo "main side: log $RUN/main.log"
python -m mgrpo_verl.main_ppo multi_agent.decoupled.role=main \
  multi_agent.decoupled.sub_urls.sub="http://127.0.0.1:$PORT" \
  trainer.default_local_dir="$RUN/main" mgrpo_verl.metrics_file="$RUN/main/metrics.jsonl" "${common[@]}" \
  2>&1 | tee "$RUN/main.log" | grep --line-buffered "^mgrpo_verl:" || true
main_rc=${PIPESTATUS[0]}
sub_rc=0
wait $sub_pid || sub_rc=$?
trap - EXIT
grep "^mgrpo_verl:" "$RUN/sub.log" || true
echo "main side exit $main_rc, sub side exit $sub_rc"
[ "$main_rc" -eq 0 ] && [ "$sub_rc" -eq 0 ]
