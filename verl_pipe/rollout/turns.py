"""Turn-aware admission on the real rollout: how a multi-turn agent loop tells the streaming driver that its
trajectory waits on its tool (its window slot is freed) and waits for its next turn to be admitted.

The streaming driver (``verl_pipe.rollout.stream``) gives each trajectory's asyncio task a ``TurnGate`` in the task's
context (``CURRENT_TURN_GATE``). The agent loop (``verl_pipe.rollout.multiturn``) calls ``gate.turn_done()`` when a
model turn ends and its tool starts, and ``await gate.next_turn()`` before its next model turn: the driver hands the
events, in the order they were reported, to ``RolloutCore.turn_done`` / ``tool_done`` and releases the turn when the
admission policy admits it (``NextTurn``: same replica, same priority). Without a gate (verl's own agent-loop workers,
validation) both are no-ops: the trajectory holds its slot from its first turn to its last.

Pure asyncio, no verl.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Callable

CURRENT_TURN_GATE: contextvars.ContextVar = contextvars.ContextVar("verl_pipe_turn_gate", default=None)


class TurnGate:
    """One submitted trajectory's line to the driver. ``report(gate)`` wakes the driver, which then calls
    ``drain()`` and gets the gate's events in order: ("turn_done", None) or ("tool_done", future to resolve when the
    next turn is admitted)."""

    def __init__(self, request, replica: int, report: Callable[["TurnGate"], None]):
        self.request, self.replica = request, replica
        self.task: asyncio.Task | None = None  # set by the driver once the trajectory's task exists
        self._report = report
        self._events: list[tuple[str, asyncio.Future | None]] = []
        self.turns_released = 0

    def turn_done(self) -> None:
        """A model turn ended; the tool runs now (no request in vLLM)."""
        self._events.append(("turn_done", None))
        self._report(self)

    async def next_turn(self) -> None:
        """The tool returned: waits until the driver admits the next model turn."""
        fut = asyncio.get_running_loop().create_future()
        self._events.append(("tool_done", fut))
        self._report(self)
        await fut

    def drain(self) -> list[tuple[str, asyncio.Future | None]]:
        out, self._events = self._events, []
        return out


def turn_done() -> None:
    """For an agent loop: its model turn ended and its tool starts (no-op outside the streaming driver)."""
    gate = CURRENT_TURN_GATE.get()
    if gate is not None:
        gate.turn_done()


async def next_turn() -> None:
    """For an agent loop: before its next model turn, wait for its admission (no-op outside the streaming driver)."""
    gate = CURRENT_TURN_GATE.get()
    if gate is not None:
        await gate.next_turn()
