"""Per-call records of the actor worker's update and log-prob calls, for the span-by-span trainer comparison.

Off unless ``VERL_PIPE_WORKER_LOG`` names a file (the bench's ``--worker-log``, which sets it before Ray starts, so
every worker of our modes and of verl's peer inherits it). Each call appends one JSON line: the call's name, its
start and end inside the worker (``time.time()``), and the rows' sequence lengths in the order the worker got them,
with the micro-batch size, so the padding the engine computes over (verl_pipe/core/micro_batches.py) is known per call.
``python -m verl_pipe_lab.bench.trainer_gap`` matches the records to a bench run's trainer spans.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from contextlib import contextmanager


ENV = "VERL_PIPE_WORKER_LOG"


def _lengths(data) -> list[int] | None:
    try:
        return [int(x) for x in data["input_ids"].offsets().diff().tolist()]  # verl's no-padding (nested) layout
    except Exception:  # noqa: BLE001 - a layout we do not know: the call is still timed
        return None


@contextmanager
def call(name: str, data, micro_batch_size: int | None):
    """Times the body; appends the record when ``VERL_PIPE_WORKER_LOG`` is set (nothing otherwise)."""
    path = os.environ.get(ENV)
    if not path:
        yield
        return
    lengths = _lengths(data)  # before verl pops keys off the TensorDict
    start = time.time()
    try:
        yield
    finally:
        record = {"call": name, "pid": os.getpid(), "start": start, "end": time.time(), "lengths": lengths,
                  "micro_batch_size": micro_batch_size}
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def open_text(path: str):
    return gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)


def read(path: str) -> list[dict]:
    """The records of a log (gzipped when its name ends in .gz)."""
    with open_text(path) as f:
        return [json.loads(line) for line in f if line.strip()]
