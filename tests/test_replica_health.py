"""Replica health outside the rollout's requests (docs/reliability.md), as pure logic: ReplicaSupervisor's heal at a step's
start and its weight sync around dead replicas, with the probe, restart and retire steps replaced by records
(the real ones need Ray and vLLM: tests/e2e/test_faults.py kills the engine at each phase)."""

from types import SimpleNamespace

import pytest
import ray

from verl_pipe.rollout import replicas as rep
from verl_pipe.rollout.replicas import ReplicaLostError, ReplicaSupervisor


class EngineDeadError(Exception):
    """Named like vLLM's."""


class Ckpt:
    def __init__(self, replicas):
        self.replicas = list(replicas)

    def remove_replicas(self, rs):
        self.replicas = [r for r in self.replicas if r not in rs]

    def add_replicas(self, rs):
        self.replicas.extend(rs)


class Sup(ReplicaSupervisor):
    """The real supervisor's policy; ``dead`` is what the probes would find, per call of find_dead."""

    def __init__(self, n=2, restart=True, dead=()):
        reps = [SimpleNamespace(name=f"r{i}") for i in range(n)]
        mgr = SimpleNamespace(rollout_replicas=reps, server_handles=[None] * n)
        super().__init__(mgr, Ckpt(reps), push_weights=None, set_servers=None, restart=restart)
        self.probes = list(dead)  # one dict per find_dead call; {} afterwards
        self.log = []

    def find_dead(self):
        found = self.probes.pop(0) if self.probes else {}
        return {i: why for i, why in found.items() if i in self.live()}

    def restart(self, index, version):
        self.log.append(("restart", index, version, [r.name for r in self.ckpt.replicas]))
        self.ckpt.replicas.append(self.mgr.rollout_replicas[index])
        return 0.0

    def retire(self, index):
        self.log.append(("retire", index))
        self.ckpt.remove_replicas([self.mgr.rollout_replicas[index]])
        self.retired.add(index)


def test_a_replica_dead_at_step_start_is_restarted_with_theta_k():
    sup = Sup(dead=[{1: "engine dead"}])
    assert sup.heal(version=4, phase="step_start") == {1: "engine dead"}
    assert sup.log == [("restart", 1, 4, ["r0", "r1"])]
    assert sup.health.found == {"step_start": 1} and sup.health.restarts == 1
    assert sup.health.metrics()["rolloutpipe/replica_deaths_found/step_start"] == 1


def test_healthy_replicas_are_left_alone():
    sup = Sup(dead=[{}])
    assert sup.heal(version=4, phase="step_start") == {}
    assert sup.log == [] and sup.health.found == {}


def test_without_restarts_the_dead_replica_is_retired_and_with_none_left_it_is_a_clear_error():
    sup = Sup(restart=False, dead=[{0: "engine dead"}])
    sup.heal(version=2, phase="step_start")
    assert sup.log == [("retire", 0)] and sup.live() == [1]
    sup.probes = [{1: "server actor gone"}]
    with pytest.raises(ReplicaLostError, match=r"replica 1 died \(server actor gone\) and no replica is left"):
        sup.heal(version=2, phase="step_start")


def test_a_replica_dead_before_the_sync_is_synced_apart_then_restarted_with_theta_k_plus_1():
    sup = Sup(dead=[{0: "engine dead"}])
    synced = []
    sup.sync_weights(lambda: synced.append([r.name for r in sup.ckpt.replicas]) or {"m": 1}, version=5)
    assert synced == [["r1"]], "the live replica is synced without the dead one"
    assert sup.log == [("restart", 0, 5, ["r1"])], "then the dead one comes back with the new weights"
    assert sup.health.found == {"weight_sync": 1}


def test_the_only_replica_dead_during_training_comes_back_with_the_new_weights_without_a_sync_call():
    sup = Sup(n=1, dead=[{0: "engine dead"}])
    calls = []
    assert sup.sync_weights(lambda: calls.append(1), version=3) == {}
    assert calls == [] and sup.log == [("restart", 0, 3, [])]


def test_a_replica_that_dies_during_the_sync_is_set_aside_and_the_sync_retried_on_the_others():
    sup = Sup(dead=[{}, {1: "engine dead"}])
    attempts = []

    def sync():
        attempts.append([r.name for r in sup.ckpt.replicas])
        if len(attempts) == 1:
            raise RuntimeError("abort_replicas failed") from EngineDeadError()
        return {"ok": 1}

    assert sup.sync_weights(sync, version=7) == {"ok": 1}
    assert attempts == [["r0", "r1"], ["r0"]]
    assert sup.log == [("restart", 1, 7, ["r0"])]


def test_a_sync_error_that_is_not_a_replica_death_is_raised():
    sup = Sup(dead=[{}])

    def sync():
        raise ValueError("bad weights")

    with pytest.raises(ValueError, match="bad weights"):
        sup.sync_weights(sync, version=1)
    assert sup.log == []


def test_the_engine_probe_reads_vllms_errored_flag():
    assert rep._engine_down(SimpleNamespace(engine=SimpleNamespace(errored=True))) is True
    assert rep._engine_down(SimpleNamespace(engine=SimpleNamespace(errored=False))) is False
    assert rep._engine_down(SimpleNamespace()) is False  # not launched yet


@pytest.mark.parametrize("outcome,expected", [
    (True, "vLLM engine is dead"), (False, None),
    (ray.exceptions.GetTimeoutError(), "did not answer a health probe within 2s"),
    (ray.exceptions.ActorUnavailableError("x", b"0" * 16), "server actor is gone (ActorUnavailableError)")])
def test_probe_server_names_why(monkeypatch, outcome, expected):
    handle = SimpleNamespace(__ray_call__=SimpleNamespace(remote=lambda fn: fn))

    def get(ref, timeout):
        assert timeout == 2.0
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(rep.ray, "get", get)
    why = rep.probe_server(handle, 2.0)
    assert (why is None) if expected is None else (expected in why)
