"""A restarted rollout replica's placement groups, asked for with a bound, and the replica started on them.

verl's ``RolloutReplica.init_standalone`` creates the replica's placement groups and waits for them with no limit
(``ray.get(pg.ready())`` inside ``RayResourcePool.get_placement_groups``, a blocking call that an asyncio timeout
cannot interrupt). When no live node can take the replica (its rollout node lost and no spare one with a free GPU
and the pool's role resource, verl_pipe/platform/node_roles.py), Ray keeps the groups pending for good and a restart would
wait with them. Here the groups are made first: ``place`` creates them and polls; it gives up when
``verl_pipe.core.placement.unplaceable`` has said for ``confirm_s`` in a row that the live nodes' free resources
cannot hold them (the dead replica's own resources may take a moment to show free again), or after ``timeout_s``
whatever it says. ``start_on`` then runs the rest of ``init_standalone`` on the placed groups.
"""

from __future__ import annotations

import logging
import time

import ray

from verl_pipe.core.placement import unplaceable

logger = logging.getLogger(__name__)

# sha256 of inspect.getsource(verl 0.9.1's RolloutReplica.init_standalone), which start_on and the constants below
# copy: a test fails when verl's changes
VERL_INIT_STANDALONE_SHA256 = "f7a4d7da561d8548cbe884377762ec1a87da5bb8e6e87326bdca05e077dfcc10"
# verl 0.9.1's init_standalone: max_colocate_count=2 CPUs per bundle, one device, PACK (RayWorkerGroup, bin_pack off)
BUNDLE_CPUS = 2
STRATEGY = "PACK"


class ReplicaUnplaceableError(RuntimeError):
    """No live node can take a restarted replica's placement groups."""


def pool_name(replica) -> str:
    return f"rollout_pool_{replica.replica_rank}{replica.name_suffix}"


def role_of(old_replica, resources: set[str]) -> str | None:
    """The role resource a restart of ``old_replica`` asks for: its pool's (it keeps asking for it when every node
    that has it is gone, so it is not placed off its role), else the one the cluster has for the pool's name."""
    from verl_pipe.platform.node_roles import pool_resource

    pool = getattr(old_replica, "resource_pool", None)
    return getattr(pool, "accelerator_type", None) or pool_resource(pool_name(old_replica), resources)


def replica_groups(replica, role: str | None) -> list[list[dict]]:
    """The bundles of ``replica``'s placement groups as init_standalone asks for them (one group per node of the
    replica), each asking 1e-4 of the role resource ``role`` if any (verl's ``RayResourcePool.accelerator_type``)."""
    from verl.plugin.platform import get_platform

    bundle = {"CPU": BUNDLE_CPUS, get_platform().ray_resource_name(): 1}
    if role is not None:
        bundle[role] = 1e-4
    return [[dict(bundle) for _ in range(replica.gpus_per_replica_node)] for _ in range(replica.nnodes)]


def live_free() -> dict[str, dict[str, float]]:
    """{live node id: its free resources}, as Ray's GCS reports them."""
    return ray._private.state.available_resources_per_node()


def place(groups: list[list[dict]], name: str, timeout_s: float, confirm_s: float = 3.0, poll_s: float = 0.5,
          free=live_free) -> list:
    """Creates the placement groups ``groups`` and waits until Ray has placed them all; raises
    ReplicaUnplaceableError (the groups removed) once they have been unplaceable on the live nodes for ``confirm_s``
    seconds in a row, or ``timeout_s`` after the start."""
    from ray.util.placement_group import placement_group, remove_placement_group

    t0 = time.monotonic()
    prefix = f"{name}verl_group_{'_'.join(str(len(b)) for b in groups)}:"  # verl's names
    pgs = [placement_group(bundles=b, strategy=STRATEGY, name=f"{prefix}{i}") for i, b in enumerate(groups)]
    waiting = {pg.ready(): i for i, pg in enumerate(pgs)}
    since = None  # when the groups still waiting were first found unplaceable, in this run of findings
    doubted = 0  # polls that found them unplaceable (the dead replica's resources not yet shown free, e.g.)
    try:
        while waiting:
            _, pending = ray.wait(list(waiting), num_returns=len(waiting), timeout=poll_s)
            waiting = {ref: waiting[ref] for ref in pending}
            if not waiting:
                break
            why = unplaceable([groups[i] for i in waiting.values()], free(), STRATEGY)
            now = time.monotonic()
            since = (since or now) if why else None
            doubted += bool(why)
            if why and now - since >= confirm_s:
                raise ReplicaUnplaceableError(f"no live node can take it: {why}")
            if now - t0 >= timeout_s:
                raise ReplicaUnplaceableError(f"its placement groups were not placed within {timeout_s:g}s "
                                              f"({why or 'the live nodes list room for them'})")
    except BaseException:
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 -- never created, or gone with its node
                pass
        raise
    log = logger.warning if doubted else logger.info
    log("placement groups %s placed in %.1fs (%d poll(s) found them unplaceable first)", name, time.monotonic() - t0,
        doubted)
    return pgs


def placed_pool(replica, pgs, role: str | None):
    """A verl ``RayResourcePool`` for ``replica`` over the placement groups ``place`` made (verl's pool returns them
    instead of making its own)."""
    from verl.single_controller.ray.base import RayResourcePool, sort_placement_group_by_node_ip

    pool = RayResourcePool(process_on_nodes=[replica.gpus_per_replica_node] * replica.nnodes, use_gpu=True,
                           max_colocate_count=BUNDLE_CPUS, name_prefix=pool_name(replica), accelerator_type=role)
    pool.pgs = sort_placement_group_by_node_ip(pgs)
    return pool


async def start_on(replica, pool) -> None:
    """verl 0.9.1's ``RolloutReplica.init_standalone`` (a policy replica, not a reward or teacher one) on a pool whose
    placement groups are placed: its checkpoint-engine workers, then its servers."""
    from verl.single_controller.ray import RayWorkerGroup
    from verl.utils.device import get_device_name
    from verl.workers.rollout.replica import RolloutMode

    replica.rollout_mode = RolloutMode.STANDALONE
    replica.resource_pool = pool
    prefix = f"rollout_standalone_{replica.replica_rank}{replica.name_suffix}"
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=replica.get_ray_class_with_init_args(),
                           bin_pack=False, name_prefix=prefix, use_gpu=True, device_name=get_device_name())
    replica.workers = group.workers
    await replica.launch_servers()
