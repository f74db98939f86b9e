"""The rollout loop's wake-ups: every request task that finished since the last wake-up, at O(finished) cost.

``asyncio.wait(tasks, return_when=FIRST_COMPLETED)`` checks that each of the tasks in flight is not a bare
coroutine and adds and removes a done-callback on each of them at every call: O(in flight) per wake-up, so a step
with N requests in flight costs O(N) per response and O(N^2) in all (the two wake-ups side by side: docs/cpu.md, "The
driver alone, without Ray or vLLM", ``python -m verl_pipe_lab.bench driver_microbench``). Here each task gets one
callback when it is added; a wake-up returns every added task that has finished
since the previous wake-up (a task cancelled meanwhile included, as asyncio.wait does).

One difference in timing, none in what is returned over a step: asyncio.wait also returns tasks that finished in
the same event-loop iteration as the one that woke it but whose callbacks have not run yet; here those come with
the next wake-up, which follows immediately.
"""

from __future__ import annotations

import asyncio


class Completions:
    def __init__(self):
        self._finished: list[asyncio.Future] = []  # finished since the last wake-up, in order
        self._waiter: asyncio.Future | None = None

    def add(self, task: asyncio.Future) -> asyncio.Future:
        task.add_done_callback(self._on_done)
        return task

    def _on_done(self, task: asyncio.Future) -> None:
        self._finished.append(task)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> set[asyncio.Future]:
        """Blocks until at least one added task has finished since the last call; returns all of them."""
        if not self._finished:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        done, self._finished = set(self._finished), []
        return done
