"""The worked extension example (recipes/extension_example/, recipe tiny_cpu_extension_example): the recipe
composes and selects the example, verl loads its trainer class and reward the way a run does, and the
example's filter, admission priority and reward logic -- pure, no Ray. tests/e2e/test_zz_dapo.py runs it."""

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl import DataProto

from verl_pipe.config import validate
from verl_pipe.core.frontier import FCFSPolicy, FrontierPolicy, Request
from verl_pipe.core.admission import DEFAULT_FGD_POLICY, TrainerRatio
from verl_pipe.core.lengths import LengthHistory
from verl_pipe.launch.session import compose

RECIPE = "tiny_cpu_extension_example"


@pytest.fixture(scope="module")
def cfg():
    return compose([], config_name=RECIPE)


# --- the recipe ------------------------------------------------------------------------------------------------

def test_recipe_selects_the_example_and_is_dapo_style(cfg):
    validate(cfg.copy(), check_paths=False)
    rp, actor = cfg.rolloutpipe, cfg.actor_rollout_ref.actor
    assert rp.trainer_class == "verl_pipe.recipes.extension_example.trainer.ExampleTrainer"
    assert rp.mode == "cgp" and rp.fgd.enable and cfg.actor_rollout_ref.rollout.scheduling_policy == "priority"
    assert rp.filter_zero_variance and rp.oversample > 0
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert cfg.algorithm.adv_estimator == "grpo"
    assert rp.platform == "cpu" and rp.tiny_assets.enable


def test_trainer_class_loads_as_task_runner_loads_it(cfg):
    from verl.utils.import_utils import load_class_from_fqn

    from verl_pipe.recipes.extension_example.trainer import ExampleTrainer
    from verl_pipe.trainer import RolloutPipeTrainer

    cls = load_class_from_fqn(cfg.rolloutpipe.trainer_class, "rolloutpipe.trainer_class")
    assert cls is ExampleTrainer and issubclass(cls, RolloutPipeTrainer)


def test_reward_loads_through_verls_custom_reward_function(cfg):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(cfg)
    assert fn(data_source="d", solution_str="4 + 3 = 7. Answer: 7", ground_truth="7")["score"] == 1.0
    assert fn(data_source="d", solution_str="maybe 3. Answer: 3", ground_truth="7")["score"] == 0.25
    # verl's reward_kwargs reach the function
    with_kwargs = compose(["+reward.custom_reward_function.reward_kwargs.format_credit=0.5"], config_name=RECIPE)
    assert get_custom_reward_fn(with_kwargs)(data_source="d", solution_str="Answer: 3", ground_truth="7")["score"] == 0.5


# --- the reward ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("Answer: 7", {"score": 1.0, "exact": True, "has_number": True}),
    ("so 7 then 2. Answer: 2", {"score": 0.25, "exact": False, "has_number": True}),
    ("17 and 70", {"score": 0.25, "exact": False, "has_number": True}),
    ("seven", {"score": 0.0, "exact": False, "has_number": False}),
    (None, {"score": 0.0, "exact": False, "has_number": False}),
])
def test_correctness_plus_format_credit(text, expected):
    from verl_pipe.recipes.extension_example.reward import compute_score

    assert compute_score("verl_pipe/digit_math", text, "7") == expected


# --- the filter ------------------------------------------------------------------------------------------------

def _piece(scores, index=3):
    n, length = len(scores), 4
    tls = torch.zeros(n, length)
    tls[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return DataProto.from_dict(tensors={"token_level_scores": tls},
                               non_tensors={"extra_info": np.array([{"index": index}] * n, dtype=object)})


def _bare_trainer(**attrs):
    from verl_pipe.recipes.extension_example.trainer import ExampleTrainer

    t = ExampleTrainer.__new__(ExampleTrainer)  # no workers: only the attributes the hooks read
    t.filter_zero_variance, t.prompt_history, t.last_policy = True, {}, None
    for k, v in attrs.items():
        setattr(t, k, v)
    return t


def test_filter_needs_variance_and_a_minimum_spread():
    t = _bare_trainer()
    assert t.min_reward_spread == 0.1
    assert t.group_is_trainable(0, _piece([0.25, 0.25, 0.25, 0.25], index=1)) is False  # zero variance (default)
    assert t.group_is_trainable(1, _piece([0.0, 0.05, 0.0, 0.0], index=2)) is False  # spread 0.05 < 0.1
    assert t.group_is_trainable(2, _piece([0.0, 0.25, 0.0, 0.0], index=3)) is True
    assert t.prompt_history == {1: False, 2: False, 3: True}
    # the default alone keeps the small-spread group: the example is stricter
    from verl_pipe.rollout.materialize import is_trainable

    assert is_trainable(_piece([0.0, 0.05, 0.0, 0.0]), True)
    # a stricter threshold (a subclass of the example) trains only groups with a right answer
    strict = _bare_trainer(min_reward_spread=0.5)
    assert not strict.group_is_trainable(0, _piece([0.0, 0.25, 0.0, 0.0]))
    assert strict.group_is_trainable(0, _piece([0.0, 0.25, 1.0, 0.0]))
    # both checks off: everything trains
    loose = _bare_trainer(filter_zero_variance=False, min_reward_spread=0.0)
    assert loose.group_is_trainable(0, _piece([1.0, 1.0]))


def test_prompt_keys_and_deferred_groups():
    from verl_pipe.recipes.extension_example.trainer import deferred_groups, prompt_key

    assert prompt_key({"index": 4, "split": "train"}) == 4
    assert prompt_key({}) is None and prompt_key(None) is None
    assert deferred_groups([10, 11, None, 13, 14], {10: False, 11: True, 13: False}) == [0, 3]


# --- the admission priority ------------------------------------------------------------------------------------

def _policy_trainer(cfg, history=None):
    t = _bare_trainer(config=cfg, prompt_history=dict(history or {}))
    t.rollout = SimpleNamespace(num_replicas=2, live_replicas=lambda: [0, 1])
    t.n, t.groups_per_unit = 4, 2
    t.length_history, t.epoch, t.global_steps, t.trainer_ratio = LengthHistory(), 0, 1, TrainerRatio()
    return t


def _knobs(cfg, fgd=True):
    from verl_pipe.trainer.knobs import step_knobs

    return step_knobs(cfg, fgd=fgd, fgd_window=8, baseline_window=None, baseline_order="group_major")


def _step_batch(keys):
    return DataProto.from_dict(tensors={"input_ids": torch.zeros(len(keys), 2, dtype=torch.long)},
                               non_tensors={"extra_info": np.array([{"index": k} for k in keys], dtype=object)})


def test_make_policy_keeps_the_configured_policy_and_adds_deferral(cfg):
    from verl_pipe.recipes.extension_example.trainer import DeferringFrontierPolicy

    keys = [100 + g for g in range(24)]  # train_batch_size 16 + 8 oversampled
    t, knobs = _policy_trainer(cfg, history={101: False, 104: False, 105: True}), _knobs(cfg)
    p = t._make_policy(24, _step_batch(keys), knobs)
    assert isinstance(p, DeferringFrontierPolicy) and t.last_policy is p
    assert p.deferred == {1, 4}
    assert cfg.rolloutpipe.fgd.policy == "verl_pipe.recipes.extension_example.trainer:DeferringFrontierPolicy"
    # what RolloutPipeTrainer builds from the same config with the default policy
    t.admission_kwargs = lambda batch, knobs: {}
    base = t._make_policy(24, _step_batch(keys), knobs.replace(fgd_policy=DEFAULT_FGD_POLICY))
    assert type(base) is FrontierPolicy and issubclass(DeferringFrontierPolicy, FrontierPolicy)
    for attr in ("num_groups", "n", "groups_per_unit", "target_groups", "replicas", "window",
                 "frontier_groups", "affinity"):
        assert getattr(p, attr) == getattr(base, attr), attr
    del t.admission_kwargs
    # no batch (or no prompt keys): nothing deferred
    assert t._make_policy(16, None, knobs).deferred == frozenset()
    # without FGD the example leaves the baseline alone
    fcfs = _policy_trainer(cfg, history={101: False})._make_policy(24, _step_batch(keys), _knobs(cfg, fgd=False))
    assert type(fcfs) is FCFSPolicy


def _deferring(deferred, num_groups=6, n=2, window=2, replicas=(0,), target=None):
    from verl_pipe.recipes.extension_example.trainer import DeferringFrontierPolicy

    return DeferringFrontierPolicy(num_groups=num_groups, n=n, groups_per_unit=1, replicas=list(replicas),
                                   target_groups=target or num_groups, window=window, deferred=deferred)


def _finish(p, g, trainable=True):
    for i in range(p.n):
        p.on_response_done(Request(g, i))
    p.on_group_done(g, trainable)


def test_deferred_groups_go_last_with_lower_vllm_priority():
    p = _deferring([0, 2], num_groups=5, n=2, window=2)
    first = p.admit()
    assert [a.request for a in first] == [Request(1, 0), Request(1, 1)]
    assert [a.priority for a in first] == [1, 1]
    _finish(p, 1)
    assert [a.request.group for a in p.admit()] == [3, 3]
    _finish(p, 3)
    assert [a.request.group for a in p.admit()] == [4, 4]
    _finish(p, 4)
    # nothing else is pending: the deferred groups are released, in rank order, priority rank + num_groups
    adms = p.admit()
    assert [(a.request.group, a.priority) for a in adms] == [(0, 5), (0, 5)]
    _finish(p, 0)
    assert [(a.request.group, a.priority) for a in p.admit()] == [(2, 7), (2, 7)]
    _finish(p, 2)
    assert p.admission_order == [1, 3, 4, 0, 2] and p.all_done
    assert p.stats()["deferred_groups"] == 2 and p.stats()["deferred_admitted"] == 2


def test_deferred_groups_are_the_leftovers_once_the_batch_is_full():
    p = _deferring([0, 1], num_groups=6, n=2, window=None, target=3)
    adms = p.admit()  # unbounded window: everything at once, vLLM's priorities order it
    assert [a.request.group for a in adms] == [2, 2, 3, 3, 4, 4, 5, 5, 0, 0, 1, 1]
    assert min(a.priority for a in adms if a.request.group in (0, 1)) > max(
        a.priority for a in adms if a.request.group not in (0, 1))
    for g in (2, 3, 4):
        _finish(p, g)
    assert p.batch_full and p.trained_groups() == [2, 3, 4]
    assert {q.group for q in p.to_abort()} == {0, 1, 5}


def test_a_failed_deferred_request_waits_again_and_closed_ones_are_skipped():
    p = _deferring([0], num_groups=3, n=2, window=2, target=2)
    assert [a.request.group for a in p.admit()] == [1, 1]
    _finish(p, 1)
    assert [a.request.group for a in p.admit()] == [2, 2]
    p.on_response_done(Request(2, 0))
    assert [a.request for a in p.admit()] == [Request(0, 0)]  # only group 0 left: released
    p.on_request_failed(Request(0, 0))  # back to pending: held again, behind the already released (0, 1)
    assert [a.request for a in p.admit()] == [Request(0, 1)]
    p.on_response_done(Request(2, 1))
    p.on_group_done(2, True)
    assert p.batch_full and p.admit() == []  # the held (0, 0) was closed with the batch, never re-admitted
    assert p.stats()["dropped"] == 1


@pytest.mark.parametrize("seed", range(20))
def test_random_drive_keeps_every_invariant(seed):
    """Random completions, retried failures, dropped groups and trainability: each request is admitted while
    pending only, windows hold, admission is work-conserving, and no deferred group starts while a
    non-deferred one waits."""
    rng = random.Random(seed)
    num_groups, n = rng.randint(2, 9), rng.randint(1, 4)
    deferred = set(rng.sample(range(num_groups), rng.randint(0, num_groups)))
    window = rng.choice([None, 1, 2, 3, 5])
    replicas = list(range(rng.randint(1, 3)))
    p = _deferring(deferred, num_groups=num_groups, n=n, window=window, replicas=replicas,
                   target=rng.randint(1, num_groups))
    inflight, done = set(), {g: 0 for g in range(num_groups)}
    for _ in range(2000):
        for a in p.admit():
            assert a.request not in inflight
            inflight.add(a.request)
            assert a.priority == a.request.group + (num_groups if a.request.group in deferred else 0)
        if window is not None:
            assert all(p.inflight_count(r) <= window for r in p.replicas)
        if p.pending_count and not p.all_done:
            assert window is not None and all(p.inflight_count(r) == window for r in p.replicas), "work-conserving"
        if p.all_done or not inflight:
            break
        req = rng.choice(sorted(inflight))
        roll = rng.random()
        if roll < 0.05:  # a request failed for good: its group is dropped (the rollout's drop-or-fail)
            closed = p.drop_group(req.group)
            assert req in closed
            inflight.difference_update(closed)
            continue
        inflight.discard(req)
        if roll < 0.2:
            p.on_request_failed(req)
            continue
        p.on_response_done(req)
        done[req.group] += 1
        if done[req.group] == n:
            p.on_group_done(req.group, rng.random() < 0.6)
    assert p.all_done
    order = p.admission_order
    regular = [g for g in order if g not in deferred]
    first_deferred = next((i for i, g in enumerate(order) if g in deferred), len(order))
    assert all(g not in deferred for g in order[:first_deferred]) and len(order[:first_deferred]) == len(regular), \
        f"a deferred group started before a regular one: {order} (deferred {sorted(deferred)})"


# --- the estimator (registered with verl and with verl_pipe.estimators) ----------------------------------------

def test_example_estimator_is_registered_with_verl_and_streams(cfg):
    from verl.trainer.ppo import core_algos

    from verl_pipe import estimators
    from verl_pipe.config import ConfigError
    from verl_pipe.recipes.extension_example.estimator import NAME, compute_grpo_median_advantage

    assert core_algos.get_adv_estimator_fn(NAME) is compute_grpo_median_advantage
    assert estimators.streaming(NAME) == estimators.GROUP
    # the recipe's trainer class carries the registration: CGP accepts it at either granularity
    for granularity in ("minibatch", "group"):
        validate(compose([f"algorithm.adv_estimator={NAME}", f"rolloutpipe.cgp.granularity={granularity}"],
                         config_name=RECIPE), check_paths=False)
    # re-declaring it with another streaming kind is refused
    with pytest.raises(ValueError, match="already registered"):
        estimators.register_streaming(NAME, how="batch")
    # an unregistered name is refused with the way to register it
    with pytest.raises(ConfigError, match="register_streaming"):
        validate(compose(["algorithm.adv_estimator=not_registered_anywhere"], config_name=RECIPE), check_paths=False)


def test_example_estimator_values_through_verls_compute_advantage():
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from verl_pipe.recipes.extension_example.estimator import NAME

    scores = torch.tensor([1.0, 0.0, 0.25, 0.0, 1.0, 1.0])
    mask = torch.tensor([[1, 1, 0]] * 6, dtype=torch.float32)
    rewards = torch.zeros(6, 3)
    rewards[:, 1] = scores
    uid = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": uid})
    adv = compute_advantage(data, adv_estimator=NAME, num_repeat=3).batch["advantages"]
    expected = torch.tensor([0.75, -0.25, 0.0, -1.0, 0.0, 0.0]).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected)


def test_estimator_registry_builtins_and_cgp_problems():
    from verl_pipe import estimators
    from verl_pipe.config import cgp_estimator_problem

    assert {"grpo", "rloo", "grpo_passk", "opo"} <= set(estimators.registered(estimators.GROUP))
    assert estimators.registered(estimators.AFFINE_BATCH) == ("reinforce_plus_plus_baseline",)
    assert cgp_estimator_problem("grpo", "minibatch") is None
    assert cgp_estimator_problem("reinforce_plus_plus_baseline", "group") is None
    assert "granularity=group" in cgp_estimator_problem("reinforce_plus_plus_baseline", "minibatch")
    assert "mode=sync" in cgp_estimator_problem("gpg", "group")
    with pytest.raises(ValueError, match="how must be one of"):
        estimators.register_streaming("x", how="sometimes")
