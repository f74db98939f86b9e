import pytest

# A long-tailed, group-correlated response-length workload: groups finish at different
# times, so a pipelined trainer has something to overlap with.
LONGTAIL = {"kind": "lognormal", "median": 12, "sigma": 0.8, "rho": 0.7, "cap": 32, "seed": 0}

PARTIAL_CREDIT_REWARD = ["reward.custom_reward_function.path=pkg://recipes.extension_example.reward",
                         "reward.custom_reward_function.name=compute_score"]

E2E_OVERRIDES = [
    "trainer.total_training_steps=1000",  # steps are driven one by one
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
    from verl_pipe.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("ckpt")
    # The worked example's reward (1 right, 0.25 a wrong number, 0 none): the tiny model's 0/1 digit-math reward
    # is so sparse (~3%) that a step often has no signal at all, and these tests need the actor to move.
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
