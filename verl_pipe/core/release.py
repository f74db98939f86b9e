"""How complete groups are filled into training units: ``rolloutpipe.cgp.unit_fill``.

Pure Python, no verl, Ray or torch, shared by the real trainer (``RolloutPipeTrainer._start_rollout``) and the
simulator (``verl_pipe.sim.trainer.schedule``).

- ``dispatch``: the trainer's FIFO receives the step's trainable groups in dispatch order (the order
  of the prompts in the batch, as verl's synchronous trainer sees them). A group that completes early waits here
  until every group dispatched before it has ended (trained, found untrainable, dropped, late or aborted). Each
  unit then holds the same groups as sync's PPO mini-batch at the same position, so with the same samples CGP
  makes the same optimizer steps as sync: exactly the synchronous baseline's math, whatever the completion
  order. The unit still trains while later groups generate; FGD admits groups in dispatch order, so the groups
  the next unit needs are the ones the engine runs first.
- ``completion`` (the default; the RolloutPipe paper's CGP, and verl's own streaming trainer, whose rows leave
  TransferQueue as they complete): a unit takes the groups that complete first. Units are ready sooner where groups finish out
  of order, but a unit holds groups of similar response length (the short ones first), not sync's mini-batch:
  the same samples and weights, different optimizer steps when a step has more than one unit (docs/learning.md
  has what that did to the learning curves).

With one unit per step both fills train the same batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

UNIT_FILLS = ("dispatch", "completion")


def check_fill(fill: str) -> str:
    if fill not in UNIT_FILLS:
        raise ValueError(f"rolloutpipe.cgp.unit_fill: got {fill!r}; allowed: {', '.join(UNIT_FILLS)}")
    return fill


class DispatchOrderRelease:
    """Hands trained groups to ``put`` (the step's GroupQueue.put) in dispatch order.

    Driver protocol (the rollout thread): ``hold(index, group)`` when a group is materialized and trainable, then
    ``ended(index)`` once the rollout has settled the group however it ended (every group of the step ends exactly
    once: verl_pipe/core/rollout_core.py ``GroupEnded``); ``flush()`` when the rollout is over (groups it ended without
    a report, e.g. aborted once the batch was full, release nothing; what is held goes out in order). A group is
    put once every group dispatched before it has ended.
    """

    def __init__(self, put: Callable[[object], None], num_groups: int):
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        self._put, self.num_groups = put, num_groups
        self._held: dict[int, object] = {}
        self._ended: set[int] = set()
        self._next = 0  # every group before it has ended and been put (if trained)
        self._lock = threading.Lock()  # the rollout thread and the future's done-callback
        self.released: list[int] = []

    def hold(self, index: int, group: object) -> None:
        self._check(index)
        with self._lock:
            if index in self._held or index < self._next:
                raise RuntimeError(f"group {index} held twice")
            self._held[index] = group

    def ended(self, index: int) -> None:
        self._check(index)
        with self._lock:
            self._ended.add(index)
            ready = []
            while self._next in self._ended:
                g = self._held.pop(self._next, None)
                if g is not None:
                    ready.append((self._next, g))
                self._next += 1
            self._release(ready)

    def flush(self) -> None:
        """The rollout is over: whatever is still held goes out, in dispatch order."""
        with self._lock:
            ready = sorted(self._held.items())
            self._held.clear()
            self._next = self.num_groups
            self._release(ready)

    @property
    def waiting(self) -> list[int]:
        """Groups held back for an earlier group (introspection, tests)."""
        with self._lock:
            return sorted(self._held)

    def _release(self, ready: Iterable[tuple[int, object]]) -> None:
        for index, g in ready:
            self.released.append(index)
            self._put(g)

    def _check(self, index: int) -> None:
        if not 0 <= index < self.num_groups:
            raise ValueError(f"group {index} out of range (the step has {self.num_groups} groups)")


def dispatch_release_times(completions: list[tuple[float, int]], ended: dict[int, float],
                           rollout_end: float) -> list[tuple[float, int]]:
    """The simulator's ``dispatch`` fill: (time, group) of the trained groups as the trainer's FIFO receives them.

    ``completions``: the trained groups (time, group) in completion order; ``ended``: when each group of the step
    ended, trained or not (a group absent ended with the rollout, ``rollout_end``). A trained group is released
    when it and every group dispatched before it have ended, in dispatch order."""
    if not completions:
        return []
    last = max(g for _, g in completions)
    trained = {g: t for t, g in completions}
    out, settled = [], float("-inf")
    for g in range(last + 1):
        settled = max(settled, trained.get(g, ended.get(g, rollout_end)))
        if g in trained:
            out.append((settled, g))
    return out
