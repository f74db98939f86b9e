"""One rank's collective group for one weight sync, with a deadline and a teardown that works mid-collective.

A collective over NCCL has no timeout: when a peer dies mid-broadcast, every other rank's kernels wait for it
for good, and the thread that waits for them (verl's NCCL engine calls ``torch.cuda.synchronize()`` on the
worker's event loop) never returns, so no call the trainer sends can reach that worker any more. The only way
out is from another thread: abort the group's communicators (NCCL's ``ncclCommAbort``), which ends the stuck
kernels. ``SyncGuard`` does that from a watchdog thread when a sync is not finished by its deadline, or at once
when asked (``abort``), and makes sure a group that a sync cut short left behind is gone before the next sync
creates its own (the library refuses a second group of the same name).

The collective library is injected (``CollectiveOps``): the NCCL engine passes ray.util.collective's
(verl_pipe/platform/nccl_engine.py), the unit tests a stand-in.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

logger = logging.getLogger(__name__)


class CollectiveOps(Protocol):
    """The group operations the guard needs from a collective library (one process's view)."""

    def exists(self, group: str) -> bool:
        """Whether this process still holds the group."""

    def abort(self, group: str) -> None:
        """End the group's unfinished collectives and forget the group (a no-op when it is not held)."""


class SyncAborted(RuntimeError):
    """This rank's weight sync was given up (deadline, a failure, or the trainer asked); its group is gone."""


class SyncGuard:
    """Deadline and teardown of the collective group of this rank's current weight sync.

    ``begin`` (when the sync's group is created) tears down a group an earlier sync left and arms the watchdog;
    ``end`` (the sync finished on every rank: verl's ``finalize``) disarms it; ``abort`` gives the sync up from
    any thread; ``check`` raises once it was given up, so no data from an aborted transfer is used.
    """

    def __init__(self, ops: CollectiveOps, timer: Callable[..., threading.Timer] = threading.Timer):
        self._ops = ops
        self._timer_cls = timer
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.group: str | None = None
        self.deadline_s: float | None = None
        self.aborted: str | None = None  # why the current sync was given up
        self.aborts = 0

    def begin(self, group: str, deadline_s: float | None) -> None:
        with self._lock:
            self._disarm()
            stale = self.group
            if stale is not None and stale != group and self._ops.exists(stale):
                # finalize never ran for it (a sync cut short on another rank): abort, not destroy, since a
                # collective of it may still be waiting for a peer that is gone
                logger.warning("weight sync: tearing down group %s that an earlier sync left behind", stale)
                self._ops.abort(stale)
            self.group, self.deadline_s, self.aborted = group, deadline_s, None
            if deadline_s:
                self._timer = self._timer_cls(deadline_s, self._expire, args=(group,))
                self._timer.daemon = True
                self._timer.start()

    def end(self) -> None:
        with self._lock:
            self._disarm()

    def abort(self, why: str) -> bool:
        """Gives the current sync up: its group's collectives end and the group is forgotten. Idempotent; safe
        from any thread. Returns whether this call did it."""
        return self._abort(why, None)

    def holds_group(self) -> bool:
        """Whether this process holds the current sync's group (a rank outside the collective creates none)."""
        return self.group is not None and self._ops.exists(self.group)

    def check(self) -> None:
        if self.aborted is not None:
            raise SyncAborted(f"weight sync group {self.group} was torn down: {self.aborted}")

    def _expire(self, group: str) -> None:
        self._abort(f"not finished within {self.deadline_s:g}s (the sync's deadline; a peer is probably dead)",
                    group)

    def _abort(self, why: str, group: str | None) -> bool:
        with self._lock:
            if self.group is None or self.aborted is not None or (group is not None and group != self.group):
                return False  # nothing open, already given up, or a watchdog of an earlier sync
            # flag first: a rank waiting on the collective wakes up when the abort below ends it, and must see
            # the flag then (check) instead of using a half-received bucket
            self.aborted = why
            self.aborts += 1
            self._disarm()
            logger.error("weight sync: tearing down group %s: %s", self.group, why)
            self._ops.abort(self.group)
            return True

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
