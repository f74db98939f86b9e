#!/bin/bash
# The tuning sweep of verl's separate_async (docs/peer.md, "Tuning verl's separate_async"), one quiet window
# (tools/quiet_window.sh: the Ray lock, /tmp/verl_pipe_quiet, the load average every 15 s):
#   1. the poll interval as a within-stack A/B (0.1 s vs verl's 2 s, three pairs of consecutive steps on one workload,
#      the arms' order alternating over the pairs);
#   2. the tuned configuration, verl's 8 storage units, verl's 8 agent-loop workers, the tuned configuration again:
#      each its own stack on the same three workloads (step i: seed + i), the tuned stack before and after the knobs
#      so a drift of the machine over the window shows as a difference between the two.
# Analysis: python -m verl_pipe_lab.bench.peer.tuning OUT_DIR --day DATE --out OUT_DIR/peer_tuning.json
#   tools/peer_tuning.sh OUT_DIR [DATE]      (BENCH=lab/verl_pipe_lab/bench/conf/....yaml for another setting; PYTHON=...)
set -u
dir=$1; day=${2:-$(date -u +%F)}
mkdir -p "$dir"
exec "$(dirname "$0")/quiet_window.sh" "$dir/peer_tuning_load_$day.log" "$dir/sweep.log" bash -c '
  dir=$1; day=$2; py=$3; bench=$4
  run() {  # name, extra args
    local name=$1; shift
    echo "[peer_tuning] $name start $(date -Is)"
    timeout 900 "$py" -m verl_pipe_lab.bench.peer --bench "$bench" --config tuned "$@" \
      --out "$dir/peer_tuning_${name}_$day.json" --log "$dir/peer_tuning_${name}_runner_$day.log"
    echo "[peer_tuning] $name exit $? at $(date -Is)"
  }
  run poll_ab --steps 6 --warmup-steps 1 --knob poll_interval_s=0.1,0.1,2,2 --workload-cycle 2
  run base_a --steps 3
  run storage8 --steps 3 --knob storage_units=8
  run workers8 --steps 3 --knob agent_workers=8
  run base_b --steps 3
' bash "$dir" "$day" "${PYTHON:-python}" "${BENCH:-lab/verl_pipe_lab/bench/conf/peer_split_quick.yaml}"
