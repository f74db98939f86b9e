"""The trainer's schedule (verl_pipe/core/schedule.py), pure: every mode over arbitrary arrival orders and timings.

A fake FIFO feeds the schedule: groups arrive in a drawn order, a drawn number of them arrive while the trainer
works, and the rollout may end with fewer groups than the batch (a short last unit). A checker executes the
actions and tracks the actor's weights: every group is trained exactly once, with old log-probs at θ_k, in units
of the right size, the optimizer stepping once per unit, θ_k kept before the first step when later units need
it, the whitening gradient buffers used only in unit 0 and combined only after the whole batch is known, and the LR
scheduler stepping once per step, after its last optimizer step (as verl's, whose last mini-batch steps it).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fakes import fake_of
from verl_pipe.core import schedule as S


@fake_of(None, why="a checking executor of the pure schedule's actions (the real one, ActorBackend, runs them on "
                   "verl's workers: tests/test_actor_backend.py)")
class FakeRun:
    """The FIFO (arrivals drawn by hypothesis) and a checker of the actions, in one executor."""

    def __init__(self, arrival: list[int], extra, units_per_step: int, groups_per_unit: int, use_ref: bool):
        self.arrival, self.extra = arrival, extra
        self.arrived = self.taken = 0
        self.ups, self.gpu, self.use_ref = units_per_step, groups_per_unit, use_ref
        self.stepped = self.snapshot = False
        self.log: list = []
        self.old_lp: list[int] = []
        self.ref_lp: list[int] = []
        self.trained: list[int] = []  # by Update / Accumulate, in order
        self.steps: list[int] = []  # units whose optimizer step ran
        self.lr_steps: list[int] = []  # per LR-scheduler step: how many optimizer steps had run
        self.unit_groups: dict[int, list[int]] = {}
        self.whitened: tuple | None = None
        self.open_unit: int | None = None

    def _arrive(self, need: int) -> None:
        while self.arrived - self.taken < need and self.arrived < len(self.arrival):
            self.arrived += 1
        self.arrived = min(len(self.arrival), self.arrived + self.extra())  # more arrive while the trainer works

    @property
    def closed(self) -> bool:
        return self.arrived == len(self.arrival)

    def __call__(self, a):
        self.log.append(a)
        if isinstance(a, S.Take):
            assert 1 <= a.need <= a.max_k <= self.gpu * self.ups - self.taken
            self._arrive(a.need)
            got = self.arrival[self.taken:self.taken + min(a.max_k, self.arrived - self.taken)]
            self.taken += len(got)
            return S.Arrivals(tuple(got), self.closed)
        if isinstance(a, S.Drain):
            self.arrived = len(self.arrival)
            got = self.arrival[self.taken:]
            self.taken = len(self.arrival)
            return S.Arrivals(tuple(got), True)
        if isinstance(a, S.WaitRest):
            self.arrived = len(self.arrival)
            return tuple(self.arrival[self.taken:])
        if isinstance(a, S.OldLogProb):
            # at θ_k: the actor has not stepped yet and computes as is, or it has and θ_k is swapped in
            assert a.at_theta_k == self.stepped, a
            assert not a.at_theta_k or self.snapshot, "θ_k swapped in without having been kept"
            self.old_lp.extend(a.groups)
        elif isinstance(a, S.RefLogProb):
            assert self.use_ref
            self.ref_lp.extend(a.groups)
        elif isinstance(a, S.Snapshot):
            assert not self.stepped and not self.snapshot, "θ_k is kept once, before the step's first optimizer step"
            self.snapshot = True
        elif isinstance(a, S.Update):
            assert set(a.groups) <= set(self.old_lp)
            self.trained.extend(a.groups)
            self.unit_groups[a.unit] = list(a.groups)
            self._step(a.unit, a.lr_step)
        elif isinstance(a, S.BeginUnit):
            assert self.open_unit is None
            self.open_unit = a.unit
            self.unit_groups[a.unit] = []
        elif isinstance(a, S.Accumulate):
            assert a.unit == self.open_unit and set(a.groups) <= set(self.old_lp)
            if a.into_buffers:
                assert a.unit == 0 and self.whitened is None, "gradient buffers only before the batch is known, unit 0"
            if a.final_advantages:
                assert self.whitened is not None and set(a.groups) <= set(self.whitened)
            self.trained.extend(a.groups)
            self.unit_groups[a.unit].extend(a.groups)
        elif isinstance(a, S.Whiten):
            assert self.whitened is None, "the batch's statistics are computed once"
            assert not self.stepped, "unit 0's step waits for the whole batch"
            self.whitened = a.groups
        elif isinstance(a, S.OptimizerStep):
            assert a.unit == self.open_unit and list(a.groups) == self.unit_groups[a.unit]
            assert not a.buffered or (a.unit == 0 and self.whitened is not None)
            self.open_unit = None
            self._step(a.unit, a.lr_step)
        elif isinstance(a, S.LrStep):
            assert self.open_unit is None or not self.unit_groups[self.open_unit], "no unit half-trained"
            self.lr_steps.append(len(self.steps))
        return None

    def _step(self, unit: int, lr_step: bool) -> None:
        assert unit not in self.steps, "one optimizer step per unit"
        self.steps.append(unit)
        self.stepped = True
        if lr_step:  # with this optimizer step (verl: train_batch with update_lr_scheduler)
            self.lr_steps.append(len(self.steps))


def _check(run: FakeRun, out: S.ScheduleOutcome, mode: str, groups: int, gpu: int, use_ref: bool) -> None:
    expected = sorted(run.arrival)
    # every group trained exactly once; old (and ref) log-probs once each
    assert sorted(out.trained) == sorted(run.trained) == expected
    assert sorted(run.old_lp) == expected
    assert sorted(run.ref_lp) == (expected if use_ref else [])
    # units of the right size: full ones, then at most one short last unit (the rollout ran out of groups)
    sizes = [len(u) for u in out.units]
    assert sizes == [min(gpu, groups - i) for i in range(0, groups, gpu)]
    assert [list(u) for u in out.units] == [run.unit_groups[u] for u in range(len(out.units))]
    # the optimizer steps once per unit, in order
    assert run.steps == list(range(len(out.units)))
    # the LR scheduler steps once per step that trained, after its last optimizer step, whatever the mode,
    # granularity, arrivals or a short batch (verl: once per step, with the last mini-batch of the last epoch; the
    # epochs of ppo_epochs > 1 are inside each Update's verl call: tests/test_worker_lr_schedule.py)
    assert run.lr_steps == ([len(out.units)] if out.units else [])
    # the last optimizer step carries it unless the step ran out of groups at a unit boundary (it learns that after)
    apart = [a for a in run.log if isinstance(a, S.LrStep)]
    boundary = bool(out.units) and len(out.units) < run.ups and len(out.units[-1]) == gpu
    assert len(apart) == (1 if boundary and mode != "sync" else 0), "sync knows its last unit"
    # the step keeps θ_k iff it is CGP with more than one unit configured
    assert run.snapshot == (mode == "cgp" and run.ups > 1 and groups > 0)
    if mode == "sync":
        assert list(out.trained) == expected, "sync trains in dispatch order, like verl"
    else:
        assert list(out.trained) == run.arrival, "CGP trains FIFO"
    timeline = [a.unit for a in run.log if isinstance(a, S.UnitReady)]
    assert timeline == list(range(len(out.units)))


arrivals = st.integers(1, 4).flatmap(lambda gpu: st.tuples(
    st.just(gpu), st.integers(1, 4),  # groups per unit, units per step
    st.booleans()))


@settings(max_examples=300, deadline=None)
@given(shape=arrivals, data=st.data())
def test_every_schedule_over_arrival_orders(shape, data):
    gpu, ups, use_ref = shape
    target = gpu * ups
    groups = data.draw(st.integers(0, target), label="groups that arrive (short batch: the pool ran out)")
    arrival = data.draw(st.permutations(range(groups)), label="arrival order")
    extra = lambda: data.draw(st.integers(0, 3), label="arrive while the trainer works")  # noqa: E731
    for mode, granularity, coalesce in (("sync", "minibatch", True), ("cgp", "minibatch", True),
                                        ("cgp", "minibatch", False), ("cgp", "group", True)):
        run = FakeRun(list(arrival), extra, ups, gpu, use_ref)
        out = S.drive(S.train_schedule(mode, granularity, gpu, ups, use_ref=use_ref, coalesce=coalesce), run)
        _check(run, out, mode, groups, gpu, use_ref)
        assert not out.buffered and run.whitened is None
        calls = [a for a in run.log if isinstance(a, S.OldLogProb)]
        if (mode, granularity, coalesce) == ("cgp", "minibatch", False):
            assert [a.groups for a in calls] == list(out.units), "one old log-prob call per unit, over the unit"
        if (mode, granularity) == ("cgp", "minibatch"):
            # each call covers what was taken: every group queued when a unit needed groups (coalesce)
            takes = [a for a in run.log if isinstance(a, S.Take)]
            assert len(calls) <= len(takes) and len(calls) <= len(out.units)


@settings(max_examples=300, deadline=None)
@given(shape=arrivals, data=st.data())
def test_whitened_group_schedule_over_arrival_orders(shape, data):
    """A batch-whitened estimator at group granularity: groups trained before the batch is complete go into
    gradient buffers, only in unit 0; the batch's statistics come once, over the whole batch in dispatch order,
    before unit 0's optimizer step; the buffered groups get their final advantages at the end."""
    gpu, ups, use_ref = shape
    target = gpu * ups
    groups = data.draw(st.integers(1, target))
    arrival = data.draw(st.permutations(range(groups)))
    extra = lambda: data.draw(st.integers(0, 3))  # noqa: E731
    run = FakeRun(list(arrival), extra, ups, gpu, use_ref)
    out = S.drive(S.train_schedule("cgp", "group", gpu, ups, use_ref=use_ref, whiten=True), run)
    _check(run, out, "cgp", groups, gpu, use_ref)
    assert run.whitened == tuple(range(groups)), "the whole batch, in dispatch order"
    buffered = [g for a in run.log if isinstance(a, S.Accumulate) and a.into_buffers for g in a.groups]
    assert out.buffered == buffered and set(buffered) <= set(out.units[0])
    final = [a for a in run.log if isinstance(a, S.FinalAdvantages)]
    assert [f.groups for f in final] == ([tuple(buffered)] if buffered else [])
    # every group not buffered trained with the final advantages
    direct = [g for a in run.log if isinstance(a, S.Accumulate) and a.final_advantages for g in a.groups]
    assert sorted(direct + buffered) == list(range(groups))


def test_coalesced_log_probs_one_call_per_catch_up():
    """Mini-batch CGP with a trainer that lags: unit 0 takes the 2 groups queued; while it trains all 6 others
    arrive, and unit 1 takes them all: one old log-prob call at θ_k (swapped in) for units 1-3, and units 2 and 3
    need no call, no take, no swap of their own. Without coalescing: one call per unit."""
    extra = iter([0, 8])
    run = FakeRun([5, 0, 3, 1, 2, 4, 7, 6], lambda: next(extra), 4, 2, True)
    out = S.drive(S.train_schedule("cgp", "minibatch", 2, 4, use_ref=True), run)
    calls = [(a.unit, a.groups, a.at_theta_k) for a in run.log if isinstance(a, S.OldLogProb)]
    assert calls == [(0, (5, 0), False), (1, (3, 1, 2, 4, 7, 6), True)]
    assert [a.groups for a in run.log if isinstance(a, S.RefLogProb)] == [(5, 0), (3, 1, 2, 4, 7, 6)]
    assert out.units == [(5, 0), (3, 1), (2, 4), (7, 6)]
    ready = [(a.unit, a.groups) for a in run.log if isinstance(a, S.UnitReady)]
    assert ready == list(enumerate(out.units))
    extra = iter([0, 8, 0, 0])
    run = FakeRun([5, 0, 3, 1, 2, 4, 7, 6], lambda: next(extra), 4, 2, False)
    out = S.drive(S.train_schedule("cgp", "minibatch", 2, 4, coalesce=False), run)
    assert [a.groups for a in run.log if isinstance(a, S.OldLogProb)] == out.units


def test_batch_complete_from_the_start_buffers_nothing():
    """All groups queued and the rollout over before training: the first take sees the rollout closed."""
    run = FakeRun([3, 0, 1, 2], lambda: 4, 2, 2, False)
    out = S.drive(S.train_schedule("cgp", "group", 2, 2, whiten=True), run)
    assert out.buffered == [] and run.whitened == (0, 1, 2, 3)


def test_trickled_unit_zero_buffers_exactly_its_groups():
    """Unit 0's groups arrive one at a time, each before the next (the e2e test's trickled queue): all of unit 0
    goes into buffers, and unit 0's step waits for the rest of the batch."""
    run = FakeRun([0, 1, 2, 3], lambda: 0, 2, 2, False)
    out = S.drive(S.train_schedule("cgp", "group", 2, 2, whiten=True), run)
    assert out.buffered == [0, 1]
    kinds = [type(a).__name__ for a in run.log]
    assert kinds.index("Whiten") < kinds.index("OptimizerStep")
    assert [a for a in run.log if isinstance(a, S.WaitRest)], "the batch was not complete: wait for the rest"


@pytest.mark.parametrize("mode,granularity", [("sync", "minibatch"), ("cgp", "minibatch"), ("cgp", "group")])
@pytest.mark.parametrize("groups,flags", [
    (8, [False, False, False, True]),  # a full step: its last unit (verl: its last mini-batch) steps the LR
    (5, [False, False, True]),  # a short last unit: the rollout ended and every group was taken, it is the last
    (4, [False, True]),  # out of groups at a unit boundary: sync knows it, CGP learns it after the step (LrStep)
])
def test_the_lr_scheduler_steps_with_the_steps_last_optimizer_step(mode, granularity, groups, flags):
    """recipes/qwen3_1p7b_dapo_math_4x4.yaml: 4 units a step and a 10-step warmup. Stepping the scheduler with
    every unit would run the schedule 4 times as fast as verl's, in sync as in CGP."""
    run = FakeRun(list(range(groups)), lambda: 0, 4, 2, False)
    out = S.drive(S.train_schedule(mode, granularity, 2, 4), run)
    steps = [a for a in run.log if isinstance(a, (S.Update, S.OptimizerStep))]
    apart = [a for a in run.log if isinstance(a, S.LrStep)]
    assert len(steps) == len(out.units) == len(flags)
    if mode == "cgp" and groups == 4:
        assert [a.lr_step for a in steps] == [False, False] and len(apart) == 1
        assert run.log.index(apart[0]) > run.log.index(steps[-1])
    else:
        assert [a.lr_step for a in steps] == flags and not apart
    assert run.lr_steps == [len(out.units)], "once, after the step's last optimizer step"


def test_sync_recomputes_batch_normalized_advantages_before_the_log_probs():
    run = FakeRun([1, 0], lambda: 0, 1, 2, False)
    S.drive(S.train_schedule("sync", "minibatch", 2, 1, batch_normalized=True), run)
    kinds = [type(a).__name__ for a in run.log]
    assert kinds[:3] == ["Drain", "BatchAdvantages", "OldLogProb"]


def test_order_hook_fixes_the_order_within_what_was_taken():
    run = FakeRun([0, 1, 2, 3], lambda: 0, 1, 4, False)
    out = S.drive(S.train_schedule("cgp", "minibatch", 4, 1, order=lambda gs: sorted(gs, reverse=True)), run)
    assert out.trained == [3, 2, 1, 0]


@pytest.mark.parametrize("kw,match", [(dict(mode="async"), "mode"), (dict(granularity="token"), "granularity"),
                                      (dict(groups_per_unit=0), ">= 1")])
def test_bad_arguments(kw, match):
    args = dict(mode="cgp", granularity="group", groups_per_unit=2, units_per_step=2) | kw
    with pytest.raises(ValueError, match=match):
        S.train_schedule(**args)
