"""The rollout side of a step as pure code: one event handler, driven by the real rollout and by the simulator.

Pure Python (no asyncio, Ray, verl, torch or vLLM), like ``frontier.py`` and ``schedule.py``. ``RolloutCore`` wraps
the step's admission policy (``verl_pipe.core.frontier``) and holds what happens to a request or a group between its
admission and its end: a response taken, a complete group handed to the trainer (or found late: complete after the
batch was full), a failed or timed-out request retried or given up on (the step fails, or its group is dropped and
the next group in dispatch order, an oversampled one, takes its place), a dead replica's requests requeued and the
replica restarted or retired, the step's leftovers aborted once the batch is full. Each event is a method that
returns the actions the driver carries out, in order. Two drivers run it: ``verl_pipe.rollout.stream`` (asyncio
tasks over verl's agent loop and the vLLM replicas) and ``verl_pipe.sim.simulate`` (the simulated clock and engine
model; it models no faults, so it meets only the admission, response, hand-over and abort events).

Driver protocol (one step)::

    core = RolloutCore(policy, max_retries=2, on_request_failure="fail")   # or "drop_group"
    do(core.admit())                            # Submit each (NextTurn: release a trajectory's next turn); again
                                                # after every round of events
    do(core.turn_done(req, replica))            # multi-turn: a model turn ended, the trajectory waits on its tool
    do(core.tool_done(req, replica))            # its tool returned: a later admit() gives NextTurn
    do(core.response_done(req, replica, tokens))  # Take; then HandOver(g), or GroupEnded(g, "late")
    do(core.handed_over(g, trainable))          # after HandOver, with the driver's verdict: GroupEnded
    do(core.too_late(g))                        # or, HandOver'd but not built when the batch filled: GroupEnded
    do(core.request_failed(req, replica))       # raised or timed out: Retry; or GiveUp + FailStep | drop
    do(core.reward_failed(g, req, replica))     # scoring raised or timed out (req: its own reward, before its
                                                # response_done; None: the group's, after HandOver): ZeroReward
                                                # (then on as usual), or FailStep, or Cancel + GroupEnded(g, "dropped")
    do(core.replica_died(replica, restart))     # Restart | Retire, Cancel (its requests are requeued); or FailStep
    do(core.replica_back(replica, ok))          # a Restart finished: nothing, or FailStep (no replica left)
    if core.batch_full: do(core.close())        # Cancel the leftovers: nothing of the step carries over
    ... until core.all_done, or nothing is in flight and no replica is restarting

A drop is GiveUp, Cancel (the group's other requests in flight), GroupEnded(g, "dropped"). When the driver calls
``close()`` is its timing model, not a decision: the real driver takes every response that finished by its wake-up
first (a group they complete after the batch filled is late), the simulated one closes the moment the batch fills.
Every decision about a request or a group is made here, once.

Invariants (checked here, tested over random event orders in tests/test_rollout_core.py): a request is never
submitted while it is in flight; every group ends exactly once (``outcomes()``: trained, untrainable, late,
dropped, aborted, or failed with the step); a request fails at most ``max_retries + 1`` times and is never
resubmitted after its last failure. The policy must be driven only through the core (its mutators are called
here), so that both see the same requests in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_pipe.core.frontier import Admission, AdmissionPolicy, Request

ON_REQUEST_FAILURE = ("fail", "drop_group")
# A reward that raised or timed out (rolloutpipe.reward.on_failure): the step fails naming the record; the failed
# responses score 0 and the group goes on; or the group is dropped as a request's failure drops it.
ON_REWARD_FAILURE = ("fail", "zero_reward", "drop_group")
GROUP_ENDS = ("trained", "untrainable", "late", "dropped", "aborted", "failed")


# ---------------------------------------------------------------------------------------------- actions

@dataclass(frozen=True)
class Submit:
    """Send ``admission.request`` to ``admission.replica`` with ``admission.priority``; ``attempt``: how often it
    failed before (0 on its first submission)."""
    admission: Admission
    attempt: int


@dataclass(frozen=True)
class NextTurn:
    """Multi-turn: the trajectory of ``admission.request`` (in flight, its tool returned) may send its next model turn
    (``admission.turn``) to ``admission.replica`` (the replica it runs on) with ``admission.priority``."""
    admission: Admission


@dataclass(frozen=True)
class Take:
    """``request``'s response counts: keep it for its group (and record it)."""
    request: Request


@dataclass(frozen=True)
class HandOver:
    """All n responses of ``group`` are in and the batch is not full: build the group, give it to the trainer, and
    report whether it is trainable with ``handed_over``."""
    group: int


@dataclass(frozen=True)
class GroupEnded:
    """``group`` is finished with; its responses can go. ``how``: "trained" or "untrainable" (handed over), "late"
    (complete after the batch was full: never trained) or "dropped" (a request of it failed past its retries)."""
    group: int
    how: str

    @property
    def trainable(self) -> bool:
        return self.how == "trained"


@dataclass(frozen=True)
class Retry:
    """``request`` failed (its ``attempt``-th failure); it is pending again and a later ``admit()`` resubmits it."""
    request: Request
    attempt: int


@dataclass(frozen=True)
class GiveUp:
    """``request`` failed past its retries (its ``attempt``-th failure); FailStep or its group's drop follows."""
    request: Request
    attempt: int


@dataclass(frozen=True)
class ZeroReward:
    """Scoring ``group`` (``request``'s response alone, or with None the group's responses) raised or timed out, and
    on_reward_failure=zero_reward: the responses without a score get reward 0 (and the reward's extra-info keys at 0);
    then on as usual (``response_done`` for ``request``, ``handed_over`` for the group)."""
    group: int
    request: Request | None = None


@dataclass(frozen=True)
class Cancel:
    """Stop whatever of these requests still runs; any later report about them is stale and ignored. ``why``:
    "replica_died" (requeued: they are admitted again), "group_dropped" or "batch_full" (closed)."""
    requests: tuple[Request, ...]
    why: str


@dataclass(frozen=True)
class Restart:
    """Restart ``replica`` (with the step's weights) and report the outcome with ``replica_back``."""
    replica: int


@dataclass(frozen=True)
class Retire:
    """``replica`` is gone for good: release it; the step goes on with the others."""
    replica: int


@dataclass(frozen=True)
class FailStep:
    """The step cannot finish. ``why``: "request_failed" (``request`` past its retries with
    on_request_failure=fail), "reward_failed" (scoring ``group``, or ``request``'s response, raised or timed out with
    on_reward_failure=fail), "no_replica_left" (``replica`` died, no restart, none left) or "restart_failed"
    (``replica``'s restart failed and none is left)."""
    why: str
    request: Request | None = None
    replica: int | None = None
    group: int | None = None


@dataclass
class RolloutCounts:
    """The step's counters (the real driver's ``StepResult`` carries them)."""
    responses: int = 0
    failed_attempts: int = 0
    aborted: int = 0  # in flight when the batch was full
    groups_done: int = 0  # handed over
    untrainable: int = 0
    late_groups: int = 0  # completed after the batch was full: dropped, never trained
    dropped_groups: int = 0  # a request failed past max_retries, or its reward failed (on_*_failure=drop_group)
    reward_failures: int = 0  # scoring a response or a group raised or timed out
    replica_failures: int = 0  # replicas found dead during the step
    replica_restarts: int = 0
    requeued_requests: int = 0  # in flight on a dead replica, admitted again


# ---------------------------------------------------------------------------------------------- the core

class RolloutCore:
    """One step's rollout decisions over ``policy`` (an ``AdmissionPolicy``; its ``n`` responses make a group).

    ``max_retries``: how often a failed request is resubmitted; ``on_request_failure``: then "fail" the step or
    "drop_group"; ``on_reward_failure``: a reward that raised or timed out "fail"s the step, scores "zero_reward" or
    drops its group ("drop_group"). Seams the drivers rely on: the action classes above, ``counts``, ``batch_full`` / ``all_done``,
    ``inflight_count()`` and ``failures(request)``.
    """

    def __init__(self, policy: AdmissionPolicy, max_retries: int = 2, on_request_failure: str = "fail",
                 on_reward_failure: str = "fail"):
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if on_request_failure not in ON_REQUEST_FAILURE:
            raise ValueError(f"on_request_failure must be one of {ON_REQUEST_FAILURE}, got {on_request_failure!r}")
        if on_reward_failure not in ON_REWARD_FAILURE:
            raise ValueError(f"on_reward_failure must be one of {ON_REWARD_FAILURE}, got {on_reward_failure!r}")
        self.policy, self.n = policy, policy.n
        self.max_retries, self.on_request_failure = max_retries, on_request_failure
        self.on_reward_failure = on_reward_failure
        self.counts = RolloutCounts()
        self._inflight: dict[Request, int] = {}  # submitted, not yet answered -> replica; in admission order
        self._failures: dict[Request, int] = {}
        self._responses = [0] * policy.num_groups  # responses taken per group
        self._handing: set[int] = set()  # HandOver given, verdict not yet reported
        self._restarting: set[int] = set()
        self._ended: dict[int, str] = {}  # group -> how it ended (GROUP_ENDS)
        self._closed = self._failed = False

    # --- state the drivers read -----------------------------------------------------------------------------
    @property
    def batch_full(self) -> bool:
        return self.policy.batch_full

    @property
    def all_done(self) -> bool:
        return self.policy.all_done

    def inflight_count(self) -> int:
        return len(self._inflight)

    @property
    def failed(self) -> bool:
        """A FailStep was given: the step is over."""
        return self._failed

    def failures(self, request: Request) -> int:
        return self._failures.get(request, 0)

    def outcomes(self) -> dict[int, str]:
        """How each group ended so far (a group still open is absent)."""
        return dict(self._ended)

    # --- events ---------------------------------------------------------------------------------------------
    def admit(self) -> list:
        """What the policy admits now: Submit (a trajectory's first turn, submitted once) or NextTurn (the next turn
        of a trajectory in flight)."""
        out = []
        for adm in self.policy.admit():
            req = adm.request
            if adm.turn:
                if self._inflight.get(req) != adm.replica:
                    raise RuntimeError(f"next turn of {req} admitted on replica {adm.replica}, where it does not run")
                out.append(NextTurn(adm))
                continue
            if req in self._inflight or req.group in self._ended:
                raise RuntimeError(f"{req} admitted while in flight or after its group ended")
            self._inflight[req] = adm.replica
            out.append(Submit(adm, self._failures.get(req, 0)))
        return out

    def response_done(self, request: Request, replica: int, tokens: int | None = None) -> list:
        """``request`` answered on ``replica`` (``tokens``: its response's length, which the policy's length
        predictions learn from). [] when the answer is stale (requeued elsewhere or closed)."""
        if not self.policy.on_response_done(request, replica):
            return []
        if tokens is not None:
            self.policy.observe_length(request, tokens)
        if self._inflight.pop(request, None) != replica:
            raise RuntimeError(f"{request} answered on replica {replica}, not where the core sent it")
        self.counts.responses += 1
        g = request.group
        self._responses[g] += 1
        if self._responses[g] < self.n:
            return [Take(request)]
        if self.policy.batch_full:  # completed after the batch's last group (before the driver closed the step)
            self.policy.on_group_done(g, False)
            self.counts.late_groups += 1
            return [Take(request), self._end(g, "late")]
        self._handing.add(g)
        return [Take(request), HandOver(g)]

    def turn_done(self, request: Request, replica: int) -> list:
        """Multi-turn: a model turn of ``request``'s trajectory on ``replica`` ended and it waits on its tool (it gives
        its window slot back). [] always; a stale report is ignored."""
        if self._inflight.get(request) == replica:
            self.policy.on_turn_done(request, replica)
        return []

    def tool_done(self, request: Request, replica: int) -> list:
        """Multi-turn: ``request``'s tool returned; a later ``admit()`` releases its next turn (NextTurn). [] always;
        a stale report is ignored."""
        if self._inflight.get(request) == replica:
            self.policy.on_tool_done(request, replica)
        return []

    def handed_over(self, group: int, trainable: bool) -> list:
        """The driver built ``group`` (after HandOver) and found it ``trainable`` or not."""
        if group not in self._handing:
            raise RuntimeError(f"group {group} was not handed over")
        self._handing.remove(group)
        trainable = bool(trainable)
        self.policy.on_group_done(group, trainable)
        self.counts.groups_done += 1
        self.counts.untrainable += 0 if trainable else 1
        return [self._end(group, "trained" if trainable else "untrainable")]

    def too_late(self, group: int) -> list:
        """A group given HandOver whose build the driver had not finished when the batch filled (it builds groups off
        its loop, e.g. scoring their rewards): it ends late, as a group completing after the batch filled does."""
        if group not in self._handing:
            raise RuntimeError(f"group {group} was not handed over")
        if not self.policy.batch_full:
            raise RuntimeError(f"group {group}: the batch is not full, hand it over")
        self._handing.remove(group)
        self.policy.on_group_done(group, False)
        self.counts.late_groups += 1
        return [self._end(group, "late")]

    def request_failed(self, request: Request, replica: int) -> list:
        """``request`` raised or timed out on ``replica`` (not because the replica died: ``replica_died``). [] when
        the report is stale. Within ``max_retries`` it is requeued; past them the step fails or its group is dropped
        (its other requests cancelled; it counts as untrainable, so the next group takes its place)."""
        if self._inflight.get(request) != replica:
            return []
        del self._inflight[request]
        attempt = self._failures[request] = self._failures.get(request, 0) + 1
        self.counts.failed_attempts += 1
        if attempt <= self.max_retries:
            self.policy.on_request_failed(request, replica)
            return [Retry(request, attempt)]
        if self.on_request_failure == "fail":
            return [GiveUp(request, attempt), self._fail("request_failed", request=request)]
        g = request.group
        self.policy.drop_group(g)
        cancel = self._take_inflight(lambda q, r: q.group == g)
        self.counts.dropped_groups += 1
        return [GiveUp(request, attempt), Cancel(cancel, "group_dropped"), self._end(g, "dropped")]

    def reward_failed(self, group: int, request: Request | None = None, replica: int | None = None,
                      can_zero: bool = True) -> list:
        """Scoring raised or timed out: ``request``'s own reward (verl's per-response call, reported before its
        ``response_done``; [] when the report is stale), or with ``request`` None the reward of ``group`` (after its
        HandOver, rolloutpipe.reward.score_by_group). Not retried: the same rows would be scored again (a reward bug is
        deterministic), and a request retry would regenerate a response that was fine. ``on_reward_failure`` decides:
        ZeroReward; FailStep; or the group dropped (its other requests cancelled; the next group takes its place).
        ``can_zero``: the driver can give the failed responses a zero score (it knows the reward's extra-info keys
        from a response scored before); without it a zero_reward failure drops the group instead."""
        if request is not None:
            if request.group != group:
                raise ValueError(f"{request} is not of group {group}")
            if self._inflight.get(request) != replica:
                return []
        elif group not in self._handing:
            raise RuntimeError(f"group {group} was not handed over")
        self.counts.reward_failures += 1
        if self.on_reward_failure == "zero_reward" and can_zero:
            return [ZeroReward(group, request)]
        if request is not None:
            del self._inflight[request]
        else:
            self._handing.remove(group)
        if self.on_reward_failure == "fail":
            return [self._fail("reward_failed", request=request, group=group)]
        self.policy.drop_group(group)
        cancel = self._take_inflight(lambda q, r: q.group == group)
        self.counts.dropped_groups += 1
        return [Cancel(cancel, "group_dropped"), self._end(group, "dropped")]

    def replica_died(self, replica: int, restart: bool) -> list:
        """``replica``'s server or engine is gone. The first report takes it out of admission: its requests in flight
        go back to pending (no retry used up: not their fault) and are cancelled; it is restarted (``restart``: the
        driver can) or retired. Without a restart the last replica cannot go: the step fails. A report about a
        replica already out of admission is ignored ([])."""
        if replica not in self.policy.replicas:
            return []
        self.counts.replica_failures += 1
        if not restart and len(self.policy.replicas) == 1:
            return [self._fail("no_replica_left", replica=replica)]
        self.counts.requeued_requests += len(self.policy.remove_replica(replica, allow_none_left=restart))
        cancel = Cancel(self._take_inflight(lambda q, r: r == replica), "replica_died")
        if restart:
            self._restarting.add(replica)
            return [Restart(replica), cancel]
        return [Retire(replica), cancel]

    def replica_back(self, replica: int, ok: bool) -> list:
        """A Restart finished: ``ok``, the replica admits again; failed, the step goes on without it, or fails when
        no replica is left."""
        if replica not in self._restarting:
            raise RuntimeError(f"replica {replica} is not being restarted")
        self._restarting.remove(replica)
        if ok:
            self.counts.replica_restarts += 1
            self.policy.add_replica(replica)
            return []
        return [] if self.policy.replicas else [self._fail("restart_failed", replica=replica)]

    def close(self) -> list:
        """Once the batch is full: every request still in flight is cancelled (closed in the policy, so late reports
        about them are ignored) and every group not ended yet ends "aborted". [] before that, and after the first."""
        if not self.policy.batch_full or self._closed:
            return []
        if self._handing:
            raise RuntimeError(f"groups {sorted(self._handing)} are being handed over")
        self._closed = True
        closed = self.policy.to_abort()
        known = set(closed)
        cancel = tuple(closed) + self._take_inflight(lambda q, r: q not in known)
        self._inflight.clear()
        self.counts.aborted += len(cancel)
        self._end_open("aborted")
        return [Cancel(cancel, "batch_full")]

    # --- internals ------------------------------------------------------------------------------------------
    def _take_inflight(self, pred) -> tuple[Request, ...]:
        out = tuple(q for q, r in self._inflight.items() if pred(q, r))
        for q in out:
            del self._inflight[q]
        return out

    def _end(self, group: int, how: str) -> GroupEnded:
        if group in self._ended:
            raise RuntimeError(f"group {group} ended twice ({self._ended[group]}, then {how})")
        self._ended[group] = how
        return GroupEnded(group, how)

    def _end_open(self, how: str) -> None:
        for g in range(len(self._responses)):
            self._ended.setdefault(g, how)

    def _fail(self, why: str, request: Request | None = None, replica: int | None = None,
              group: int | None = None) -> FailStep:
        self._failed = True
        self._end_open("failed")
        return FailStep(why, request, replica, group)
