"""Progress of a long wait (the asset build, the SFT warm-start, the workers' start-up): what it waits for, steps done
of the total, elapsed time and an ETA.

On a terminal it is one live line, rewritten in place (at most every ``tty_every_s``); in a log (not a terminal) a
full line every ``log_every_s`` (30 s), so a captured log shows the run is alive without a line per step. The
formatting (``progress_text``, ``duration``, ``eta_s``) and the throttle (``Throttle``) are pure; ``Progress`` writes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

LOG_EVERY_S = 30.0  # a line in a log this often
TTY_EVERY_S = 0.5  # the live line on a terminal at most this often


def duration(seconds: float) -> str:
    """``42s``, ``6m05s``, ``1h02m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_s(done: int, total: int | None, elapsed_s: float) -> float | None:
    """The time left at the rate so far; None before the first step or without a total."""
    if not total or done <= 0:
        return None
    return elapsed_s / done * max(0, total - done)


_RATE_SO_FAR = object()


def progress_text(what: str, done: int | None, total: int | None, elapsed_s: float, unit: str = "steps",
                  eta: float | None | object = _RATE_SO_FAR) -> str:
    """e.g. ``warm-start: 120/720 steps (17%), 1m05s elapsed, ETA 5m25s``; without a count (a wait on something
    else): ``starting vLLM replicas: 1m30s elapsed``. ``eta``: the seconds left if known otherwise (None: unknown);
    by default at the rate so far (``eta_s``)."""
    if done is None:
        return f"{what}: {duration(elapsed_s)} elapsed"
    count = f"{done}/{total} {unit} ({done / total:.0%})" if total else f"{done} {unit}"
    if eta is _RATE_SO_FAR:
        eta = eta_s(done, total, elapsed_s)
    return f"{what}: {count}, {duration(elapsed_s)} elapsed, ETA {duration(eta) if eta is not None else '?'}"


class Throttle:
    """``due(now)``: whether at least ``every_s`` passed since the last time it said yes (the first call: yes)."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self._last: float | None = None

    def due(self, now: float) -> bool:
        if self._last is not None and now - self._last < self.every_s:
            return False
        self._last = now
        return True


class Progress:
    """Reports ``what`` as ``update(done)`` advances; ``finish()`` prints the closing line. ``out``: where to write
    (default stdout); ``tty``: whether it is a terminal (default: ``out.isatty()``); ``clock``: seconds."""

    def __init__(self, what: str, total: int | None = None, unit: str = "steps", out=None, tty: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, log_every_s: float = LOG_EVERY_S,
                 tty_every_s: float = TTY_EVERY_S):
        self.what, self.total, self.unit = what, total, unit
        self.out = out if out is not None else sys.stdout
        self.tty = bool(getattr(self.out, "isatty", lambda: False)()) if tty is None else tty
        self.clock = clock
        self.t0 = clock()
        self.done: int | None = None
        self._first: tuple[float, int] | None = None  # (when, count) of the first count
        self.throttle = Throttle(tty_every_s if self.tty else log_every_s)
        self.throttle.due(self.t0)  # the first line comes after the first interval (start() says what begins)
        self._lock = threading.Lock()

    def text(self) -> str:
        now = self.clock()
        eta = None
        if self._first is not None and self.done is not None and self.total:
            # the rate since the first count came: a subprocess's start-up before its first step is no step's time
            t_first, d_first = self._first
            eta = eta_s(self.done - d_first, self.total - d_first, now - t_first)
        return progress_text(self.what, self.done, self.total, now - self.t0, self.unit, eta=eta)

    def _write(self, line: str, final: bool = False) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K" + line + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def start(self, line: str | None = None) -> None:
        """The line that says what begins (``what`` and, known, the total)."""
        with self._lock:
            self._write(line or (f"{self.what}: {self.total} {self.unit}" if self.total else f"{self.what} ..."),
                        final=True)

    def update(self, done: int | None = None) -> None:
        """``done`` steps so far (None: still waiting, no count); writes when the throttle says it is time."""
        with self._lock:
            if done is not None:
                self.done = done
                if self._first is None:
                    self._first = (self.clock(), done)
            if self.throttle.due(self.clock()):
                self._write(self.text())

    def finish(self, line: str | None = None) -> None:
        with self._lock:
            self._write(line or f"{self.what}: done in {duration(self.clock() - self.t0)}", final=True)


@contextmanager
def waiting(what: str, out=None, tty: bool | None = None, log_every_s: float = LOG_EVERY_S):
    """A wait with no step count (e.g. workers starting): says what it waits for, then the elapsed time every
    ``log_every_s`` (on a terminal: a live line) until the block ends; the closing line gives the time it took."""
    progress = Progress(what, out=out, tty=tty, log_every_s=log_every_s)
    progress.start(f"{what} ...")
    stop = threading.Event()

    def beat():
        while not stop.wait(min(log_every_s, progress.throttle.every_s)):
            progress.update()

    thread = threading.Thread(target=beat, name=f"progress: {what}", daemon=True)
    thread.start()
    ok = False
    try:
        yield progress
        ok = True
    finally:
        stop.set()
        thread.join()
        progress.finish(None if ok else f"{what}: stopped after {duration(progress.clock() - progress.t0)}")
