"""The trainer's side of a weight sync: how long it may take, and the teardown when it fails.

A sync over a backend that tears its group down at a deadline (``abort_sync`` on the engine class: the NCCL
engine of verl_pipe/platform/nccl_engine.py) gets a deadline sized to what it moves instead of the flat
``rolloutpipe.weight_sync_timeout_s``: ``setup_s`` (aborting requests, freeing the KV cache, creating the group,
resuming) plus the actor's weight bytes at ``min_gib_per_s``, a conservative floor of the link's bandwidth;
``weight_sync_timeout_s`` still applies when it is shorter. The same figure is the engines' own deadline, so a
rank stuck in a collective with a dead peer frees itself (verl_pipe/platform/sync_guard.py).

When the sync fails (an error or the deadline), every actor rank and every rollout worker of the sync is asked
to tear its group down (``abort_sync`` through verl's ``execute_checkpoint_engine``), and the trainer waits up to
``setup_s`` for them before the error goes on to ``ReplicaSupervisor.sync_weights``, which sets the dead replica
aside and retries on the live ones: the retry creates a new group, on workers that hold none.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

from verl_pipe.core.deadline import DeadlineExceeded, call_with_deadline

logger = logging.getLogger(__name__)

GIB = float(1 << 30)
TIMEOUT_KEY = "rolloutpipe.weight_sync_timeout_s"
BANDWIDTH_KEY = "rolloutpipe.nccl_sync.min_gib_per_s"
SETUP_KEY = "rolloutpipe.nccl_sync.setup_s"


def bytes_deadline_s(nbytes: int, min_gib_per_s: float, setup_s: float) -> float:
    """``setup_s`` plus the time ``nbytes`` take at ``min_gib_per_s``."""
    for key, value, low in ((BANDWIDTH_KEY, min_gib_per_s, 0.0), (SETUP_KEY, setup_s, 0.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= low:
            raise ValueError(f"{key}: got {value!r}; allowed: a number > 0")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"weight bytes: got {nbytes!r}; allowed: an integer >= 0")
    return float(setup_s) + nbytes / GIB / float(min_gib_per_s)


@dataclass(frozen=True)
class Deadline:
    seconds: float | None  # None: wait as long as it takes
    hint: str  # what to change when a sync is just slow

    def message(self, what: str) -> str:
        return f"{what} did not finish within {self.seconds:.0f}s ({self.hint})"


def sync_deadline(rolloutpipe, bounded: bool, nbytes: int | None) -> Deadline:
    """The deadline of one sync. ``bounded``: the backend tears its group down at a deadline; ``nbytes``: the
    actor's weight bytes (needed then)."""
    timeout = rolloutpipe.get("weight_sync_timeout_s")
    plain = Deadline(timeout, f"raise {TIMEOUT_KEY} if it is just slow")
    nccl = rolloutpipe.get("nccl_sync") or {}
    floor = nccl.get("min_gib_per_s")
    if not bounded or floor is None:
        return plain
    setup = nccl.get("setup_s")
    derived = bytes_deadline_s(int(nbytes or 0), floor, setup)
    if timeout is not None and timeout <= derived:
        return plain
    return Deadline(derived, f"{setup:g} s + {(nbytes or 0) / GIB:.2f} GiB at {floor:g} GiB/s; if the sync is just "
                             f"slow, lower {BANDWIDTH_KEY} or raise {SETUP_KEY}")


class WeightSync:
    """Runs ``manager.update_weights`` (verl's CheckpointEngineManager) with a deadline; on failure, has every
    rank of the sync tear its group down before the error is raised.

    ``abort``: (manager) -> handles of the teardown calls it started, or None for a backend without one;
    ``wait``: (handles, seconds) -> None, waits for them (errors of dead workers are expected and ignored).
    """

    def __init__(self, deadline: Deadline, teardown_wait_s: float | None = None,
                 abort: Callable[[Any], list] | None = None, wait: Callable[[list, float | None], None] | None = None):
        self.deadline = deadline
        self.teardown_wait_s = teardown_wait_s
        self._abort = abort
        self._wait = wait or wait_ignoring_errors
        self.teardowns = 0

    def run(self, manager, version: int, what: str) -> dict:
        try:
            return call_with_deadline(lambda: manager.update_weights(version), self.deadline.seconds, what,
                                      TIMEOUT_KEY) or {}
        except DeadlineExceeded as e:
            self.tear_down(manager)
            raise DeadlineExceeded(self.deadline.message(what)) from e
        except BaseException:
            self.tear_down(manager)
            raise

    def tear_down(self, manager) -> None:
        if self._abort is None:
            return
        self.teardowns += 1
        try:
            handles = self._abort(manager)
        except Exception as e:  # e.g. a worker group that cannot be built: the sync's error is the one to raise
            logger.error("weight sync failed; asking its ranks to tear their groups down failed too: %s", e)
            return
        self._wait(handles, self.teardown_wait_s)


def abort_all_ranks(manager) -> list:
    """Starts ``abort_sync`` on every actor rank and every rollout worker of ``manager``'s replicas, the way verl's
    manager calls any engine method (``execute_checkpoint_engine`` on the actor group and on a worker group
    over the replicas' workers)."""
    from verl.checkpoint_engine.base import _worker_cls
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

    actor_wg = manager.actor_wg
    handles = list(actor_wg.execute_checkpoint_engine(["abort_sync"] * actor_wg.world_size))
    workers = [w for replica in manager.replicas for w in replica.workers]
    if workers:
        rollout = RayWorkerGroup(worker_handles=workers, ray_cls_with_init=RayClassWithInitArgs(cls=_worker_cls))
        handles += list(rollout.execute_checkpoint_engine(["abort_sync"] * rollout.world_size))
    return handles


def wait_ignoring_errors(handles: list, seconds: float | None) -> None:
    """Waits for Ray calls, each on its own: a dead replica's worker raises, a stuck one counts as not done."""
    import ray

    if not handles:
        return
    done, pending = ray.wait(handles, num_returns=len(handles), timeout=seconds)
    for ref in done:
        try:
            ray.get(ref)
        except Exception as e:
            logger.info("weight sync teardown: a worker did not answer (%s)", type(e).__name__)
    if pending:
        logger.warning("weight sync teardown: %d worker(s) still busy after %ss; the retry waits behind them",
                       len(pending), seconds)


def plan_weight_sync(config, checkpoint_manager, actor_wg) -> WeightSync:
    """The run's sync, built at its first sync: a backend that tears its group down at a deadline (the NCCL engine of
    verl_pipe/platform/nccl_engine.py: ``abort_sync`` on ``checkpoint_manager.backend_cls``) gets a deadline sized to
    the actor's weight bytes, which its engines on the actor ranks learn here (the master hands it to the rest).
    verl seams: our worker's ``weight_sync_nbytes`` and verl's ``execute_checkpoint_engine`` on the actor group."""
    import ray

    rp = config.rolloutpipe
    bounded = hasattr(checkpoint_manager.backend_cls, "abort_sync")
    nbytes = int(actor_wg.weight_sync_nbytes()[0]) if bounded else None
    deadline = sync_deadline(rp, bounded, nbytes)
    if bounded:
        n = actor_wg.world_size
        ray.get(actor_wg.execute_checkpoint_engine(["set_sync_deadline"] * n, [deadline.seconds] * n))
        logger.info("weight sync deadline %s s (%s)", deadline.seconds, deadline.hint)
        # the actor ranks outside the broadcast wait in FSDP gathers for rank 0 up to the deadline; past
        # torch.distributed's own timeout torch ends them instead of the watchdog freeing rank 0
        torch_timeout = config.actor_rollout_ref.get("nccl_timeout")
        if deadline.seconds and torch_timeout and deadline.seconds >= float(torch_timeout):
            logger.warning("weight sync deadline %.0f s >= actor_rollout_ref.nccl_timeout %s s: a sync stuck on a "
                           "dead replica ends the actor's ranks before its own teardown; lower the deadline "
                           "(rolloutpipe.nccl_sync) or raise nccl_timeout", deadline.seconds, torch_timeout)
    setup = (rp.get("nccl_sync") or {}).get("setup_s")
    return WeightSync(deadline, teardown_wait_s=setup, abort=abort_all_ranks if bounded else None)


class RolloutWeights:
    """The actor's weights into the rollout pool: the step's sync into every live replica, and one restarted
    replica's load (θ_k from the worker's store while the step trains, the actor's current weights after its sync).

    verl seams: verl's ``CheckpointEngineManager`` (``checkpoint_manager``: ``update_weights``, and a manager of the
    same class over one replica for a restart). ``seam``: the trainer's (verl_pipe/trainer/seam.py: the actor's lock,
    whether θ_k is saved, the θ_k swap)."""

    def __init__(self, config, checkpoint_manager, seam):
        self.config, self.checkpoint_manager, self.seam = config, checkpoint_manager, seam
        self._plan: WeightSync | None = None

    def plan(self) -> WeightSync:
        if self._plan is None:
            self._plan = plan_weight_sync(self.config, self.checkpoint_manager, self.seam.workers)
        return self._plan

    def sync(self, supervisor, step: int) -> dict:
        """θ_{k+1} (weights ``step``) into every live replica; a replica found dead before or during the sync is
        synced apart (restarted with them, or retired) instead of failing the run (ReplicaSupervisor.sync_weights).
        Returns the supervisor's metrics."""
        return supervisor.sync_weights(lambda: self.plan().run(self.checkpoint_manager, step,
                                                               f"step {step}'s weight sync"), step) or {}

    def push(self, replica, version: int, theta_k: bool) -> None:
        """Loads weights ``version`` into one (restarted) replica without touching the others' in-flight requests;
        ``theta_k``: they are the step's θ_k, taken from the worker's store once the actor has stepped past it."""
        cm, seam = self.checkpoint_manager, self.seam
        with seam.lock, (seam.at_theta_k() if theta_k and seam.saved else nullcontext()):
            manager = type(cm)(config=cm.config, actor_wg=cm.actor_wg, replicas=[replica])
            self.plan().run(manager, version, f"loading weights version {version} into a restarted replica")
