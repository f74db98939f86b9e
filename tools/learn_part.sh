#!/bin/bash
# One quiet part of the learning comparison (docs/learning.md, "The powered comparison"): a tools/quiet_window.sh
# window (the Ray lock, the quiet file, the load average every 15 s into OUT_load.log) around the learning bench,
# bounded by LEARN_PART_LIMIT_S (default 2400 s = 40 min; a part cut short keeps its finished runs in
# OUT_partial.json, which --merge reads).
#   tools/learn_part.sh OUT.json --seeds 0,1,2,3,4 --slice 0:3 [more bench args]
# Log: OUT.log beside OUT.json.
set -u
out=$1; shift
exec "$(dirname "$0")/quiet_window.sh" "${out%.json}_load.log" "${out%.json}.log" \
  timeout "${LEARN_PART_LIMIT_S:-2400}" "${PYTHON:-python}" -m verl_pipe_lab.bench --learn --out "$out" "$@"
