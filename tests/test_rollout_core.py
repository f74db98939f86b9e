"""The rollout core (verl_pipe/core/rollout_core.py), pure: hand-written fault sequences, and random event orders
checked against its invariants (every group ends exactly once, no request submitted twice, retries bounded)."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_pipe.core.frontier import FCFSPolicy, FrontierPolicy, Request
from verl_pipe.core.rollout_core import (GROUP_ENDS, Cancel, FailStep, GiveUp, GroupEnded, HandOver, Restart, Retire,
                                         Retry, RolloutCore, Submit, Take, ZeroReward)


def _core(groups=3, n=2, target=3, replicas=(0,), window=None, **kw):
    policy = FCFSPolicy(groups, n, 1, target, list(replicas), window=window)
    return RolloutCore(policy, **kw)


def _sent(actions):
    return [(a.admission.request, a.admission.replica) for a in actions if isinstance(a, Submit)]


def _answer(core, req, replica, trainable=True):
    """A response, and the hand-over's verdict if it completes its group."""
    out = core.response_done(req, replica)
    for a in list(out):
        if isinstance(a, HandOver):
            out += core.handed_over(a.group, trainable)
    return out


def test_a_group_is_handed_over_once_its_n_responses_are_in():
    core = _core(groups=1, target=1)
    assert _sent(core.admit()) == [(Request(0, 0), 0), (Request(0, 1), 0)]
    assert core.response_done(Request(0, 0), 0) == [Take(Request(0, 0))]
    assert core.response_done(Request(0, 1), 0) == [Take(Request(0, 1)), HandOver(0)]
    assert core.handed_over(0, True) == [GroupEnded(0, "trained")]
    assert core.all_done and core.outcomes() == {0: "trained"}
    assert (core.counts.responses, core.counts.groups_done, core.counts.untrainable) == (2, 1, 0)


def test_a_failed_request_is_retried_then_given_up_and_the_step_fails():
    core = _core(groups=1, target=1, max_retries=1)
    core.admit()
    r = Request(0, 0)
    assert core.request_failed(r, 0) == [Retry(r, 1)]
    assert [a.attempt for a in core.admit() if a.admission.request == r] == [1]
    out = core.request_failed(r, 0)
    assert out == [GiveUp(r, 2), FailStep("request_failed", request=r)]
    assert core.failed and core.outcomes() == {0: "failed"} and core.counts.failed_attempts == 2


def test_drop_group_cancels_its_other_requests_and_the_next_group_takes_its_place():
    core = _core(groups=3, target=2, window=2, max_retries=0, on_request_failure="drop_group")
    assert _sent(core.admit()) == [(Request(0, 0), 0), (Request(0, 1), 0)]
    out = core.request_failed(Request(0, 0), 0)
    assert out == [GiveUp(Request(0, 0), 1), Cancel((Request(0, 1),), "group_dropped"), GroupEnded(0, "dropped")]
    assert core.response_done(Request(0, 1), 0) == [], "a cancelled request's answer is stale"
    assert _sent(core.admit()) == [(Request(1, 0), 0), (Request(1, 1), 0)]
    assert core.counts.dropped_groups == 1 and core.outcomes() == {0: "dropped"}


def test_a_group_reward_that_fails_fails_the_step_naming_the_group_and_is_not_retried():
    core = _core(groups=2, n=1, target=2, max_retries=2)
    core.admit()
    assert core.response_done(Request(0, 0), 0) == [Take(Request(0, 0)), HandOver(0)]
    assert core.reward_failed(0) == [FailStep("reward_failed", group=0)]
    assert core.failed and core.counts.reward_failures == 1 and core.counts.failed_attempts == 0
    assert core.outcomes() == {0: "failed", 1: "failed"}


def test_a_response_reward_that_fails_drops_its_group_or_scores_zero():
    core = _core(groups=3, n=2, target=2, window=2, on_reward_failure="drop_group")
    core.admit()
    out = core.reward_failed(0, Request(0, 0), 0)
    assert out == [Cancel((Request(0, 1),), "group_dropped"), GroupEnded(0, "dropped")]
    assert core.reward_failed(0, Request(0, 0), 0) == [], "a stale report"
    assert core.response_done(Request(0, 1), 0) == []
    assert _sent(core.admit()) == [(Request(1, 0), 0), (Request(1, 1), 0)], "the next group takes its place"
    assert (core.counts.reward_failures, core.counts.dropped_groups) == (1, 1)

    core = _core(groups=1, n=2, target=1, on_reward_failure="zero_reward")
    core.admit()
    assert core.reward_failed(0, Request(0, 0), 0) == [ZeroReward(0, Request(0, 0))]
    assert core.response_done(Request(0, 0), 0) == [Take(Request(0, 0))], "still in flight: answered as usual"
    assert core.response_done(Request(0, 1), 0)[-1] == HandOver(0)
    assert core.reward_failed(0) == [ZeroReward(0)]
    assert core.handed_over(0, True) == [GroupEnded(0, "trained")]
    assert core.counts.reward_failures == 2 and core.counts.dropped_groups == 0


def test_zero_reward_without_the_rewards_keys_drops_the_group():
    core = _core(groups=2, n=1, target=1, on_reward_failure="zero_reward")
    core.admit()
    core.response_done(Request(0, 0), 0)
    assert core.reward_failed(0, can_zero=False) == [Cancel((), "group_dropped"), GroupEnded(0, "dropped")]
    with pytest.raises(RuntimeError, match="not handed over"):
        core.reward_failed(0)
    with pytest.raises(ValueError, match="not of group"):
        core.reward_failed(0, Request(1, 0), 0)


def test_a_dead_replica_is_restarted_and_its_requests_requeued_without_using_a_retry():
    core = _core(groups=2, target=2, replicas=(0, 1), max_retries=0)
    sent = dict(_sent(core.admit()))
    on_0 = tuple(q for q, r in sent.items() if r == 0)
    out = core.replica_died(0, restart=True)
    assert out == [Restart(0), Cancel(on_0, "replica_died")]
    assert core.replica_died(0, restart=True) == [], "a second report of the same death is ignored"
    assert core.counts.requeued_requests == len(on_0) and core.counts.replica_failures == 1
    assert {r for _, r in _sent(core.admit())} == {1}, "the dead replica takes nothing until it is back"
    assert core.replica_back(0, ok=True) == []
    assert core.counts.replica_restarts == 1 and 0 in core.policy.replicas
    assert all(core.failures(q) == 0 for q in on_0)


def test_the_last_replica_dying_without_restart_fails_the_step():
    core = _core()
    core.admit()
    assert core.replica_died(0, restart=False) == [FailStep("no_replica_left", replica=0)]
    assert set(core.outcomes().values()) == {"failed"}


def test_without_restart_a_dead_replica_is_retired():
    core = _core(replicas=(0, 1))
    core.admit()
    out = core.replica_died(1, restart=False)
    assert out[0] == Retire(1) and isinstance(out[1], Cancel) and core.policy.replicas == [0]


def test_a_failed_restart_with_no_replica_left_fails_the_step():
    core = _core()
    core.admit()
    core.replica_died(0, restart=True)
    assert core.admit() == []
    assert core.replica_back(0, ok=False) == [FailStep("restart_failed", replica=0)]
    with pytest.raises(RuntimeError, match="not being restarted"):
        core.replica_back(0, ok=True)


def test_a_group_completed_after_the_batch_filled_is_late_and_close_aborts_the_rest():
    core = _core(groups=3, n=1, target=1)
    core.admit()
    assert _answer(core, Request(0, 0), 0)[-1] == GroupEnded(0, "trained")
    assert core.batch_full
    # the real driver takes the rest of its wake-up before closing: a group completed now is late
    assert core.response_done(Request(1, 0), 0) == [Take(Request(1, 0)), GroupEnded(1, "late")]
    assert core.close() == [Cancel((Request(2, 0),), "batch_full")]
    assert core.close() == []
    assert core.response_done(Request(2, 0), 0) == []
    assert core.outcomes() == {0: "trained", 1: "late", 2: "aborted"}
    assert (core.counts.late_groups, core.counts.aborted) == (1, 1)


def test_a_group_still_being_built_when_the_batch_fills_ends_late():
    core = _core(groups=3, n=1, target=1)
    core.admit()
    assert core.response_done(Request(0, 0), 0) == [Take(Request(0, 0)), HandOver(0)]
    assert core.response_done(Request(1, 0), 0) == [Take(Request(1, 0)), HandOver(1)]  # built off the loop, later
    with pytest.raises(RuntimeError, match="not full"):
        core.too_late(1)
    assert core.handed_over(0, True) == [GroupEnded(0, "trained")]
    assert core.batch_full
    with pytest.raises(RuntimeError, match="being handed over"):
        core.close()
    assert core.too_late(1) == [GroupEnded(1, "late")]
    with pytest.raises(RuntimeError, match="not handed over"):
        core.too_late(1)
    core.close()
    assert core.outcomes() == {0: "trained", 1: "late", 2: "aborted"}
    assert core.counts.late_groups == 1 and core.counts.groups_done == 1


def test_submitting_a_request_twice_is_refused():
    class Twice(FCFSPolicy):
        def admit(self):
            out = super().admit()
            return out + out[:1]

    core = RolloutCore(Twice(1, 2, 1, 1, [0]))
    with pytest.raises(RuntimeError, match="admitted while in flight"):
        core.admit()


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="max_retries"):
        _core(max_retries=-1)
    with pytest.raises(ValueError, match="on_request_failure"):
        _core(on_request_failure="ignore")


def test_the_core_is_pure_python():
    code = ("import sys, verl_pipe.core.rollout_core; "
            "print(sorted(m for m in ('asyncio', 'ray', 'torch', 'verl', 'vllm', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- random event orders ------------------------------------------------------------------------------------------

class World:
    """A random driver: requests finish, fail or find their replica dead in any order, restarts finish or fail, and
    the driver closes either the moment the batch fills (the simulator) or after a round of events (the real one)."""

    def __init__(self, core: RolloutCore, rng: random.Random, restart: bool, eager_close: bool):
        self.core, self.rng, self.restart, self.eager_close = core, rng, restart, eager_close
        self.inflight: dict[Request, int] = {}
        self.restarting: set[int] = set()
        self.cancelled: list[tuple[Request, int]] = []  # answers that may still arrive (an abort races them)
        self.ends = Counter()
        self.submits = Counter()
        self.failures = Counter()
        self.requeues = Counter()
        self.done: set[Request] = set()
        self.given_up: set[Request] = set()
        self.failed = False
        self.reward_failures = 0
        self.zeroed: set[int] = set()  # groups a ZeroReward was given for

    def do(self, actions) -> None:
        core = self.core
        for a in actions:
            if isinstance(a, Submit):
                q = a.admission.request
                assert q not in self.inflight and q not in self.done, f"{q} submitted twice"
                assert q not in self.given_up, f"{q} resubmitted after its last failure"
                assert q.group not in self.ends, f"{q} submitted after its group ended"
                assert a.attempt == self.failures[q] <= core.max_retries
                assert a.admission.replica in core.policy.replicas
                self.inflight[q] = a.admission.replica
                self.submits[q] += 1
            elif isinstance(a, Take):
                assert a.request not in self.done
                self.done.add(a.request)
            elif isinstance(a, Cancel):
                for q in a.requests:
                    self.requeues[q] += a.why == "replica_died"
                    if q in self.inflight:
                        self.cancelled.append((q, self.inflight.pop(q)))
            elif isinstance(a, GroupEnded):
                assert a.how in GROUP_ENDS
                self.ends[a.group] += 1
                assert self.ends[a.group] == 1, f"group {a.group} ended twice"
            elif isinstance(a, HandOver):
                if self.rng.random() < 0.1:  # the group's reward raised or timed out
                    self.reward_failures += 1
                    out = core.reward_failed(a.group)
                    self.do(out)
                    if not (out and isinstance(out[0], ZeroReward)):
                        continue
                self.do(core.handed_over(a.group, self.rng.random() < 0.7))
                if self.eager_close:
                    self.do(core.close())
            elif isinstance(a, ZeroReward):
                assert core.on_reward_failure == "zero_reward"
                self.zeroed.add(a.group)
            elif isinstance(a, Restart):
                assert a.replica not in self.restarting
                self.restarting.add(a.replica)
            elif isinstance(a, GiveUp):
                assert a.attempt == core.max_retries + 1
                self.given_up.add(a.request)
            elif isinstance(a, FailStep):
                self.failed = True
            else:
                assert isinstance(a, (Retry, Retire)), a

    def event(self) -> None:
        core, rng = self.core, self.rng
        roll = rng.random()
        if self.cancelled and roll < 0.05:  # a stale answer: the request was cancelled (closed or requeued) before
            q, r = self.cancelled.pop(rng.randrange(len(self.cancelled)))
            if q not in self.inflight:  # (resubmitted, possibly to the same replica once restarted: not stale)
                assert core.response_done(q, r) == [] and core.request_failed(q, r) == []
            return
        if self.restarting and (roll < 0.15 or not self.inflight):
            r = rng.choice(sorted(self.restarting))
            self.restarting.remove(r)
            self.do(core.replica_back(r, ok=rng.random() < 0.8))
            return
        q = rng.choice(sorted(self.inflight))
        r = self.inflight[q]
        if roll < 0.3:
            del self.inflight[q]
            self.failures[q] += 1
            self.do(core.request_failed(q, r))
        elif roll < 0.36:
            del self.inflight[q]
            self.do(core.replica_died(r, self.restart))
        elif roll < 0.40:  # its own reward raised or timed out
            del self.inflight[q]
            self.reward_failures += 1
            out = core.reward_failed(q.group, q, r)
            self.do(out)
            if out and isinstance(out[0], ZeroReward):
                self.inflight[q] = r  # still in flight: it answers next
        else:
            del self.inflight[q]
            self.do(core.response_done(q, r))

    def run(self) -> None:
        core = self.core
        self.do(core.admit())
        for _ in range(20_000):
            if self.failed or core.all_done or not (self.inflight or self.restarting):
                break
            for _ in range(self.rng.randint(1, 4)):  # one wake-up of the driver
                if self.failed or not (self.inflight or self.restarting):
                    break
                self.event()
            if self.failed:
                break
            if core.batch_full:
                self.do(core.close())
            self.do(core.admit())


@settings(max_examples=300, deadline=None)
@given(groups=st.integers(1, 8), n=st.integers(1, 3), replicas=st.integers(1, 3), extra=st.integers(0, 3),
       window=st.sampled_from([None, 1, 2, 5]), fgd=st.booleans(), max_retries=st.integers(0, 2),
       on_failure=st.sampled_from(["fail", "drop_group"]), restart=st.booleans(), eager_close=st.booleans(),
       on_reward=st.sampled_from(["fail", "zero_reward", "drop_group"]), seed=st.integers(0, 10**6))
def test_random_event_orders(groups, n, replicas, extra, window, fgd, max_retries, on_failure, restart, eager_close,
                             on_reward, seed):
    target = max(1, groups - extra)
    cls = FrontierPolicy if fgd else FCFSPolicy
    policy = cls(groups, n, 1, target, list(range(replicas)), window=window)
    core = RolloutCore(policy, max_retries=max_retries, on_request_failure=on_failure, on_reward_failure=on_reward)
    world = World(core, random.Random(seed), restart, eager_close)
    world.run()

    outcomes = core.outcomes()
    assert world.failed or core.all_done, "the step ends: failed, batch full, or every group completed"
    assert sorted(outcomes) == list(range(groups)), "every group ended"
    assert all(c == 1 for c in world.ends.values()), "and exactly once"
    for g, how in outcomes.items():  # by an event of its own (a GroupEnded), or with the step (closed, failed)
        assert world.ends[g] == (how in ("trained", "untrainable", "late", "dropped"))
    # retries bounded: at most max_retries + 1 failures per request, no submission after the last one
    assert all(f <= max_retries + 1 for f in world.failures.values())
    assert all(world.submits[q] <= 1 + min(world.failures[q], max_retries) + world.requeues[q] for q in world.submits)
    if on_failure == "drop_group":
        assert {q.group for q in world.given_up} <= {g for g, how in outcomes.items() if how == "dropped"}
    if not world.failed:  # nothing left in flight once the step is over
        assert core.inflight_count() == 0 and not world.inflight
    # the counters say what the events said
    how = Counter(outcomes.values())
    c = core.counts
    assert c.groups_done == how["trained"] + how["untrainable"] and c.untrainable == how["untrainable"]
    assert (c.late_groups, c.dropped_groups) == (how["late"], how["dropped"])
    assert c.failed_attempts == sum(world.failures.values()) and c.responses == len(world.done)
    assert c.reward_failures <= world.reward_failures  # a stale report is not counted
    if on_reward == "zero_reward":
        dropped_by_requests = len({q.group for q in world.given_up}) if on_failure == "drop_group" else 0
        assert c.dropped_groups == dropped_by_requests, "a reward failure drops nothing"
    elif on_reward == "fail" and c.reward_failures:
        assert world.failed
    assert how["trained"] <= target and set(core.policy.trained_groups()) <= {g for g, h in outcomes.items()
                                                                               if h == "trained"}
    if eager_close:  # the simulator's timing: nothing completes after the batch is full
        assert how["late"] == 0
