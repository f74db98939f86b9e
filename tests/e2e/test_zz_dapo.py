"""A DAPO-style CGP + FGD step on the real stack, run by the worked extension example.

The recipe tiny_cpu_extension_example (recipes/extension_example/): ExampleTrainer (custom trainability
filter, deferring admission policy), its reward (correctness + format credit) through verl's custom_reward_function,
clip-higher (0.2 / 0.28), token-mean loss, the zero-variance filter and oversampling (8 extra prompts).
The tiny model's 0/1 reward is rarely right before training (the random-initialised model: 1 of 128 sampled, kept in
docs/bench/logs), so nearly every group would be zero-variance; the example reward's format credit (0.25 for a
response with a number) gives most groups reward variance (8 of 10 completed groups in the run docs/extending.md
quotes). Its own stack (a
different trainer class and reward), after the shared modules are torn down.

The stack also has an LR warmup (recipes/qwen3_1p7b_dapo_math_4x4.yaml has one: 10 steps, 4 units a step): the LR
schedule steps once per training step in every mode, as verl's (its last mini-batch steps it), not once per unit.
"""

import math

import numpy as np
import pytest
import torch

from tests.e2e.conftest import E2E_OVERRIDES

pytestmark = pytest.mark.e2e

RECIPE = "tiny_cpu_extension_example"
N = 4
TRAIN_BATCH = 8
GROUPS_PER_UNIT = 4
OVERSAMPLE = 8  # the recipe's
DEFERRED = [0, 1, 2, 3]
WARMUP = 8  # LR warmup steps: verl's constant schedule with warmup, lr = optim.lr * min(1, k / WARMUP) after k steps


@pytest.fixture(scope="module")
def dapo_pipe(tmp_path_factory):
    from verl_pipe.launch.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("ckpt_dapo")
    # n=4, 8 prompts per batch, units of 4 (E2E_OVERRIDES); a window of one unit's requests (4 groups x 4)
    cfg = compose(E2E_OVERRIDES + [f"trainer.default_local_dir={ckpt}", "rolloutpipe.fgd.window=16",
                                   f"actor_rollout_ref.actor.optim.lr_warmup_steps={WARMUP}"],
                  config_name=RECIPE)
    session = PipeSession(cfg)
    print(f"dapo stack ready in {session.startup_s:.1f}s")
    yield session
    session.close()


def test_dapo_step_with_the_extension_example(dapo_pipe):
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from verl_pipe.recipes.extension_example.trainer import DeferringFrontierPolicy, ExampleTrainer, prompt_key

    pipe = dapo_pipe
    trainer = pipe.trainer
    assert type(trainer) is ExampleTrainer, "rolloutpipe.trainer_class selected the example"
    actor = trainer.config.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    knobs = trainer.configured_knobs
    assert knobs.mode == "cgp" and knobs.fgd and trainer.filter_zero_variance
    assert trainer.config.data.gen_batch_size == TRAIN_BATCH + OVERSAMPLE

    batch_dict = next(pipe._batches)
    keys = [prompt_key(e) for e in batch_dict["extra_info"]]
    num_groups = TRAIN_BATCH + OVERSAMPLE
    assert len(keys) == num_groups and None not in keys, "the loader yields the oversampled prompts"
    # The example's admission priority: prompts untrainable last time go last. Say it of the first four.
    trainer.prompt_history.update({keys[g]: False for g in DEFERRED})
    version = trainer.global_steps - 1  # θ_k of this step

    rec = pipe.step(batch_dict=batch_dict)

    # ---- admission: the deferred groups started only after every other group had
    policy = trainer.last_policy
    assert isinstance(policy, DeferringFrontierPolicy) and policy.deferred == set(DEFERRED)
    order = policy.admission_order
    first_deferred = next((i for i, g in enumerate(order) if g in policy.deferred), len(order))
    assert all(g in policy.deferred for g in order[first_deferred:]), order
    assert set(order[:first_deferred]) == set(range(num_groups)) - policy.deferred or first_deferred == len(order)

    # ---- how many groups trained: train_batch_size, or all trainable ones (a short last unit)
    trained = rec["trained_groups"]
    m = rec["metrics"]
    tm = rec["timeline"]
    assert trained, "no group had reward variance: the format credit should give most of them some"
    assert len(set(trained)) == len(trained) <= TRAIN_BATCH
    if len(trained) < TRAIN_BATCH:  # the pool ran out: every group completed, the untrainable ones dropped
        assert m["rolloutpipe/untrainable_groups"] == num_groups - len(trained)
        assert m["rolloutpipe/aborted_requests"] == 0
    units = [u["groups"] for u in trainer.timelines[-1].to_dict()["units_ready"]]
    assert [len(u) for u in units] == [min(GROUPS_PER_UNIT, len(trained) - i)
                                       for i in range(0, len(trained), GROUPS_PER_UNIT)]
    assert tm["num_units"] == math.ceil(len(trained) / GROUPS_PER_UNIT) == len(trainer.last_outcome.unit_metrics)
    assert tm["num_trainable_groups"] == len(trained)

    # ---- the trained groups: n responses each, all with reward variance (the custom filter's spread)
    batch = trainer.last_outcome.batch
    assert len(batch) == len(trained) * N
    scores = batch.batch["token_level_scores"].sum(-1)
    assert set(scores.tolist()) <= {0.0, 0.25, 1.0}, "the example's reward: correct 1, a number 0.25, else 0"
    assert {"exact", "has_number"} <= set(batch.non_tensor_batch), "the reward's extra info is kept per response"
    uids = batch.non_tensor_batch["uid"]
    for uid in np.unique(uids):
        group_scores = scores[torch.from_numpy(uids == uid)]
        assert len(group_scores) == N
        assert group_scores.var() > 0 and group_scores.max() - group_scores.min() >= trainer.min_reward_spread
    # the example recorded every trained prompt as trainable (its history for the next visit)
    assert all(trainer.prompt_history[keys[g]] is True for g in trained)

    # ---- exactly on-policy: every sample generated with θ_k
    assert set(batch.non_tensor_batch["min_global_steps"]) == {version}
    assert set(batch.non_tensor_batch["max_global_steps"]) == {version}

    # ---- per-group advantages equal verl's whole-batch compute_advantage on the same rewards
    algo = trainer.config.algorithm
    fresh = DataProto.from_dict(
        tensors={"token_level_rewards": batch.batch["token_level_rewards"].clone(),
                 "response_mask": batch.batch["response_mask"].clone()},
        non_tensors={"uid": uids})
    expected = compute_advantage(fresh, adv_estimator=algo.adv_estimator, num_repeat=N, config=algo,
                                 norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True))
    torch.testing.assert_close(batch.batch["advantages"], expected.batch["advantages"], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(batch.batch["old_log_probs"]).all()

    print(f"dapo step: {len(trained)}/{TRAIN_BATCH} groups trained in {tm['num_units']} units, "
          f"{m['rolloutpipe/untrainable_groups']} untrainable, {m['rolloutpipe/aborted_requests']} requests "
          f"aborted, admission order {order}, reward mean {float(scores.mean()):.3f}, "
          f"step {tm['step_time_s']:.2f}s (rollout {tm['rollout_end_s']:.2f}s, "
          f"rollout→train end {tm['rollout_to_train_end_s']:.2f}s)")


def test_lr_schedule_steps_once_per_step_in_every_mode(dapo_pipe):
    """Each step is 2 units (an optimizer step each) or fewer (the zero-variance filter: a short last unit, or the
    pool runs out at a unit boundary, when the scheduler steps after the last unit). verl's scheduler steps once per
    step; ours did once per unit, so the warmup ran twice as fast. After k steps that trained, the scheduler has
    stepped k times and ``actor/lr`` is verl's schedule at k (the LR after the step's scheduler step)."""
    trainer = dapo_pipe.trainer
    lr = float(trainer.config.actor_rollout_ref.actor.optim.lr)
    state = trainer.actor_wg.lr_schedule_state()[0]
    assert state["steps"] == trainer.global_steps - 1, "every earlier step of this stack trained, each stepped once"
    steps = state["steps"]
    # sync, group granularity, then back to the recipe's mini-batch CGP (the knobs stay for later steps)
    for knobs in (dict(mode="sync"), dict(mode="cgp", granularity="group"), dict(mode="cgp", granularity="minibatch")):
        rec = dapo_pipe.step(**knobs)
        units = len(trainer.last_outcome.unit_metrics)
        steps += 1 if units else 0  # a step that trained no group takes no optimizer step
        state = trainer.actor_wg.lr_schedule_state()[0]
        print(f"[lr] {knobs}: {units} units, scheduler steps {state['steps']}, lr {state['lr']!r}, "
              f"actor/lr {rec['metrics'].get('actor/lr')!r}")
        assert state["steps"] == steps, (knobs, units)
        assert state["lr"] == pytest.approx(lr * min(1.0, steps / WARMUP), rel=1e-9, abs=0.0)
        if units:
            assert rec["metrics"]["actor/lr"] == state["lr"], "the LR after the step's scheduler step"
