"""A verl checkpoint engine whose weight sync survives a peer that dies mid-sync (mixed in before the engine).

verl's NCCL engine (verl/checkpoint_engine/nccl_checkpoint_engine.py, with ``rebuild_group``) creates a collective
group in ``init_process_group`` and destroys it in ``finalize``, both driven by verl's
``CheckpointEngineManager.update_weights``. When a rollout replica dies mid-broadcast, the live ranks wait in
the collective for good and ``finalize`` never runs, so every rank keeps the group: a retried sync's
``init_collective_group`` raises "Trying to initialize a group a second time". ``RecoverableSync`` changes four
things through verl's own engine methods (the seams: ``prepare`` → ``build_topology`` → ``init_process_group``
→ ``send_weights`` / ``receive_weights`` → ``finalize``, and ``execute_checkpoint_engine`` on both worker kinds,
which calls any engine method by name):

- every sync gets a group of its own name, chosen by the master in ``prepare`` and handed to every rank by
  ``build_topology``: a group or a stuck thread left by a sync cut short can never meet the next sync's;
- every rank arms a deadline when its group is created (``SyncGuard``, verl_pipe/platform/sync_guard.py): past
  it, a watchdog thread aborts the group, which ends the stuck collective and frees the worker; the trainer
  sets the deadline (``set_sync_deadline`` on the actor ranks; the master passes it to the others);
- any failure tears this rank's group down at once, the sender first walks the rest of the weights unsent
  (gathering each one is a collective over the actor's ranks, which would otherwise wait for it), and a
  receiver never hands on a tensor of a transfer that was given up;
- the trainer can tear a group down itself (``abort_sync``), and the next sync's ``init_process_group`` tears
  down any group an earlier sync left, before creating its own.

The collective library is the concrete engine's (``collective_ops``); see verl_pipe/platform/nccl_engine.py.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from verl_pipe.platform.sync_guard import CollectiveOps, SyncGuard

logger = logging.getLogger(__name__)

GROUP_PREFIX = "verl_pipe_weights"


@dataclass
class SyncMetadata:
    """A rank's ``prepare`` result: the wrapped engine's own, plus, from the master, this sync's id and deadline."""
    inner: Any
    sync_id: str | None = None
    deadline_s: float | None = None


def check_deadline(seconds) -> float | None:
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"weight sync deadline: got {seconds!r}; allowed: null or a number of seconds > 0")
    return float(seconds)


class RecoverableSync:
    """Mix in before a verl ``CheckpointEngine`` that moves the weights over one collective group per sync."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # verl's NCCL engine creates the group in every init_process_group and destroys it in finalize only
        # with rebuild_group; a group per sync needs exactly that
        self.rebuild_group = True
        self.sync_deadline_s: float | None = None
        self.guard = SyncGuard(self.collective_ops())

    def collective_ops(self) -> CollectiveOps:
        raise NotImplementedError("the concrete engine names its collective library")

    def set_sync_deadline(self, seconds: float | None) -> None:
        """How long a sync may take from its group's creation (the trainer sets it on the actor ranks)."""
        self.sync_deadline_s = check_deadline(seconds)

    def prepare(self) -> SyncMetadata:
        inner = super().prepare()
        if not getattr(self, "is_master", False):
            return SyncMetadata(inner)
        return SyncMetadata(inner, uuid.uuid4().hex[:12], self.sync_deadline_s)

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list):
        master = metadata[0]
        if not isinstance(master, SyncMetadata) or master.sync_id is None:
            raise RuntimeError(f"{cls.__name__}: trainer rank 0 must be the checkpoint-engine master")
        strays = [i for i, m in enumerate(metadata) if not isinstance(m, SyncMetadata)]
        if strays:
            raise RuntimeError(f"{cls.__name__}: workers {strays} run another engine class; every worker must import "
                               "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module")
        actor, rollout = super().build_topology(actor_wg_world_size, rollout_world_size, [m.inner for m in metadata])
        group = f"{GROUP_PREFIX}-{master.sync_id}"
        for kwargs, n in ((actor, actor_wg_world_size), (rollout, rollout_world_size)):
            kwargs["sync_group"] = [group] * n
            kwargs["deadline_s"] = [master.deadline_s] * n
        return actor, rollout

    def init_process_group(self, sync_group: str, deadline_s: float | None = None, **kwargs):
        self.guard.begin(sync_group, check_deadline(deadline_s))  # first: creating the group can wait on a peer
        self.group_name = sync_group
        try:
            result = super().init_process_group(**kwargs)
        except BaseException as e:
            self.guard.abort(f"creating the group failed ({type(e).__name__}: {e})")
            raise
        if not self.guard.holds_group():
            self.guard.end()  # a rank outside the broadcast (verl: an actor rank given rank -1) has nothing to free
        return result

    async def send_weights(self, weights, global_steps: int | None = None):
        source = weights if hasattr(weights, "__aiter__") else iter(weights)
        try:
            result = await super().send_weights(source, global_steps=global_steps)
            self.guard.check()  # the watchdog may have ended the collective under the last bucket
            return result
        except BaseException as e:
            self.guard.abort(f"sending failed ({type(e).__name__}: {e})")
            await drain(source)
            raise

    async def receive_weights(self, global_steps: int | None = None):
        try:
            async for name, tensor in super().receive_weights(global_steps=global_steps):
                self.guard.check()  # a bucket whose collective was aborted is not complete: never hand it on
                yield name, tensor
            self.guard.check()
        except BaseException as e:
            self.guard.abort(f"receiving failed ({type(e).__name__}: {e})")
            raise

    def finalize(self):
        self.guard.end()  # every rank got through the sync (verl calls finalize only then): no deadline any more
        return super().finalize()

    def abort_sync(self, why: str = "the trainer gave the sync up") -> bool:
        """Tears this rank's group down now (the trainer calls it through ``execute_checkpoint_engine`` when a sync
        failed). The transfer buffers go too; the next ``prepare`` allocates them again."""
        done = self.guard.abort(why)
        for attr in ("send_buf", "recv_buf"):
            if hasattr(self, attr):
                setattr(self, attr, None)
        return done


async def drain(source) -> None:
    """Walks the rest of the weights without sending them: producing each one is a collective over the actor's
    ranks (the full-tensor gather of FSDP), so a rank that stopped early would leave the others waiting in it.
    verl's own engine does the same for actor ranks outside the broadcast group."""
    n = 0
    try:
        if hasattr(source, "__aiter__"):
            async for _ in source:
                n += 1
        else:
            for _ in source:
                n += 1
    except Exception as e:  # the original failure is the one raised
        logger.warning("weight sync: walking the remaining weights after a failure stopped: %s", e)
    if n:
        logger.warning("weight sync: walked %d remaining weights unsent after a failure", n)
