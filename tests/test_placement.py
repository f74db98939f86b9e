"""Whether a restarted replica's placement groups fit on the live nodes' free resources
(verl_pipe/core/placement.py), and what the supervisor does when they do not (pure logic; the real placement on a
multi-node Ray cluster is tests/e2e/test_multinode.py's)."""

from types import SimpleNamespace

import pytest

from verl_pipe.core.placement import unplaceable
from verl_pipe.rollout import placement
from verl_pipe.rollout.replicas import ReplicaLostError, ReplicaSupervisor

BUNDLE = {"CPU": 2, "GPU": 1, "verl_pipe_rollout": 1e-4}
# a rollout node whose GPU holds the surviving replica, the trainer node (free GPU, no rollout resource), the head
FULL = {"rollout_b": {"CPU": 14, "GPU": 0, "verl_pipe_rollout": 0.9999},
        "trainer": {"CPU": 13, "GPU": 1, "verl_pipe_trainer": 0.9999}, "head": {"CPU": 30}}


def test_a_free_rollout_node_takes_the_replica():
    free = dict(FULL, rollout_c={"CPU": 16, "GPU": 1, "verl_pipe_rollout": 1.0})
    assert unplaceable([[BUNDLE]], free) is None


def test_no_rollout_node_with_a_free_gpu_is_unplaceable_and_says_what_is_free_where():
    why = unplaceable([[BUNDLE]], FULL)
    assert why is not None
    assert "GPU 1" in why and "verl_pipe_rollout 0.0001" in why, why  # what was asked
    assert "rollout_: CPU 14, GPU 0, verl_pipe_rollout 0.9999" in why, why  # what the rollout node has free
    assert "trainer: CPU 13, GPU 1, verl_pipe_rollout 0" in why, why  # a free GPU, but not the role's


def test_the_role_resource_share_is_compared_with_rays_fixed_point_slack():
    assert unplaceable([[BUNDLE]], {"n": {"CPU": 2, "GPU": 1, "verl_pipe_rollout": 0.0001}}) is None
    assert unplaceable([[BUNDLE]], {"n": {"CPU": 2, "GPU": 1, "verl_pipe_rollout": 0.0}}) is not None


def test_no_live_node_at_all():
    assert unplaceable([[BUNDLE]], {}) == ("no live node for a bundle of CPU 2, GPU 1, verl_pipe_rollout 0.0001")


def test_pack_spreads_bundles_over_nodes_strict_pack_needs_one_node():
    two = [[{"GPU": 1}, {"GPU": 1}]]
    free = {"a": {"GPU": 1}, "b": {"GPU": 1}}
    assert unplaceable(two, free, "PACK") is None
    assert "GPU 2" in unplaceable(two, free, "STRICT_PACK")
    assert unplaceable(two, {"a": {"GPU": 2}}, "STRICT_PACK") is None


def test_groups_share_the_free_resources():
    free = {"a": {"GPU": 1}, "b": {"GPU": 1}}
    assert unplaceable([[{"GPU": 1}], [{"GPU": 1}]], free) is None
    assert unplaceable([[{"GPU": 1}], [{"GPU": 1}], [{"GPU": 1}]], free) is not None
    assert free == {"a": {"GPU": 1}, "b": {"GPU": 1}}, "the caller's view is not changed"


def test_an_unknown_strategy_is_a_clear_error():
    with pytest.raises(ValueError, match="PACK or STRICT_PACK"):
        unplaceable([[BUNDLE]], FULL, "SPREAD")


class Ckpt:
    def __init__(self, replicas):
        self.replicas = list(replicas)

    def remove_replicas(self, rs):
        self.replicas = [r for r in self.replicas if r not in rs]


class Unplaceable(ReplicaSupervisor):
    """The real supervisor's heal; its restart finds no node for the replica (retires it and raises, as the real
    one does after placement.place gives up)."""

    def __init__(self, n):
        reps = [SimpleNamespace(name=f"r{i}") for i in range(n)]
        super().__init__(SimpleNamespace(rollout_replicas=reps, server_handles=[None] * n), Ckpt(reps),
                         push_weights=None, set_servers=None, restart=True)
        self.dead = {}

    def find_dead(self):
        return {i: why for i, why in self.dead.items() if i in self.live()}

    def restart(self, index, version):
        self.retired.add(index)
        raise placement.ReplicaUnplaceableError("no live node can take it: no live node has a bundle of GPU 1 free")


def test_a_dead_replica_that_cannot_be_placed_is_retired_and_the_others_go_on():
    sup = Unplaceable(2)
    sup.dead = {0: "its server actor is gone"}
    assert sup.heal(version=3, phase="step_start") == {0: "its server actor is gone"}
    assert sup.live() == [1] and sup.health.retired == 1 and sup.health.restarts == 0


def test_the_last_replica_that_cannot_be_placed_is_a_clear_error():
    sup = Unplaceable(1)
    sup.dead = {0: "its server actor is gone"}
    with pytest.raises(ReplicaLostError, match=r"replica 0 died \(its server actor is gone\), cannot be restarted "
                                               r"\(no live node can take it: .*\) and no replica is left"):
        sup.heal(version=3, phase="step_start")


def test_the_copied_verl_method_is_the_one_installed():
    """rollout/placement.py's start_on copies verl's RolloutReplica.init_standalone: a verl upgrade that changes it
    must be looked at."""
    import hashlib
    import inspect

    from verl.workers.rollout.replica import RolloutReplica
    from verl_pipe.rollout.placement import VERL_INIT_STANDALONE_SHA256

    src = inspect.getsource(RolloutReplica.init_standalone)
    assert hashlib.sha256(src.encode()).hexdigest() == VERL_INIT_STANDALONE_SHA256, \
        "verl's init_standalone changed: check verl_pipe/rollout/placement.py (place, start_on) against it"
