"""Per-step timeline: the one place that records a training step's events and computes every metric.

The real trainer, the benchmark and the simulator all record into a ``StepTimeline`` and read metrics and
Chrome/Perfetto traces from it, so a metric means the same thing everywhere (docs/metrics.md).
Pure stdlib on purpose: the simulator and the tests must not pull in Ray, vLLM or torch.

Recorders store raw events only (cheap, under a lock, callable from any thread); all derivation happens
in ``metrics()`` and friends, so a timeline reloaded with ``from_dict`` yields exactly the same numbers.
"""

from __future__ import annotations

import copy
import heapq
import json
import math
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

# The raw event lists a timeline holds; also the keys of ``to_dict``.
_EVENT_KINDS = ("requests", "responses", "aborts", "groups", "units_ready", "train_spans", "weight_syncs")

_UNIT_READY_TID = 0  # trainer process: instants on tid 0, span lanes on tid 1, 2, ...


def _union_length(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of intervals clipped to [lo, hi]; overlapping trainer work is counted once."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in clipped:
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _percentile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    if not sorted_xs:
        return math.nan
    pos = q * (len(sorted_xs) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(sorted_xs) - 1)
    return sorted_xs[i] + (sorted_xs[j] - sorted_xs[i]) * (pos - i)


def _assign_lanes(intervals: list[tuple[float, float]]) -> list[int]:
    """Lowest free lane per interval (greedy by start), so bars sharing a trace thread never overlap.

    Heaps keep it O(n log n): a sync rollout can put thousands of requests on one replica at once.
    """
    lanes = [0] * len(intervals)
    busy: list[tuple[float, int]] = []  # (end, lane)
    free: list[int] = []
    for idx in sorted(range(len(intervals)), key=lambda k: intervals[k]):
        start, end = intervals[idx]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lane = heapq.heappop(free) if free else len(busy) + len(free)
        heapq.heappush(busy, (max(start, end), lane))
        lanes[idx] = lane
    return lanes


def _last_unit_cost(spans: list[dict], t0: float, train_end: float) -> float:
    """The trainer's irreducible tail: the union of the last unit's spans, clipped to [t0, train_end]. With
    per-group work (spans tagged with a group) only the last group's spans and the unit's group-less ones
    (the optimizer step) count. 0 without unit-tagged spans."""
    units = [s["unit"] for s in spans if s["unit"] is not None]
    if not units:
        return 0.0
    last = max(units)
    tail = [s for s in spans if s["unit"] == last]
    groups = [s.get("group") for s in tail if s.get("group") is not None]
    if groups:
        last_group = groups[-1]
        tail = [s for s in tail if s.get("group") in (None, last_group)]
    return _union_length(((s["start"], s["end"]) for s in tail), t0, train_end)


class StepTimeline:
    """Events of one training step (absolute clock seconds) and the metrics derived from them."""

    def __init__(self, step: int, groups_per_unit: int, clock: Callable[[], float] = time.perf_counter):
        if groups_per_unit < 1:
            raise ValueError(f"groups_per_unit must be >= 1, got {groups_per_unit}")
        self.step = step
        self.groups_per_unit = groups_per_unit
        self._clock = clock
        self._lock = threading.Lock()
        self._ev: dict[str, list[dict]] = {k: [] for k in _EVENT_KINDS}

    def now(self) -> float:
        return float(self._clock())

    def _add(self, _category: str, **fields) -> None:
        with self._lock:
            self._ev[_category].append(fields)

    def _at(self, t: float | None) -> float:
        return self.now() if t is None else float(t)

    # ---- rollout side -------------------------------------------------------------------------------
    def request_submitted(self, request_id: str, group: int, replica: int | None = None,
                          t: float | None = None) -> None:
        self._add("requests", t=self._at(t), request_id=request_id, group=group, replica=replica)

    def response_done(self, request_id: str, group: int, num_tokens: int, t: float | None = None) -> None:
        self._add("responses", t=self._at(t), request_id=request_id, group=group, num_tokens=num_tokens)

    def request_aborted(self, request_id: str, group: int, t: float | None = None) -> None:
        self._add("aborts", t=self._at(t), request_id=request_id, group=group)

    def group_done(self, group: int, trainable: bool, t: float | None = None) -> None:
        self._add("groups", t=self._at(t), group=group, trainable=bool(trainable))

    # ---- trainer side -------------------------------------------------------------------------------
    def unit_ready(self, unit: int, groups: list[int], t: float | None = None) -> None:
        self._add("units_ready", t=self._at(t), unit=unit, groups=list(groups))

    def train_span(self, kind: str, start: float, end: float, unit: int | None = None,
                   group: int | None = None, groups: list[int] | None = None) -> None:
        """``group``: the last group this span processed, when the trainer works per group (group
        granularity); the irreducible tail after the rollout is then only that group's work plus the
        unit's group-less spans (the optimizer step), not the whole last unit. ``groups``: every group the
        call processed, when known (a coalesced log-prob call covers groups of later units too)."""
        extra = {} if groups is None else {"groups": [int(g) for g in groups]}
        self._add("train_spans", kind=kind, start=float(start), end=float(end), unit=unit, group=group, **extra)

    def weight_sync(self, start: float, end: float) -> None:
        self._add("weight_syncs", start=float(start), end=float(end))

    @contextmanager
    def span(self, kind: str, unit: int | None = None, group: int | None = None,
             groups: list[int] | None = None) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:  # time spent before an exception was still trainer time
            self.train_span(kind, start, self.now(), unit, group, groups)

    # ---- derived quantities -------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, list[dict]]:
        with self._lock:
            return {k: list(v) for k, v in self._ev.items()}

    @property
    def t0(self) -> float | None:
        reqs = self._snapshot()["requests"]
        return min(r["t"] for r in reqs) if reqs else None

    def _origin(self, ev: dict[str, list[dict]]) -> float | None:
        """t0, or the earliest event at all when no request was recorded (traces only)."""
        if ev["requests"]:
            return min(r["t"] for r in ev["requests"])
        times = [e[k] for kind in _EVENT_KINDS for e in ev[kind] for k in ("t", "start") if k in e]
        return min(times) if times else None

    @staticmethod
    def _group_completions(ev: dict[str, list[dict]]) -> list[dict]:
        """First group_done per group, in completion order (a duplicate report must not count twice)."""
        first: dict[int, dict] = {}
        for g in ev["groups"]:
            if g["group"] not in first or g["t"] < first[g["group"]]["t"]:
                first[g["group"]] = g
        return sorted(first.values(), key=lambda g: (g["t"], str(g["group"])))

    def _derived_ready(self, ev: dict[str, list[dict]], rollout_end: float) -> Callable[[int], float]:
        """Absolute ready time of unit u if units fill FIFO with trainable groups in completion order.

        Derived from the rollout alone so that every trainer mode is measured against the same readiness.
        A unit that never fills (a partial last unit) is only known complete when the rollout ends.
        """
        trainable_t = [g["t"] for g in self._group_completions(ev) if g["trainable"]]

        def ready(unit: int) -> float:
            k = (unit + 1) * self.groups_per_unit - 1
            return trainable_t[k] if 0 <= k < len(trainable_t) else rollout_end

        return ready

    def _rollout_end(self, ev: dict[str, list[dict]]) -> float:
        ends = [e["t"] for e in ev["responses"]] + [e["t"] for e in ev["aborts"]]
        if not ends:
            raise ValueError(f"step {self.step}: no response_done or request_aborted recorded")
        return max(ends)

    def metrics(self) -> dict[str, float]:
        """All step metrics in seconds since t0 (definitions: docs/metrics.md); every value a float.

        ``ideal_lower_bound_s`` bounds ``rollout_to_train_end_s`` only for a causal trainer whose last unit
        starts after the rollout ends; when late groups are untrainable the trainer may finish earlier and
        ``pipeline_efficiency`` exceeds 1 (reported as is). Group percentiles are NaN without group_done.
        """
        ev = self._snapshot()
        if not ev["requests"]:
            raise ValueError(f"step {self.step}: no request_submitted recorded (t0 unknown)")
        if not ev["train_spans"]:
            raise ValueError(f"step {self.step}: no train_span recorded")
        t0 = min(r["t"] for r in ev["requests"])
        rollout_end = self._rollout_end(ev)
        spans = ev["train_spans"]
        train_end = max(s["end"] for s in spans)
        window = train_end - t0
        if window <= 0:
            raise ValueError(f"step {self.step}: train spans end at or before the first request")

        busy = _union_length(((s["start"], s["end"]) for s in spans), t0, train_end)
        last_unit_cost = _last_unit_cost(spans, t0, train_end)
        first_ready = self._derived_ready(ev, rollout_end)(0) - t0
        rollout_end_s = rollout_end - t0
        ideal = max(rollout_end_s + last_unit_cost, self._first_work(ev, first_ready, t0) + busy)
        # A step is over when the trainer, the rollout and the weight sync are all done: a trainer that
        # finishes early (late groups untrainable) still cannot push weights into a generating rollout.
        step_end = max([train_end, rollout_end] + [w["end"] for w in ev["weight_syncs"]])
        completions = self._group_completions(ev)
        done_s = sorted(g["t"] - t0 for g in completions)
        units = {s["unit"] for s in spans if s["unit"] is not None}
        return {
            "rollout_end_s": rollout_end_s,
            "train_end_s": window,
            "rollout_to_train_end_s": window,
            "trainer_busy_s": busy,
            "trainer_wait_ratio": (window - busy) / window,
            "first_unit_ready_s": first_ready,
            "first_unit_start_s": min(s["start"] for s in spans) - t0,
            "weight_sync_s": sum(max(0.0, w["end"] - w["start"]) for w in ev["weight_syncs"]),
            "last_unit_cost_s": last_unit_cost,
            "ideal_lower_bound_s": ideal,
            "pipeline_efficiency": ideal / window,
            "step_time_s": step_end - t0,
            "num_requests": float(len({r["request_id"] for r in ev["requests"]})),
            "num_responses": float(len(ev["responses"])),
            "num_aborted": float(len(ev["aborts"])),
            "num_groups": float(len(completions)),
            "num_trainable_groups": float(sum(1 for g in completions if g["trainable"])),
            "num_units": float(len(units | {u["unit"] for u in ev["units_ready"]})),
            "response_tokens": float(sum(r["num_tokens"] for r in ev["responses"])),
            "group_done_p50_s": _percentile(done_s, 0.5),
            "group_done_p90_s": _percentile(done_s, 0.9),
        }

    def trainer_busy_in_rollout_s(self) -> float:
        """Trainer work done while the rollout still ran (the union of trainer spans before the rollout's end): what
        pipelining took off the step; 0 in sync mode. Kept out of ``metrics()``, whose keys the bench JSONs fix."""
        ev = self._snapshot()
        if not ev["requests"] or not ev["train_spans"]:
            return 0.0
        t0 = min(r["t"] for r in ev["requests"])
        return _union_length(((s["start"], s["end"]) for s in ev["train_spans"]), t0, self._rollout_end(ev))

    def _first_work(self, ev: dict[str, list[dict]], first_ready: float, t0: float) -> float:
        """When the trainer could first work, since t0: the first unit's readiness, or, for a trainer that works
        per group (spans tagged with a group), the first trainable group's completion."""
        if not any(s.get("group") is not None for s in ev["train_spans"]):
            return first_ready
        trainable = [g["t"] for g in self._group_completions(ev) if g["trainable"]]
        return (min(trainable) - t0) if trainable else first_ready

    def unit_table(self) -> list[dict]:
        """Per unit: when it was ready (recorded, else derived), when the trainer worked on it, how long."""
        ev = self._snapshot()
        if not ev["requests"]:
            raise ValueError(f"step {self.step}: no request_submitted recorded (t0 unknown)")
        t0 = min(r["t"] for r in ev["requests"])
        derived = self._derived_ready(ev, self._rollout_end(ev))
        recorded: dict[int, float] = {}
        for u in ev["units_ready"]:
            recorded[u["unit"]] = min(u["t"], recorded.get(u["unit"], math.inf))
        unit_ids = sorted(set(recorded) | {s["unit"] for s in ev["train_spans"] if s["unit"] is not None})
        rows = []
        for u in unit_ids:
            spans = [(s["start"], s["end"]) for s in ev["train_spans"] if s["unit"] == u]
            rows.append({
                "unit": u,
                "ready_s": recorded.get(u, derived(u)) - t0,
                "derived_ready_s": derived(u) - t0,
                "start_s": min(s for s, _ in spans) - t0 if spans else None,
                "end_s": max(e for _, e in spans) - t0 if spans else None,
                "busy_s": _union_length(spans, -math.inf, math.inf),
            })
        return rows

    def group_completion_cdf(self) -> list[tuple[float, float]]:
        ev = self._snapshot()
        origin = self._origin(ev)
        done = self._group_completions(ev)
        return [(g["t"] - origin, (i + 1) / len(done)) for i, g in enumerate(done)]

    # ---- trace --------------------------------------------------------------------------------------
    def to_chrome_trace(self, origin: float | None = None) -> dict:
        """Chrome/Perfetto trace; ``origin`` (absolute seconds, default t0) is timestamp zero."""
        ev = self._snapshot()
        if origin is None:
            origin = self._origin(ev) or 0.0
        us = lambda t: round((t - origin) * 1e6, 3)  # noqa: E731
        out: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
                           for pid, name in ((1, "rollout"), (2, "trainer"), (3, "weight_sync"))]
        threads: dict[tuple[int, int], str] = {}  # (pid, tid) -> thread name, for the ones used
        latest = max([e.get("t", e.get("end", -math.inf)) for k in _EVENT_KINDS for e in ev[k]] or [origin])
        groups_tid = self._trace_rollout(ev, us, latest, out, threads)
        self._trace_trainer(ev, us, out, threads)
        for (pid, tid), name in sorted(threads.items()):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        if (1, groups_tid) in threads:  # show the group instants above the replica lanes
            out.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": groups_tid,
                        "args": {"sort_index": -1}})
        return {"traceEvents": out, "displayTimeUnit": "ms"}

    @staticmethod
    def _request_records(ev: dict[str, list[dict]]) -> dict[str, dict]:
        """Per request id, in submission order: its first submission (``sub``) and its first end (``end``, a
        response's or an abort's time; None while unfinished) with that response's ``tokens`` and ``aborted``."""
        reqs: dict[str, dict] = {}
        for r in sorted(ev["requests"], key=lambda r: r["t"]):
            reqs.setdefault(r["request_id"], {"sub": r, "end": None, "tokens": None, "aborted": False})
        for kind in ("responses", "aborts"):
            for e in ev[kind]:
                rec = reqs.get(e["request_id"])
                if rec is not None and (rec["end"] is None or e["t"] < rec["end"]):
                    rec.update(end=e["t"], tokens=e.get("num_tokens"), aborted=kind == "aborts")
        return reqs

    def _trace_rollout(self, ev: dict[str, list[dict]], us: Callable[[float], float], latest: float,
                       out: list[dict], threads: dict[tuple[int, int], str]) -> int:
        """The rollout process (pid 1) into ``out``: one bar per request, submit -> first done/abort (unfinished
        ones run to ``latest``, the last event seen), on lanes per replica, then the group instants on a thread of
        their own; names the threads it uses in ``threads``. Returns the group instants' tid."""
        by_replica: dict[int, list[tuple[str, dict]]] = {}
        for rid, rec in self._request_records(ev).items():
            by_replica.setdefault(rec["sub"]["replica"] or 0, []).append((rid, rec))
        placed = {}
        for replica, items in by_replica.items():
            spans = [(rec["sub"]["t"], max(rec["sub"]["t"], latest if rec["end"] is None else rec["end"]))
                     for _, rec in items]
            placed[replica] = (items, spans, _assign_lanes(spans))
        # tid = replica * 1000 + lane; a wider stride only if some replica ever held 1000+ requests at once
        # (e.g. a sync rollout queueing everything), so that replicas never share a tid.
        most_lanes = max([max(lanes) + 1 for _, _, lanes in placed.values() if lanes] or [1])
        stride = 1000 if most_lanes <= 1000 else 10 ** len(str(most_lanes))
        groups_tid = (max(placed, default=0) + 1) * stride
        for replica, (items, spans, lanes) in placed.items():
            for (rid, rec), (s, e), lane in zip(items, spans, lanes):
                tid = replica * stride + lane
                threads[(1, tid)] = f"replica {replica} lane {lane}"
                args = {"group": rec["sub"]["group"], "tokens": rec["tokens"], "step": self.step}
                if rec["aborted"]:
                    args["aborted"] = True
                if rec["end"] is None:
                    args["unfinished"] = True
                out.append({"ph": "X", "name": rid, "pid": 1, "tid": tid, "ts": us(s), "dur": us(e) - us(s),
                            "args": args})
        for g in ev["groups"]:
            threads[(1, groups_tid)] = "groups"
            out.append({"ph": "i", "s": "t", "name": f"group {g['group']} done", "pid": 1, "tid": groups_tid,
                        "ts": us(g["t"]), "args": {"group": g["group"], "trainable": g["trainable"]}})
        return groups_tid

    def _trace_trainer(self, ev: dict[str, list[dict]], us: Callable[[float], float], out: list[dict],
                       threads: dict[tuple[int, int], str]) -> None:
        """The trainer (pid 2: spans on lanes, units' ready instants) and the weight syncs (pid 3) into ``out``."""
        # Trainer spans may overlap (e.g. concurrent log-prob work); lanes keep every bar visible.
        tspans = [(s["start"], max(s["start"], s["end"])) for s in ev["train_spans"]]
        for sp, (s, e), lane in zip(ev["train_spans"], tspans, _assign_lanes(tspans)):
            threads[(2, 1 + lane)] = f"train lane {lane}"
            out.append({"ph": "X", "name": sp["kind"], "pid": 2, "tid": 1 + lane, "ts": us(s),
                        "dur": us(e) - us(s), "args": {"unit": sp["unit"], "step": self.step}})
        for u in ev["units_ready"]:
            threads[(2, _UNIT_READY_TID)] = "unit_ready"
            out.append({"ph": "i", "s": "t", "name": f"unit {u['unit']} ready", "pid": 2, "tid": _UNIT_READY_TID,
                        "ts": us(u["t"]), "args": {"unit": u["unit"], "groups": u["groups"]}})
        for w in ev["weight_syncs"]:
            threads[(3, 0)] = "weight_sync"
            out.append({"ph": "X", "name": "weight_sync", "pid": 3, "tid": 0, "ts": us(w["start"]),
                        "dur": max(0.0, us(w["end"]) - us(w["start"])), "args": {"step": self.step}})

    # ---- serialization ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d: dict = {"step": self.step, "groups_per_unit": self.groups_per_unit}
        d.update(copy.deepcopy(self._snapshot()))
        return d

    @classmethod
    def from_dict(cls, d: dict, clock: Callable[[], float] = time.perf_counter) -> "StepTimeline":
        tl = cls(d["step"], d["groups_per_unit"], clock)
        for kind in _EVENT_KINDS:
            tl._ev[kind] = copy.deepcopy(list(d.get(kind, [])))
        return tl


def write_chrome_trace(timelines: list[StepTimeline], path) -> None:
    """Several steps in one trace, each at its own absolute time, so consecutive steps read left to right."""
    origins = [o for o in (tl._origin(tl._snapshot()) for tl in timelines) if o is not None]
    origin = min(origins) if origins else 0.0
    events, seen_meta = [], set()
    for tl in timelines:
        for e in tl.to_chrome_trace(origin=origin)["traceEvents"]:
            if e["ph"] == "M":  # every step names the same processes and threads; keep one copy
                key = json.dumps(e, sort_keys=True)
                if key in seen_meta:
                    continue
                seen_meta.add(key)
            events.append(e)
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


def summarize(metrics_list: list[dict]) -> dict:
    """Mean per metric over repeated runs, plus ``runs`` and ``spread`` (max - min) per metric.

    Shaped like one mode's entry of the benchmark JSON (docs/metrics.md, "Benchmark output").
    """
    if not metrics_list:
        raise ValueError("summarize: no metrics given")
    keys = [k for k, v in metrics_list[0].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
            and all(isinstance(m.get(k), (int, float)) for m in metrics_list[1:])]
    out: dict = {}
    spread: dict = {}
    for k in keys:
        xs = [float(m[k]) for m in metrics_list]
        out[k] = sum(xs) / len(xs)
        spread[k] = max(xs) - min(xs)
    out["runs"] = len(metrics_list)
    out["spread"] = spread
    return out
