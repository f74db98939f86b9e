#!/bin/bash
# One quiet part of the learning comparison (docs/learning.md, "The powered comparison"), as COORDINATION.md asks:
# under the Ray lock, the quiet file up for the part's duration (removed on exit), bounded by LEARN_PART_LIMIT_S
# (default 2400 s = 40 min; a part cut short keeps its finished runs in OUT_partial.json, which --merge reads).
#   tools/learn_part.sh OUT.json --seeds 0,1,2,3,4 --slice 0:3 [more bench args]
# Log: OUT.log beside OUT.json.
set -u
out=$1; shift
py=${PYTHON:-python}
log=${out%.json}.log
exec flock /tmp/verl_pipe_ray.lock bash -c '
  touch /tmp/verl_pipe_quiet; trap "rm -f /tmp/verl_pipe_quiet" EXIT
  echo "[learn_part] lock and quiet file at $(date -Is); load $(cat /proc/loadavg)"
  timeout "${LEARN_PART_LIMIT_S:-2400}" "$0" -m verl_pipe.bench --learn --out "$1" "${@:2}"
  rc=$?; echo "[learn_part] done at $(date -Is), exit $rc; load $(cat /proc/loadavg)"; exit $rc
' "$py" "$out" "$@" > "$log" 2>&1
