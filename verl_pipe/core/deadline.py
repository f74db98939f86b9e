"""Fail loudly instead of hanging: run a blocking call with a deadline.

Some of verl's calls have no timeout of their own; e.g. a vLLM worker that dies while loading new
weights leaves ``CheckpointEngineManager.update_weights`` waiting forever. The call runs in a
daemon thread; past the deadline the caller gets an error naming the setting to raise (the thread
is abandoned: the run is failing anyway and Ray tears its actors down on shutdown).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable


class DeadlineExceeded(RuntimeError):
    pass


def call_with_deadline(fn: Callable[[], Any], seconds: float | None, what: str, setting: str,
                       while_waiting: Callable[[], None] | None = None, poll_s: float = 0.001) -> Any:
    """``while_waiting``: called every ``poll_s`` in the caller's thread until ``fn`` returns or the deadline passes
    (the launcher's teardown re-asserts its signal dispositions with it: verl_pipe/launch/teardown.py)."""
    if not seconds:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name=f"deadline:{what}", daemon=True)
    t.start()
    if while_waiting is None:
        t.join(seconds)
    else:
        deadline = time.monotonic() + seconds
        while t.is_alive() and time.monotonic() < deadline:
            while_waiting()
            t.join(poll_s)
    if t.is_alive():
        raise DeadlineExceeded(f"{what} did not finish within {seconds:.0f}s (raise {setting} if it is just slow)")
    if "error" in box:
        raise box["error"]
    return box.get("value")
