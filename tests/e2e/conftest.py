import os
import signal
import time
from contextlib import contextmanager

import pytest

# The exactness machinery lives in the runtime (python -m verl_pipe.doctor runs it too); re-exported for the tests.
from verl_pipe.launch.replay import prefilled_queue, train_same_responses, trainer_in, update_deviation  # noqa: F401

# A long-tailed, group-correlated response-length workload: groups finish at different
# times, so a pipelined trainer has something to overlap with.
LONGTAIL = {"kind": "lognormal", "median": 12, "sigma": 0.8, "rho": 0.7, "cap": 32, "seed": 0}

PARTIAL_CREDIT_REWARD = ["reward.custom_reward_function.path=pkg://verl_pipe.recipes.extension_example.reward",
                         "reward.custom_reward_function.name=compute_score"]

E2E_OVERRIDES = [
    "trainer.total_training_steps=1000",  # steps are driven one by one
    # The pipeline's mechanics on the random-init base model (fast, and these tests were sized on it); the
    # warm-started learning default has its own module (test_learning.py).
    "rolloutpipe.tiny_assets.warm_start.steps=0",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # 2 units per step
    "actor_rollout_ref.rollout.n=4",
    # micro-batches of one group, so group granularity can train a group at a time
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.optim.lr=3e-3",
]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """One live RolloutPipe stack for the end-to-end tests of a module (one Ray cluster, one vLLM
    start); torn down with the module so the next module's stack gets the machine's cores."""
    from verl_pipe.launch.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("ckpt")
    # The worked example's reward (1 right, 0.25 a wrong number, 0 none): the tiny model's 0/1 digit-math reward
    # is so sparse before training that a step often has no signal at all, and these tests need the actor to move.
    cfg = compose(E2E_OVERRIDES + [f"trainer.default_local_dir={ckpt}", *PARTIAL_CREDIT_REWARD])
    session = PipeSession(cfg)
    yield session
    session.close()


def assert_every_group_once_at(rec: dict, batch, groups: int, n: int, version: int) -> None:
    """The step trained ``groups`` distinct groups of n responses each, all generated with weights ``version``."""
    import numpy as np

    assert len(rec["trained_groups"]) == groups == len(set(rec["trained_groups"]))
    uids, counts = np.unique(batch.non_tensor_batch["uid"], return_counts=True)
    assert len(uids) == groups and set(counts) == {n}
    assert set(batch.non_tensor_batch["min_global_steps"]) == {version} == set(batch.non_tensor_batch["max_global_steps"])


def trickled_queue(groups, version, first: int):
    """A queue fed by a thread: the first ``first`` groups one at a time, each put only after the
    trainer took the previous one (so they train before the batch is complete), then the rest."""
    import threading
    import time

    from verl_pipe.core.group_queue import GroupQueue

    q = GroupQueue(weight_version=version)
    ordered = sorted(groups, key=lambda g: g.index)

    def feed():
        for i, g in enumerate(ordered):
            q.put(g)
            deadline = time.monotonic() + 120
            while i < first and len(q.taken) <= i and time.monotonic() < deadline:
                time.sleep(0.01)
        q.close()

    threading.Thread(target=feed, daemon=True, name="trickle").start()
    return q


@contextmanager
def with_estimator(trainer, name: str):
    """algorithm.adv_estimator = name inside the block (the trainer reads it every step)."""
    from omegaconf import open_dict

    algo = trainer.config.algorithm
    before = algo.adv_estimator
    with open_dict(algo):
        algo.adv_estimator = name
    try:
        yield
    finally:
        with open_dict(algo):
            algo.adv_estimator = before


def whitened_estimator_equivalence(session, tmp_path) -> dict:
    """reinforce_plus_plus_baseline on the same responses three ways: sync; CGP group granularity with the
    batch complete from the start (final advantages only); CGP group granularity with unit 0's groups
    trained before the batch is complete (gradient buffers, verl_pipe/trainer/whitening.py)."""
    trainer = session.trainer
    sync, group = trainer_in(trainer, "sync", "minibatch"), trainer_in(trainer, "cgp", "group")

    def runs(groups, version):
        return [("sync", sync, prefilled_queue(groups, version)),
                ("group_complete", group, prefilled_queue(groups, version)),
                ("group_buffered", group, trickled_queue(groups, version, first=trainer.groups_per_unit))]

    with with_estimator(trainer, "reinforce_plus_plus_baseline"):
        return train_same_responses(session, tmp_path, runs)


def check_whitened_equivalence(out: dict, n_groups: int, groups_per_unit: int, rel: float,
                               max_update_deviation: float) -> None:
    """``rel``: allowed relative difference of unit 0's gradient norm between the three runs;
    ``max_update_deviation``: of the step's parameter update, buffered vs batch complete."""
    import numpy as np
    import torch

    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    buffered = out["group_buffered"]
    assert buffered["metrics"]["rolloutpipe/groups_trained_before_batch_complete"] == groups_per_unit
    assert out["group_complete"]["metrics"]["rolloutpipe/groups_trained_before_batch_complete"] == 0
    # the advantages every group was trained with are verl's, over the whole batch, in every run
    for name in ("sync", "group_complete", "group_buffered"):
        b = out[name]["batch"]
        fresh = DataProto.from_dict(tensors={"token_level_rewards": b.batch["token_level_rewards"].clone(),
                                             "response_mask": b.batch["response_mask"]},
                                    non_tensors={"uid": np.array(list(b.non_tensor_batch["uid"]), dtype=object)})
        expected = compute_advantage(fresh, adv_estimator="reinforce_plus_plus_baseline", num_repeat=4)
        torch.testing.assert_close(b.batch["advantages"], expected.batch["advantages"], atol=1e-5, rtol=1e-5,
                                   msg=name)
    norms = {k: out[k]["norms"] for k in ("sync", "group_complete", "group_buffered")}
    print(f"[whitened] unit grad norms: {norms}")
    assert len(norms["sync"]) == n_groups // groups_per_unit
    for name in ("group_complete", "sync"):
        assert norms["group_buffered"][0] == pytest.approx(norms[name][0], rel=rel), name
    deviation = update_deviation(out["group_buffered"]["state"], out["group_complete"]["state"], out["theta_k"])
    print(f"[whitened] |Δθ_buffered - Δθ_complete| / |Δθ_complete| = {deviation:.2e}")
    assert deviation <= max_update_deviation


class KillAtFirstUnit:
    """A subclass of the trainer's schedule executor (``backend_cls``, for one step): SIGKILL a vLLM server process
    the moment unit 0's (short) groups are in, while the long groups still have many decode steps to go (killing
    after unit 0's update instead raced them on a fast machine: CI saw nothing in flight). Records whether the
    actor had stepped past θ_k when the restarted replica got its weights (the restart takes seconds, unit 0's
    training about one): the replica must then be given θ_k from the store, not the actor's weights."""

    def __init__(self, trainer, pid: int):
        self.trainer, self.pid = trainer, pid
        self.killed_at = None
        self.inflight_at_kill = None
        self.pushes: list[bool] = []  # per weight push into a restarted replica: had the actor stepped past θ_k?
        self.updates = 0  # units trained in the step
        kill = self

        class Backend(type(trainer).backend_cls):
            def UnitReady(self, a):
                super().UnitReady(a)
                if a.unit == 0:
                    kill.now()

            def Update(self, a):
                super().Update(a)
                kill.updates += 1

        self.backend_cls = Backend

    def now(self):
        if self.killed_at is None:
            self.inflight_at_kill = self.trainer.rollout._tasks and len(self.trainer.rollout._tasks)
            os.kill(self.pid, signal.SIGKILL)
            self.killed_at = time.perf_counter()

    def pushed(self, replica, version):
        self.pushes.append(self.trainer.actor_seam.stepped)
        return type(self.trainer)._push_weights(self.trainer, replica, version)


@pytest.fixture(scope="module")
def learn_pipe(tmp_path_factory):
    """A live stack of the base config's digit-math task (its SFT warm-start, its reward, its learning settings),
    driven step by step."""
    from verl_pipe.launch.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("ckpt")
    cfg = compose(["trainer.total_training_steps=1000", "trainer.test_freq=-1", "trainer.val_before_train=false",
                   f"trainer.default_local_dir={ckpt}"])
    session = PipeSession(cfg)
    yield session
    session.close()
