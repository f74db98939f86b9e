"""Calibrate the simulator from measured steps and check it against them (the bench's ``sim_validation``).

Pure Python + numpy (no Ray, vLLM or torch): it reads recorded ``StepTimeline`` dicts only.

Engine (``verl_pipe.sim.engine``), fitted twice: on sync steps (the rollout runs alone) and on pipelined steps (the
trainer works at the same time; ``Calibration``), pooled over a stack's settings, then run at each setting's own
speed where it has enough requests (``with_setting_engines``). The client timeline knows when each request was
submitted and finished and how many tokens it generated, not when vLLM scheduled it. On one replica with FCFS
admission, the engine start of a request is its submission, or, if ``max_num_seqs`` requests were already running,
the moment a slot freed (``engine_intervals``). A request that ran from ``a`` to ``f`` generated L tokens in L decode
steps, each costing ``t0 + per_seq * b`` for the batch ``b`` running at that step, plus the prefills the engine did
in that time (prompt tokens of requests that started meanwhile, its own included):

    f - a = t0 * L + per_seq * sum_b + prefill_s_per_token * prefill_tokens

``sum_b`` is the batch summed over the request's own L steps, counted on the engine's step clock
(``step_clock_starts``): every running request gains one token per step, so a request that finished at ``f`` after
L tokens puts the clock at (its start step + L) then, and a request's start step is the clock at its start,
interpolated between those points. Counted in steps, not in seconds, the batch needs no step cost to weigh it (a
time average over [a, f] weighs the slow, full-batch steps more and makes the few-request tail look free).
A non-negative least-squares fit over all requests gives the three costs; each request then yields a
decode-step sample ``(sum_b / L, (f - a - prefill share) / L)`` and ``fit_engine_params`` fits t0 and per_seq
on those samples (the joint fit's when that gives a negative cost).

Trainer (``verl_pipe.sim.trainer``). verl's FSDP engine without remove-padding pads every micro-batch to its
longest row, so a call costs by *padded* tokens (``padded_tokens``). The simulator's cost model per trainer
call is update = beta*tok + h + o, forward_backward = beta*tok + h and old_log_prob = lambda*(beta*tok + h)
(h: per-call overhead, ``call_overhead_s``; o: optimizer step per unit); it is fitted by least squares to the
measured spans, one sample per call (a group-granularity burst is one call). Old-log-prob calls of units after
the first also swap theta_k in and out, costed as ``swap_copies`` x the measured ``snapshot_theta_k`` span: 0
with the default store on CPU (rolloutpipe.theta_k.store auto -> device: a pointer swap, no copy; its two worker
calls stay in the fitted per-call overhead); 3 for a store that copies (save + 2 restores, as before the store,
when the snapshot span held theta_k alone); that is taken off their duration before the fit and charged back by
the simulator.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from verl_pipe.sim.peer_fit import PeerFit, fit_engine_scale, fit_peer, scaled
from verl_pipe.core.variants import OURS, SIMULATED, variant
from verl_pipe.core.workload import Workload
from verl_pipe.sim.engine import CPU_TINY, EngineParams, fit_engine_params
from verl_pipe.sim.trainer import TrainerParams

# Requests shorter than this say more about per-request latency than about decode steps.
MIN_TOKENS_FOR_STEP_SAMPLE = 4


# ---------------------------------------------------------------------------------------------- engine


def engine_intervals(tl: dict, max_num_seqs: int) -> list[dict]:
    """Per finished request: engine start ``a``, finish ``f`` (seconds since t0), tokens, replica.

    Assumes FCFS admission in submission order per replica and that KV never binds (true for the bench). Where a
    whole batch is submitted at once through several agent workers and ``max_num_seqs`` binds (the 32-slot queue
    stacks' sync and cgp steps), vLLM receives the requests in another order than the client stamped them: some
    finish while this inference still holds them queued, are admitted later here and never leave, each holding a
    slot to the step's end; the requests queued behind get late starts or none (docs/plan.md). Those fits rest on fewer and skewed requests;
    ``with_setting_engines`` then sets each setting's speed from its rollout figures.
    """
    reqs = sorted(tl["requests"], key=lambda r: r["t"])
    if not reqs:
        return []
    t0 = reqs[0]["t"]
    first_sub: dict[str, dict] = {}
    for r in reqs:
        first_sub.setdefault(r["request_id"], r)
    ends: dict[str, tuple[float, int | None]] = {}
    for r in tl["responses"]:
        ends.setdefault(r["request_id"], (r["t"] - t0, int(r["num_tokens"])))
    for r in tl.get("aborts", []):
        ends.setdefault(r["request_id"], (r["t"] - t0, None))
    events = [(r["t"] - t0, 1, rid, r.get("replica") or 0) for rid, r in first_sub.items()]
    events += [(t, 0, rid, first_sub[rid].get("replica") or 0) for rid, (t, _) in ends.items() if rid in first_sub]
    events.sort(key=lambda e: (e[0], e[1]))  # at equal times a finish frees its slot before a submission
    queues: dict[int, list[str]] = {}
    running: dict[int, set[str]] = {}
    start: dict[str, float] = {}
    for t, kind, rid, rep in events:
        q, run = queues.setdefault(rep, []), running.setdefault(rep, set())
        if kind == 1:
            q.append(rid)
        else:
            run.discard(rid)
        while q and len(run) < max_num_seqs:
            nxt = q.pop(0)
            run.add(nxt)
            start[nxt] = t
    out = []
    for rid, a in start.items():
        if rid in ends and ends[rid][1] is not None:
            f, n_tok = ends[rid]
            out.append({"request_id": rid, "a": a, "f": f, "tokens": n_tok, "group": first_sub[rid]["group"],
                        "replica": first_sub[rid].get("replica") or 0})
    return out


def step_clock_starts(intervals: list[dict]) -> dict[str, float]:
    """Each request's start on one replica's decode-step clock (``engine_intervals`` of that replica).

    Every running request gains one token per engine step, so a request that finished at ``f`` with L tokens, started
    at step s, marks the clock at (f, s + L). In finish order, a request's start step is the clock at its start ``a``,
    interpolated between the points marked so far (the origin (0, 0) included); after the last point, the clock runs
    at the request's own pace L / (f - a) from it."""
    pts_t, pts_k = [0.0], [0.0]
    out: dict[str, float] = {}
    for x in sorted(intervals, key=lambda x: x["f"]):
        a, f, L = x["a"], x["f"], x["tokens"]
        i = bisect.bisect_right(pts_t, a)
        if i < len(pts_t):
            t1, k1, t2, k2 = pts_t[i - 1], pts_k[i - 1], pts_t[i], pts_k[i]
            k = k1 + (k2 - k1) * (a - t1) / (t2 - t1) if t2 > t1 else k2
        else:
            k = pts_k[-1] + (L / (f - a) if f > a else 0.0) * (a - pts_t[-1])
        out[x["request_id"]] = k
        if f >= pts_t[-1] and k + L >= pts_k[-1]:  # the clock never runs backwards
            pts_t.append(f)
            pts_k.append(k + L)
    return out


def step_batch_sums(intervals: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per request of one replica (``intervals``' order): the batch summed over its own decode steps (the other
    requests' step spans overlapping its own, itself included) and how many requests started within its steps."""
    s = step_clock_starts(intervals)
    S = np.asarray([s[x["request_id"]] for x in intervals], dtype=float)
    E = S + np.asarray([x["tokens"] for x in intervals], dtype=float)
    overlap = np.clip(np.minimum(E[:, None], E[None, :]) - np.maximum(S[:, None], S[None, :]), 0.0, None)
    started = (S[None, :] >= S[:, None] - 1e-9) & (S[None, :] < E[:, None])
    return overlap.sum(axis=1), np.maximum(started.sum(axis=1), 1)


def nonneg_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0: drop the most negative column until none is negative."""
    active = list(range(X.shape[1]))
    coef = np.zeros(X.shape[1])
    while active:
        c, *_ = np.linalg.lstsq(X[:, active], y, rcond=None)
        if (c >= 0).all():
            coef[active] = c
            return coef
        active.pop(int(np.argmin(c)))
    return coef


@dataclass
class EngineFit:
    params: EngineParams
    prefill_s_per_token: float
    samples: list[tuple[float, float]]  # (mean running batch, decode step seconds)
    num_requests: int
    rms_residual_s: float  # of the per-request regression
    scale: float = 1.0  # a setting's own speed over the pooled fit's (``with_setting_engines``); 1: the fit as is


def engine_regression_rows(tl: dict, max_num_seqs: int, prompt_len: float) -> list[tuple[float, float, float, float]]:
    """(f - a, L, batch summed over its L steps, prefill tokens during its steps) per request of one step, per
    replica (``step_batch_sums``)."""
    rows = []
    by_rep: dict[int, list[dict]] = {}
    for x in engine_intervals(tl, max_num_seqs):
        if x["tokens"] >= 1:
            by_rep.setdefault(x["replica"], []).append(x)
    for reps in by_rep.values():
        sums, started = step_batch_sums(reps)
        rows += [(x["f"] - x["a"], float(x["tokens"]), float(b), float(n) * prompt_len)
                 for x, b, n in zip(reps, sums, started)]
    return rows


def fit_engine(steps: list[dict], max_num_seqs: int, base: EngineParams) -> EngineFit:
    """``steps``: [{"timeline": tl_dict, "prompt_len": P}, ...] from the real runs."""
    rows = []
    for s in steps:
        rows += engine_regression_rows(s["timeline"], max_num_seqs, s["prompt_len"])
    if len(rows) < 3:
        raise ValueError("need at least 3 finished requests to fit the engine")
    R = np.asarray(rows, dtype=float)
    y, X = R[:, 0], R[:, 1:]
    coef = nonneg_lstsq(X, y)
    rms = float(np.sqrt(np.mean((X @ coef - y) ** 2)))
    p = float(coef[2])
    samples = [(r[2] / r[1], (r[0] - p * r[3]) / r[1]) for r in rows if r[1] >= MIN_TOKENS_FOR_STEP_SAMPLE]
    if len(samples) < 2:
        samples = [(r[2] / r[1], (r[0] - p * r[3]) / r[1]) for r in rows]
    params = fit_engine_params(samples, base=base)
    if params.t0_s < 0 or params.per_seq_s < 0:  # keep a physical model: fall back to the joint nnls fit
        params = params.with_(t0_s=float(coef[0]), per_seq_s=float(coef[1]))
    if p > 0:
        params = params.with_(prefill_flops_per_token=1.0, prefill_flops_per_s=1.0 / p)
    else:
        params = params.with_(prefill_flops_per_token=0.0, prefill_flops_per_s=1.0)
    return EngineFit(params, p, samples, len(rows), rms)


# --------------------------------------------------------------------------------------------- trainer


def padded_tokens(groups: list[int], lengths: list[list[int]], prompt_len: float, micro_rows: int,
                  order: str = "arrival") -> float:
    """Tokens the trainer actually processes: each micro-batch padded to its longest row, the rows in group order
    (``arrival``) or sorted longest first (``length``: rolloutpipe.micro_batch_order of an update call)."""
    rows = [L for g in groups for L in lengths[g]]
    if order == "length":
        rows.sort(reverse=True)
    total = 0.0
    for i in range(0, len(rows), micro_rows):
        mb = rows[i:i + micro_rows]
        total += len(mb) * (prompt_len + max(mb))
    return total


@dataclass
class TrainerFit:
    params: TrainerParams
    update_line: tuple[float, float]  # fitted (intercept s, s per padded token) of an update call
    logprob_line: tuple[float, float]  # of an old_log_prob call
    swap_s: float
    num_spans: dict


def trainer_span_samples(step: dict, micro_rows: int,
                         update_order: str = "arrival") -> dict[str, list[tuple[float, float]]]:
    """(padded tokens, seconds) of each trainer span of one step, by kind (``_trainer_spans``)."""
    out: dict[str, list[tuple[float, float]]] = {"update": [], "old_log_prob": [], "old_log_prob_swapped": [],
                                                 "forward_backward": [], "optimizer_step": [], "swap": []}
    for key, tokens, dur, _ in _trainer_spans(step, micro_rows, update_order):
        out[key].append((tokens, dur))
    return out


def _trainer_spans(step: dict, micro_rows: int, update_order: str = "arrival") -> list[tuple[str, float, float, float]]:
    """(cost kind, padded tokens, seconds, start) of each trainer span of one step, in start order."""
    return [(r["key"], r["tokens"], r["seconds"], r["start"])
            for r in trainer_span_records(step, micro_rows, update_order)]


def trainer_span_records(step: dict, micro_rows: int, update_order: str = "arrival") -> list[dict]:
    """Each trainer span of one step, in start order: {"key": cost kind, "tokens": padded tokens, "seconds",
    "start", "unit", "group"} (unit and group as the span was tagged, so a caller can pick a unit's work).

    ``step``: {"timeline": tl_dict, "lengths": [[...]], "prompt_len": P}. A span's groups: those the trainer
    recorded as ready for its unit; with group granularity a span names the last group of the burst it
    processed, and the burst is the unit's groups after the previous burst up to that one; a span without a
    unit covers every trained group (sync's whole-batch log-prob). ``update_order``: the rows' order in an update
    or forward_backward call, which decides its padding (log-prob calls keep group order).
    """
    tl, lengths, P = step["timeline"], step["lengths"], step["prompt_len"]
    unit_groups = {u["unit"]: list(u["groups"]) for u in tl["units_ready"]}
    all_groups = [g for u in sorted(unit_groups) for g in unit_groups[u]]
    out: list[dict] = []

    def record(key, tokens, dur, span):
        out.append({"key": key, "tokens": tokens, "seconds": dur, "start": span["start"], "unit": span["unit"],
                    "group": span.get("group")})

    # A unit with its own optimizer_step span (group granularity, or the simulator's timelines) has update
    # spans without the optimizer step: they cost like forward_backward.
    own_opt = {s["unit"] for s in tl["train_spans"] if s["kind"] == "optimizer_step"}
    burst_start: dict[tuple[int, str], int] = {}  # (unit, kind) -> where the next burst starts in the unit's groups
    for s in sorted(tl["train_spans"], key=lambda s: s["start"]):
        kind, dur, unit = s["kind"], s["end"] - s["start"], s["unit"]
        if kind in ("snapshot_theta_k", "optimizer_step"):
            record("swap" if kind == "snapshot_theta_k" else kind, 0.0, dur, s)
            continue
        if kind not in ("update", "old_log_prob", "forward_backward"):
            continue
        if s.get("groups") is not None:  # recorded: e.g. a coalesced log-prob call over several units' groups
            groups = list(s["groups"])
        elif unit is None:
            groups = all_groups
        elif s.get("group") is not None and unit in unit_groups and s["group"] in unit_groups[unit]:
            ug = unit_groups[unit]
            lo = burst_start.get((unit, kind), 0)
            hi = ug.index(s["group"]) + 1
            groups = ug[lo:hi]
            burst_start[(unit, kind)] = hi
        else:
            groups = unit_groups.get(unit, [])
        if groups:
            key = "forward_backward" if kind == "update" and unit in own_opt else kind
            if kind == "old_log_prob" and unit is not None and unit > 0:
                key = "old_log_prob_swapped"  # TrainerSeam.old_log_prob at θ_k: the span includes the theta_k swap
            order = update_order if key in ("update", "forward_backward") else "arrival"
            record(key, padded_tokens(groups, lengths, P, micro_rows, order), dur, s)
    return out


def trainer_cost_split(steps: list[dict], micro_rows: int) -> dict[str, dict[str, float]]:
    """Seconds per 1,000 padded tokens of each trainer call kind, for calls that ended before the rollout's last
    response (``during_rollout``), started after it (``after_rollout``) or ran across it (``across_rollout_end``),
    pooled over ``steps`` (total seconds over total tokens): ``{kind: {phase: s}}``, a phase without calls left
    out. Where the trainer shares the host with the rollout's processes, overlapped work runs slower than the same
    work after the rollout; this is what that costs (docs/results.md, "paper_tiny"). Old-log-prob calls at θ_k after
    unit 0 count as old_log_prob."""
    total: dict[str, dict[str, list[float]]] = {}
    for step in steps:
        tl = step["timeline"]
        ends = [e["t"] for e in tl["responses"]] + [e["t"] for e in tl["aborts"]]
        if not ends:
            continue
        rollout_end = max(ends)
        for key, tokens, dur, start in _trainer_spans(step, micro_rows):
            if tokens <= 0:
                continue
            kind = "old_log_prob" if key == "old_log_prob_swapped" else key
            phase = ("after_rollout" if start >= rollout_end else
                     "during_rollout" if start + dur <= rollout_end else "across_rollout_end")
            acc = total.setdefault(kind, {}).setdefault(phase, [0.0, 0.0])
            acc[0] += dur
            acc[1] += tokens
    return {kind: {phase: 1000.0 * s / tok for phase, (s, tok) in phases.items()} for kind, phases in total.items()}


def fit_trainer(steps: list[dict], micro_rows: int, base: TrainerParams | None = None,
                swap_copies: float = 0.0, update_order: str = "arrival") -> TrainerFit:
    """Least squares of the simulator's trainer cost model on the measured spans.

    Model (TrainerParams, h = call_overhead_s per call): update = beta*tok + h + o, old_log_prob =
    lambda*(beta*tok + h); group granularity: forward_backward = beta*tok + h, optimizer_step = o.
    Old-log-prob calls at theta_k after unit 0 first lose the modelled swap (``swap_copies`` x the mean measured
    snapshot). lambda is scanned on a grid; for each, (beta, h, o) >= 0 is a linear fit. Tokens are padded ones, each
    call's rows in runs of ``micro_rows`` (update calls' rows in ``update_order``), and the fitted params pad the same
    way (``pad_rows``, ``update_order``).
    """
    upd, fb, opt, lp, lp_sw, swap = [], [], [], [], [], []
    for s in steps:
        smp = trainer_span_samples(s, micro_rows, update_order)
        upd += smp["update"]
        fb += smp["forward_backward"]
        opt += [d for _, d in smp["optimizer_step"]]
        lp += smp["old_log_prob"]
        lp_sw += smp["old_log_prob_swapped"]
        swap += [d for _, d in smp["swap"]]
    swap_s = float(np.mean(swap)) if swap else 0.0
    lp = lp + [(x, max(0.0, d - swap_copies * swap_s)) for x, d in lp_sw]
    if len(upd) + len(fb) < 2 or not lp:
        raise ValueError("need update (or forward_backward) and old_log_prob spans to fit the trainer")
    y = np.asarray([d for _, d in upd] + [d for _, d in fb] + opt + [d for _, d in lp], dtype=float)
    best = None
    for lam in np.linspace(0.05, 1.5, 146):
        X = np.asarray([[x, 1.0, 1.0] for x, _ in upd] + [[x, 1.0, 0.0] for x, _ in fb] + [[0.0, 0.0, 1.0]] * len(opt)
                       + [[lam * x, lam, 0.0] for x, _ in lp], dtype=float)
        c = nonneg_lstsq(X, y)
        sse = float(np.sum((X @ c - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, float(lam), c)
    _, lam, (beta, h, o) = best
    beta = max(float(beta), 1e-12)
    params = (base or TrainerParams()).with_(
        num_gpus=1, flops_per_s_per_gpu=1.0 / beta, efficiency=1.0, linear_flops_per_token=1.0,
        attn_flops_coef=0.0, call_overhead_s=float(h), microbatch_overhead_s=0.0, max_tokens_per_microbatch=1 << 40,
        logprob_ratio=lam, use_ref=False, optimizer_step_s=float(o), time_scale=1.0,
        swap_save_s=swap_s, swap_restore_s=swap_s, swap_cycle_s=swap_copies * swap_s, opt_snapshot_s=0.0,
        pad_rows=micro_rows, update_order=update_order)
    return TrainerFit(params, (float(h + o), beta), (lam * float(h), lam * beta), swap_s,
                      {"update": len(upd), "forward_backward": len(fb), "optimizer_step": len(opt),
                       "old_log_prob": len(lp), "old_log_prob_swapped": len(lp_sw), "swap": len(swap)})


class PaddedWorkload(Workload):
    """A workload whose trainer-side sequences are padded per group (micro-batch = one group of n rows).

    The rollout still generates ``lengths``; only ``seq_lens`` (what the simulated trainer pays for) changes.
    """

    def seq_lens(self, group: int) -> list[int]:
        return [self.prompt_len + max(self.lengths[group])] * self.n


# ------------------------------------------------------------------------------------------ validation


def rel_error(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas if meas else math.inf


@dataclass(frozen=True)
class StepShape:
    """What the simulator needs to know about the measured setup."""

    n: int
    groups_per_unit: int
    micro_rows: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    num_replicas: int = 1
    # The rollout's admission, as the trainer configures it: the stock dispatch of sync/cgp/cgp_group
    # (order, per-replica window) and FGD's window (None: max_num_seqs; "adaptive": frontier.AdaptiveWindow).
    baseline_order: str = "group_major"
    baseline_window: int | None = None
    fgd_window: int | str | None = None
    # The KV pool's allocation unit (vLLM's block size) where it binds: a pool capped in blocks
    # (sim/records.py capped_kv_tokens); 1 counts it in tokens (an uncapped pool never binds on the bench)
    kv_block_tokens: int = 1
    # The rows' order in an update call (rolloutpipe.micro_batch_order), which decides its padding
    update_order: str = "arrival"


def base_engine(shape: StepShape) -> EngineParams:
    return CPU_TINY.with_(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                          kv_capacity_tokens=shape.kv_capacity_tokens, kv_block_tokens=shape.kv_block_tokens)


# A setting whose own steps hold at least this many finished requests of a kind (alone or overlapped) gets its own
# engine speed of that kind (``with_setting_engines``): a few rounds of a bench setting
MIN_SETTING_REQUESTS = 512


@dataclass
class Calibration:
    """Engine fits for a rollout running alone (sync) and beside a busy trainer (pipelined modes), and the
    trainer fit. On a small machine the rollout's client lives in the trainer's driver process and helper
    processes are unpinned, so the rollout is measurably slower while the trainer works; the simulator has no
    such coupling, so each case gets its own engine constants (the same model, refit). ``peer``: verl's peer's own
    mechanisms where the run measured it (``bench.peer_fit``): its engine is the overlapped one scaled, its mini-step
    gap is in the trainer's params (only verl's schedule reads it).

    ``per_setting``: {setting: {"alone" | "overlapped": EngineFit}}, the engine at one setting's own speed where it
    has enough requests of its own (``with_setting_engines``). The host's engine speed is not one constant across a
    stack's settings: the trainer's nice level, the host's drift between settings and the batch's shape (on the
    32-slot queue stacks an equal-length batch runs in whole waves, the first one slower, and a long tail drains to
    one request) move it, and a fit pooled over the settings reproduces none of them exactly.
    ``engine_for(mode, setting)`` takes the setting's own where there is one, the pooled fit otherwise (a setting
    held out of the calibration, one with too few requests, or no setting named)."""

    alone: EngineFit
    overlapped: EngineFit
    trainer: TrainerFit
    peer: PeerFit | None = None
    per_setting: dict[str, dict[str, EngineFit]] = dataclasses.field(default_factory=dict)

    def engine_for(self, mode: str, setting: str | None = None) -> EngineParams:
        if not variant(mode).ours and self.peer is not None:
            return scaled(self.overlapped.params, self.peer.engine_scale)
        kind = "overlapped" if variant(mode).overlapped else "alone"
        own = self.per_setting.get(setting, {}).get(kind) if setting is not None else None
        return (own or getattr(self, kind)).params


def with_peer(cal: Calibration, peer_steps: list[dict], shape: StepShape) -> Calibration:
    """``cal`` with verl's peer's mechanisms fitted on its measured steps (``bench.peer_fit``); as is without any."""
    def simulate(step: dict, engine: EngineParams) -> dict:
        return simulate_like(step, step["mode"], "minibatch", engine, cal.trainer.params, shape)

    fit = fit_peer(peer_steps, simulate, cal.overlapped.params)
    if fit is None:
        return cal
    trainer = dataclasses.replace(cal.trainer, params=cal.trainer.params.with_(verl_ministep_gap_s=fit.ministep_gap_s))
    return dataclasses.replace(cal, trainer=trainer, peer=fit)


def calibrate(steps: list[dict], shape: StepShape) -> Calibration:
    base = base_engine(shape)
    alone = [s for s in steps if not variant(s["mode"]).overlapped]
    overlapped = [s for s in steps if variant(s["mode"]).overlapped]
    joint = None
    if not alone or not overlapped:
        joint = fit_engine(steps, shape.max_num_seqs, base)
    return Calibration(alone=fit_engine(alone, shape.max_num_seqs, base) if alone and overlapped else joint,
                       overlapped=fit_engine(overlapped, shape.max_num_seqs, base) if alone and overlapped else joint,
                       trainer=fit_trainer(steps, shape.micro_rows, update_order=shape.update_order))


def with_setting_engines(cal: Calibration, steps: list[dict], shape: StepShape,
                         min_requests: int | None = None) -> Calibration:
    """``cal`` with each setting's own engine speed (``Calibration.per_setting``) where the setting's steps of a kind
    (alone: sync; overlapped: the pipelined modes) hold at least ``min_requests`` finished requests (default
    ``MIN_SETTING_REQUESTS``): ``cal``'s engine of that kind with its step and prefill costs scaled
    (``peer_fit.scaled``) so that the setting's simulated rollout figures (first unit ready, group completion p50
    and p90, last response) match its measured ones (``peer_fit.fit_engine_scale``, as verl's peer gets its own).
    The per-request fit gives the engine's shape (a step's fixed and per-sequence cost, prefill), pooled over the
    stack's settings; the speed is the one figure a setting has enough requests to fit on its own, and fitted
    through the simulator it sees the running batch even where the request timings cannot (a capped KV pool: the
    donor's engine, at the capped stack's own speed)."""
    def simulate(step: dict, engine: EngineParams) -> dict:
        return simulate_like(step, step["mode"], step["granularity"], engine, cal.trainer.params, shape)

    min_requests = MIN_SETTING_REQUESTS if min_requests is None else min_requests
    out: dict[str, dict[str, EngineFit]] = {}
    for setting in sorted({s["setting"] for s in steps}):
        for kind, overlapped in (("alone", False), ("overlapped", True)):
            mine = [s for s in steps if s["setting"] == setting and s["mode"] in OURS
                    and variant(s["mode"]).overlapped == overlapped]
            if sum(len(s["timeline"]["responses"]) for s in mine) < min_requests:
                continue
            pooled: EngineFit = getattr(cal, kind)
            scale = fit_engine_scale(mine, simulate, pooled.params)
            out.setdefault(setting, {})[kind] = dataclasses.replace(pooled, params=scaled(pooled.params, scale),
                                                                    scale=scale)
    return dataclasses.replace(cal, per_setting=out)


def with_own_speeds(cal: Calibration, steps: list[dict], shape: StepShape, borrowed: bool = False) -> Calibration:
    """``with_setting_engines`` where ``cal``'s engine was fitted on more than one setting's steps (``steps`` span
    several settings) or on none of them (``borrowed``: a donor's engine); ``cal`` as is otherwise."""
    if borrowed or len({s["setting"] for s in steps}) > 1:
        return with_setting_engines(cal, steps, shape)
    return cal


def simulate_like(step: dict, mode: str, granularity: str, engine: EngineParams, trainer: TrainerParams,
                  shape: StepShape, client_s_per_request: float = 0.0, predictions=None,
                  rest_order: str = "rank") -> dict:
    """Simulated metrics of one measured step's workload in ``mode`` (any simulator mode); ``client_s_per_request``:
    a driver that costs that much per request (``sim.simulate.simulate_rollout``; 0: instantaneous); ``predictions``:
    the step's length predictions (verl_pipe/sim/tail.py) and FGD's order beyond the frontier with them."""
    from verl_pipe.sim.simulate import simulate_step

    lengths = step["lengths"]
    # a trainer that pads per call (a fit: pad_rows) takes the rows as generated, else each group padded to its longest
    wl = (Workload if trainer.pad_rows else PaddedWorkload)(
        len(lengths), shape.n, [list(map(int, g)) for g in lengths], int(round(step["prompt_len"])))
    # the step's own FGD window when its setting set one (bench setting key fgd_window), else the stack's
    fgd_window = step.get("fgd_window") or shape.fgd_window or shape.max_num_seqs
    window = fgd_window if variant(mode).fgd else shape.baseline_window
    if predictions is None and variant(mode).fgd and step.get("fgd_lengths", "off") != "off":
        # a measured FGD step that ordered by its length predictions: replayed with them (verl_pipe/sim/tail.py)
        from verl_pipe.sim.tail import recorded_lengths

        predictions = recorded_lengths(step.get("length_predictions"), shape.n)
        rest_order = (step.get("admission") or {}).get("rest_order") or rest_order
    measured_fgd = variant(mode).fgd and variant(step.get("mode", mode)).fgd
    policy = (step.get("admission") or {}).get("policy") if measured_fgd else None
    if policy:  # the plug-in the measured FGD step ran with (rolloutpipe.fgd.policy)
        from verl_pipe.core.admission import load_policy

        kwargs = {"fgd_policy": load_policy(policy)}
    else:
        kwargs = {}
    tl = simulate_step(wl, engine, trainer, mode, shape.num_replicas, window=window,
                       groups_per_unit=shape.groups_per_unit, order=shape.baseline_order, granularity=granularity,
                       weight_sync_s=float(step.get("weight_sync_s", 0.0)), client_s_per_request=client_s_per_request,
                       unit_fill=step.get("unit_fill", "completion"),  # steps recorded before the knob: completion
                       lengths=predictions, rest_order=rest_order, **kwargs)
    return tl.metrics()


def _validation_table(steps: list[dict], fits_for, shape: StepShape) -> dict:
    """Per setting and mode: measured vs predicted mean rollout_to_train_end_s and the relative error."""
    per: dict[tuple[str, str], dict] = {}
    for s in steps:
        cal = fits_for(s)
        mode = s["mode"]
        pred = simulate_like(s, mode, s["granularity"], cal.engine_for(mode, s["setting"]), cal.trainer.params, shape)
        d = per.setdefault((s["setting"], s["mode"]), {"measured": [], "predicted": [], "meas_rollout": [],
                                                      "pred_rollout": []})
        d["measured"].append(s["metrics"]["rollout_to_train_end_s"])
        d["predicted"].append(pred["rollout_to_train_end_s"])
        d["meas_rollout"].append(s["metrics"]["rollout_end_s"])
        d["pred_rollout"].append(pred["rollout_end_s"])
    rows = []
    for (setting, mode), d in per.items():
        m, p = float(np.mean(d["measured"])), float(np.mean(d["predicted"]))
        rows.append({"setting": setting, "mode": mode, "measured_s": m, "predicted_s": p,
                     "rel_error": rel_error(p, m),
                     "rollout_end_measured_s": float(np.mean(d["meas_rollout"])),
                     "rollout_end_predicted_s": float(np.mean(d["pred_rollout"])),
                     "runs": len(d["measured"])})
    per_mode: dict[str, dict] = {}
    for r in rows:
        pm = per_mode.setdefault(r["mode"], {"errors": []})
        pm["errors"].append(r["rel_error"])
    for pm in per_mode.values():
        errs = pm.pop("errors")
        pm.update(mean_rel_error=float(np.mean(errs)), max_rel_error=float(np.max(errs)), settings=len(errs))
    return {"rows": rows, "per_mode": per_mode,
            "max_rel_error": float(max(r["rel_error"] for r in rows)) if rows else math.nan}


def with_engine_of(cal: Calibration, donor: Calibration, shape: StepShape) -> Calibration:
    """``cal`` with the engine fits of ``donor`` (the same model on the same machine), sized to ``shape``'s slots and
    KV pool: for a stack whose KV pool binds, where the per-request fit cannot see how many requests run (vLLM admits
    by free blocks and preempts; the fit assumes every admitted request runs)."""
    def sized(fit: EngineFit) -> EngineFit:
        return dataclasses.replace(fit, params=fit.params.with_(max_num_seqs=shape.max_num_seqs,
                                                                kv_capacity_tokens=shape.kv_capacity_tokens,
                                                                kv_block_tokens=shape.kv_block_tokens))

    return Calibration(alone=sized(donor.alone), overlapped=sized(donor.overlapped), trainer=cal.trainer, peer=cal.peer)


def sim_validation(steps: list[dict], shape: StepShape, target: float = 0.15,
                   engine_donor: Calibration | None = None) -> dict:
    """Calibrate on every measured step, re-simulate each one, compare rollout_to_train_end_s.

    Also a leave-one-setting-out check: each setting predicted by a fit on the other settings only.
    ``steps``: measured steps, each {"setting", "mode", "granularity", "timeline", "lengths", "prompt_len",
    "weight_sync_s", "metrics"}.
    """
    # Re-simulated: our modes, and the measured peer on-policy (lab/verl_pipe_lab/bench/peer), the simulator's model of verl's
    # trainer, with its own rollout speed and mini-step gap fitted on its steps (bench.peer_fit); its one-batch-ahead
    # configuration is not modelled. The engine and trainer fits are our modes'.
    steps = [s for s in steps if s["mode"] in SIMULATED]
    ours = [s for s in steps if s["mode"] in OURS]
    peer = [s for s in steps if s["mode"] not in OURS]
    cal = calibrate(ours, shape)
    if engine_donor is not None:
        cal = with_engine_of(cal, engine_donor, shape)
    settings = sorted({s["setting"] for s in ours})
    cal = with_own_speeds(cal, ours, shape, borrowed=engine_donor is not None)
    cal = with_peer(cal, peer, shape)
    in_sample = _validation_table(steps, lambda s: cal, shape)
    holdout = None
    if len(settings) >= 2:
        fits = {}
        for name in settings:
            others = [s for s in ours if s["setting"] != name]
            try:
                fits[name] = calibrate(others, shape)
                if engine_donor is not None:
                    fits[name] = with_engine_of(fits[name], engine_donor, shape)
                fits[name] = with_peer(fits[name], [s for s in peer if s["setting"] != name], shape)
            except ValueError:
                fits = None
                break
        if fits:
            holdout = _validation_table(steps, lambda s: fits[s["setting"]], shape)
    out = {
        "metric": "rollout_to_train_end_s",
        "target_rel_error": target,
        "max_rel_error": in_sample["max_rel_error"],
        "within_target": bool(in_sample["max_rel_error"] <= target),
        "per_mode": in_sample["per_mode"],
        "rows": in_sample["rows"],
        "calibration": calibration_summary(cal),
        "note": ("in-sample: the simulator is calibrated on all measured steps of this run, then re-simulates "
                 "each one; holdout: each setting predicted from a calibration on the other settings only"),
    }
    if holdout is not None:
        out["holdout_max_rel_error"] = holdout["max_rel_error"]
        out["holdout_per_mode"] = holdout["per_mode"]
    return out, cal


def _engine_summary(eng: EngineFit) -> dict:
    e = eng.params
    return {"t0_s": e.t0_s, "per_seq_s": e.per_seq_s, "prefill_s_per_token": eng.prefill_s_per_token,
            "max_num_seqs": e.max_num_seqs, "kv_capacity_tokens": e.kv_capacity_tokens,
            "step_samples": len(eng.samples), "requests": eng.num_requests, "request_fit_rms_s": eng.rms_residual_s}


def calibration_summary(cal: Calibration) -> dict:
    tr, t = cal.trainer, cal.trainer.params
    b = cal.alone.params.max_num_seqs
    return {
        "engine_alone": _engine_summary(cal.alone),
        "engine_overlapped": _engine_summary(cal.overlapped),
        # decode-step time at a full batch, beside a busy trainer vs alone
        "rollout_slowdown_when_overlapped": cal.overlapped.params.step_time(b, 0) / cal.alone.params.step_time(b, 0),
        "trainer": {"update_intercept_s": tr.update_line[0], "update_s_per_padded_token": tr.update_line[1],
                    "logprob_intercept_s": tr.logprob_line[0], "logprob_s_per_padded_token": tr.logprob_line[1],
                    "logprob_ratio": t.logprob_ratio, "per_call_overhead_s": t.call_overhead_s,
                    "optimizer_step_s": t.optimizer_step_s, "theta_k_snapshot_s": tr.swap_s,
                    "pad_rows": t.pad_rows, "update_order": t.update_order,
                    "spans": tr.num_spans},
        **({"verl_peer": cal.peer.summary()} if cal.peer is not None else {}),
        # each setting's own engine speed over engine_alone / engine_overlapped (with_setting_engines)
        **({"engine_scale_per_setting": {name: {kind: fit.scale for kind, fit in fits.items()}
                                         for name, fits in cal.per_setting.items()}} if cal.per_setting else {}),
    }
