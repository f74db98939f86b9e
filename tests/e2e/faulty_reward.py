"""The fault tests' reward (tests/e2e/test_faults.py): verl_pipe's digit-math reward, except on the records a control
file names, read at every call from the path in VERL_PIPE_FAULTY_REWARD (JSON): ``{"raise": [index, ...]}`` raises on
those records (a deterministic reward bug), ``{"hang": {index: marker}, "hang_s": s}`` sleeps ``s`` seconds in the first
call for each (the marker file, created exclusively, says it was taken), or until the control no longer names the
record: a reward that hangs. ``index`` is the record's
extra_info.index. Runs in verl's reward worker, as a user's custom reward function does."""

import json
import os
import time

from verl_pipe.assets.reward import compute_score as digit_math


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    path = os.environ.get("VERL_PIPE_FAULTY_REWARD")
    index = (extra_info or {}).get("index")
    if path and os.path.exists(path):
        with open(path) as f:
            control = json.load(f)
        if index in control.get("raise", []):
            raise ValueError(f"faulty reward: record {index} raises")
        marker = control.get("hang", {}).get(str(index))
        if marker:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                _hang(path, str(index), float(control.get("hang_s", 30)))
    return digit_math(data_source, solution_str, ground_truth, extra_info, **kwargs)


def _hang(path: str, index: str, seconds: float) -> None:
    """Sleeps up to ``seconds`` while the control file still names ``index`` among its hangs: a disarmed control
    (the test's step is over) frees the reward worker's thread at once, so a later step's rewards do not queue behind
    an earlier step's hang (verl's reward manager scores on the event loop's default executor, a few threads)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            with open(path) as f:
                if index not in json.load(f).get("hang", {}):
                    return
        except (OSError, ValueError):  # being rewritten
            continue
