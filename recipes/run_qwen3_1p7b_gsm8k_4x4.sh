#!/usr/bin/env bash
# Qwen3-1.7B GSM8K GRPO on one 8-GPU node, 4 rollout + 4 trainer GPUs (recipe qwen3_1p7b_gsm8k_4x4).
# Prepares the data and the model on first run, then launches. Extra arguments are Hydra overrides:
#   bash recipes/run_qwen3_1p7b_gsm8k_4x4.sh trainer.logger='[console,wandb]' rolloutpipe.mode=sync
# Needs: pip install ".[gpu]" -c constraints/gpu.txt (verl 0.9.1, vLLM 0.29.0, cupy), git, network access for the first run.
set -xeuo pipefail

PYTHON=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
MODEL_DIR=${MODEL_DIR:-$HOME/models/Qwen3-1.7B}
# A checkout of verl's repository at the release pip installs (the data scripts, examples/data_preprocess, are not in
# the pip package): tag v0.9.1, never its moving HEAD; an existing checkout at another commit is refused.
VERL_SRC=${VERL_SRC:-$HOME/verl}
VERL_TAG=v0.9.1

if [ ! -f "$DATA_DIR/train.parquet" ] || [ ! -f "$DATA_DIR/test.parquet" ]; then
  if [ ! -f "$VERL_SRC/examples/data_preprocess/gsm8k.py" ]; then
    git clone --depth 1 --branch "$VERL_TAG" https://github.com/volcengine/verl "$VERL_SRC"
  fi
  if [ "$(git -C "$VERL_SRC" rev-parse HEAD)" != "$(git -C "$VERL_SRC" rev-parse "$VERL_TAG^{commit}" 2>/dev/null)" ]; then
    echo "$VERL_SRC is not verl's $VERL_TAG (the release pip installs): check it out, or set VERL_SRC" >&2
    exit 1
  fi
  "$PYTHON" "$VERL_SRC/examples/data_preprocess/gsm8k.py" --local_save_dir "$DATA_DIR"
fi

# shellcheck source=lib/fetch_model.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/fetch_model.sh"
fetch_model Qwen/Qwen3-1.7B "$MODEL_DIR"

exec "$PYTHON" -m verl_pipe.main_grpo --config-name qwen3_1p7b_gsm8k_4x4 \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  actor_rollout_ref.model.path="$MODEL_DIR" \
  "$@"
