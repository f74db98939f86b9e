#!/bin/bash
# One quiet measuring window (docs/peer.md, "Ours against verl's best"): under the Ray lock, /tmp/verl_pipe_quiet set
# for the window's duration, the load average logged every 15 s into LOAD_LOG, the command's output into OUT_LOG.
#   tools/quiet_window.sh LOAD_LOG OUT_LOG command [args...]
# e.g. tools/quiet_window.sh docs/bench/logs/peer_split_paper_tiny_w1_load_DAY.log \
#        docs/bench/logs/peer_split_paper_tiny_w1_DAY.log \
#        python -m verl_pipe_lab.bench --config lab/verl_pipe_lab/bench/conf/peer_split_paper_tiny.yaml --out docs/bench/peer/...json
set -u
load_log=$1; out_log=$2; shift 2
exec flock /tmp/verl_pipe_ray.lock bash -c '
  load_log=$1; shift
  touch /tmp/verl_pipe_quiet
  ( while true; do echo "$(date -Is) $(cat /proc/loadavg)"; sleep 15; done ) > "$load_log" &
  loadpid=$!
  trap "rm -f /tmp/verl_pipe_quiet; kill $loadpid" EXIT
  echo "[quiet_window] lock and quiet file at $(date -Is); load $(cat /proc/loadavg); $*"
  "$@"
  rc=$?; echo "[quiet_window] done at $(date -Is), exit $rc; load $(cat /proc/loadavg)"; exit $rc
' bash "$load_log" "$@" > "$out_log" 2>&1
