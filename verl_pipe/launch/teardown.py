"""Leave no process behind: the launcher adopts every process its run starts, and reaps what is left at the end.

A scheduler (slurm, Kubernetes, ``timeout``) signals a job's whole process group, so Ray's raylet, GCS and workers
and vLLM's engine processes get the signal at the same moment as the launcher. A worker that dies first orphans
its children (vLLM's ``EngineCore`` under a server actor); Linux reparents orphans to init, where nobody tears them
down. The launcher therefore makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4+): every
orphan of the run is reparented to it, stays in its process tree, and ``reap`` ends it after Ray's own shutdown.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from typing import Any, Callable

logger = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants of this process are reparented to it (Linux); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants() -> list:
    """This process's live descendants (psutil.Process), deepest first."""
    import psutil

    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    return [p for p in reversed(procs) if _alive(p)]


def _alive(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def reap(grace_s: float = 5.0) -> list[int]:
    """SIGTERM every live descendant, SIGKILL what is still alive after ``grace_s``, and collect the exit statuses of
    our (adopted) children. Returns the pids that had to be killed."""
    import psutil

    procs = descendants()
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    killed = []
    for p in alive:
        try:
            p.kill()
            killed.append(p.pid)
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    _collect_zombies()
    if killed:
        logger.warning("killed %d process(es) left after the shutdown: %s", len(killed), killed)
    return killed


def _collect_zombies() -> None:
    """waitpid on every exited child (an adopted orphan that exited is our zombie until then)."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_ignoring(fn: Callable[[], Any], timeout_s: float, signals=(signal.SIGTERM, signal.SIGINT),
                 poll_s: float = 0.001) -> bool:
    """Runs ``fn`` (verl_pipe.core.deadline.call_with_deadline) while ``signals`` stay ignored; True if it returned
    within ``timeout_s`` (an error it raised is logged, not raised: this is for teardown).

    Why the polling: Ray's driver installs absl's failure-signal handler on ``ray.init`` (SIGSEGV, SIGILL, SIGFPE,
    SIGABRT, SIGTERM) and ``ray.shutdown`` puts those signals back to SIG_DFL (RayLog::UninstallSignalAction), over
    our SIG_IGN: a second SIGTERM during the shutdown then killed the launcher mid-teardown and left its processes
    behind. The main thread re-asserts SIG_IGN every ``poll_s`` until ``fn`` is done, and once more after; the
    window left is that poll interval."""
    from verl_pipe.core.deadline import DeadlineExceeded, call_with_deadline

    def ignore() -> None:
        for s in signals:
            signal.signal(s, signal.SIG_IGN)

    ignore()
    try:
        call_with_deadline(fn, timeout_s, getattr(fn, "__name__", "teardown"), "the launcher's teardown",
                           while_waiting=ignore, poll_s=poll_s)
        return True
    except DeadlineExceeded:
        return False
    except BaseException as e:  # noqa: BLE001 -- a half-dead cluster: what is left is ended by reap()
        logger.warning("%s failed during teardown: %s: %s", getattr(fn, "__name__", fn), type(e).__name__, e)
        return True
    finally:
        ignore()
