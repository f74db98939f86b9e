"""Two rollout replicas (both on the rollout core: time-sliced, which is fine for correctness): FGD keeps each
group on one replica and uses both; a replica killed mid-step with restarts off is retired, its unfinished
requests finish on the other one, and later steps run without it."""

import os
from collections import defaultdict

import pytest
import ray
from omegaconf import open_dict

from tests.e2e.conftest import E2E_OVERRIDES, KillAtFirstUnit, assert_every_group_once_at

pytestmark = pytest.mark.e2e

N = 4
GROUPS = 8
SHORT, LONG = 4, 128


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    from verl_pipe.launch.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("two_ckpt")
    session = PipeSession(compose(E2E_OVERRIDES + [
        "actor_rollout_ref.rollout.n_gpus_per_node=2",  # two replicas of TP 1
        "rolloutpipe.mode=cgp", "rolloutpipe.fgd.enable=true",
        f"data.max_response_length={LONG}", "actor_rollout_ref.rollout.max_model_len=256",
        f"trainer.default_local_dir={ckpt}"]))
    yield session
    session.close()


def _lengths(group: int, index: int) -> dict:
    return {"max_tokens": SHORT if group < 4 else LONG, "ignore_eos": True}


def _replicas_of_groups(timeline) -> dict[int, set]:
    out = defaultdict(set)
    for ev in timeline._ev["requests"]:
        out[ev["group"]].add(ev["replica"])
    return out


def test_fgd_pins_each_group_to_one_of_two_replicas(two):
    trainer = two.trainer
    assert trainer.rollout.live_replicas() == [0, 1]
    rec = two.step(sampling_overrides=_lengths)
    where = _replicas_of_groups(trainer.timelines[-1])
    assert all(len(r) == 1 for r in where.values()), f"a group's requests went to several replicas: {dict(where)}"
    assert set().union(*where.values()) == {0, 1}, "both replicas served"
    assert len(rec["trained_groups"]) == GROUPS


def test_replica_killed_without_restart_is_retired(two):
    trainer = two.trainer
    with open_dict(trainer.config.rolloutpipe.fault):
        trainer.config.rolloutpipe.fault.replica_restart = False
    trainer.rollout.supervisor.restart_enabled = False
    version = trainer.global_steps - 1
    handle = trainer.llm_server_manager.server_handles[0]
    pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
    kill = KillAtFirstUnit(trainer, pid)  # the moment unit 0's groups are in, while the long ones are generated
    rec = two.step(sampling_overrides=_lengths, backend_cls=kill.backend_cls)  # this step's executor only
    m = rec["metrics"]
    print(f"\n[replicas] killed replica 0 with {kill.inflight_at_kill} requests in flight; "
          f"{m['rolloutpipe/requeued_requests']} requeued to replica 1")
    assert kill.killed_at is not None and kill.inflight_at_kill
    assert m["rolloutpipe/replica_failures"] == 1 and m["rolloutpipe/replica_restarts"] == 0
    assert m["rolloutpipe/requeued_requests"] > 0
    batch = trainer.last_outcome.batch
    assert_every_group_once_at(rec, batch, GROUPS, N, version)
    assert trainer.rollout.live_replicas() == [1]
    # the next step runs on the survivor only and gets θ_{k+1} (the weight sync skips the retired replica)
    rec2 = two.step(sampling_overrides=_lengths)
    assert rec2["metrics"]["rolloutpipe/replica_failures"] == 0
    assert {ev["replica"] for ev in trainer.timelines[-1]._ev["requests"]} == {1}
    assert set(trainer.last_outcome.batch.non_tensor_batch["min_global_steps"]) == {version + 1}
