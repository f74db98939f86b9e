#!/bin/bash
# usage: run1.sh NAME overrides...
cd /work/main
export VERL_PIPE_CACHE=/work/main/.cache/verl_pipe
name=$1; shift
start=$(date +%s)
timeout 900 .venv/bin/python -m verl_pipe.main_grpo --config-name tiny_cpu_chain trainer.total_training_steps=14 \
  trainer.test_freq=-1 trainer.val_before_train=false trainer.logger='[console]' "$@" > /tmp/pilot/$name.log 2>&1
echo "$name rc=$? $(( $(date +%s)-start ))s"
