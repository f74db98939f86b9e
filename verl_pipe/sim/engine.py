"""One rollout replica with continuous batching, modelled on vLLM V1's scheduler.

What is mirrored, because it decides who finishes when:
- ``max_num_seqs`` running slots and a per-step token budget (``max_num_batched_tokens``) for prefills;
- a KV pool allocated in blocks of ``kv_block_tokens`` (vLLM's block size: 16 on GPU, 128 on vLLM-CPU); a running
  request holds the blocks of its prompt + generated tokens, and needs a new block at each block boundary. When the
  next step does not fit, the engine preempts (recompute: the victim loses all its computed tokens) the
  latest-admitted running request (fcfs: vLLM's ``running.pop()``) or the one with the largest (priority, arrival)
  (priority policy) back to the front of waiting (``waiting.prepend_request``), and admits nothing in that step
  (vLLM V1's ``Scheduler.schedule``). With blocks of 128 tokens a pool of 32 blocks runs at most 32 requests, however
  short; a pool counted in tokens would run a hundred and thrash;
- the waiting queue: fcfs (a preempted request is prepended) or a heap on (priority, arrival). A waiting
  high-priority request never evicts a running one when ``max_num_seqs`` binds (vLLM V1; vllm#40004).

Decode cost (docs/sim_sources.md §3): t_step = t0 + per_seq_s*b + (W + sum ctx_i * kv_bytes) / BW_eff, plus
prefill FLOPs / FLOP rate for the prompts (or recomputed contexts) admitted in that step; one token per
running request per step. Between scheduling decisions the batch is fixed, so the engine advances many
steps at once in closed form (step k of a segment costs a + c*k) instead of looping per token.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class EngineParams:
    """Defaults: Qwen3-1.7B, TP=1 on an H100-class GPU (docs/sim_sources.md §3 and §7, which give each figure's
    source). Tags as there: [S] sourced, [D] derived (arithmetic shown), [A] assumed."""

    max_num_seqs: int = 256  # verl rollout.yaml [S]
    max_num_batched_tokens: int = 8192  # verl rollout.yaml [S]
    kv_capacity_tokens: int = 540_000  # H100 80 GB at util 0.85 [D]
    kv_bytes_per_token: float = 114_688.0  # 2*28 layers*8 kv heads*128*2 B [D]
    weight_bytes: float = 4.06e9  # Qwen3-1.7B: 2.03B params in bf16 [S]
    t0_s: float = 3.0e-3  # fixed per-step overhead [D: midpoint of 2.5-3.4 ms]
    per_seq_s: float = 0.0  # compute per running sequence per step; 0 on GPU (memory-bound), fitted on CPU
    bw_eff_Bps: float = 0.8 * 3.35e12  # [A: 0.8 x H100 SXM peak]
    prefill_flops_per_token: float = 2 * 1.72e9  # 2N [D]
    prefill_flops_per_s: float = 0.4 * 989e12  # MFU 0.4 x H100 bf16 dense [A]/[D]
    scheduling_policy: str = "fcfs"  # "fcfs" | "priority", as vLLM's --scheduling-policy
    kv_block_tokens: int = 1  # KV allocation unit (vLLM's block_size); 1: the pool is counted in tokens

    def step_time(self, batch: int, ctx_sum: float, prefill_tokens: float = 0.0) -> float:
        return (self.t0_s + self.per_seq_s * batch + (self.weight_bytes + ctx_sum * self.kv_bytes_per_token)
                / self.bw_eff_Bps + prefill_tokens * self.prefill_flops_per_token / self.prefill_flops_per_s)

    def with_(self, **kw) -> "EngineParams":
        return replace(self, **kw)


H100_QWEN3_1P7B = EngineParams()

# The 2-core CPU runs of verl_pipe (tiny Qwen3, vLLM CPU on one AMD EPYC core). Calibrated by
# `python -m verl_pipe_lab.bench` (verl_pipe/sim/calib.py fit_engine: fit_engine_params on decode-step samples of the tiny-model
# sync runs, rollout alone, batches <= 16): t ~ 0.14 ms + 0.39 ms per running sequence, prefill ~0.16 ms per
# prompt token; t0/per_seq are only jointly identified near b = 16 (larger batches are an extrapolation).
# KV: 1 GiB (rolloutpipe.cpu.kv_cache_gib) / 1 KiB per token (2 layers x 1 KV head x 64 x 2 x fp32).
# A live bench run recalibrates per model size and reports its constants in sim_validation.calibration.
CPU_TINY = EngineParams(
    max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=1_048_576, kv_bytes_per_token=0.0,
    weight_bytes=0.0, t0_s=1.4e-4, per_seq_s=3.9e-4, bw_eff_Bps=1.0, prefill_flops_per_token=1.0,
    prefill_flops_per_s=6.2e3,
)

PRESETS = {"h100_qwen3_1.7b": H100_QWEN3_1P7B, "cpu_tiny": CPU_TINY}


def fit_engine_params(measurements, base: EngineParams = CPU_TINY) -> EngineParams:
    """Least-squares fit of the decode-step cost from measured steps.

    ``measurements``: (batch_size, step_time_s) pairs -> t = t0 + per_seq_s*b; or
    (batch_size, ctx_sum_tokens, step_time_s) triples -> also a per-context-token cost, stored as
    kv_bytes_per_token / bw_eff_Bps with bw_eff_Bps = 1 and weight_bytes = 0 (the intercept absorbs them).
    """
    m = np.asarray(measurements, dtype=float)
    if m.ndim != 2 or m.shape[1] not in (2, 3) or len(m) < m.shape[1]:
        raise ValueError("need >= 2 (batch, time) pairs or >= 3 (batch, ctx_sum, time) triples")
    cols = [np.ones(len(m)), m[:, 0]] + ([m[:, 1]] if m.shape[1] == 3 else [])
    coef, *_ = np.linalg.lstsq(np.stack(cols, axis=1), m[:, -1], rcond=None)
    kw = dict(t0_s=float(coef[0]), per_seq_s=float(coef[1]), weight_bytes=0.0)
    if m.shape[1] == 3:
        kw.update(kv_bytes_per_token=float(coef[2]), bw_eff_Bps=1.0)
    return replace(base, **kw)


class Seq:
    """A request inside an engine. ``done`` is lazy: generated = base + (replica steps since join)."""

    __slots__ = ("rid", "group", "index", "length", "prompt", "priority", "arrival", "order", "base",
                 "joined_at_step", "running", "aborted", "preemptions", "cached", "turn")

    def __init__(self, rid, group, index, length, prompt, priority, arrival, order, cached=0, turn=0):
        self.rid, self.group, self.index = rid, group, index
        # prompt tokens already in the replica's prefix cache (a multi-turn trajectory's earlier context on the same
        # replica): held in KV like the rest of the prompt, not prefilled again
        self.cached, self.turn = cached, turn
        self.length, self.prompt, self.priority = length, prompt, priority
        self.arrival, self.order = arrival, order
        self.base = 0  # tokens generated before the current run in the batch (kept across preemption)
        self.joined_at_step = 0
        self.running = False
        self.aborted = False
        self.preemptions = 0


@dataclass
class _Segment:
    start: float
    steps: int
    a: float  # duration of step 0 without prefill
    c: float  # growth of the step time per step (the batch's KV grows by b tokens per step)
    prefill_s: float

    def elapsed(self, k: int) -> float:
        return k * self.a + self.c * k * (k - 1) / 2 + (self.prefill_s if k > 0 else 0.0)

    @property
    def end(self) -> float:
        return self.start + self.elapsed(self.steps)


class Replica:
    """State of one engine; the driver (simulate.py) owns the clock and calls plan/finish/interrupt."""

    def __init__(self, idx: int, params: EngineParams):
        self.idx, self.p = idx, params
        self.waiting: list = []  # heap of (key, Seq)
        self.running: dict[int, Seq] = {}  # admission order: the fcfs preemption victim is the last one
        self.finish_heap: list = []  # (replica step at which it finishes, rid)
        self.steps = 0  # decode steps run so far
        self.ctx_sum = 0  # KV tokens held by the running batch
        self.seg: _Segment | None = None
        self._prepends = 0
        self.num_preemptions = 0
        self.busy_s = 0.0
        self.peak_kv = 0

    # ---- queueing ---------------------------------------------------------------------------------
    def _key(self, s: Seq, prepend: bool):
        if self.p.scheduling_policy == "priority":  # vLLM re-pushes a preempted request with its old key
            return (s.priority, s.arrival, s.order)
        if prepend:  # fcfs: preempted requests go to the front, the latest preempted first
            self._prepends += 1
            return (0, -self._prepends, 0)
        return (1, s.arrival, s.order)

    def submit(self, s: Seq) -> None:
        heapq.heappush(self.waiting, (self._key(s, False), s.order, s))

    def abort(self, s: Seq) -> None:
        s.aborted = True  # lazily dropped from the queues at the next scheduling point

    def generated(self, s: Seq) -> int:
        return s.base + (self.steps - s.joined_at_step if s.running else 0)

    @property
    def idle(self) -> bool:
        return self.seg is None

    def _leave(self, s: Seq) -> None:
        s.base = self.generated(s)
        s.running = False
        del self.running[s.rid]
        self.ctx_sum -= s.prompt + s.base

    # ---- one scheduling decision ------------------------------------------------------------------
    def plan(self, t: float) -> float | None:
        """Schedule at time t and start a segment of steps; returns its end, or None if nothing runs."""
        assert self.seg is None
        p = self.p
        for s in [s for s in self.running.values() if s.aborted]:
            self._leave(s)
        preempted = self._preempt_until_fits()
        # vLLM V1 never evicts and admits in the same step
        prefill_tokens, budget_bound = (0, False) if preempted else self._admit()
        if not self.running:
            return None

        b = len(self.running)
        while True:  # the head of finish_heap may be stale (preempted, aborted, finished earlier)
            step, rid = self.finish_heap[0]
            s = self.running.get(rid)
            if s is not None and s.joined_at_step + s.length - s.base == step:
                break
            heapq.heappop(self.finish_heap)
        steps = min(step - self.steps, self._kv_steps(step - self.steps))
        if preempted or budget_bound:
            steps = 1  # the next step may admit again (after preemption / with a fresh token budget)
        steps = max(1, steps)
        a = p.step_time(b, self.ctx_sum)
        self.seg = _Segment(t, steps, a, b * p.kv_bytes_per_token / p.bw_eff_Bps,
                            prefill_tokens * p.prefill_flops_per_token / p.prefill_flops_per_s)
        return self.seg.end

    def _preempt_until_fits(self) -> bool:
        """vLLM's victims until the next step fits the pool (priority: the largest (priority, arrival); fcfs: the
        latest admitted), each back to waiting with what it generated; True if any was preempted."""
        preempted = False
        while self.running and not self._next_step_fits():
            if self.p.scheduling_policy == "priority":
                victim = max(self.running.values(), key=lambda r: (r.priority, r.arrival, r.order))
            else:
                victim = next(reversed(self.running.values()))
            self._leave(victim)
            victim.preemptions += 1
            self.num_preemptions += 1
            heapq.heappush(self.waiting, (self._key(victim, True), victim.order, victim))
            preempted = True
        return preempted

    def _admit(self) -> tuple[int, bool]:
        """Admit from the head of waiting while a slot, the pool and the step's token budget allow; returns the
        prefill tokens admitted and whether the budget stopped it."""
        p, cap, B = self.p, self.p.kv_capacity_tokens, self.p.kv_block_tokens
        prefill_tokens, budget_bound = 0, False
        blocks = self._blocks_next_step() if B > 1 else 0
        budget = p.max_num_batched_tokens - len(self.running)
        while self.waiting and len(self.running) < p.max_num_seqs:
            s = self.waiting[0][2]
            if s.aborted:
                heapq.heappop(self.waiting)
                continue
            need = s.prompt + s.base  # prompt prefill, or the recompute of a preempted request
            new_blocks = -(-(need + 1) // B)
            if (blocks + new_blocks > cap // B if B > 1 else self.ctx_sum + need + len(self.running) + 1 > cap):
                break  # head does not fit in KV: vLLM stops admitting (no skipping)
            if need > budget and (self.running or prefill_tokens):
                budget_bound = True  # the rest fits in a later step's budget (approximates chunking)
                break
            heapq.heappop(self.waiting)
            s.running, s.joined_at_step = True, self.steps
            self.running[s.rid] = s
            self.ctx_sum += need
            blocks += new_blocks
            budget -= need
            prefill_tokens += need - min(s.cached, need)
            heapq.heappush(self.finish_heap, (self.steps + s.length - s.base, s.rid))
        return prefill_tokens, budget_bound

    # ---- KV blocks ----------------------------------------------------------------------------------
    def _held(self) -> np.ndarray:
        """Tokens each running request holds in KV (prompt + generated), in admission order."""
        return np.fromiter((s.prompt + self.generated(s) for s in self.running.values()), dtype=np.int64,
                           count=len(self.running))

    def _blocks_next_step(self) -> int:
        """Blocks the running batch holds after one more step (each request one token more)."""
        B = self.p.kv_block_tokens
        return int((-(-(self._held() + 1) // B)).sum()) if self.running else 0

    def _next_step_fits(self) -> bool:
        if self.p.kv_block_tokens <= 1:
            return self.ctx_sum + len(self.running) <= self.p.kv_capacity_tokens
        return self._blocks_next_step() <= self.p.kv_capacity_tokens // self.p.kv_block_tokens

    def _kv_steps(self, horizon: int) -> int:
        """How many steps (at most ``horizon``) the running batch can take before the pool runs out."""
        p, b = self.p, len(self.running)
        if p.kv_block_tokens <= 1:
            return (p.kv_capacity_tokens - self.ctx_sum) // b
        B, n = p.kv_block_tokens, self._held()
        free = p.kv_capacity_tokens // B - int((-(-n // B)).sum())
        first = (-n) % B + 1  # the step at which each request needs its next block

        def crossings(k: int) -> int:
            due = first <= k
            return int(due.sum() + ((k - first[due]) // B).sum())

        lo, hi = 0, horizon  # the largest k with crossings(k) <= free
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if crossings(mid) <= free else (lo, mid - 1)
        return lo

    def finish_segment(self) -> list[Seq]:
        """Apply the segment's steps; returns the requests that generated their last token."""
        seg, self.seg = self.seg, None
        self.busy_s += seg.elapsed(seg.steps)
        b = len(self.running)
        self.steps += seg.steps
        self.ctx_sum += seg.steps * b
        self.peak_kv = max(self.peak_kv, self.ctx_sum)
        done = []
        while self.finish_heap and self.finish_heap[0][0] <= self.steps:
            step, rid = heapq.heappop(self.finish_heap)
            s = self.running.get(rid)
            if s is not None and s.joined_at_step + s.length - s.base == step:
                self._leave(s)
                done.append(s)
        return done

    def interrupt(self, t: float) -> float | None:
        """Something arrived at t mid-segment: end the segment after the step in progress.

        Returns the new end time, or None if the segment end does not move. Only worth it when the new
        request can actually join (a free slot) or a running one was aborted.
        """
        seg = self.seg
        if seg is None or t >= seg.end:
            return None
        dt = t - seg.start
        # smallest k >= 1 with elapsed(k) >= dt: solve c/2 k^2 + (a - c/2) k + P - dt = 0, then fix rounding
        a, c, P = seg.a, seg.c, seg.prefill_s
        if c > 0:
            bq = a - c / 2
            k = math.ceil((-bq + math.sqrt(max(0.0, bq * bq + 2 * c * (dt - P)))) / c)
        else:
            k = math.ceil((dt - P) / a) if a > 0 else 1
        k = min(max(k, 1), seg.steps)
        while k > 1 and seg.elapsed(k - 1) >= dt:
            k -= 1
        while k < seg.steps and seg.elapsed(k) < dt:
            k += 1
        if k >= seg.steps:
            return None
        seg.steps = k
        return seg.end
