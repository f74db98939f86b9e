"""The FIFO of materialized groups between the rollout and the trainer (CGP).

Pure Python, no Ray/verl imports: the rollout thread ``put``s each trainable group
as soon as it is materialized; the trainer takes them ``groups_per_unit`` at a
time, in arrival order. Every group carries the weight version it was generated
with, and the queue refuses a group from another version: a sample of step k is
never trained in step k+1. ``close()`` marks the end of the step's rollout (the
last unit may then be short); ``fail()`` propagates a rollout error to the trainer.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass
class Group:
    index: int  # dispatch index of the group (its prompt) within the step
    data: Any  # the materialized DataProto piece (n rows)
    weight_version: int
    ready_time: float


class WrongWeightVersion(RuntimeError):
    pass


class GroupQueue:
    def __init__(self, weight_version: int):
        self.weight_version = weight_version
        self._items: deque[Group] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._seen: set[int] = set()
        self.taken: list[int] = []

    def put(self, group: Group) -> None:
        if group.weight_version != self.weight_version:
            raise WrongWeightVersion(
                f"group {group.index} was generated with weight version {group.weight_version}, "
                f"but this step trains version {self.weight_version}"
            )
        with self._cond:
            if self._closed:
                raise RuntimeError(f"group {group.index} arrived after the step's queue was closed")
            if group.index in self._seen:
                raise RuntimeError(f"group {group.index} materialized twice")
            self._seen.add(group.index)
            self._items.append(group)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._closed = True
            self._cond.notify_all()

    def end_with(self, producer) -> None:
        """Closes the queue when ``producer`` (a concurrent.futures.Future: the step's rollout) finishes, or fails it
        with the producer's error; in the thread that finishes the future."""

        def finished(f) -> None:
            if f.exception() is not None:
                self.fail(f.exception())
            else:
                self.close()

        producer.add_done_callback(finished)

    def take(self, k: int, timeout: float | None = None, need: int | None = None) -> list[Group]:
        """Blocks until ``need`` (default k) groups are queued (or the queue is closed); returns every queued
        group up to k, FIFO.

        Returns [] once the queue is closed and drained.
        """
        need = k if need is None else need
        if not 1 <= need <= k:
            raise ValueError(f"take(k={k}, need={need}): need 1 <= need <= k")
        return self._pop(k, need=need, timeout=timeout)

    def _pop(self, max_k: int, need: int, timeout: float | None) -> list[Group]:
        with self._cond:
            ok = self._cond.wait_for(lambda: self._error is not None or len(self._items) >= need or self._closed,
                                     timeout=timeout)
            if self._error is not None:
                raise RuntimeError("the rollout failed") from self._error
            if not ok:
                raise TimeoutError(f"fewer than {need} groups within {timeout}s ({len(self._items)} queued)")
            out = [self._items.popleft() for _ in range(min(max_k, len(self._items)))]
            self.taken.extend(g.index for g in out)
            return out

    def drain(self) -> list[Group]:
        """Waits for the end of the rollout and returns everything left (sync mode)."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed)
            if self._error is not None:
                raise RuntimeError("the rollout failed") from self._error
            out = list(self._items)
            self._items.clear()
            self.taken.extend(g.index for g in out)
            return out

    def wait_rest(self) -> list[Group]:
        """Waits for the end of the rollout and returns the groups still queued, leaving them queued
        (a batch-whitened estimator needs every group's rewards before the first unit can step)."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed)
            if self._error is not None:
                raise RuntimeError("the rollout failed") from self._error
            return list(self._items)

    @property
    def closed(self) -> bool:
        """The rollout has ended (no group will be added)."""
        with self._cond:
            return self._closed

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
