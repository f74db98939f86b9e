"""Rollout-side admission policies: the stock FCFS baseline and FGD (frontier-group dispatch).

Pure bookkeeping, stdlib only, so that the real rollout driver (asyncio, vLLM replicas) and the discrete-event
simulator share one implementation and it can be tested exhaustively.

Why a client-side policy at all: vLLM V1 with ``scheduling_policy="priority"`` only reorders its *waiting* queue;
a high-priority arrival never preempts a running request when ``max_num_seqs`` binds (vllm#40004). If every
request goes to the engine at once, whatever got a running slot first keeps it. So FGD keeps a per-replica
admission ``window`` on the client and decides itself which request takes a freed slot; the engine priority
orders what does queue inside vLLM (and picks KV-pressure preemption victims). The default window
(``AdaptiveWindow``) is never below the engine's running slots, so the client never throttles the engine:
FGD only chooses which requests fill the slots and orders the short queue behind them.

Driver protocol (one step):
    policy = FrontierPolicy(...)
    send(policy.admit())                          # and again after every callback below
    policy.on_response_done(req) / policy.on_request_failed(req)
    policy.on_turn_done(req) / policy.on_tool_done(req)   # multi-turn: a model turn ended / its tool returned
    policy.on_group_done(g, trainable)            # after the group's rewards/advantages are computed
    if policy.batch_full: abort(policy.to_abort())
    ... until policy.all_done and policy.inflight_count() == 0

Requests the policy cancels (``to_abort`` once the batch is full, and pending ones dropped then) are *closed*:
late callbacks about them are ignored, because an abort always races with a response that just finished.

Multi-turn (turn-aware admission): a request is a whole trajectory, admitted once for its first turn
(``Admission.turn == 0``). When one of its model turns ends and it waits on its tool (``on_turn_done``), it gives
its window slot back: it stays on its replica but holds no slot, so windows and ``inflight_count`` count *turns in
flight*, not trajectories. When the tool returns (``on_tool_done``) its next turn is ready; ``admit()`` admits it
(``Admission.turn >= 1``) on the same replica (prefix cache), with the same priority (sticky across turns), and
the subclass decides its place against first turns (FGD: by group rank, a next turn ahead of any first turn of its
own or a later group). A trajectory ends from any of its states (its last turn's response, a tool that ends it, a
failure); a dead replica's trajectories restart from their first turn.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, order=True)
class Request:
    group: int
    index: int  # 0..n-1 within its group


@dataclass(frozen=True)
class Admission:
    request: Request
    replica: int
    priority: int  # vLLM priority: lower runs first
    turn: int = 0  # 0: the trajectory's first turn (start it); k >= 1: its (k+1)-th model turn may go now


def _check_int(name: str, value, low: int) -> None:
    # bool is an int subclass; True as a count is always a caller bug.
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


AUTO_WINDOW_UNITS = 2  # fgd.window=auto: the requests of this many training units in flight per replica
# fgd.window=adaptive: the refill margin covers this many times the largest burst of completions seen between two
# admissions on one replica (a burst is noticed one driver cycle late and refilled one cycle later).
ADAPTIVE_BURST_FACTOR = 2


@dataclass(frozen=True)
class AdaptiveWindow:
    """``rolloutpipe.fgd.window=adaptive``: per replica, the engine's running slots (``capacity`` =
    ``max_num_seqs``) plus a refill margin, so FGD never costs the engine throughput.

    Why not fewer than ``capacity``: a smaller window runs a smaller decode batch than admitting everything would,
    and the engine's throughput falls with it (the ``auto`` window's rollout on CPU: docs/fgd.md, "The default
    window: ``adaptive``"). With at least ``capacity`` in flight the engine runs the same batch as
    with full admission; FGD only decides which requests are in it (rank order) and, where the KV cache binds
    first, vLLM's priority queue runs the frontier's waiting requests first and preempts the latest ranks.

    Why more than ``capacity``: a slot freed inside the engine is refilled from vLLM's own waiting queue at the
    next scheduler step, but a request the client still holds must first travel through the driver (response
    back, policy, agent loop, HTTP): with a window of exactly ``capacity`` the slot idles meanwhile. The margin
    keeps the next-ranked requests waiting inside vLLM (priority-ordered, so nothing overtakes the frontier).
    It starts at ``floor`` (one group's requests) and grows to ``ADAPTIVE_BURST_FACTOR`` times the largest
    number of slots seen freeing on one replica between two ``admit()`` calls (what the driver must refill per
    cycle; equal-length groups free a whole batch at once), never above ``capacity``: the window stays within
    ``[capacity + floor, 2 * capacity]`` and never shrinks within a step.

    With one replica the margin is ``capacity`` from the start (``limit(..., replicas=1)``): a request held on the
    client could only ever go to that replica, so holding it buys nothing, while a margin still growing costs the
    refill of the first burst (equal-length responses finish a whole batch together: on the 32-slot bench the second
    wave took longer than with everything submitted, docs/fgd.md, "The default window: ``adaptive``"). With several
    replicas the margin
    grows from ``floor``: requests the client holds go to whichever replica frees slots first.
    """

    capacity: int
    floor: int = 1

    def __post_init__(self):
        _check_int("capacity", self.capacity, 1)
        _check_int("floor", self.floor, 1)

    def limit(self, peak_burst: int, replicas: int = 2) -> int:
        """In-flight requests allowed per replica once bursts of up to ``peak_burst`` completions were seen, with
        ``replicas`` replicas open to admissions."""
        if replicas == 1:
            return 2 * self.capacity
        margin = min(self.capacity, max(self.floor, ADAPTIVE_BURST_FACTOR * peak_burst))
        return self.capacity + margin


def resolve_window(window: int | str | None, groups_per_unit: int, n: int,
                   max_num_seqs: int) -> int | AdaptiveWindow:
    """FGD's per-replica admission window (``rolloutpipe.fgd.window``), as the policies take it.

    ``adaptive`` (the default) = ``AdaptiveWindow``: never below ``max_num_seqs``, plus a refill margin that
    starts at one group's ``n`` requests and grows with the completion bursts the driver sees. An int as given;
    null = ``max_num_seqs`` (no margin: a freed slot waits for the client's refill); ``auto`` = the requests of
    ``AUTO_WINDOW_UNITS`` training units (the frontier unit and the next), at most ``max_num_seqs``: when
    ``max_num_seqs`` covers the whole step it lets the frontier unit's groups finish first, at the cost of a
    smaller decode batch (docs/fgd.md)."""
    _check_int("max_num_seqs", max_num_seqs, 1)
    if window is None:
        return max_num_seqs
    if window == "adaptive":
        _check_int("n", n, 1)
        return AdaptiveWindow(capacity=max_num_seqs, floor=min(n, max_num_seqs))
    if window == "auto":
        _check_int("groups_per_unit", groups_per_unit, 1)
        _check_int("n", n, 1)
        return min(max_num_seqs, AUTO_WINDOW_UNITS * groups_per_unit * n)
    _check_int("window", window, 1)
    return window


def auto_frontier(groups_per_unit: int, n: int, window: int | None, num_replicas: int) -> int:
    """Smallest frontier that is at least one training unit AND can fill every replica's window.

    With fewer than ``window * num_replicas / n`` groups the frontier cannot keep all admission slots busy, so
    the surplus slots take work beyond it (``stats()["spill_admissions"]``); sized to the slots, the frontier
    is exactly the set of groups being generated. With unbounded windows everything is admitted at once and
    only the engine priority orders work, so one unit is enough.
    """
    _check_int("groups_per_unit", groups_per_unit, 1)
    _check_int("n", n, 1)
    _check_int("num_replicas", num_replicas, 1)
    if window is None:
        return groups_per_unit
    _check_int("window", window, 1)
    return max(groups_per_unit, math.ceil(window * num_replicas / n))


class AdmissionPolicy:
    """Shared bookkeeping: request states, per-replica slots, group completion, batch fill, abort.

    Every request is in exactly one state: pending, in flight (on one replica), done, or closed (aborted or
    dropped once the batch is full). Subclasses only decide *which* pending request goes *where*
    (``_queue_push`` / ``_queue_pop`` and a few hooks) and with what priority.
    """

    def __init__(self, num_groups: int, n: int, groups_per_unit: int, target_groups: int,
                 replicas: Sequence[int], window: int | AdaptiveWindow | None, lengths=None):
        _check_int("num_groups", num_groups, 1)
        _check_int("n", n, 1)
        _check_int("groups_per_unit", groups_per_unit, 1)
        _check_int("target_groups", target_groups, 1)
        if target_groups > num_groups:
            raise ValueError(f"target_groups ({target_groups}) must be <= num_groups ({num_groups})")
        if groups_per_unit > target_groups:
            raise ValueError(f"groups_per_unit ({groups_per_unit}) must be <= target_groups ({target_groups})")
        if window is not None and not isinstance(window, AdaptiveWindow):
            _check_int("window", window, 1)
        replicas = list(replicas)
        if not replicas:
            raise ValueError("replicas must not be empty")
        for r in replicas:
            _check_int("replicas", r, 0)
        if len(set(replicas)) != len(replicas):
            raise ValueError(f"replicas must be unique, got {replicas}")

        if lengths is not None and lengths.num_groups != num_groups:
            raise ValueError(f"lengths predict {lengths.num_groups} groups, the step has {num_groups}")
        self.num_groups, self.n, self.window = num_groups, n, window
        self.lengths = lengths  # verl_pipe.core.lengths.StepLengths, or None: per-group length predictions
        # AdaptiveWindow: slots freed per replica since the last admit(), and the largest such burst so far
        self._freed = {r: 0 for r in replicas}
        self._peak_burst = 0
        self._adaptive_peak = 0  # the adaptive window's largest limit so far (it never shrinks within a step)
        self._inflight: dict[int, set[Request]] = {r: set() for r in sorted(replicas)}  # turns in flight (slots)
        self._limit = self.window_limit()
        self.groups_per_unit, self.target_groups = groups_per_unit, target_groups
        self._replica_of: dict[Request, int] = {}  # every trajectory started: in a turn, on its tool, or ready
        self._tool_wait: set[Request] = set()  # waiting on its tool: on its replica, no slot
        # tool returned, next turn not yet admitted -> (the turn's number, a token naming its heap entry)
        self._ready: dict[Request, tuple[int, int]] = {}
        self._next_turns: dict[int, list] = {r: [] for r in replicas}  # heaps of (_turn_key, token, request); lazy
        self._tokens = itertools.count()
        self._turns: dict[Request, int] = {}  # model turns admitted so far per started trajectory
        self._pending: set[Request] = set()
        self._closed: set[Request] = set()
        self._done_in_group = [0] * num_groups
        self._group_trainable: dict[int, bool] = {}  # completed groups
        self._trainable_order: list[int] = []  # trainable groups in completion order (the trainer's FIFO)
        self._stats = dict(admitted=0, responses_done=0, failed=0, requeued_on_replica_loss=0,
                           aborted=0, dropped=0, late_group_done=0, dropped_groups=0, turns_admitted=0,
                           tool_waits=0)
        self._init_queue()
        for g in range(num_groups):
            for i in range(n):
                self._to_pending(Request(g, i))

    @classmethod
    def for_step(cls, step) -> "AdmissionPolicy":
        """The policy of one step from what the step tells it (``verl_pipe.core.admission.StepAdmission``): how the
        real rollout and the simulator build it (``rolloutpipe.fgd.policy`` names the class). Subclasses pick the
        arguments they take; ``step.extra`` (a trainer subclass's ``admission_kwargs``) goes to the constructor."""
        raise NotImplementedError(f"{cls.__name__} does not say how a step builds it: implement for_step(step)")

    # --- what subclasses decide -----------------------------------------------------------------------------
    def _init_queue(self) -> None:
        raise NotImplementedError

    def _queue_push(self, req: Request) -> None:
        raise NotImplementedError

    def _queue_pop(self, open_replicas: list[int]) -> tuple[Request, int] | None:
        """Remove and return the next pending request and a replica from ``open_replicas`` (all have room)."""
        raise NotImplementedError

    def _priority(self, req: Request) -> int:
        return 0

    def _turn_key(self, req: Request) -> tuple:
        """Order of ready next turns on one replica (lowest first)."""
        raise NotImplementedError

    def _next_turn_first(self, req: Request, open_replicas: list[int]) -> bool:
        """Whether ``req``'s ready next turn goes before the first turn ``_queue_pop`` would pick now."""
        raise NotImplementedError

    def _on_admitted(self, req: Request, replica: int) -> None: ...

    def _on_group_closed(self, group: int) -> None: ...

    def _on_replica_removed(self, replica: int) -> None: ...

    def _on_replica_added(self, replica: int) -> None: ...

    def _on_group_dropped(self, group: int) -> None: ...

    # --- admission ------------------------------------------------------------------------------------------
    def window_limit(self) -> float:
        """In-flight requests allowed per replica now (inf: no window)."""
        w = self.window
        if w is None:
            return math.inf
        if isinstance(w, AdaptiveWindow):
            # never shrinks within a step, also when a replica joins one that ran alone
            self._adaptive_peak = max(self._adaptive_peak, w.limit(self._peak_burst, replicas=len(self._inflight)))
            return self._adaptive_peak
        return w

    def _room(self, replica: int) -> float:
        return self._limit - len(self._inflight[replica])

    def _least_loaded(self, replicas: list[int]) -> int:
        # One window for all replicas, so "most window room" and "fewest in flight" are the same order.
        return min(replicas, key=lambda r: (len(self._inflight[r]), r))

    def admit(self) -> list[Admission]:
        if self.all_done:
            return []
        if self._freed:
            self._peak_burst = max(self._peak_burst, max(self._freed.values()))
            self._freed = dict.fromkeys(self._freed, 0)
        self._limit = self.window_limit()  # fixed for this call: its admissions refill one burst
        out = []
        while self._pending or self._ready:
            open_replicas = [r for r in self._inflight if self._room(r) > 0]
            if not open_replicas:
                break
            nxt = self._best_next_turn(open_replicas)
            if nxt is not None and (not self._pending or self._next_turn_first(nxt[0], open_replicas)):
                out.append(self._admit_next_turn(*nxt))
                continue
            pick = self._queue_pop(open_replicas) if self._pending else None
            if pick is None:
                break
            req, r = pick
            self._pending.remove(req)
            self._inflight[r].add(req)
            self._replica_of[req] = r
            self._turns[req] = 1
            self._stats["admitted"] += 1
            self._on_admitted(req, r)
            out.append(Admission(req, r, self._priority(req)))
        return out

    def _best_next_turn(self, open_replicas: list[int]) -> tuple[Request, int] | None:
        """The ready next turn with the lowest ``_turn_key`` on an open replica (stale heap entries dropped)."""
        best = None
        for r in open_replicas:
            heap = self._next_turns[r]
            while heap and not self._valid_entry(heap[0], r):
                heapq.heappop(heap)
            if heap and (best is None or heap[0][:2] < best[0]):
                best = (heap[0][:2], heap[0][2], r)
        return None if best is None else (best[1], best[2])

    def _valid_entry(self, entry: tuple, r: int) -> bool:
        _, token, req = entry
        return self._replica_of.get(req) == r and self._ready.get(req, (0, None))[1] == token

    def _admit_next_turn(self, req: Request, r: int) -> Admission:
        heapq.heappop(self._next_turns[r])
        turn, _ = self._ready.pop(req)
        self._inflight[r].add(req)
        self._turns[req] = turn + 1
        self._stats["turns_admitted"] += 1
        return Admission(req, r, self._priority(req), turn)

    def _to_pending(self, req: Request) -> None:
        self._pending.add(req)
        self._queue_push(req)

    def _back_to_pending(self, req: Request) -> None:
        if self.batch_full:  # nothing of this step is admitted any more
            self._closed.add(req)
            self._stats["dropped"] += 1
        else:
            self._to_pending(req)

    def _release(self, req: Request, replica: int | None) -> bool:
        """Take ``req``'s trajectory out of its replica, whatever its state; False means: ignore this callback."""
        if req in self._closed:
            return False
        r = self._replica_of.get(req)
        if replica is not None and r != replica:
            return False  # stale: the request was moved off that replica when it was removed
        if r is None:
            raise RuntimeError(f"{req} is not in flight")
        self._forget(req, r)
        return True

    def _forget(self, req: Request, r: int) -> None:
        """``req``'s trajectory leaves replica ``r`` (its slot, if it held one, is freed)."""
        del self._replica_of[req]
        self._turns.pop(req, None)
        self._tool_wait.discard(req)
        self._ready.pop(req, None)  # its heap entry is skipped lazily
        if req in self._inflight.get(r, ()):
            self._inflight[r].remove(req)
            self._freed[r] = self._freed.get(r, 0) + 1

    def _in_turn(self, req: Request, replica: int | None, state: str) -> int | None:
        """The replica of ``req`` if it is in ``state`` ("turn": a model turn in flight, "tool": on its tool);
        None for a stale callback (closed, moved off ``replica``)."""
        if req in self._closed:
            return None
        r = self._replica_of.get(req)
        if r is None or (replica is not None and r != replica):
            return None
        in_state = req in self._inflight[r] if state == "turn" else req in self._tool_wait
        if not in_state:
            raise RuntimeError(f"{req} is not {'in a model turn' if state == 'turn' else 'waiting on its tool'}")
        return r

    # --- callbacks ------------------------------------------------------------------------------------------
    def observe_length(self, request: Request, tokens: int) -> None:
        """``request``'s response (taken: ``on_response_done`` said True) has ``tokens`` response tokens: its group's
        length prediction learns from it (``lengths``; nothing without)."""
        if self.lengths is not None:
            self.lengths.observe(request.group, tokens)

    def on_response_done(self, request: Request, replica: int | None = None) -> bool:
        """Pass ``replica`` (where it ran) to have stale callbacks from a removed replica ignored.
        False: the response is stale (its request was requeued or closed) and must not be used."""
        if self._release(request, replica):
            self._done_in_group[request.group] += 1
            self._stats["responses_done"] += 1
            return True
        return False

    def on_turn_done(self, request: Request, replica: int | None = None) -> bool:
        """A model turn of ``request``'s trajectory ended and it now waits on its tool: its slot is freed (it stays on
        its replica). False: stale, ignore."""
        r = self._in_turn(request, replica, "turn")
        if r is None:
            return False
        self._inflight[r].remove(request)
        self._freed[r] = self._freed.get(r, 0) + 1
        self._tool_wait.add(request)
        self._stats["tool_waits"] += 1
        return True

    def on_tool_done(self, request: Request, replica: int | None = None) -> bool:
        """``request``'s tool returned: its next turn is ready and a later ``admit()`` admits it on the same replica.
        False: stale, ignore."""
        r = self._in_turn(request, replica, "tool")
        if r is None:
            return False
        self._tool_wait.remove(request)
        token = next(self._tokens)
        self._ready[request] = (self._turns[request], token)
        heapq.heappush(self._next_turns[r], (self._turn_key(request), token, request))
        return True

    def on_request_failed(self, request: Request, replica: int | None = None) -> None:
        if self._release(request, replica):
            self._stats["failed"] += 1
            self._back_to_pending(request)

    def on_group_done(self, group: int, trainable: bool) -> None:
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group {group} out of range")
        if group in self._group_trainable:
            raise RuntimeError(f"group {group} reported done twice")
        if self.batch_full:
            # It finished while the step's leftovers were being aborted: recorded, never trained.
            self._stats["late_group_done"] += 1
        elif self._done_in_group[group] != self.n:
            raise RuntimeError(f"group {group} reported done with {self._done_in_group[group]}/{self.n} responses")
        self._group_trainable[group] = bool(trainable)
        if trainable:
            self._trainable_order.append(group)
        self._on_group_closed(group)
        if self.batch_full and self._pending:  # nothing of this step carries into the next
            self._stats["dropped"] += len(self._pending)
            self._closed |= self._pending
            self._pending.clear()

    def drop_group(self, group: int) -> list[Request]:
        """Give up on ``group`` (a request of it failed too often): its pending requests are closed and the ones
        in flight returned (closed too: the caller cancels them, their late callbacks are ignored). The group
        counts as completed and untrainable, so the next group in order takes its place, like a group the
        zero-variance filter drops (the oversampled groups are the replacements)."""
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group {group} out of range")
        if group in self._group_trainable:
            raise RuntimeError(f"group {group} is already completed")
        inflight = sorted(q for q in self._replica_of if q.group == group)
        for q in inflight:
            self._forget(q, self._replica_of[q])
        pending = [q for q in self._pending if q.group == group]
        self._pending.difference_update(pending)
        self._closed.update(inflight, pending)
        self._on_group_dropped(group)
        self._stats["dropped_groups"] += 1
        self._group_trainable[group] = False
        self._on_group_closed(group)
        return inflight

    # --- replicas -------------------------------------------------------------------------------------------
    def remove_replica(self, replica: int, allow_none_left: bool = False) -> list[Request]:
        """Requests in flight there go back to pending. ``allow_none_left``: the last replica may go too (it is
        being restarted); nothing is admitted until ``add_replica``."""
        if replica not in self._inflight:
            raise ValueError(f"unknown replica {replica}")
        if len(self._inflight) == 1 and not allow_none_left:
            raise RuntimeError(f"cannot remove replica {replica}: no replica would be left")
        lost = sorted(q for q, r in self._replica_of.items() if r == replica)  # on their tool too: restarted
        self._inflight.pop(replica)
        self._next_turns.pop(replica)
        self._freed.pop(replica, None)  # a lost replica's requests are requeued, not a burst to refill there
        self._on_replica_removed(replica)  # unpin first, so the requeued requests find a new home
        for req in lost:
            self._forget(req, replica)
            self._stats["requeued_on_replica_loss"] += 1
            self._back_to_pending(req)
        return lost

    def add_replica(self, replica: int) -> None:
        _check_int("replica", replica, 0)
        if replica in self._inflight:
            raise ValueError(f"replica {replica} already present")
        self._inflight = dict(sorted({**self._inflight, replica: set()}.items()))
        self._next_turns[replica] = []
        self._on_replica_added(replica)

    # --- batch ----------------------------------------------------------------------------------------------
    @property
    def batch_full(self) -> bool:
        return len(self._trainable_order) >= self.target_groups

    @property
    def all_done(self) -> bool:
        return self.batch_full or len(self._group_trainable) == self.num_groups

    def trained_groups(self) -> list[int]:
        return self._trainable_order[: self.target_groups]

    def to_abort(self) -> list[Request]:
        """Once the batch is full: every request still in flight (none belongs to a trained group, those are
        complete). They are closed here, so each is returned once and late callbacks are ignored."""
        if not self.batch_full:
            return []
        trained = set(self.trained_groups())
        out = sorted(q for q in self._replica_of if q.group not in trained)
        for req in out:
            self._forget(req, self._replica_of[req])
            self._closed.add(req)
        self._stats["aborted"] += len(out)
        return out

    # --- introspection --------------------------------------------------------------------------------------
    @property
    def replicas(self) -> list[int]:
        return list(self._inflight)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def inflight_count(self, replica: int | None = None) -> int:
        """Model turns in flight (holding a window slot), on ``replica`` or on all. A trajectory waiting on its
        tool, or whose next turn is not admitted yet, is not counted (``trajectory_count``)."""
        if replica is None:
            return sum(len(s) for s in self._inflight.values())
        return len(self._inflight[replica])

    def trajectory_count(self, replica: int | None = None) -> int:
        """Trajectories started and not ended: in a turn, on their tool, or with their next turn ready."""
        return sum(1 for r in self._replica_of.values() if replica is None or r == replica)

    def tool_wait_count(self) -> int:
        return len(self._tool_wait)

    def ready_turn_count(self) -> int:
        """Next turns whose tool returned, not yet admitted."""
        return len(self._ready)

    def stats(self) -> dict:
        trainable = len(self._trainable_order)
        limit = self.window_limit()
        return dict(self._stats, pending=self.pending_count, inflight=self.inflight_count(),
                    trajectories=self.trajectory_count(), tool_wait=self.tool_wait_count(),
                    window_limit=None if limit == math.inf else int(limit), completion_burst_peak=self._peak_burst,
                    replicas=len(self._inflight), groups_done=len(self._group_trainable),
                    trainable_groups_done=trainable,
                    untrainable_groups_done=len(self._group_trainable) - trainable)


class FCFSPolicy(AdmissionPolicy):
    """What verl's stock rollout does: a fixed submission order, priority 0, and a per-request least-loaded
    replica (verl's GlobalRequestLoadBalancer), so the n requests of a group may land on different replicas.

    order="group_major": requests in (group, index) order.
    order="interleave:<k>": AgentLoopManager splits the repeated batch into k contiguous chunks, one per agent
    worker, and the workers submit concurrently; modelled as round robin over the k chunks.
    """

    def __init__(self, num_groups: int, n: int, groups_per_unit: int, target_groups: int,
                 replicas: Sequence[int], window: int | None = None, order: str = "group_major", lengths=None):
        self._chunks = self._parse_order(order)
        self.order = order
        super().__init__(num_groups, n, groups_per_unit, target_groups, replicas, window, lengths)

    @classmethod
    def for_step(cls, step) -> "FCFSPolicy":
        """The baseline's dispatch: its window and order (``rolloutpipe.dispatch.*``); predictions are only kept
        (recorded), never used."""
        return cls(step.num_groups, step.n, step.groups_per_unit, step.target_groups, list(step.replicas),
                   window=step.baseline_window, order=step.baseline_order, lengths=step.lengths, **step.extra)

    @staticmethod
    def _parse_order(order: str) -> int:
        if order == "group_major":
            return 1
        if isinstance(order, str) and order.startswith("interleave:"):
            k = order.split(":", 1)[1]
            if k.isdigit() and int(k) >= 1:
                return int(k)
        raise ValueError(f"order must be 'group_major' or 'interleave:<k>' with k >= 1, got {order!r}")

    def _init_queue(self) -> None:
        reqs = [Request(g, i) for g in range(self.num_groups) for i in range(self.n)]
        k = self._chunks
        base, extra = divmod(len(reqs), k)  # numpy.array_split sizes: the first `extra` chunks get one more
        bounds = list(itertools.accumulate([0] + [base + (c < extra) for c in range(k)]))
        chunks = [reqs[a:b] for a, b in zip(bounds, bounds[1:])]
        order = [c[j] for j in range(len(chunks[0])) for c in chunks if j < len(c)]
        self._pos = {req: p for p, req in enumerate(order)}
        self._heap: list[tuple[int, Request]] = []  # (submission position, request): a retry keeps its place

    def _queue_push(self, req: Request) -> None:
        heapq.heappush(self._heap, (self._pos[req], req))

    def _queue_pop(self, open_replicas):
        while self._heap:
            _, req = heapq.heappop(self._heap)
            if req in self._pending:
                return req, self._least_loaded(open_replicas)
        return None

    def _turn_key(self, req: Request) -> tuple:
        return ()  # stock verl: a trajectory's next turn goes to the engine when its tool returns (heap: token order)

    def _next_turn_first(self, req: Request, open_replicas: list[int]) -> bool:
        return True  # verl's agent loop calls generate again at once; no client queue holds it


class FrontierPolicy(AdmissionPolicy):
    """FGD: frontier groups first, one replica per group, priority = dispatch rank.

    The frontier is the first ``frontier_groups`` groups (dispatch order) not yet completed and not dropped.
    Completing a group advances it; an untrainable group is completed too, so the next group in order simply
    takes its place (that is what the oversampled extra groups are for).

    Admission takes pending requests in (group rank, index) order. Because the frontier is a prefix of the open
    groups and ranks never change, "frontier first, then the next groups only to keep slots busy" *is* rank
    order, so ``frontier_groups`` never changes which request is admitted: it names the prefix (``frontier()``)
    and counts admissions beyond it (``spill_admissions``: slots the frontier could not fill, see
    ``auto_frontier``). Any value >= 1 is therefore allowed, also below ``groups_per_unit`` (for the
    frontier-size sensitivity study). "auto" = ``groups_per_unit + slack``: the groups the next training unit
    needs, plus a margin for groups that turn out untrainable.

    The priority is the rank itself, not the distance to the frontier: monotone, so an earlier group always
    outranks a later one in vLLM's waiting queue, and nothing must be re-sent when the frontier advances
    (vLLM priorities are static; changing one means abort + resubmit).

    Affinity: a group is pinned at its first admission to the open replica with the most window room (ties:
    fewest in flight, then lowest id), and its requests go only there: prefix-cache hits on the shared prompt,
    and the group finishes at one replica's pace instead of the slowest of several. Work conservation wins
    over affinity: if a replica has room and no pending request may go there (every pending group is pinned
    to a full replica -- only at the tail of a step, once every group has started), it takes the lowest-ranked
    pending request anyway (``split_admissions``). With unbounded windows that never happens. If the pinned
    replica dies, the group is re-pinned at its next admission.

    Length-aware order (``lengths``: the groups' predicted response lengths, verl_pipe/core/lengths.py; off with
    ``by_length=False``). The frontier is still what the next training unit takes: with ``unit_fill=dispatch`` the
    next groups in rank order (sync's mini-batch), with ``completion`` the open groups predicted shortest (the next
    unit's groups chosen by predicted finish; re-chosen as responses refine the predictions). Frontier groups go
    first, longest predicted first among them (the unit completes soonest); the rest in ``rest_order``: ``rank``,
    ``shortest`` first (the trainer is the bottleneck: complete groups as early as possible) or ``longest`` first
    (the rollout is: start the long groups early), ``verl_pipe.core.admission.rest_order``. The vLLM priority is then
    no longer the rank: a frontier admission gets the number of groups completed so far (below ``num_groups``), any
    other ``num_groups`` + its group's place among those admitted beyond the frontier, so frontier requests overtake
    every other waiting request in vLLM's queue and are the last preempted. Nothing is re-sent either way. With
    predictions all equal (a run's first step, equal lengths) the order is the rank order.
    """

    def __init__(self, num_groups: int, n: int, groups_per_unit: int, target_groups: int,
                 replicas: Sequence[int], window: int | None = None, frontier_groups: int | str = "auto",
                 slack: int = 0, affinity: bool = True, unit_fill: str = "completion", lengths=None,
                 by_length: bool = True, rest_order: str = "rank"):
        _check_int("slack", slack, 0)
        if frontier_groups == "auto":
            frontier_groups = groups_per_unit + slack
        else:
            _check_int("frontier_groups", frontier_groups, 1)
        if unit_fill not in ("completion", "dispatch"):
            raise ValueError(f"unit_fill must be 'completion' or 'dispatch', got {unit_fill!r}")
        self.frontier_groups, self.affinity, self.unit_fill = frontier_groups, bool(affinity), unit_fill
        super().__init__(num_groups, n, groups_per_unit, target_groups, replicas, window, lengths)
        self._by_length = lengths is not None and bool(by_length)  # the length-aware order
        if rest_order not in ("rank", "shortest", "longest"):
            raise ValueError(f"rest_order must be rank, shortest or longest, got {rest_order!r}")
        self.rest_order = rest_order

    @classmethod
    def for_step(cls, step) -> "FrontierPolicy":
        """FGD: the FGD window, the frontier's size, the unit fill and the length predictions (with ``step.lengths``
        the order is length-aware, see the class docstring)."""
        return cls(step.num_groups, step.n, step.groups_per_unit, step.target_groups, list(step.replicas),
                   window=step.fgd_window, frontier_groups=step.frontier_groups, slack=step.slack,
                   unit_fill=step.unit_fill, lengths=step.lengths, by_length=step.order_by_length,
                   rest_order=step.rest_order, **step.extra)

    def _init_queue(self) -> None:
        self._idx: list[list[int]] = [[] for _ in range(self.num_groups)]  # pending indices per group (heaps)
        self._pin: dict[int, int] = {}  # group -> replica
        # Heaps of group ranks with pending work: one for unpinned groups, one per replica for pinned ones.
        # Entries are validated lazily on peek (still has pending work, still lives there); duplicates are
        # harmless because a valid top is only peeked, never popped.
        self._unpinned: list[int] = []
        self._pinned: dict[int, list[int]] = {r: [] for r in self._inflight}
        self._frontier: list[int] | None = None  # cache, dropped when a group completes
        self._frontier_set: set[int] = set()
        self._first_open = 0
        self._spill = self._split = 0
        # length-aware order (``lengths`` given): groups with pending requests, and each admitted request's priority
        self._open_pending: set[int] = set()
        self._prio: dict[Request, int] = {}
        self._later_groups: dict[int, int] = {}  # group -> its place among groups first admitted beyond the frontier
        self._frontier_version = -1  # the predictions' version the cached frontier was chosen with

    def _queue_push(self, req: Request) -> None:
        g = req.group
        heapq.heappush(self._idx[g], req.index)
        self._open_pending.add(g)
        r = self._pin.get(g)
        heapq.heappush(self._unpinned if r is None else self._pinned[r], g)

    def _top(self, heap: list[int], replica: int | None) -> int | None:
        while heap and not (self._idx[heap[0]] and self._pin.get(heap[0]) == replica):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _queue_pop(self, open_replicas):
        if self._by_length:
            return self._pop_by_length(open_replicas)
        # Lowest rank among each open replica's pinned groups and the unpinned groups (which fit anywhere).
        cands = [(g, r) for r in open_replicas if (g := self._top(self._pinned[r], r)) is not None]
        g = self._top(self._unpinned, None)
        if g is not None and (not cands or g < min(cands)[0]):
            r = self._least_loaded(open_replicas)  # most window room
            if self.affinity:
                self._pin[g] = r
                heapq.heappush(self._pinned[r], g)
            cands = [(g, r)]
        if not cands:
            # Every pending group is pinned to a full replica: split the earliest rather than idle a slot.
            tops = [g for r, h in self._pinned.items() if (g := self._top(h, r)) is not None]
            if not tops:
                return None
            self._split += 1
            cands = [(min(tops), self._least_loaded(open_replicas))]
        g, r = min(cands)
        return Request(g, heapq.heappop(self._idx[g])), r

    # --- the length-aware order (``lengths`` given) ----------------------------------------------------------------
    def _length_key(self, g: int) -> tuple:
        """Admission order with predictions: frontier groups first, then the rest; within each, longest predicted
        first (ties, and groups with nothing predicted, by rank)."""
        t = self.lengths.log_mean(g)
        t = 0.0 if t is None else t
        if g in self._frontier_set:
            return (False, -t, g)
        return (True, {"longest": -t, "shortest": t, "rank": 0.0}[self.rest_order], g)

    def _pick_by_length(self, open_replicas) -> tuple[int, int, bool] | None:
        """(group, replica, split) of the next first turn in the length-aware order, without admitting it."""
        self.frontier()
        best = split = None
        for g in self._open_pending:
            r = self._pin.get(g)
            key = self._length_key(g)
            if r is None or r in open_replicas:
                if best is None or key < best[0]:
                    best = (key, g, r)
            elif split is None or key < split[0]:
                split = (key, g)
        if best is not None:
            _, g, r = best
            return g, r, False  # r None: not pinned yet, it fits anywhere
        if split is None:
            return None
        return split[1], None, True

    def _pop_by_length(self, open_replicas):
        pick = self._pick_by_length(open_replicas)
        if pick is None:
            return None
        g, r, split = pick
        if r is None:
            r = self._least_loaded(open_replicas)  # most window room
            if self.affinity and not split:
                self._pin[g] = r
        self._split += split
        req = Request(g, heapq.heappop(self._idx[g]))
        if not self._idx[g]:
            self._open_pending.discard(g)
        if g in self._frontier_set:
            # frontier groups overtake everything admitted beyond the frontier in vLLM's queue; the frontier
            # admitted later waits behind the earlier one
            self._prio[req] = len(self._group_trainable)
        else:
            self._prio[req] = self.num_groups + self._later_groups.setdefault(g, len(self._later_groups))
        return req, r

    def _priority(self, req: Request) -> int:
        if self._by_length:
            return self._prio.get(req, req.group)
        return req.group

    def _turn_key(self, req: Request) -> tuple:
        if self._by_length:
            return (self._prio.get(req, req.group), req.group, req.index)
        return (req.group, req.index)

    def _next_turn_first(self, req: Request, open_replicas: list[int]) -> bool:
        """Rank order over next turns and first turns: a next turn goes first unless the first turn that
        ``_queue_pop`` would admit now belongs to an earlier-ranked group (a frontier group still starting). With
        predictions: unless that first turn is a frontier group's and the next turn's group is not in the frontier."""
        if self._by_length:
            pick = self._pick_by_length(open_replicas)
            return pick is None or pick[0] not in self._frontier_set or req.group in self._frontier_set
        g = self._peek_first_turn(open_replicas)
        return g is None or req.group <= g

    def _peek_first_turn(self, open_replicas) -> int | None:
        """The group of the first turn ``_queue_pop(open_replicas)`` would admit, without admitting it."""
        tops = [g for r in open_replicas if (g := self._top(self._pinned[r], r)) is not None]
        g = self._top(self._unpinned, None)
        if g is not None:
            tops.append(g)
        if not tops:
            tops = [g for r, h in self._pinned.items() if (g := self._top(h, r)) is not None]
        return min(tops) if tops else None

    def frontier(self) -> list[int]:
        """The groups the next training unit takes: the first ``frontier_groups`` open groups in rank order; with
        predictions and ``unit_fill=completion`` (a unit takes the groups that complete first), the open groups
        predicted shortest (ties by rank)."""
        by_length = self._by_length and self.unit_fill == "completion"
        if by_length and self._frontier_version != self.lengths.version:
            self._frontier = None  # a response came in: the predictions moved
        if self._frontier is None:
            if self.batch_full:  # everything not completed is dropped
                self._frontier = []
            elif by_length:
                self._frontier_version = self.lengths.version
                open_groups = [g for g in range(self.num_groups) if g not in self._group_trainable]
                logs = {g: self.lengths.log_mean(g) for g in open_groups}
                open_groups.sort(key=lambda g: (logs[g] if logs[g] is not None else 0.0, g))
                self._frontier = open_groups[: self.frontier_groups]
            else:
                while self._first_open in self._group_trainable:
                    self._first_open += 1
                open_groups = (g for g in range(self._first_open, self.num_groups)
                               if g not in self._group_trainable)
                self._frontier = list(itertools.islice(open_groups, self.frontier_groups))
            self._frontier_set = set(self._frontier)
        return self._frontier

    def _on_admitted(self, req: Request, replica: int) -> None:
        self.frontier()
        if req.group not in self._frontier_set:
            self._spill += 1

    def _on_group_closed(self, group: int) -> None:
        self._pin.pop(group, None)
        self._frontier = None

    def _on_replica_removed(self, replica: int) -> None:
        del self._pinned[replica]
        for g in [g for g, r in self._pin.items() if r == replica]:
            del self._pin[g]
            if self._idx[g]:
                heapq.heappush(self._unpinned, g)

    def _on_replica_added(self, replica: int) -> None:
        self._pinned[replica] = []

    def _on_group_dropped(self, group: int) -> None:
        self._idx[group].clear()  # its heap entries are skipped lazily by _top
        self._open_pending.discard(group)

    def stats(self) -> dict:
        return dict(super().stats(), spill_admissions=self._spill, split_admissions=self._split,
                    frontier_groups=self.frontier_groups, by_length=self._by_length,
                    rest_order=self.rest_order if self._by_length else None)
