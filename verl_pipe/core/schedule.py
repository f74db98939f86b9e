"""The trainer's step plan as pure code: one schedule, run by the real trainer and by the simulator.

Pure Python (no verl, Ray or torch), like ``frontier.py``. A step's schedule is a generator over actions: it
yields what the trainer does next (take groups from the FIFO, old log-probs at θ_k, ref log-probs, keep θ_k,
update, accumulate a group, optimizer step, ...) and receives each action's result. Groups are their dispatch
indices; the executor holds their data. Two executors run it: ``verl_pipe.trainer.actor_backend.ActorBackend`` over
verl's worker group (the real trainer) and ``verl_pipe.sim.trainer.CostModel`` (the simulator's clock).

Driver protocol (one step)::

    steps = train_schedule(mode, granularity, groups_per_unit, units_per_step, use_ref=..., whiten=...)
    outcome = drive(steps, executor)     # executor(action) -> the action's result
    # outcome: ScheduleOutcome (trained groups in order, units, groups trained into gradient buffers)

Results the executor returns: ``Take`` and ``Drain`` -> ``Arrivals`` (the groups, FIFO, and whether the
rollout had ended when they were taken); ``WaitRest`` -> the groups still queued at the rollout's end (left
queued); every other action -> None.

The three schedules:

- sync: wait for the whole rollout, old (and ref) log-probs for the whole batch (batch-normalized estimators
  recomputed over it first), then one ``Update`` (forward/backward + optimizer step) per unit;
- cgp, mini-batch units: per unit, when its groups are in: old log-probs (at θ_k from the second unit on),
  ref, keep θ_k before unit 0's step (if the step has more than one unit), ``Update``. With ``coalesce`` (the
  default), a unit that needs groups takes every group queued by then (up to the step's batch) and computes
  their old (and ref) log-probs in one call: θ_k is fixed for the step, so a group's old log-probs are the
  same whichever call computes them, and a trainer that lags behind the rollout pays one call (and one θ_k
  swap) per catch-up instead of one per unit; the units are then formed FIFO from what was taken;
- cgp, group granularity: each take of whatever has arrived (up to the unit's remainder) is one
  gradient-accumulation micro-batch (old log-probs, ref, ``Accumulate``); the optimizer steps when the unit is
  complete. A batch-whitened estimator (``whiten``, verl_pipe/trainer/whitening.py) trains the groups that arrive
  before the batch is complete into gradient buffers, which only unit 0 can do (later units start after unit
  0's step, which waits for the batch); their advantages are set to the final ones at the end.

The LR schedule: verl 0.9.1 steps the actor's LR scheduler once per training step, with the step's last PPO
mini-batch (its engine worker's ``train_mini_batch``: ``update_lr_scheduler`` on the last iteration of the last
epoch). A step here is several optimizer steps (one per unit, each its own call into verl), so exactly one of them
carries ``lr_step``: the step's last. A schedule knows its last unit when it is the step's last configured one or a
short one (fewer groups than a unit: the rollout has ended and every group was taken); a step that runs out of
groups at a unit boundary learns it only at the next take, after that unit's optimizer step, and ends with
``LrStep``. A step that trains no group steps nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from verl_pipe.core.variants import GRANULARITIES, TRAINER_MODES as MODES, pipelines


# ---------------------------------------------------------------------------------------------- actions

@dataclass(frozen=True)
class Take:
    """Block until ``need`` groups are queued (or the rollout ended); take every queued group, up to ``max_k``,
    FIFO."""
    max_k: int
    need: int


@dataclass(frozen=True)
class Drain:
    """Wait for the end of the rollout; take every group still queued."""


@dataclass(frozen=True)
class WaitRest:
    """Wait for the end of the rollout; the groups still queued, left queued."""


@dataclass(frozen=True)
class UnitReady:
    """A unit's groups are all in (the timeline's unit_ready)."""
    unit: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class BatchAdvantages:
    """Recompute a batch-normalized estimator's advantages over the whole batch (sync, as verl does)."""
    groups: tuple[int, ...]


@dataclass(frozen=True)
class OldLogProb:
    """Old log-probs of ``groups`` under θ_k; ``at_theta_k``: the actor moved past θ_k, swap the kept θ_k in."""
    unit: int | None
    groups: tuple[int, ...]
    at_theta_k: bool
    tag: int | None = None  # the last group of a per-group burst (the timeline's group tag)
    span = "old_log_prob"


@dataclass(frozen=True)
class RefLogProb:
    unit: int | None
    groups: tuple[int, ...]
    tag: int | None = None
    span = "ref_log_prob"


@dataclass(frozen=True)
class Snapshot:
    """Keep θ_k (and the optimizer's rollback state) before the step's first optimizer step."""
    unit: int
    tag = None
    span = "snapshot_theta_k"


@dataclass(frozen=True)
class Update:
    """One PPO mini-batch: forward/backward over ``groups`` and the optimizer step (verl's update_actor);
    ``lr_step``: the step's last optimizer step, which also steps the LR scheduler (the others hold it)."""
    unit: int
    groups: tuple[int, ...]
    lr_step: bool = False
    tag = None
    span = "update"


@dataclass(frozen=True)
class BeginUnit:
    """Group granularity: zero the unit's gradient."""
    unit: int


@dataclass(frozen=True)
class Accumulate:
    """Forward/backward of ``groups`` into the unit's gradient, no optimizer step. ``into_buffers``: with the
    whitening basis advantages into gradient buffers (the batch is not complete); ``final_advantages``: with the
    whole batch's advantages (set from the last ``Whiten``)."""
    unit: int
    groups: tuple[int, ...]
    into_buffers: bool
    final_advantages: bool
    tag: int | None = None
    span = "forward_backward"


@dataclass(frozen=True)
class Whiten:
    """The whole batch (``groups``) is known: its advantages and the gradient buffers' coefficients."""
    groups: tuple[int, ...]


@dataclass(frozen=True)
class OptimizerStep:
    """Group granularity: the unit's optimizer step over its accumulated gradient (and buffers, if any);
    ``lr_step``: as ``Update``'s."""
    unit: int
    groups: tuple[int, ...]
    buffered: bool
    lr_step: bool = False
    tag = None
    span = "optimizer_step"


@dataclass(frozen=True)
class LrStep:
    """Step the LR scheduler: the step ran out of groups at a unit boundary, after an optimizer step that did not
    know it was the step's last (no optimizer step since, so the same schedule as stepping with it)."""
    unit = None
    tag = None


@dataclass(frozen=True)
class FinalAdvantages:
    """The groups trained into gradient buffers get the advantages they were trained with (for metrics, checks)."""
    groups: tuple[int, ...]


@dataclass(frozen=True)
class Arrivals:
    groups: tuple[int, ...]
    closed: bool = False


@dataclass
class ScheduleOutcome:
    trained: list[int] = field(default_factory=list)  # in training order
    units: list[tuple[int, ...]] = field(default_factory=list)
    buffered: list[int] = field(default_factory=list)  # trained before the batch was complete (whitening)


Steps = Generator[object, object, ScheduleOutcome]
Order = Callable[[list[int]], list[int]]


def _keep(groups: list[int]) -> list[int]:
    return groups


# ---------------------------------------------------------------------------------------------- schedules

def train_schedule(mode: str, granularity: str, groups_per_unit: int, units_per_step: int, *,
                   use_ref: bool = False, whiten: bool = False, batch_normalized: bool = False,
                   order: Order | None = None, coalesce: bool = True) -> Steps:
    """The step's schedule. ``whiten``: a batch-whitened (affine) estimator at group granularity;
    ``batch_normalized``: sync recomputes the advantages over the whole batch; ``order``: fixes the order groups
    train in within what was taken (a test hook; default: as taken); ``coalesce``: mini-batch CGP computes the
    log-probs of every group queued when a unit needs groups in one call (False: one call per unit)."""
    if mode not in MODES:
        raise ValueError(f"mode: got {mode!r}; allowed: {', '.join(MODES)}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: got {granularity!r}; allowed: {', '.join(GRANULARITIES)}")
    if groups_per_unit < 1 or units_per_step < 1:
        raise ValueError(f"groups_per_unit={groups_per_unit}, units_per_step={units_per_step}: both must be >= 1")
    order = order or _keep
    if not pipelines(mode):
        return sync_schedule(groups_per_unit, use_ref, batch_normalized, order)
    if granularity == "group":
        return group_schedule(groups_per_unit, units_per_step, use_ref, whiten, order)
    return minibatch_schedule(groups_per_unit, units_per_step, use_ref, order, coalesce)


def sync_schedule(groups_per_unit: int, use_ref: bool, batch_normalized: bool, order: Order) -> Steps:
    arrived: Arrivals = yield Drain()
    groups = tuple(order(sorted(arrived.groups)))  # dispatch order, like verl
    out = ScheduleOutcome(trained=list(groups))
    if not groups:
        return out
    if batch_normalized:
        yield BatchAdvantages(groups)
    yield OldLogProb(None, groups, at_theta_k=False)  # nothing has been updated yet
    if use_ref:
        yield RefLogProb(None, groups)
    for u, i in enumerate(range(0, len(groups), groups_per_unit)):
        unit = groups[i:i + groups_per_unit]
        yield UnitReady(u, unit)
        yield Update(u, unit, lr_step=i + groups_per_unit >= len(groups))
        out.units.append(unit)
    return out


def _last(u: int, units_per_step: int, unit: Sequence[int], groups_per_unit: int) -> bool:
    """Known to be the step's last unit: its last configured one, or a short one (the rollout ended, every group
    taken)."""
    return u == units_per_step - 1 or len(unit) < groups_per_unit


def _lr_step_after(out: ScheduleOutcome, stepped: bool):
    """The step's LR-scheduler step if its last optimizer step did not carry it (the step ran out of groups at a
    unit boundary); none for a step that trained nothing."""
    if out.units and not stepped:
        yield LrStep()


def minibatch_schedule(groups_per_unit: int, units_per_step: int, use_ref: bool, order: Order,
                       coalesce: bool = True) -> Steps:
    out = ScheduleOutcome()
    target = groups_per_unit * units_per_step
    taken = 0
    lr_step = False
    pending: list[int] = []  # taken, in no unit yet (FIFO)
    formed: list[tuple[int, ...]] = []  # complete units, their log-probs computed, not trained yet
    for u in range(units_per_step):
        while not formed and taken < target:
            need = groups_per_unit - len(pending)
            arrived: Arrivals = yield Take(target - taken if coalesce else need, need=need)
            got = tuple(order(list(arrived.groups)))
            if not got and not pending:
                break  # the rollout ended and every group was taken
            taken += len(got)
            pending.extend(got)
            # fewer than needed: the rollout ended (a short last unit)
            while len(pending) >= groups_per_unit or (pending and len(got) < need):
                unit, pending = tuple(pending[:groups_per_unit]), pending[groups_per_unit:]
                yield UnitReady(len(out.units) + len(formed), unit)
                formed.append(unit)
            if got:
                yield OldLogProb(u, got, at_theta_k=u > 0)  # unit 0: the actor still holds θ_k
                if use_ref:
                    yield RefLogProb(u, got)
        if not formed:
            break
        unit = formed.pop(0)
        if u == 0 and units_per_step > 1:
            yield Snapshot(u)  # later units' old log-probs
        lr_step = _last(u, units_per_step, unit, groups_per_unit)
        yield Update(u, unit, lr_step=lr_step)
        out.trained.extend(unit)
        out.units.append(unit)
    yield from _lr_step_after(out, lr_step)
    return out


def group_schedule(groups_per_unit: int, units_per_step: int, use_ref: bool, whiten: bool, order: Order) -> Steps:
    out = ScheduleOutcome()
    target = units_per_step * groups_per_unit
    seen: list[int] = []  # every group taken this step
    final = False  # the whole batch's advantages exist (whiten)
    lr_step = False
    for u in range(units_per_step):
        yield BeginUnit(u)
        unit: list[int] = []
        buffered = False
        while len(unit) < groups_per_unit:
            # whatever has arrived, up to the unit's remainder: one θ_k swap for a burst of groups
            arrived: Arrivals = yield Take(groups_per_unit - len(unit), need=1)
            if not arrived.groups:
                break
            got = tuple(order(list(arrived.groups)))
            seen.extend(got)
            if whiten and not final and (len(seen) == target or arrived.closed):
                final = yield from _whiten(seen, target)  # the batch is complete
            into = whiten and not final
            yield OldLogProb(u, got, at_theta_k=u > 0, tag=got[-1])
            if use_ref:
                yield RefLogProb(u, got, tag=got[-1])
            yield Accumulate(u, got, into_buffers=into, final_advantages=whiten and final, tag=got[-1])
            if into:
                buffered = True
                out.buffered.extend(got)
            unit.extend(got)
        if not unit:
            break
        yield UnitReady(u, tuple(unit))
        if buffered and not final:
            # trained before the batch was complete: the step needs the whole batch's statistics
            final = yield from _whiten(seen, target)
        if u == 0 and units_per_step > 1:
            yield Snapshot(u)
        lr_step = _last(u, units_per_step, unit, groups_per_unit)
        yield OptimizerStep(u, tuple(unit), buffered, lr_step=lr_step)
        out.trained.extend(unit)
        out.units.append(tuple(unit))
    yield from _lr_step_after(out, lr_step)
    if out.buffered:
        yield FinalAdvantages(tuple(out.buffered))
    return out


def _whiten(seen: Sequence[int], target: int):
    """The whole batch: the first ``target`` groups taken or still queued, in dispatch order."""
    rest = (yield WaitRest()) if len(seen) < target else ()
    yield Whiten(tuple(sorted((list(seen) + list(rest))[:target])))
    return True


# ---------------------------------------------------------------------------------------------- driver

def drive(steps: Steps, execute: Callable[[object], object]) -> ScheduleOutcome:
    """Runs a schedule to its end: each action goes to ``execute``, its result back into the schedule."""
    result = None
    while True:
        try:
            action = steps.send(result)
        except StopIteration as stop:
            return stop.value
        result = execute(action)
