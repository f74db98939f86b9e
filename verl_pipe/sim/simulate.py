"""Discrete-event simulation of one RL step: admission policy -> replicas -> group completions -> trainer.

The rollout is an event loop (heapq) over replica segment ends; the admission policy is the real one from
``verl_pipe.frontier`` and every boundary is recorded into the real ``verl_pipe.timeline.StepTimeline``, so
the simulator and the real trainer cannot disagree on what a metric means. The trainer never feeds back into
the rollout (separate pools, weights fixed for the step), so its schedule is computed from the completion
times afterwards (``trainer.schedule``), and the rollout can be reused across trainer modes.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from verl_pipe.frontier import AdaptiveWindow, FCFSPolicy, FrontierPolicy, Request, resolve_window
from verl_pipe.sim.engine import EngineParams, Replica, Seq
from verl_pipe.sim.trainer import MODES, TrainerParams, schedule
from verl_pipe.workload import Workload
from verl_pipe.timeline import StepTimeline

_EVENT, _PLAN = 0, 1  # at equal times, arrivals and completions are all in before any replica schedules


@dataclass
class RolloutResult:
    log: list[tuple[str, dict]]  # StepTimeline recorder calls, in time order
    completions: list[tuple[float, int]]  # trained groups (time, group), completion order
    rollout_end: float
    stats: dict = field(default_factory=dict)

    def record_into(self, tl: StepTimeline) -> None:
        for method, kw in self.log:
            getattr(tl, method)(**kw)


def request_id(req: Request) -> str:
    return f"{req.group}-{req.index}"


def simulate_rollout(workload: Workload, engine: EngineParams, policy, num_replicas: int,
                     trainable: list[bool] | None = None, client_s_per_request: float = 0.0) -> RolloutResult:
    """Run the rollout of one step to its end; ``policy`` is an FCFSPolicy/FrontierPolicy over the replicas.

    ``client_s_per_request``: the driver's own time per request (submitting it, taking its response), on one
    thread, as the real driver is one asyncio loop (verl_pipe/rollout/stream.py): it wakes up, takes every response
    finished by then, one after the other, then submits what the policy admits, one after the other, and sleeps
    until the next response. Requests reach their replica when submitted; responses that finish while the driver
    is busy wait for its next cycle. 0 (the default): an instantaneous driver."""
    if engine.step_time(1, 0) <= 0:
        raise ValueError("engine step time must be positive")
    if client_s_per_request < 0:
        raise ValueError(f"client_s_per_request must be >= 0, got {client_s_per_request}")
    c = float(client_s_per_request)
    trainable = trainable or [True] * workload.num_groups
    reps = [Replica(r, engine) for r in range(num_replicas)]
    version = [0] * num_replicas
    plan_pending: set[int] = set()
    heap: list = []
    tie = itertools.count()
    seqs: dict[Request, tuple[Seq, int]] = {}
    left_in_group = [workload.n] * workload.num_groups
    done_t: dict[int, float] = {}
    log: list[tuple[str, dict]] = []
    order = itertools.count()
    ready: list[tuple[Seq, int]] = []  # generated, not yet taken by the (busy) driver
    driver_busy = False

    def push(t, phase, kind, payload):
        heapq.heappush(heap, (t, phase, next(tie), kind, payload))

    def wake(r: int, t: float) -> None:
        rep = reps[r]
        if rep.idle:
            if r not in plan_pending:
                plan_pending.add(r)
                push(t, _PLAN, "plan", r)
            return
        # cut the segment after the step in progress only if the newcomer could join it
        if len(rep.running) < engine.max_num_seqs or any(s.aborted for s in rep.running.values()):
            end = rep.interrupt(t)
            if end is not None:
                version[r] += 1
                push(end, _EVENT, "seg_end", (r, version[r]))

    def admit(t: float) -> float:
        """Submits what the policy admits, from t on; returns when the driver is done submitting."""
        touched = set()
        for adm in policy.admit():
            req, r = adm.request, adm.replica
            g, i = req.group, req.index
            t += c
            s = Seq(len(seqs), g, i, workload.lengths[g][i], workload.prompt_len, adm.priority, t, next(order))
            seqs[req] = (s, r)
            log.append(("request_submitted", dict(request_id=request_id(req), group=g, replica=r, t=t)))
            if c:
                push(t, _EVENT, "arrive", (s, r))
                continue
            reps[r].submit(s)
            touched.add(r)
        for r in sorted(touched):
            wake(r, t)
        return t

    def abort(qs: Seq, qr: int, t: float) -> None:
        reps[qr].abort(qs)
        wake(qr, t)

    def respond(s: Seq, r: int, t: float) -> None:
        """The driver takes a generated response: the policy's callbacks, the group's completion, the aborts."""
        req = Request(s.group, s.index)
        if not policy.on_response_done(req, r):
            return  # aborted earlier in the same driver cycle (the batch filled): the driver drops it
        log.append(("response_done", dict(request_id=request_id(req), group=s.group, num_tokens=s.length, t=t)))
        left_in_group[s.group] -= 1
        if left_in_group[s.group] == 0:
            done_t[s.group] = t
            policy.on_group_done(s.group, trainable[s.group])
            log.append(("group_done", dict(group=s.group, trainable=trainable[s.group], t=t)))
            if policy.batch_full:
                for q in policy.to_abort():
                    qs, qr = seqs[q]
                    log.append(("request_aborted", dict(request_id=request_id(q), group=q.group, t=t)))
                    if c:
                        push(t, _EVENT, "abort", (qs, qr))
                    else:
                        abort(qs, qr, t)

    def driver_cycle(t: float) -> None:
        """One wake-up of a driver with a cost: every response ready now, then the admissions; its next
        wake-up is when that work is done (it then sleeps if nothing finished meanwhile)."""
        nonlocal ready, driver_busy
        batch, ready = ready, []
        for s, r in batch:
            if not s.aborted:  # a leftover aborted after it finished, before the driver took it
                t += c
                respond(s, r, t)
        driver_busy = True
        push(admit(t), _EVENT, "driver", None)

    if c:
        driver_cycle(0.0)
    else:
        admit(0.0)
    while heap:
        t, _, _, kind, payload = heapq.heappop(heap)
        if kind == "plan":
            plan_pending.discard(payload)
            if reps[payload].idle:
                end = reps[payload].plan(t)
                if end is not None:
                    version[payload] += 1
                    push(end, _EVENT, "seg_end", (payload, version[payload]))
            continue
        if kind == "arrive":  # a request the driver submitted reaches its replica
            s, r = payload
            reps[r].submit(s)
            wake(r, t)
            continue
        if kind == "abort":
            abort(*payload, t)
            continue
        if kind == "driver":
            if ready:
                driver_cycle(t)
            else:
                driver_busy = False
            continue
        r, v = payload
        if v != version[r]:
            continue  # superseded by an interrupt
        for s in reps[r].finish_segment():
            if s.aborted:
                continue
            if c:
                ready.append((s, r))
            else:
                respond(s, r, t)
        if c:
            if ready and not driver_busy:
                driver_cycle(t)
        else:
            admit(t)
        if r not in plan_pending:
            plan_pending.add(r)
            push(t, _PLAN, "plan", r)

    trained = policy.trained_groups()
    completions = sorted(((done_t[g], g) for g in trained), key=lambda x: x[0])
    unfinished = [q for q, (s, _) in seqs.items() if not s.aborted and left_in_group[q.group] > 0]
    if policy.pending_count or (unfinished and not policy.batch_full):
        raise RuntimeError("rollout ended with work left: the engine model stalled")
    stats = dict(policy.stats(), preemptions=sum(rep.num_preemptions for rep in reps),
                 replica_busy_s=[rep.busy_s for rep in reps], peak_kv_tokens=[rep.peak_kv for rep in reps])
    # the rollout ends with its last response or abort (an aborted request's leftover steps do not count)
    rollout_end = max((kw["t"] for m, kw in log if m in ("response_done", "request_aborted")), default=0.0)
    return RolloutResult(log, completions, rollout_end, stats)


def make_policy(kind: str, workload: Workload, num_replicas: int, groups_per_unit: int,
                window: int | AdaptiveWindow | None, target_groups: int | None = None, order: str = "group_major",
                frontier: dict | None = None):
    """``kind``: "fcfs" (stock dispatch in ``order``) or "fgd" (FrontierPolicy with ``frontier`` kwargs)."""
    args = (workload.num_groups, workload.n, groups_per_unit, target_groups or workload.num_groups,
            list(range(num_replicas)), window)
    if kind == "fcfs":
        return FCFSPolicy(*args, order=order)
    if kind == "fgd":
        return FrontierPolicy(*args, **(frontier or {}))
    raise ValueError(f"unknown policy kind {kind!r}")


def rollout_for_mode(mode: str, workload: Workload, engine: EngineParams, num_replicas: int, groups_per_unit: int,
                     window: int | str | AdaptiveWindow | None, order: str = "group_major",
                     frontier: dict | None = None, target_groups: int | None = None,
                     trainable: list[bool] | None = None, client_s_per_request: float = 0.0) -> RolloutResult:
    """FGD modes use the FrontierPolicy and vLLM's priority scheduling (its priorities are group ranks);
    every other mode uses the stock FCFS dispatch with the engine as configured (verl default: fcfs).
    A window given as ``rolloutpipe.fgd.window`` spells it ("adaptive", "auto") is resolved as the trainer
    resolves it (``frontier.resolve_window``), against the engine's ``max_num_seqs``."""
    fgd = mode == "cgp_fgd"
    if isinstance(window, str):
        window = resolve_window(window, groups_per_unit, workload.n, engine.max_num_seqs)
    policy = make_policy("fgd" if fgd else "fcfs", workload, num_replicas, groups_per_unit, window,
                         target_groups, order, frontier)
    if fgd:
        engine = engine.with_(scheduling_policy="priority")
    return simulate_rollout(workload, engine, policy, num_replicas, trainable, client_s_per_request)


def timeline_for(rollout: RolloutResult, workload: Workload, trainer: TrainerParams, mode: str,
                 groups_per_unit: int, weight_sync_s: float, granularity: str = "minibatch",
                 step: int = 0) -> StepTimeline:
    """Schedule the trainer on a finished rollout and record everything into a fresh StepTimeline."""
    tmode = "cgp_group" if (mode == "cgp_fgd" and granularity == "group") else mode
    plan = schedule(tmode, rollout.completions, workload.seq_lens, trainer, groups_per_unit, rollout.rollout_end)
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
                  trainable_prob: float = 1.0, client_s_per_request: float = 0.0) -> StepTimeline:
    """One step in ``mode`` (sync, cgp, cgp_group, cgp_fgd, verl_separate_async) -> its StepTimeline.

    ``window``: per-replica client admission window (None: submit everything at once; for cgp_fgd also
    "adaptive" / "auto" as ``rolloutpipe.fgd.window`` spells them). ``client_s_per_request``: the driver's
    serial time per request (``simulate_rollout``). ``frontier``:
    FrontierPolicy kwargs for cgp_fgd; ``granularity`` ("minibatch" | "group") is its trainer granularity.
    ``seed`` draws which groups are trainable when ``trainable_prob`` < 1 (DAPO-style filtering).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    trainable = [bool(x) for x in np.random.default_rng(seed).random(workload.num_groups) < trainable_prob]
    if target_groups is None and trainable_prob >= 1.0:
        target_groups = workload.num_groups
    rollout = rollout_for_mode(mode, workload, engine_params, num_replicas, groups_per_unit, window, order,
                               frontier, target_groups or workload.num_groups, trainable, client_s_per_request)
    return timeline_for(rollout, workload, trainer_params, mode, groups_per_unit, weight_sync_s, granularity)
