"""client.CancellingServer: a request's task cancelled -> its actor call cancelled (pure asyncio, no Ray cluster)."""

import asyncio
import copy

import pytest

from tests.fakes import fake_of
from verl_pipe.rollout import client


@fake_of(None, why="Ray's ObjectRef (Cython): only awaited here")
class FakeRef:
    """Awaitable like a Ray ObjectRef."""

    def __init__(self, fut):
        self.fut = fut

    def __await__(self):
        return self.fut.__await__()


@fake_of(None, why="a Ray actor handle: generate.remote and any other attribute, as Ray's handle")
class FakeHandle:
    def __init__(self):
        self.calls, self.refs = [], []
        self.other = "other attribute"
        handle = self

        class Generate:
            @staticmethod
            def remote(*args, **kwargs):
                handle.calls.append((args, kwargs))
                ref = FakeRef(asyncio.get_running_loop().create_future())
                handle.refs.append(ref)
                return ref

        self.generate = Generate


def test_cancelled_task_cancels_the_actor_call(monkeypatch):
    cancelled = []
    monkeypatch.setattr(client.ray, "cancel", lambda ref: cancelled.append(ref))
    handle = FakeHandle()
    server = client.CancellingServer(handle)
    assert server.other == "other attribute"  # anything but generate is the handle's own
    assert copy.copy(server).other == "other attribute"
    with pytest.raises(AttributeError):  # a copy made without __init__ (pickling, copy's protocol lookups)
        object.__new__(client.CancellingServer).other

    async def main():
        done = asyncio.ensure_future(server.generate.remote(request_id="a", prompt_ids=[1]))
        call = server.generate.remote(request_id="b", prompt_ids=[2])
        assert call.ref is handle.refs[1]
        stuck = asyncio.ensure_future(call)
        await asyncio.sleep(0)
        handle.refs[0].fut.set_result("output a")
        assert await done == "output a"
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck

    asyncio.run(main())
    assert [kw["request_id"] for _, kw in handle.calls] == ["a", "b"]
    assert cancelled == [handle.refs[1]], "only the cancelled request's call is cancelled"


def test_an_error_is_not_a_cancellation(monkeypatch):
    cancelled = []
    monkeypatch.setattr(client.ray, "cancel", lambda ref: cancelled.append(ref))
    handle = FakeHandle()
    server = client.CancellingServer(handle)

    async def main():
        task = asyncio.ensure_future(server.generate.remote(request_id="a"))
        await asyncio.sleep(0)
        handle.refs[0].fut.set_exception(RuntimeError("engine died"))
        with pytest.raises(RuntimeError, match="engine died"):
            await task

    asyncio.run(main())
    assert cancelled == []
