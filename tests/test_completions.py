"""rollout.completions.Completions: what the rollout loop's wake-ups return (the driver's replacement for
asyncio.wait over every task in flight)."""

import asyncio

import pytest

from verl_pipe.rollout.completions import Completions


def test_each_finished_task_is_returned_once_and_a_wake_up_takes_all_finished_since_the_last():
    async def main():
        loop = asyncio.get_running_loop()
        cq = Completions()
        futs = [loop.create_future() for _ in range(4)]
        tasks = [cq.add(asyncio.ensure_future(f)) for f in futs]
        futs[2].set_result(2)
        assert await cq.wait() == {tasks[2]}
        futs[0].set_result(0)
        futs[3].set_result(3)
        await asyncio.sleep(0)  # both finish before the driver gets back to waiting
        await asyncio.sleep(0)
        assert await cq.wait() == {tasks[0], tasks[3]}
        tasks[1].cancel()  # a cancelled task is returned too, like asyncio.wait does
        assert await cq.wait() == {tasks[1]}
        assert tasks[1].cancelled()
        late = cq.add(asyncio.ensure_future(asyncio.sleep(0.01, result="x")))
        assert await cq.wait() == {late} and late.result() == "x"
        with pytest.raises(asyncio.TimeoutError):  # nothing left: it blocks
            await asyncio.wait_for(cq.wait(), timeout=0.05)

    asyncio.run(main())


def test_same_tasks_as_asyncio_wait_over_a_random_run():
    """Over a run, the union of the wake-ups is every task exactly once, in an order consistent with completion."""
    import random

    async def main():
        rng = random.Random(0)
        cq = Completions()
        tasks = [cq.add(asyncio.ensure_future(asyncio.sleep(rng.random() / 100, result=i))) for i in range(200)]
        seen, order = set(), []
        while len(seen) < len(tasks):
            done = await cq.wait()
            assert not (done & seen)
            seen |= done
            order.append(done)
        assert seen == set(tasks)

    asyncio.run(main())
