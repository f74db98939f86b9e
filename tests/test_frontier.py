"""Tests of the admission policies (verl_pipe.core.frontier): pure logic, so a random driver checks the invariants."""

import random
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_pipe.core.frontier import (ADAPTIVE_BURST_FACTOR, Admission, AdaptiveWindow, FCFSPolicy, FrontierPolicy,
                                     Request, auto_frontier, resolve_window)
from verl_pipe.core.lengths import Prediction, StepLengths


def finish_group(policy, g, trainable=True, replica=None):
    for i in range(policy.n):
        policy.on_response_done(Request(g, i), replica)
    policy.on_group_done(g, trainable)


def by_replica(adms):
    out = defaultdict(list)
    for a in adms:
        out[a.replica].append(a.request)
    return dict(out)


# --- frontier ---------------------------------------------------------------------------------------------------

def test_frontier_advances_and_priority_is_rank():
    p = FrontierPolicy(num_groups=6, n=2, groups_per_unit=2, target_groups=4, replicas=[0], window=4)
    adms = p.admit()
    assert [a.request for a in adms] == [Request(0, 0), Request(0, 1), Request(1, 0), Request(1, 1)]
    assert [a.priority for a in adms] == [0, 0, 1, 1]
    assert p.frontier() == [0, 1]
    finish_group(p, 1)  # out of order: the frontier keeps group 0 and takes the next group in
    assert p.frontier() == [0, 2]
    assert [a.request.group for a in p.admit()] == [2, 2]
    assert p.stats()["spill_admissions"] == 0


def test_untrainable_group_is_replaced_by_the_next():
    p = FrontierPolicy(num_groups=5, n=1, groups_per_unit=1, target_groups=2, replicas=[0], window=1)
    assert [a.request for a in p.admit()] == [Request(0, 0)]
    finish_group(p, 0, trainable=False)
    assert p.frontier() == [1]
    assert [a.request for a in p.admit()] == [Request(1, 0)]
    finish_group(p, 1)
    assert not p.batch_full
    p.admit()
    finish_group(p, 2)
    assert p.batch_full and p.trained_groups() == [1, 2]
    assert p.stats()["untrainable_groups_done"] == 1


def test_spill_counts_work_beyond_a_small_frontier():
    # Windows hold 4 groups, the frontier 1: three groups' worth of slots are filled beyond it.
    p = FrontierPolicy(num_groups=8, n=2, groups_per_unit=1, target_groups=4, replicas=[0, 1], window=4)
    assert len(p.admit()) == 8
    assert p.stats()["spill_admissions"] == 6
    assert auto_frontier(groups_per_unit=1, n=2, window=4, num_replicas=2) == 4
    assert auto_frontier(groups_per_unit=8, n=2, window=4, num_replicas=2) == 8
    assert auto_frontier(groups_per_unit=3, n=2, window=None, num_replicas=2) == 3


# --- replicas, affinity, windows ---------------------------------------------------------------------------------

def test_affinity_pins_each_group_to_one_replica():
    p = FrontierPolicy(num_groups=6, n=4, groups_per_unit=2, target_groups=4, replicas=[0, 1], window=4)
    assert by_replica(p.admit()) == {0: [Request(0, i) for i in range(4)], 1: [Request(1, i) for i in range(4)]}
    p.on_response_done(Request(1, 0))
    # group 2 is pinned where the slot freed; the rest of it waits for that replica, not for replica 0
    assert by_replica(p.admit()) == {1: [Request(2, 0)]}
    p.on_response_done(Request(0, 0))
    p.on_response_done(Request(1, 1))
    assert by_replica(p.admit()) == {0: [Request(3, 0)], 1: [Request(2, 1)]}


def test_affinity_pin_prefers_most_room():
    p = FrontierPolicy(num_groups=4, n=2, groups_per_unit=1, target_groups=2, replicas=[0, 1, 2], window=3)
    assert by_replica(p.admit()) == {0: [Request(0, 0), Request(0, 1), Request(3, 0)],
                                     1: [Request(1, 0), Request(1, 1), Request(3, 1)],
                                     2: [Request(2, 0), Request(2, 1)]}
    assert p.stats()["split_admissions"] == 1  # group 3 at the tail: split rather than idle replica 0's slot


def test_affinity_never_splits_with_unbounded_windows():
    p = FrontierPolicy(num_groups=5, n=3, groups_per_unit=1, target_groups=5, replicas=[0, 1], window=None)
    adms = p.admit()
    assert len(adms) == 15
    homes = defaultdict(set)
    for a in adms:
        homes[a.request.group].add(a.replica)
    assert all(len(h) == 1 for h in homes.values())
    assert [min(h) for g, h in sorted(homes.items())] == [0, 1, 0, 1, 0]


def test_fcfs_splits_a_group_least_loaded():
    p = FCFSPolicy(num_groups=2, n=4, groups_per_unit=1, target_groups=2, replicas=[3, 1])
    adms = p.admit()
    assert [(a.request, a.replica, a.priority) for a in adms[:4]] == [
        (Request(0, 0), 1, 0), (Request(0, 1), 3, 0), (Request(0, 2), 1, 0), (Request(0, 3), 3, 0)]
    assert len(adms) == 8  # window None: everything goes to the engines at once


def test_window_is_respected_per_replica():
    for policy in (FCFSPolicy, FrontierPolicy):
        p = policy(num_groups=10, n=3, groups_per_unit=2, target_groups=4, replicas=[0, 1], window=2)
        adms = p.admit()
        assert len(adms) == 4 and p.inflight_count(0) == 2 and p.inflight_count(1) == 2
        assert p.admit() == []
        p.on_response_done(adms[0].request)
        assert [a.replica for a in p.admit()] == [adms[0].replica]


def test_failure_requeues_on_the_same_replica():
    p = FrontierPolicy(num_groups=4, n=2, groups_per_unit=1, target_groups=2, replicas=[0, 1], window=2)
    p.admit()
    p.on_request_failed(Request(1, 1))
    assert p.admit() == [Admission(Request(1, 1), 1, 1)]
    assert p.stats()["failed"] == 1


def test_replica_removal_requeues_and_repins():
    p = FrontierPolicy(num_groups=4, n=2, groups_per_unit=1, target_groups=2, replicas=[0, 1], window=2)
    p.admit()
    assert p.remove_replica(0) == [Request(0, 0), Request(0, 1)]
    p.on_response_done(Request(0, 0), replica=0)  # stale callback from the dead replica: ignored
    assert p.pending_count == 6 and p.inflight_count() == 2
    p.on_response_done(Request(1, 0))
    assert p.admit() == [Admission(Request(0, 0), 1, 0)]  # group 0 comes first again, on its new home
    p.add_replica(5)
    assert by_replica(p.admit()) == {5: [Request(2, 0), Request(2, 1)]}  # 0.1 waits for group 0's new home
    with pytest.raises(ValueError, match="already"):
        p.add_replica(5)


def test_removal_repins_a_group_with_nothing_in_flight_there():
    p = FrontierPolicy(num_groups=2, n=2, groups_per_unit=1, target_groups=2, replicas=[0, 1], window=1)
    p.admit()
    p.on_response_done(Request(0, 0))  # group 0 now: one done, one pending, pinned to 0, nothing in flight
    assert p.remove_replica(0) == []
    assert p.admit() == []  # replica 1 is full
    p.add_replica(2)
    assert p.admit() == [Admission(Request(0, 1), 2, 0)]


def test_removing_the_last_replica_raises():
    p = FCFSPolicy(num_groups=2, n=1, groups_per_unit=1, target_groups=1, replicas=[0, 1])
    p.remove_replica(1)
    with pytest.raises(RuntimeError):
        p.remove_replica(0)
    assert p.replicas == [0]


# --- end of step -------------------------------------------------------------------------------------------------

def test_to_abort_after_batch_full_and_pending_dropped():
    p = FrontierPolicy(num_groups=6, n=2, groups_per_unit=1, target_groups=2, replicas=[0, 1], window=2)
    p.admit()
    assert p.to_abort() == []
    finish_group(p, 1)
    p.admit()
    finish_group(p, 2)
    assert p.batch_full and p.all_done and p.trained_groups() == [1, 2]
    assert p.pending_count == 0 and p.admit() == []
    assert p.to_abort() == [Request(0, 0), Request(0, 1)]
    assert p.to_abort() == [] and p.inflight_count() == 0
    p.on_response_done(Request(0, 0))  # raced with the abort: ignored
    assert p.stats()["aborted"] == 2 and p.stats()["dropped"] == 6  # groups 3..5 never admitted


def test_failure_after_batch_full_is_dropped_not_requeued():
    p = FCFSPolicy(num_groups=3, n=1, groups_per_unit=1, target_groups=1, replicas=[0])
    p.admit()
    finish_group(p, 0)
    p.on_request_failed(Request(1, 0))  # reported before the driver got to to_abort()
    assert p.pending_count == 0 and p.to_abort() == [Request(2, 0)]
    assert p.stats()["dropped"] == 1


def test_all_done_without_a_full_batch():
    p = FCFSPolicy(num_groups=2, n=1, groups_per_unit=1, target_groups=2, replicas=[0])
    p.admit()
    finish_group(p, 0, trainable=False)
    finish_group(p, 1)
    assert p.all_done and not p.batch_full and p.trained_groups() == [1]


def test_group_done_needs_all_responses_and_only_once():
    p = FCFSPolicy(num_groups=2, n=2, groups_per_unit=1, target_groups=2, replicas=[0])
    p.admit()
    p.on_response_done(Request(0, 0))
    with pytest.raises(RuntimeError, match="1/2"):
        p.on_group_done(0, True)
    with pytest.raises(RuntimeError, match="not in flight"):
        p.on_response_done(Request(0, 0))
    p.on_response_done(Request(0, 1))
    p.on_group_done(0, True)
    with pytest.raises(RuntimeError, match="twice"):
        p.on_group_done(0, True)


# --- FCFS order --------------------------------------------------------------------------------------------------

def test_interleave_order_is_round_robin_over_worker_chunks():
    p = FCFSPolicy(num_groups=3, n=2, groups_per_unit=1, target_groups=1, replicas=[0], order="interleave:2")
    # chunks [0.0 0.1 1.0] and [1.1 2.0 2.1]
    assert [(a.request.group, a.request.index) for a in p.admit()] == [
        (0, 0), (1, 1), (0, 1), (2, 0), (1, 0), (2, 1)]
    p = FCFSPolicy(num_groups=2, n=2, groups_per_unit=1, target_groups=1, replicas=[0], order="interleave:3")
    # numpy.array_split sizes: chunks [0.0 0.1], [1.0], [1.1]
    assert [(a.request.group, a.request.index) for a in p.admit()] == [(0, 0), (1, 0), (1, 1), (0, 1)]


# --- arguments ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    (dict(num_groups=0), "num_groups"),
    (dict(n=0), "n"),
    (dict(groups_per_unit=0), "groups_per_unit"),
    (dict(target_groups=5), "target_groups"),
    (dict(target_groups=0), "target_groups"),
    (dict(groups_per_unit=3, target_groups=2), "groups_per_unit"),
    (dict(window=0), "window"),
    (dict(replicas=[]), "replicas"),
    (dict(replicas=[0, 0]), "replicas"),
    (dict(frontier_groups=0), "frontier_groups"),
    (dict(frontier_groups=True), "frontier_groups"),
    (dict(slack=-1), "slack"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    args = dict(num_groups=4, n=2, groups_per_unit=1, target_groups=2, replicas=[0], window=2) | kwargs
    with pytest.raises(ValueError, match=name):
        FrontierPolicy(**args)


def test_frontier_below_a_unit_is_allowed_and_order_is_checked():
    assert FrontierPolicy(4, 2, 2, 2, [0], 2, frontier_groups=1).frontier() == [0]
    assert FrontierPolicy(4, 2, 2, 2, [0], 2, slack=1).frontier_groups == 3
    with pytest.raises(ValueError, match="order"):
        FCFSPolicy(4, 2, 1, 2, [0], order="interleave:0")


# --- random driver: exactly once, no starvation, work conservation ----------------------------------------------

@st.composite
def scenarios(draw):
    num_groups = draw(st.integers(1, 8))
    target = draw(st.integers(1, num_groups))
    kind = draw(st.sampled_from(["fcfs", "fcfs_interleave", "fgd", "fgd_noaffinity", "fgd_lengths"]))
    return dict(num_groups=num_groups, n=draw(st.integers(1, 4)), target_groups=target,
                groups_per_unit=draw(st.integers(1, target)), replicas=list(range(draw(st.integers(1, 3)))),
                window=draw(st.one_of(st.none(), st.integers(1, 5),
                                      st.builds(AdaptiveWindow, st.integers(1, 4), st.integers(1, 3)))), kind=kind,
                frontier_groups=draw(st.integers(1, 4)), removal=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)), unit_fill=draw(st.sampled_from(["completion", "dispatch"])),
                rest_order=draw(st.sampled_from(["rank", "shortest", "longest"])),
                history=draw(st.lists(st.one_of(st.none(), st.floats(0.0, 6.0)), min_size=num_groups,
                                      max_size=num_groups)))


def make(sc):
    args = {k: sc[k] for k in ("num_groups", "n", "groups_per_unit", "target_groups", "replicas", "window")}
    if sc["kind"] == "fcfs":
        return FCFSPolicy(**args)
    if sc["kind"] == "fcfs_interleave":
        return FCFSPolicy(**args, order="interleave:3")
    if sc["kind"] == "fgd_lengths":  # the length-aware order: some groups with history, the rest on the prior
        lengths = StepLengths([Prediction(h, "history", 1.0) if h is not None else Prediction(None, "prior", 0.25)
                               for h in sc["history"]], sc["n"])
        return FrontierPolicy(**args, frontier_groups=sc["frontier_groups"], unit_fill=sc["unit_fill"],
                              lengths=lengths, rest_order=sc["rest_order"])
    return FrontierPolicy(**args, frontier_groups=sc["frontier_groups"], affinity=sc["kind"] == "fgd")


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_random_driver_invariants(sc):
    rng = random.Random(sc["seed"])
    p = make(sc)
    G, n = sc["num_groups"], sc["n"]
    inflight = {}  # request -> replica (our own shadow of the policy)
    done, aborted = set(), set()
    completion = []  # (group, trainable) in the order we reported them
    next_replica = 10
    removal = sc["removal"]

    homes = defaultdict(set)  # group -> replicas it was admitted to
    removed = False

    def admit():
        for a in p.admit():
            assert a.request not in inflight and a.request not in done
            assert a.replica in p.replicas
            if isinstance(p, FrontierPolicy) and p.lengths is None:
                assert a.priority == a.request.group
            elif isinstance(p, FrontierPolicy):  # frontier admissions outrank every other one in vLLM's queue
                assert (a.priority < G) == (a.request.group in p.frontier())
            inflight[a.request] = a.replica
            homes[a.request.group].add(a.replica)
        if sc["kind"] in ("fgd", "fgd_lengths") and not removed:
            # affinity: each extra replica a group uses is a recorded tail split (never with unbounded windows)
            extra = sum(len(h) - 1 for h in homes.values())
            assert extra <= p.stats()["split_admissions"]
            assert sc["window"] is not None or extra == 0
        limit = p.window_limit()
        for r in p.replicas:
            on_r = sum(1 for x in inflight.values() if x == r)
            assert on_r == p.inflight_count(r)
            assert on_r <= limit
            # work conserving: no slot idles while anything waits
            assert p.pending_count == 0 or on_r == limit

    admit()
    for _ in range(10_000):
        if not inflight:
            break
        roll = rng.random()
        req = rng.choice(sorted(inflight))
        if roll < 0.1:
            del inflight[req]
            p.on_request_failed(req)
        elif roll < 0.15 and removal and len(p.replicas) > 1:
            dead = rng.choice(p.replicas)
            removed = True
            lost = p.remove_replica(dead)
            assert sorted(lost) == sorted(q for q, r in inflight.items() if r == dead)
            for q in lost:
                del inflight[q]
        elif roll < 0.18:
            p.add_replica(next_replica)
            next_replica += 1
        else:
            del inflight[req]
            assert req not in done
            done.add(req)
            assert p.on_response_done(req)
            p.observe_length(req, rng.randint(1, 500))
            if all(Request(req.group, i) in done for i in range(n)):
                trainable = rng.random() < 0.7
                completion.append((req.group, trainable))
                p.on_group_done(req.group, trainable)
        if p.batch_full:
            to_abort = p.to_abort()
            assert sorted(to_abort) == sorted(inflight)
            aborted |= set(to_abort)
            inflight.clear()
        admit()

    assert not inflight and p.all_done
    trainable_order = [g for g, t in completion if t]
    assert p.trained_groups() == trainable_order[: sc["target_groups"]]
    assert len(set(p.trained_groups())) == len(p.trained_groups())
    assert p.batch_full == (len(trainable_order) >= sc["target_groups"])
    if not p.batch_full:  # no starvation: every request ran to completion
        assert len(done) == G * n
    for g in p.trained_groups():
        assert all(Request(g, i) in done for i in range(n))
    s = p.stats()
    assert s["responses_done"] == len(done) and s["pending"] == 0 and s["inflight"] == 0
    assert s["aborted"] == len(aborted)
    # exactly one end per request: done, aborted in flight, or dropped (pending when the batch filled)
    assert s["responses_done"] + s["aborted"] + s["dropped"] == G * n


# --- faults: a dropped group, the last replica restarted ---------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: FCFSPolicy(num_groups=4, n=2, groups_per_unit=1, target_groups=2, replicas=[0], window=3),
    lambda: FrontierPolicy(num_groups=4, n=2, groups_per_unit=1, target_groups=2, replicas=[0], window=3),
])
def test_dropped_group_is_replaced_by_the_next(make):
    p = make()
    first = p.admit()
    assert [a.request for a in first] == [Request(0, 0), Request(0, 1), Request(1, 0)]
    cancelled = p.drop_group(0)
    assert cancelled == [Request(0, 0), Request(0, 1)]
    assert not p.on_response_done(Request(0, 0), 0)  # late callback of a cancelled request: ignored
    p.on_request_failed(Request(0, 1), 0)  # ignored too, nothing goes back to pending
    nxt = p.admit()
    assert {a.request.group for a in nxt} <= {1, 2}
    for a in first[2:] + nxt:
        assert p.on_response_done(a.request, a.replica)
    for a in p.admit():
        assert p.on_response_done(a.request, a.replica)
    for g in (1, 2):
        p.on_group_done(g, True)
    assert p.batch_full and p.trained_groups() == [1, 2]
    assert p.stats()["dropped_groups"] == 1
    with pytest.raises(RuntimeError, match="already completed"):
        p.drop_group(1)


@pytest.mark.parametrize("cls", [FCFSPolicy, FrontierPolicy])
def test_last_replica_removed_for_restart_and_added_back(cls):
    p = cls(num_groups=2, n=2, groups_per_unit=1, target_groups=2, replicas=[0], window=None)
    adm = p.admit()
    assert len(adm) == 4
    with pytest.raises(RuntimeError, match="no replica would be left"):
        p.remove_replica(0)
    done = adm[0]
    assert p.on_response_done(done.request, 0)
    lost = p.remove_replica(0, allow_none_left=True)
    assert lost == [a.request for a in adm[1:]]
    assert p.admit() == []  # nowhere to go until the replica is back
    assert not p.on_response_done(adm[1].request, 0)  # stale: it ran on the dead replica
    p.add_replica(0)
    again = p.admit()
    assert sorted(a.request for a in again) == sorted(lost)  # resubmitted, the finished one is not
    for a in again:
        assert p.on_response_done(a.request, a.replica)
    p.on_group_done(0, True)
    p.on_group_done(1, True)
    assert p.all_done and p.stats()["requeued_on_replica_loss"] == 3


def test_fgd_window_resolution():
    assert resolve_window("adaptive", 8, 8, 256) == AdaptiveWindow(capacity=256, floor=8)  # one group's margin
    assert resolve_window("adaptive", 8, 16, 8) == AdaptiveWindow(capacity=8, floor=8)  # the margin <= the slots
    assert resolve_window(None, 8, 8, 256) == 256  # max_num_seqs
    assert resolve_window("auto", 8, 8, 256) == 128  # two units of 8 groups x 8
    assert resolve_window("auto", 8, 8, 100) == 100  # at most the slots
    assert resolve_window(64, 8, 8, 256) == 64
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        resolve_window(0, 8, 8, 256)


# --- the adaptive window -----------------------------------------------------------------------------------------

def test_adaptive_limit_starts_at_slots_plus_floor_and_is_capped_at_twice_the_slots():
    w = AdaptiveWindow(capacity=16, floor=8)
    assert w.limit(0) == 24 and w.limit(4) == 24  # 2 x 4 = 8: the floor
    assert w.limit(5) == 16 + ADAPTIVE_BURST_FACTOR * 5
    assert w.limit(16) == 32 and w.limit(1000) == 32
    with pytest.raises(ValueError, match="capacity"):
        AdaptiveWindow(capacity=0)
    with pytest.raises(ValueError, match="floor"):
        AdaptiveWindow(capacity=4, floor=0)


def test_adaptive_margin_grows_with_the_largest_burst_seen_on_one_replica():
    p = FrontierPolicy(num_groups=16, n=2, groups_per_unit=2, target_groups=16, replicas=[0, 1],
                       window=AdaptiveWindow(capacity=4, floor=1))
    first = p.admit()
    assert p.inflight_count(0) == p.inflight_count(1) == 5  # 4 slots + a margin of 1
    assert p.stats()["window_limit"] == 5 and p.stats()["completion_burst_peak"] == 0
    on0 = [a.request for a in first if a.replica == 0]
    for req in on0[:3]:  # three slots free on replica 0 in one driver cycle
        p.on_response_done(req)
    on1 = [a.request for a in first if a.replica == 1]
    p.on_response_done(on1[0])
    again = p.admit()
    assert p.window_limit() == 4 + 4  # min(capacity, 2 x 3)
    assert p.inflight_count(0) == p.inflight_count(1) == 8
    assert len(again) == 3 + 3 + 1 + 3  # refills, plus the grown margin on both replicas
    p.on_response_done(again[0].request)
    p.admit()
    assert p.window_limit() == 8 and p.stats()["completion_burst_peak"] == 3  # a smaller burst never shrinks it


def test_adaptive_margin_is_the_slots_from_the_start_with_one_replica():
    # one replica: a held request could go nowhere else, so a whole batch waits in vLLM from the first admission (an
    # equal-length first wave's refill is not left to the driver)
    w = AdaptiveWindow(capacity=32, floor=8)
    assert w.limit(0, replicas=1) == 64 and w.limit(0, replicas=2) == 40
    one = FrontierPolicy(num_groups=32, n=8, groups_per_unit=4, target_groups=32, replicas=[0], window=w)
    first = one.admit()
    assert len(first) == 64 and [a.request.group for a in first] == sorted(a.request.group for a in first)
    assert {a.request.group for a in first} == set(range(8))  # the frontier's ranks first
    two = FrontierPolicy(num_groups=32, n=8, groups_per_unit=4, target_groups=32, replicas=[0, 1], window=w)
    assert len(two.admit()) == 80  # 40 per replica: the margin grows with the bursts seen
    one.add_replica(1)  # a replica joins (a restart): the window does not shrink within the step
    one.admit()
    assert one.window_limit() == 64 and one.inflight_count(1) > 0


def test_adaptive_admits_everything_when_the_slots_cover_the_step():
    # max_num_seqs covers the step (verl's GPU default): the whole step is in the engine at once, like the baseline,
    # where fgd.window=auto would hold all but two units back.
    adaptive = FrontierPolicy(num_groups=32, n=8, groups_per_unit=4, target_groups=32, replicas=[0],
                              window=resolve_window("adaptive", 4, 8, 256))
    assert len(adaptive.admit()) == 256
    auto = FrontierPolicy(num_groups=32, n=8, groups_per_unit=4, target_groups=32, replicas=[0],
                          window=resolve_window("auto", 4, 8, 256))
    assert len(auto.admit()) == 64


@st.composite
def adaptive_runs(draw):
    num_groups = draw(st.integers(1, 12))
    return dict(num_groups=num_groups, n=draw(st.integers(1, 4)), replicas=draw(st.integers(1, 3)),
                capacity=draw(st.integers(1, 6)), floor=draw(st.integers(1, 4)), affinity=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=300, deadline=None)
@given(adaptive_runs())
def test_adaptive_window_properties(sc):
    """Under random completions (in random bursts), failures and group completions: (1) after every admit() the
    requests in flight are at least what full admission would keep running, min(waiting + in flight, slots);
    (2) requests go in rank order: with one replica every admitted request outranks every one left pending, with
    several each group's first admission comes in rank order; (3) no request is admitted while in flight or done;
    (4) the window never shrinks and stays within [slots + floor, 2 x slots]."""
    rng = random.Random(sc["seed"])
    G, n, R, cap = sc["num_groups"], sc["n"], sc["replicas"], sc["capacity"]
    w = AdaptiveWindow(capacity=cap, floor=sc["floor"])
    p = FrontierPolicy(num_groups=G, n=n, groups_per_unit=1, target_groups=G, replicas=list(range(R)), window=w,
                       affinity=sc["affinity"])
    inflight, done, started = {}, set(), []
    last_limit = 0

    def admit():
        nonlocal last_limit
        waiting_before = p.pending_count + len(inflight)
        adms = p.admit()
        for a in adms:
            assert a.request not in inflight and a.request not in done  # (3)
            inflight[a.request] = a.replica
            if a.request.group not in started:
                started.append(a.request.group)
        assert len(inflight) >= min(waiting_before, R * cap)  # (1), over all replicas
        for r in range(R):  # (1), per replica: none below its slots while anything waits
            assert p.pending_count == 0 or p.inflight_count(r) >= cap
        if R == 1 and adms and p.pending_count:  # (2)
            pending = {Request(g, i) for g in range(G) for i in range(n)} - set(inflight) - done
            assert max(a.request for a in adms) < min(pending)
        limit = p.window_limit()
        assert last_limit <= limit and cap + min(sc["floor"], cap) <= limit <= 2 * cap  # (4)
        last_limit = limit

    admit()
    while inflight:
        burst = rng.sample(sorted(inflight), rng.randint(1, len(inflight)))  # one driver cycle's completions
        for req in burst:
            del inflight[req]
            if rng.random() < 0.1:
                p.on_request_failed(req)
                continue
            done.add(req)
            assert p.on_response_done(req)
            if all(Request(req.group, i) in done for i in range(n)):
                p.on_group_done(req.group, True)
        admit()
    assert p.all_done and len(done) == G * n
    assert started == sorted(started)  # (2): groups start in rank order
