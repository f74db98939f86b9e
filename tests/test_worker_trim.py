"""The trainer worker gives freed heap back after every weight sync (verl seam: the actor side of
CheckpointEngineManager.update_weights), also when the sync fails."""

import asyncio

import pytest


def test_the_actor_trims_after_every_weight_sync(monkeypatch):
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from verl_pipe.trainer import workers

    calls = []

    async def sync(self, global_steps=None, mode="auto"):
        calls.append(("sync", global_steps, mode))
        if mode == "broken":
            raise RuntimeError("sync failed")
        return "synced"

    monkeypatch.setattr(ActorRolloutRefWorker, "update_weights", sync)
    monkeypatch.setattr(workers, "malloc_trim", lambda: calls.append(("trim",)))
    worker = object.__new__(workers.PipeActorWorker)
    assert asyncio.run(workers.PipeActorWorker.update_weights(worker, global_steps=3, mode="naive")) == "synced"
    assert calls == [("sync", 3, "naive"), ("trim",)]
    with pytest.raises(RuntimeError, match="sync failed"):
        asyncio.run(workers.PipeActorWorker.update_weights(worker, global_steps=4, mode="broken"))
    assert calls[-1] == ("trim",)
