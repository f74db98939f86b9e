"""Pools on the nodes named for them: the rollout pool and the trainer pool of a multi-node Ray cluster.

A cluster says which nodes are for what with Ray custom resources, given when each node starts:

    ray start --address=<head>:6379 --num-gpus=8 --resources='{"verl_pipe_rollout": 1}'   # rollout node(s)
    ray start --address=<head>:6379 --num-gpus=8 --resources='{"verl_pipe_trainer": 1}'   # trainer node(s)

When the cluster has any node with one of these resources (``ray.cluster_resources()``), every bundle of that pool's
placement groups asks for 1e-4 of it, so Ray places the pool on those nodes only. This is verl's own
``RayResourcePool.accelerator_type`` (a bundle asks 1e-4 of that resource); verl 0.9.1's ResourcePoolManager just
never sets it, so ``RolePlacedResourcePoolManager`` does, by pool name: ``trainer_pool`` (the actor and reference
policy, ``verl.experimental.separation.utils.create_resource_pool_manager``) and ``rollout_pool_<rank>`` (each
rollout replica's pool, ``RolloutReplica.init_standalone``, which also runs for a replica restarted after a failure).
A cluster without the resources places the pools as verl does (anywhere their GPUs fit). With them, verl's
agent-loop and reward-loop workers (which verl spreads round-robin over every node with CPUs) are kept on the nodes
without a role resource (``_RayWithoutRoleNodes``), so a lost rollout node does not take them along; the launcher's
TaskRunner goes on the launcher's node (``on_this_node``); other actors go where Ray schedules them.

``pool_nodes`` reads where each pool's placement groups landed: the step record's ``nodes``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

ROLLOUT_RESOURCE = "verl_pipe_rollout"
TRAINER_RESOURCE = "verl_pipe_trainer"
_installed = False


def pool_resource(pool_name: str, available: set[str]) -> str | None:
    """The role resource the bundles of verl's pool ``pool_name`` ask for, if the cluster has it."""
    if pool_name == "trainer_pool" and TRAINER_RESOURCE in available:
        return TRAINER_RESOURCE
    if pool_name.startswith("rollout_pool_") and not pool_name.startswith(("rollout_pool_reward_",
                                                                          "rollout_pool_teacher_")) \
            and ROLLOUT_RESOURCE in available:
        return ROLLOUT_RESOURCE
    return None


def _manager_class():
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager

    class RolePlacedResourcePoolManager(ResourcePoolManager):
        """verl's ResourcePoolManager; each pool's bundles ask for their role's resource (see module)."""

        def create_resource_pool(self):
            super().create_resource_pool()
            import ray

            available = set(ray.cluster_resources())
            for name, pool in self.resource_pool_dict.items():
                resource = pool_resource(name, available)
                if resource is not None and pool.pgs is None:  # the groups are made on first use, with it
                    pool.accelerator_type = resource
                    logger.info("pool %s placed on the nodes with resource %s", name, resource)

    return RolePlacedResourcePoolManager


def place_pools_by_role(resource_pool_manager):
    """Installs role placement in this process when the cluster (Ray is initialized) has a role resource: returns
    ``resource_pool_manager`` as a RolePlacedResourcePoolManager (the trainer pool), and makes verl's rollout
    replicas create theirs with it. Returns ``resource_pool_manager`` unchanged otherwise."""
    global _installed
    import ray

    available = set(ray.cluster_resources())
    if not {ROLLOUT_RESOURCE, TRAINER_RESOURCE} & available:
        return resource_pool_manager
    cls = _manager_class()
    if not _installed:
        # verl.workers.rollout.replica binds ResourcePoolManager at import; init_standalone looks the name up there.
        import verl.workers.rollout.replica as replica_mod

        replica_mod.ResourcePoolManager = cls
        _keep_loop_workers_off_role_nodes()
        _installed = True
    print(f"[verl_pipe] pools placed by node role: trainer on {TRAINER_RESOURCE if TRAINER_RESOURCE in available else 'any node'}, "
          f"rollout on {ROLLOUT_RESOURCE if ROLLOUT_RESOURCE in available else 'any node'}", flush=True)
    return cls(resource_pool_spec=resource_pool_manager.resource_pool_spec, mapping=resource_pool_manager.mapping,
               max_colocate_count=resource_pool_manager.max_colocate_count)


class _RayWithoutRoleNodes:
    """``ray`` as verl's agent-loop and reward-loop managers see it: ``nodes()`` lists only the nodes without a role
    resource (when there is one with CPUs), everything else is ray's. verl 0.9.1 places its agent-loop and reward-loop
    workers round-robin over ``ray.nodes()`` with CPUs (AgentLoopManager._init_agent_loop_workers,
    RewardLoopManager); on a cluster with role nodes they then landed on a rollout node, and every request of the run
    (all go through an agent-loop worker) failed with that node (measured: both replicas given up when one rollout
    node was lost)."""

    def __init__(self, ray_module):
        self._ray = ray_module

    def nodes(self):
        nodes = self._ray.nodes()
        other = [n for n in nodes if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0
                 and not {ROLLOUT_RESOURCE, TRAINER_RESOURCE} & set(n.get("Resources", {}))]
        return other or nodes

    def __getattr__(self, name):
        return getattr(self._ray, name)


def _keep_loop_workers_off_role_nodes() -> None:
    import importlib

    import ray

    for name in ("verl.experimental.agent_loop.agent_loop", "verl.experimental.reward_loop.reward_loop"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(mod, "ray", None) is ray:
            mod.ray = _RayWithoutRoleNodes(ray)


def on_this_node():
    """A scheduling strategy for an actor on the calling process's node (soft: another node if this one has no room
    for it). The launcher's TaskRunner goes there: on a cluster with role nodes Ray may otherwise place it on a rollout
    or trainer node, whose loss would end the run, and away from the launcher's /tmp (its stop file)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)


def pool_nodes(trainer) -> dict[str, list[str]]:
    """{"trainer": node ids of the trainer pool's bundles, "rollout": per live rollout replica, the node id of its
    pool's first bundle} from the placement groups (one GCS call); {} where they cannot be read."""
    try:
        from ray.util import placement_group_table

        table = placement_group_table()

        def nodes(pool) -> list[str]:
            out = []
            for pg in list(getattr(pool, "pgs", None) or []):
                out.extend(str(n) for n in (table.get(pg.id.hex(), {}).get("bundles_to_node_id") or {}).values())
            return out

        trainer_pool = trainer.resource_pool_manager.resource_pool_dict.get("trainer_pool")
        rollout = []
        supervisor = getattr(getattr(trainer, "rollout", None), "supervisor", None)
        retired = getattr(supervisor, "retired", set())
        for i, replica in enumerate(trainer.llm_server_manager.rollout_replicas):
            if i not in retired:
                rollout.append((nodes(getattr(replica, "resource_pool", None)) or [None])[0])
        return {"trainer": nodes(trainer_pool), "rollout": rollout}
    except Exception as e:  # noqa: BLE001 -- bookkeeping only
        logger.debug("pool nodes not readable: %s", e)
        return {}
