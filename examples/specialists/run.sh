#!/usr/bin/env bash
# The three-model example end to end: data, warm start (first run only), M-GRPO. Extra arguments are Hydra
# overrides of specialists.yaml, e.g. `./run.sh trainer.total_training_steps=2`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"   # the tool class specialists.ReadPartTool, in Ray's workers too
python="${PYTHON:-python}"
[ -f data/train.parquet ] || "$python" specialists.py data
exec "$python" -m mgrpo_verl.main_ppo --config-path "$here" --config-name specialists \
    data.train_files="$here/data/train.parquet" data.val_files="$here/data/val.parquet" \
    trainer.default_local_dir="$here/outputs/checkpoints" "$@"
