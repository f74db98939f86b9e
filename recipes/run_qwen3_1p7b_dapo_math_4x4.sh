#!/usr/bin/env bash
# Qwen3-1.7B DAPO-Math GRPO on one 8-GPU node, 4 rollout + 4 trainer GPUs (recipe qwen3_1p7b_dapo_math_4x4).
# Downloads the data and the model on first run, then launches. Extra arguments are Hydra overrides.
# The two parquet files and their default paths are those of verl's recipe/dapo/prepare_dapo_data.sh.
# Needs: pip install ".[gpu]" -c constraints/gpu.txt, network access for the first run.
set -xeuo pipefail

PYTHON=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-$HOME/verl/data}
MODEL_DIR=${MODEL_DIR:-$HOME/models/Qwen3-1.7B}
TRAIN_FILE=$DATA_DIR/dapo-math-17k.parquet
TEST_FILE=$DATA_DIR/aime-2024.parquet

mkdir -p "$DATA_DIR"
if [ ! -f "$TRAIN_FILE" ]; then
  wget -O "$TRAIN_FILE" "https://huggingface.co/datasets/BytedTsinghua-SIA/DAPO-Math-17k/resolve/main/data/dapo-math-17k.parquet?download=true"
fi
if [ ! -f "$TEST_FILE" ]; then
  wget -O "$TEST_FILE" "https://huggingface.co/datasets/BytedTsinghua-SIA/AIME-2024/resolve/main/data/aime-2024.parquet?download=true"
fi

# shellcheck source=lib/fetch_model.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/fetch_model.sh"
fetch_model Qwen/Qwen3-1.7B "$MODEL_DIR"

exec "$PYTHON" -m verl_pipe.main_grpo --config-name qwen3_1p7b_dapo_math_4x4 \
  data.train_files="$TRAIN_FILE" \
  data.val_files="$TEST_FILE" \
  actor_rollout_ref.model.path="$MODEL_DIR" \
  "$@"
