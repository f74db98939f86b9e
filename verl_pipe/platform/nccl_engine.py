"""verl's NCCL checkpoint engine, made to survive a rollout replica that dies mid-sync, under verl's name "nccl".

Select it with ``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=verl_pipe.platform.nccl_engine``
(the GPU recipes do; verl_pipe.config refuses the nccl backend without it). verl seam: every process that looks a
backend up (the actor workers, the rollout replicas' CheckpointEngineWorker, the trainer's
CheckpointEngineManager) first imports ``custom_backend_module``, and ``CheckpointEngineRegistry.register``
keeps the last class registered under a name, so this class replaces verl's ``NCCLCheckpointEngine`` there
while verl's own transfer code runs unchanged underneath (RecoverableSync, verl_pipe/platform/recoverable_sync.py).

Without cupy (a CPU machine) verl's NCCL module does not import; nothing is registered here and verl's recorded
import error stays what the preflight reports.
"""

from __future__ import annotations

import importlib
import logging

from verl.checkpoint_engine.base import CheckpointEngineRegistry

from verl_pipe.platform.recoverable_sync import RecoverableSync

logger = logging.getLogger(__name__)

try:
    from verl.checkpoint_engine.nccl_checkpoint_engine import NCCLCheckpointEngine
except ImportError:  # cupy missing
    NCCLCheckpointEngine = None


class RayCollectiveOps:
    """ray.util.collective, where verl's NCCL engine keeps its groups (one GroupManager per process).

    It has no abort: ``destroy_collective_group`` calls ``ncclCommDestroy``, which first waits for the group's
    unfinished collectives, i.e. forever when a peer is dead. So the group is taken out of Ray's GroupManager and
    its communicators are aborted (cupy's ``NcclCommunicator.abort``: ``ncclCommAbort``, which ends the kernels
    waiting for the dead peer and may be called from another thread). Seams (ray 2.60): the module-level
    ``_group_mgr`` / ``_group_mgr_lock`` of ray.util.collective.collective, ``NCCLGroup._dev_comm_map`` (comm key
    -> communicators), and ``NCCLGroup._destroy_store`` / ``_generate_group_key`` for the detached actors that
    rank 0 created to hand out the NCCL unique id (``destroy_group`` kills them the same way).
    """

    def __init__(self):
        self._ray = importlib.import_module("ray.util.collective.collective")

    def exists(self, group: str) -> bool:
        return self._ray.is_group_initialized(group)

    def abort(self, group: str) -> None:
        with self._ray._group_mgr_lock:
            handle = self._ray._group_mgr._name_group_map.pop(group, None)
        if handle is None:
            return
        comm_map = dict(getattr(handle, "_dev_comm_map", None) or {})
        for comms in comm_map.values():
            for comm in comms or ():
                try:
                    comm.abort()
                except Exception as e:  # a communicator that failed already
                    logger.warning("weight sync: aborting a communicator of %s failed: %s", group, e)
        if getattr(handle, "rank", None) == 0:
            for key in comm_map:
                try:
                    handle._destroy_store(handle._generate_group_key(key))
                except Exception:
                    pass  # gone already


if NCCLCheckpointEngine is not None:

    @CheckpointEngineRegistry.register("nccl")
    class RecoverableNCCLCheckpointEngine(RecoverableSync, NCCLCheckpointEngine):
        """verl's NCCL engine with a group per sync, a deadline and a teardown on failure (RecoverableSync)."""

        def collective_ops(self) -> RayCollectiveOps:
            return RayCollectiveOps()
