"""Discrete-event simulation of one RL step: admission policy -> replicas -> group completions -> trainer.

The rollout is an event loop (heapq) over replica segment ends; the admission policy is the real one from
``verl_pipe.core.frontier``, and what happens to each response and group (hand-over, abort once the batch is full) is
decided by the real driver's ``verl_pipe.core.rollout_core.RolloutCore``, so this file holds only the clock and the
engine model. Every boundary is recorded into the real ``verl_pipe.core.timeline.StepTimeline``, so
the simulator and the real trainer cannot disagree on what a metric means. The trainer never feeds back into
the rollout (separate pools, weights fixed for the step), so its schedule is computed from the completion
times afterwards (``trainer.schedule``), and the rollout can be reused across trainer modes.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from verl_pipe.core.admission import StepAdmission
from verl_pipe.core.frontier import AdaptiveWindow, FCFSPolicy, FrontierPolicy, Request, resolve_window
from verl_pipe.core.release import check_fill, dispatch_release_times
from verl_pipe.core.rollout_core import Cancel, GroupEnded, HandOver, NextTurn, RolloutCore, Take
from verl_pipe.core.timeline import StepTimeline
from verl_pipe.core.variants import variant
from verl_pipe.core.workload import Workload
from verl_pipe.sim.engine import EngineParams, Replica, Seq
from verl_pipe.sim.trainer import MODES, TrainerParams, schedule
from verl_pipe.sim.turns import Episodes

_EVENT, _PLAN = 0, 1  # at equal times, arrivals and completions are all in before any replica schedules


@dataclass
class RolloutResult:
    log: list[tuple[str, dict]]  # StepTimeline recorder calls, in time order
    completions: list[tuple[float, int]]  # trained groups (time, group), completion order
    rollout_end: float
    stats: dict = field(default_factory=dict)

    @property
    def ended(self) -> dict[int, float]:
        """When each group ended (trained or not); a group absent ended with the rollout (aborted)."""
        return {kw["group"]: kw["t"] for m, kw in self.log if m == "group_done"}

    def arrivals(self, unit_fill: str) -> list[tuple[float, int]]:
        """(time, group) of the trained groups as the trainer's FIFO receives them (rolloutpipe.cgp.unit_fill)."""
        if check_fill(unit_fill) == "completion":
            return self.completions
        return dispatch_release_times(self.completions, self.ended, self.rollout_end)

    def record_into(self, tl: StepTimeline) -> None:
        for method, kw in self.log:
            getattr(tl, method)(**kw)


def request_id(req: Request) -> str:
    return f"{req.group}-{req.index}"


def simulate_rollout(workload: Workload, engine: EngineParams, policy, num_replicas: int,
                     trainable: list[bool] | None = None, client_s_per_request: float = 0.0,
                     episodes: Episodes | None = None) -> RolloutResult:
    """Run the rollout of one step to its end; ``policy`` is an FCFSPolicy/FrontierPolicy over the replicas.

    ``client_s_per_request``: the driver's own time per request (submitting it, taking its response), on one
    thread, as the real driver is one asyncio loop (verl_pipe/rollout/stream.py): it wakes up, takes every response
    finished by then, one after the other, then submits what the policy admits, one after the other, and sleeps
    until the next response. Requests reach their replica when submitted; responses that finish while the driver
    is busy wait for its next cycle. 0 (the default): an instantaneous driver.

    ``episodes``: multi-turn trajectories (``verl_pipe.sim.turns``; ``workload`` is then ``episodes.workload(...)``):
    each model turn is one engine request, a tool wait holds no engine or window slot (the policy's turn-aware
    admission), the next turn goes to the same replica with its earlier context in the prefix cache, in whole KV
    blocks (``Episodes.cached_before``: with a block of 1 token only the tool message is prefilled). Turn events
    cost the driver nothing; a next turn's submission costs ``client_s_per_request`` like a first turn's."""
    if engine.step_time(1, 0) <= 0:
        raise ValueError("engine step time must be positive")
    if client_s_per_request < 0:
        raise ValueError(f"client_s_per_request must be >= 0, got {client_s_per_request}")
    trainable = trainable or [True] * workload.num_groups
    if episodes is not None and (episodes.num_groups, episodes.n) != (workload.num_groups, workload.n):
        raise ValueError(f"episodes cover {episodes.num_groups} groups x {episodes.n}, the workload "
                         f"{workload.num_groups} x {workload.n}")
    return _SimRollout(workload, engine, policy, num_replicas, trainable, float(client_s_per_request),
                       episodes).run()


class _SimRollout:
    """One simulated rollout: the replicas (``sim.engine``), the event heap and the driver's own clock around the
    step's ``RolloutCore``, which makes every decision about requests and groups (as in the real driver).

    The heap holds segment ends ("seg_end", versioned: an interrupt supersedes a planned end), replica plans,
    and with a driver cost (``c`` s per request) the requests' arrivals, the aborts and the driver's wake-ups."""

    def __init__(self, workload: Workload, engine: EngineParams, policy, num_replicas: int, trainable: list[bool],
                 c: float, episodes: Episodes | None = None):
        self.workload, self.engine, self.policy, self.trainable, self.c = workload, engine, policy, trainable, c
        self.episodes = episodes
        self.turn_log: list[tuple] = []  # multi-turn: (t, group, index, turn, replica, priority) per model turn sent
        self.admit_wanted = False  # multi-turn with a driver cost: a tool returned while the driver was busy
        self.core = RolloutCore(policy)
        self.reps = [Replica(r, engine) for r in range(num_replicas)]
        self.version = [0] * num_replicas
        self.plan_pending: set[int] = set()
        self.heap: list = []
        self.tie = itertools.count()
        self.seqs: dict[Request, tuple[Seq, int]] = {}
        self.done_t: dict[int, float] = {}
        self.log: list[tuple[str, dict]] = []
        self.order = itertools.count()
        self.rids = itertools.count()  # one per engine request (a multi-turn trajectory makes one per turn)
        self.ready: list[tuple[Seq, int]] = []  # generated, not yet taken by the (busy) driver
        self.driver_busy = False

    def push(self, t, phase, kind, payload) -> None:
        heapq.heappush(self.heap, (t, phase, next(self.tie), kind, payload))

    def run(self) -> RolloutResult:
        if self.c:
            self.driver_cycle(0.0)
        else:
            self.admit(0.0)
        handlers = {"plan": self.on_plan, "arrive": self.on_arrive, "abort": self.on_abort,
                    "driver": self.on_driver, "seg_end": self.on_segment_end, "tool": self.on_tool}
        while self.heap:
            t, _, _, kind, payload = heapq.heappop(self.heap)
            handlers[kind](payload, t)
        return self.result()

    # --- the engines -------------------------------------------------------------------------------------------
    def wake(self, r: int, t: float) -> None:
        rep = self.reps[r]
        if rep.idle:
            if r not in self.plan_pending:
                self.plan_pending.add(r)
                self.push(t, _PLAN, "plan", r)
            return
        # cut the segment after the step in progress only if the newcomer could join it
        if len(rep.running) < self.engine.max_num_seqs or any(s.aborted for s in rep.running.values()):
            end = rep.interrupt(t)
            if end is not None:
                self.version[r] += 1
                self.push(end, _EVENT, "seg_end", (r, self.version[r]))

    def on_plan(self, r: int, t: float) -> None:
        self.plan_pending.discard(r)
        if self.reps[r].idle:
            end = self.reps[r].plan(t)
            if end is not None:
                self.version[r] += 1
                self.push(end, _EVENT, "seg_end", (r, self.version[r]))

    def on_arrive(self, payload: tuple[Seq, int], t: float) -> None:
        """A request the driver submitted reaches its replica."""
        s, r = payload
        self.reps[r].submit(s)
        self.wake(r, t)

    def on_abort(self, payload: tuple[Seq, int], t: float) -> None:
        self.abort(*payload, t)

    def abort(self, qs: Seq, qr: int, t: float) -> None:
        self.reps[qr].abort(qs)
        self.wake(qr, t)

    def on_segment_end(self, payload: tuple[int, int], t: float) -> None:
        r, v = payload
        if v != self.version[r]:
            return  # superseded by an interrupt
        for s in self.reps[r].finish_segment():
            if s.aborted:
                continue
            if self.episodes is not None and self.turn_ended(s, r, t):
                continue
            if self.c:
                self.ready.append((s, r))
            else:
                self.respond(s, r, t)
        if self.c:
            if self.ready and not self.driver_busy:
                self.driver_cycle(t)
        else:
            self.admit(t)
        if r not in self.plan_pending:
            self.plan_pending.add(r)
            self.push(t, _PLAN, "plan", r)

    # --- multi-turn ----------------------------------------------------------------------------------------------
    def turn_ended(self, s: Seq, r: int, t: float) -> bool:
        """A model turn generated its last token. True: the trajectory goes on to its tool (a wait, then its next
        turn or its end); False: it ended with this turn (its response is taken as a single-turn one)."""
        turns, waits = self.episodes.segments(s.group, s.index)
        if s.turn >= len(waits):
            return False
        self.do(self.core.turn_done(Request(s.group, s.index), r), t)
        self.push(t + waits[s.turn], _EVENT, "tool", (s, r))
        if self.c:  # its freed slot is refilled at the driver's next cycle (at once without a driver cost)
            if self.driver_busy:
                self.admit_wanted = True
            else:
                self.driver_cycle(t)
        return True

    def on_tool(self, payload: tuple[Seq, int], t: float) -> None:
        s, r = payload
        req = Request(s.group, s.index)
        if self.seqs.get(req, (None,))[0] is not s or s.aborted:
            return  # the trajectory was aborted meanwhile
        if s.turn + 1 >= len(self.episodes.segments(s.group, s.index)[0]):  # it ends on its tool
            if self.c:
                self.ready.append((s, r))
                if not self.driver_busy:
                    self.driver_cycle(t)
            else:
                self.respond(s, r, t)
                self.admit(t)
            return
        self.do(self.core.tool_done(req, r), t)
        if not self.c:
            self.admit(t)
        elif self.driver_busy:
            self.admit_wanted = True
        else:
            self.driver_cycle(t)

    def next_turn_seq(self, adm, t: float) -> Seq:
        req = adm.request
        g, i, k = req.group, req.index, adm.turn
        ctx = self.workload.prompt_len + self.episodes.context_before(g, i, k)
        cached = self.episodes.cached_before(g, i, k, self.workload.prompt_len)  # on this replica's prefix cache
        return Seq(next(self.rids), g, i, self.episodes.turns[g][i][k], ctx, adm.priority, t, next(self.order),
                   cached=cached, turn=k)

    # --- the driver --------------------------------------------------------------------------------------------
    def admit(self, t: float) -> float:
        """Submits what the core admits, from t on; returns when the driver is done submitting."""
        touched = set()
        self.admit_wanted = False
        for act in self.core.admit():
            adm = act.admission
            req, r = adm.request, adm.replica
            g, i = req.group, req.index
            t += self.c
            if isinstance(act, NextTurn):
                s = self.next_turn_seq(adm, t)
            else:
                length = self.episodes.turns[g][i][0] if self.episodes else self.workload.lengths[g][i]
                s = Seq(next(self.rids), g, i, length, self.workload.prompt_len, adm.priority, t, next(self.order))
                self.log.append(("request_submitted", dict(request_id=request_id(req), group=g, replica=r, t=t)))
            self.seqs[req] = (s, r)
            if self.episodes is not None:
                self.turn_log.append((t, g, i, adm.turn, r, adm.priority))
            if self.c:
                self.push(t, _EVENT, "arrive", (s, r))
                continue
            self.reps[r].submit(s)
            touched.add(r)
        for r in sorted(touched):
            self.wake(r, t)
        return t

    def respond(self, s: Seq, r: int, t: float) -> None:
        """The driver takes a generated response (stale once aborted in the same driver cycle: then dropped)."""
        self.do(self.core.response_done(Request(s.group, s.index), r, self.workload.lengths[s.group][s.index]), t)

    def do(self, actions: list, t: float) -> None:
        """Carries out the core's actions at t. This driver closes the step the moment the batch is full."""
        for act in actions:
            if isinstance(act, Take):
                q = act.request
                self.log.append(("response_done", dict(request_id=request_id(q), group=q.group,
                                                       num_tokens=self.workload.lengths[q.group][q.index], t=t)))
            elif isinstance(act, HandOver):
                self.done_t[act.group] = t
                self.do(self.core.handed_over(act.group, self.trainable[act.group]), t)
                self.do(self.core.close(), t)
            elif isinstance(act, GroupEnded):
                self.log.append(("group_done", dict(group=act.group, trainable=act.trainable, t=t)))
            elif isinstance(act, Cancel):
                for q in act.requests:
                    qs, qr = self.seqs[q]
                    self.log.append(("request_aborted", dict(request_id=request_id(q), group=q.group, t=t)))
                    if self.c:
                        self.push(t, _EVENT, "abort", (qs, qr))
                    else:
                        self.abort(qs, qr, t)
            else:
                raise TypeError(f"the simulator models no faults, got {act!r}")

    def driver_cycle(self, t: float) -> None:
        """One wake-up of a driver with a cost: every response ready now, then the admissions; its next
        wake-up is when that work is done (it then sleeps if nothing finished meanwhile)."""
        batch, self.ready = self.ready, []
        for s, r in batch:
            if not s.aborted:  # a leftover aborted after it finished, before the driver took it
                t += self.c
                self.respond(s, r, t)
        self.driver_busy = True
        self.push(self.admit(t), _EVENT, "driver", None)

    def on_driver(self, _payload, t: float) -> None:
        if self.ready or self.admit_wanted:
            self.driver_cycle(t)
        else:
            self.driver_busy = False

    def result(self) -> RolloutResult:
        policy, reps = self.policy, self.reps
        trained = policy.trained_groups()
        completions = sorted(((self.done_t[g], g) for g in trained), key=lambda x: x[0])
        if policy.pending_count or (self.core.inflight_count() and not self.core.batch_full):
            raise RuntimeError("rollout ended with work left: the engine model stalled")
        stats = dict(policy.stats(), preemptions=sum(rep.num_preemptions for rep in reps),
                     **({"turn_log": self.turn_log} if self.episodes is not None else {}),
                     replica_busy_s=[rep.busy_s for rep in reps], peak_kv_tokens=[rep.peak_kv for rep in reps])
        # the rollout ends with its last response or abort (an aborted request's leftover steps do not count)
        rollout_end = max((kw["t"] for m, kw in self.log if m in ("response_done", "request_aborted")), default=0.0)
        return RolloutResult(self.log, completions, rollout_end, stats)


def step_admission(workload: Workload, num_replicas: int, groups_per_unit: int, window, target_groups: int | None = None,
                   order: str = "group_major", frontier: dict | None = None, unit_fill: str = "completion",
                   lengths=None, baseline_window: int | None = None, rest_order: str = "rank") -> StepAdmission:
    """What a simulated step tells its admission policy (``AdmissionPolicy.for_step``), as the trainer does:
    ``window`` is FGD's (resolved), ``baseline_window`` and ``order`` the stock dispatch's; ``frontier``:
    ``frontier_groups`` / ``slack``, and any other FrontierPolicy argument (``affinity``) as the policy's extra."""
    frontier = dict(frontier or {})
    return StepAdmission(workload.num_groups, workload.n, groups_per_unit, target_groups or workload.num_groups,
                         list(range(num_replicas)), fgd_window=window,
                         frontier_groups=frontier.pop("frontier_groups", "auto"), slack=frontier.pop("slack", 0),
                         baseline_window=baseline_window, baseline_order=order, unit_fill=unit_fill,
                         lengths=lengths, rest_order=rest_order, extra=frontier)


def rollout_for_mode(mode: str, workload: Workload, engine: EngineParams, num_replicas: int, groups_per_unit: int,
                     window: int | str | AdaptiveWindow | None, order: str = "group_major",
                     frontier: dict | None = None, target_groups: int | None = None,
                     trainable: list[bool] | None = None, client_s_per_request: float = 0.0,
                     episodes: Episodes | None = None, fgd_policy: type = FrontierPolicy,
                     baseline_policy: type = FCFSPolicy, lengths=None, unit_fill: str = "completion",
                     rest_order: str = "rank") -> RolloutResult:
    """FGD modes use ``fgd_policy`` (``rolloutpipe.fgd.policy``; FrontierPolicy by default) and vLLM's priority
    scheduling; every other mode uses ``baseline_policy`` (the stock FCFS dispatch, ``window`` its window) with the
    engine as configured (verl default: fcfs). A window given as ``rolloutpipe.fgd.window`` spells it ("adaptive",
    "auto") is resolved as the trainer resolves it (``frontier.resolve_window``), against the engine's
    ``max_num_seqs``. ``lengths``: the step's length predictions (``verl_pipe.core.lengths.StepLengths``, a fresh one
    per rollout: it learns from the responses; ``sim.tail.step_lengths`` builds them), which FrontierPolicy orders by;
    ``unit_fill``: which groups the next unit takes (FGD's frontier with predictions); ``rest_order``: FGD's order
    beyond the frontier with predictions (``verl_pipe.core.admission.rest_order``)."""
    fgd = variant(mode).fgd
    if isinstance(window, str):
        window = resolve_window(window, groups_per_unit, workload.n, engine.max_num_seqs)
    step = step_admission(workload, num_replicas, groups_per_unit, window if fgd else None, target_groups, order,
                          frontier if fgd else None, unit_fill, lengths, baseline_window=None if fgd else window,
                          rest_order=rest_order)
    policy = (fgd_policy if fgd else baseline_policy).for_step(step)
    if fgd:
        engine = engine.with_(scheduling_policy="priority")
    return simulate_rollout(workload, engine, policy, num_replicas, trainable, client_s_per_request, episodes)


def timeline_for(rollout: RolloutResult, workload: Workload, trainer: TrainerParams, mode: str,
                 groups_per_unit: int, weight_sync_s: float, granularity: str = "minibatch",
                 step: int = 0, unit_fill: str = "completion") -> StepTimeline:
    """Schedule the trainer on a finished rollout and record everything into a fresh StepTimeline.
    ``unit_fill``: how our modes' FIFO is filled (verl_pipe/core/release.py; verl's peer always in completion order)."""
    arrivals = rollout.arrivals(unit_fill if variant(mode).ours else "completion")
    plan = schedule(mode, arrivals, workload.seq_lens, trainer, groups_per_unit, rollout.rollout_end, granularity)
    tl = StepTimeline(step, groups_per_unit, clock=lambda: 0.0)  # every event carries its simulated time
    rollout.record_into(tl)
    for u, groups, ready in plan.units:
        tl.unit_ready(u, groups, t=ready)
    for kind, start, end, u, g, groups in plan.spans:
        tl.train_span(kind, start, end, unit=u, group=g, groups=None if groups is None else list(groups))
    sync_start = max(plan.end, rollout.rollout_end)  # never push weights into a still-generating rollout
    tl.weight_sync(sync_start, sync_start + weight_sync_s)
    return tl


def simulate_step(workload: Workload, engine_params: EngineParams, trainer_params: TrainerParams, mode: str,
                  num_replicas: int, window: int | None = None, frontier: dict | None = None, seed: int = 0,
                  *, groups_per_unit: int = 32, order: str = "group_major", granularity: str = "minibatch",
                  weight_sync_s: float = 0.5, target_groups: int | None = None,
                  trainable_prob: float = 1.0, client_s_per_request: float = 0.0,
                  unit_fill: str = "completion", episodes: Episodes | None = None, lengths=None,
                  rest_order: str = "rank", fgd_policy: type = FrontierPolicy) -> StepTimeline:
    """One step in ``mode`` (sync, cgp, cgp_group, cgp_fgd, verl_separate_async) -> its StepTimeline.

    ``window``: per-replica client admission window (None: submit everything at once; for cgp_fgd also
    "adaptive" / "auto" as ``rolloutpipe.fgd.window`` spells them). ``client_s_per_request``: the driver's
    serial time per request (``simulate_rollout``). ``frontier``:
    FrontierPolicy kwargs for cgp_fgd; ``granularity`` ("minibatch" | "group") is its trainer granularity.
    ``seed`` draws which groups are trainable when ``trainable_prob`` < 1 (DAPO-style filtering). ``unit_fill``:
    rolloutpipe.cgp.unit_fill (the simulator's default is the paper's completion fill). ``episodes``: multi-turn
    trajectories (``simulate_rollout``); ``workload`` must then be ``episodes.workload(prompt_len)``. ``lengths``,
    ``rest_order``: the step's length predictions and FGD's order beyond the frontier, ``fgd_policy`` FGD's policy
    class (``rollout_for_mode``).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    trainable = [bool(x) for x in np.random.default_rng(seed).random(workload.num_groups) < trainable_prob]
    if target_groups is None and trainable_prob >= 1.0:
        target_groups = workload.num_groups
    rollout = rollout_for_mode(mode, workload, engine_params, num_replicas, groups_per_unit, window, order,
                               frontier, target_groups or workload.num_groups, trainable, client_s_per_request,
                               episodes, lengths=lengths, unit_fill=unit_fill, rest_order=rest_order,
                               fgd_policy=fgd_policy)
    return timeline_for(rollout, workload, trainer_params, mode, groups_per_unit, weight_sync_s, granularity,
                        unit_fill=unit_fill)
