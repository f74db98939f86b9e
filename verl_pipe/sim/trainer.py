"""Trainer cost model and the trainer's schedule for each mode.

Cost (docs/sim_sources.md §4, §7, which give each figure's source; tags as there: [S] sourced, [D] derived,
[A] assumed): a trainer call (one old_log_prob, ref, update or forward_backward call on the
worker group) over a set of sequences costs ``call_overhead_s`` + FLOPs / (GPUs * FLOP rate * eta) + a fixed
overhead per micro-batch, where the micro-batches per GPU are ceil(tokens / GPUs / max_tokens_per_microbatch)
(verl's dynamic batch size packs tokens). FLOPs per sequence of length L = L * linear + attn_coef * L^2 (6N +
2N for slime's full recompute, plus 4 x causal attention). old_log_prob = 1/3 of the update [S: verl
2.9-3.25]; ref = old_log_prob when the KL loss is on [S: verl#7412]. All trainer compute times are multiplied
by ``time_scale``, the knob of the T/R sweep (CPU model copies and polling are not compute and are not scaled).

The rollout never waits for the trainer (separate pools, fixed weights), so the trainer is a single server
that consumes group completions in order. Our modes run the real trainer's own schedule (``verl_pipe.core.schedule``,
the same generator ``verl_pipe/trainer/pipe_trainer.py`` executes on verl's workers) on ``CostModel``, which prices each
action; what that gives per mode:

- sync: one old_log_prob (and ref) call over the whole batch after the rollout, then one update per unit;
- cgp (mini-batch units): per unit, when its groups are in, old_log_prob, ref and update calls; a unit that
  needs groups takes every group queued by then (``GroupQueue.take(k, need)``), and one old_log_prob (and ref)
  call covers them all, so a lagging trainer pays one call per catch-up, not one per unit;
- cgp_group: per unit, the trainer takes whatever groups have arrived, up to the unit's remainder, as one
  burst (``GroupQueue.take(k, need=1)``): one old_log_prob, ref and forward_backward call over the burst; the
  optimizer step once the unit is complete. When the trainer lags behind the rollout, bursts merge groups and
  the per-call overhead is paid once per burst, not once per group. An idle trainer wakes on the first group
  and takes it alone;
- CGP's exact on-policy old log-probs: unit 0 runs at theta_k as is and then keeps a snapshot of theta_k
  (``snapshot_theta_k``: one save, plus the optimizer's rollback snapshot with fault.checkpoint_on_failure);
  every later unit's old_log_prob call swaps theta_k in and back out (``TrainerSeam.old_log_prob``), recorded
  inside the old_log_prob span as the real trainer does. The copy costs depend on where theta_k is kept
  (``placement_costs``, rolloutpipe.theta_k.store): ``pageable`` (verl's save_model_to_cpu, what the trainer
  did before the store: save the current weights, restore theta_k, compute, restore the current weights),
  ``pinned`` (the same copies into preallocated pinned buffers) or ``device`` (a device-to-device snapshot and
  a swap on the device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from verl_pipe.core import schedule as S
from verl_pipe.core.variants import SIMULATED as MODES, variant


@dataclass(frozen=True)
class TrainerParams:
    num_gpus: int = 2
    flops_per_s_per_gpu: float = 0.3 * 989e12  # MFU 0.3 [A] x H100 bf16 dense [D]
    efficiency: float = 1.0  # eta: measured small-model learners run 5-20x below the FLOP model [A]
    linear_flops_per_token: float = 8 * 1.72e9  # 6N + 2N (full recompute) [D]
    attn_flops_coef: float = 8 * 28 * 2048  # 4 x attn_fwd, attn_fwd/token = 4*layers*(L/2)*hidden [D]
    microbatch_overhead_s: float = 0.1  # [S: ThunderSyncRL]
    max_tokens_per_microbatch: int = 9216  # per GPU [S: slime --max-tokens-per-gpu]
    call_overhead_s: float = 0.0  # per trainer call (dispatch, batch set-up); fitted on CPU, 0 at cluster scale [A]
    logprob_ratio: float = 1 / 3  # old_log_prob / update [S: verl 2.9-3.25]
    use_ref: bool = True  # KL loss on -> a ref log-prob pass as costly as old_log_prob [A]
    optimizer_step_s: float = 0.1  # grad reduce + AdamW step per mini-batch [A]
    time_scale: float = 1.0
    # Model copies: CGP's theta_k snapshot and swaps, and verl V1 separate_async's pi_old (placement_costs)
    swap_save_s: float = 0.34  # save_model_to_cpu: 8.12 GB fp32 params / 2 GPUs / 12 GB/s [A]
    swap_restore_s: float = 0.34  # restore_model_from_cpu, same volume [A]
    swap_cycle_s: float | None = None  # a swap in + out measured as one figure (device placement); None: save + 2 restores
    opt_snapshot_s: float = 0.0  # CGP's optimizer rollback snapshot at unit 0 (fault.checkpoint_on_failure)
    # verl V1 separate_async only:
    poll_interval_s: float = 2.0  # verl V1 ReplayBuffer.poll_interval default [S: docs/peer.md]
    verl_swap_save_s: float | None = None  # its pi_old copies (verl's own pageable path); None: swap_save_s
    verl_swap_restore_s: float | None = None  # None: swap_restore_s
    verl_ministep_gap_s: float = 0.0  # between a mini-step's old-log-prob and update calls (advantages, hand-off)
    # Padding, as verl's FSDP engine without remove-padding computes: each run of ``pad_rows`` rows of a call padded
    # to its longest (0: no padding). Update (and forward_backward) calls see their rows in ``update_order``:
    # "length" sorts them longest first (rolloutpipe.micro_batch_order), "arrival" keeps them group after group;
    # log-prob calls always see them group after group (verl_pipe/core/micro_batches.py)
    pad_rows: int = 0
    update_order: str = "arrival"

    def with_(self, **kw) -> "TrainerParams":
        return replace(self, **kw)

    # ---- costs --------------------------------------------------------------------------------------
    def update_s(self, seq_lens: list[int]) -> float:
        """One forward + backward call over these sequences (in group order), without the optimizer step."""
        return self._call_s(self.padded(seq_lens, self.update_order))

    def padded(self, seq_lens: list[int], order: str) -> list[int]:
        """Each row's length as the engine computes it: its run of ``pad_rows`` rows padded to the run's longest."""
        if self.pad_rows <= 0:
            return list(seq_lens)
        if order not in ("length", "arrival"):
            raise ValueError(f"update_order: got {order!r}; allowed: length, arrival")
        rows = sorted(seq_lens, reverse=True) if order == "length" else list(seq_lens)
        k = self.pad_rows
        return [max(rows[i:i + k]) for i in range(0, len(rows), k) for _ in rows[i:i + k]]

    def _call_s(self, seq_lens: list[int]) -> float:
        if not seq_lens:
            return 0.0
        flops = sum(L * self.linear_flops_per_token + self.attn_flops_coef * L * L for L in seq_lens)
        tokens = sum(seq_lens)
        g = self.num_gpus
        microbatches = math.ceil(tokens / g / self.max_tokens_per_microbatch)
        t = (self.call_overhead_s + flops / (g * self.flops_per_s_per_gpu * self.efficiency)
             + microbatches * self.microbatch_overhead_s)
        return t * self.time_scale

    def logprob_s(self, seq_lens: list[int]) -> float:
        return self.logprob_ratio * self._call_s(self.padded(seq_lens, "arrival"))

    def ref_s(self, seq_lens: list[int]) -> float:
        return self.logprob_s(seq_lens) if self.use_ref else 0.0

    @property
    def optimizer_s(self) -> float:
        return self.optimizer_step_s * self.time_scale

    @property
    def theta_k_swap_s(self) -> float:
        """Extra cost of an old_log_prob call at theta_k after the first unit: save current, restore theta_k,
        (compute), restore current."""
        if self.swap_cycle_s is not None:
            return self.swap_cycle_s
        return self.swap_save_s + 2 * self.swap_restore_s

    @property
    def snapshot_s(self) -> float:
        """CGP's unit-0 snapshot: theta_k, and the optimizer state for a rollback."""
        return self.swap_save_s + self.opt_snapshot_s


PLACEMENTS = ("pageable", "pinned", "device")


def placement_costs(placement: str, num_gpus: int, f: dict) -> dict:
    """TrainerParams copy fields for a theta_k placement, per GPU of an FSDP trainer sharded ``num_gpus`` ways,
    from measured figures ``f`` (conf/sim/cluster_grid.yaml ``theta_k``: bytes and the one-GPU measurements).
    Each GPU copies its 1/num_gpus shard over its own host link at the one-GPU rate [A]."""
    theta = float(f["param_bytes"]) / num_gpus
    opt = float(f["opt_bytes"]) / num_gpus if f.get("checkpoint_on_failure", True) else 0.0
    if placement == "pageable":
        return dict(swap_save_s=theta / float(f["pageable_save_Bps"]), swap_restore_s=theta / float(
            f["pageable_restore_Bps"]), swap_cycle_s=None, opt_snapshot_s=opt / float(f["pageable_opt_save_Bps"]))
    if placement == "pinned":
        bw = float(f["pinned_Bps"])
        return dict(swap_save_s=theta / bw, swap_restore_s=theta / bw, swap_cycle_s=None, opt_snapshot_s=opt / bw)
    if placement == "device":
        per_byte = float(f["device_snapshot_s"]) / float(f["measured_param_bytes"])  # a device-to-device copy
        return dict(swap_save_s=theta * per_byte, swap_restore_s=theta * per_byte, opt_snapshot_s=opt * per_byte,
                    swap_cycle_s=float(f["device_swap_s"]) * theta / float(f["measured_param_bytes"]))
    raise ValueError(f"theta_k placement: got {placement!r}; allowed: {', '.join(PLACEMENTS)}")


@dataclass
class TrainPlan:
    # kind, start, end, unit, group (the last group of a per-group burst, as the real trainer tags it), groups
    # (every group the call processed, as the real trainer records it; None: not recorded)
    spans: list[tuple[str, float, float, int | None, int | None, tuple[int, ...] | None]] = field(
        default_factory=list)
    units: list[tuple[int, list[int], float]] = field(default_factory=list)  # unit, groups, ready time

    @property
    def end(self) -> float:
        return max(s[2] for s in self.spans)


class _Trainer:
    """A single server: each piece of work starts when both the trainer and its input are free."""

    def __init__(self, plan: TrainPlan, t_free: float = 0.0):
        self.plan, self.free = plan, t_free

    def run(self, kind: str, ready: float, dur: float, unit: int | None, group: int | None = None,
            groups: tuple[int, ...] | None = None) -> None:
        start = max(self.free, ready)
        self.free = start + dur
        if dur > 0:
            self.plan.spans.append((kind, start, self.free, unit, group, groups))


class CostModel:
    """Executes verl_pipe.core.schedule's actions on the clock: the simulator's executor of the real trainer's schedule.

    The FIFO is the completion list: a ``Take`` waits for its groups' completion times (or the rollout's end)
    like ``GroupQueue.take``; each compute action costs what ``TrainerParams`` says and runs
    when both the trainer and its input are free.
    """

    def __init__(self, completions: list[tuple[float, int]], seq_lens, p: TrainerParams, groups_per_unit: int,
                 rollout_end: float):
        self.fifo, self.next = completions, 0
        self.at = {g: t for t, g in completions}
        self.seq_lens, self.p, self.gpu, self.rollout_end = seq_lens, p, groups_per_unit, rollout_end
        self.plan = TrainPlan()
        self.tr = _Trainer(self.plan)
        self.ready = 0.0  # when the current input was taken

    def _lens(self, groups) -> list[int]:
        return [L for g in groups for L in self.seq_lens(g)]

    def _run(self, kind: str, dur: float, action) -> None:
        self.tr.run(kind, self.ready, dur, action.unit, getattr(action, "tag", None), getattr(action, "groups", None))

    def __call__(self, a):
        p, rest = self.p, self.fifo[self.next:]
        if isinstance(a, S.Take):
            # GroupQueue.take(max_k, need): wait until `need` groups are queued, take every queued one up to max_k.
            # An idle trainer wakes on the need-th group and takes what is queued then, `need` groups (groups are
            # materialized one at a time, so even simultaneous completions reach the FIFO one by one); a busy
            # trainer takes every group that arrived meanwhile. Fewer left than `need`: the queue closes with
            # the rollout.
            if len(rest) < a.need:
                got, self.ready = rest[:a.max_k], max(self.ready, self.rollout_end)
            else:
                take, j = max(self.tr.free, rest[a.need - 1][0]), a.need
                if self.tr.free >= rest[a.need - 1][0]:
                    while j < min(len(rest), a.max_k) and rest[j][0] <= take:
                        j += 1
                got, self.ready = rest[:j], take
            self.next += len(got)
            return S.Arrivals(tuple(g for _, g in got), closed=max(self.tr.free, self.ready) >= self.rollout_end)
        if isinstance(a, S.Drain):
            self.next = len(self.fifo)
            self.ready = max([t for t, _ in rest] + [self.rollout_end])
            return S.Arrivals(tuple(g for _, g in rest), closed=True)
        if isinstance(a, S.WaitRest):
            self.ready = max(self.ready, self.rollout_end)
            return tuple(g for _, g in rest)
        if isinstance(a, S.UnitReady):
            full = len(a.groups) == self.gpu
            self.plan.units.append((a.unit, list(a.groups), self.at[a.groups[-1]] if full else self.rollout_end))
        elif isinstance(a, S.OldLogProb):  # after unit 0's step, θ_k is swapped in and back out
            self._run(a.span, p.logprob_s(self._lens(a.groups)) + (p.theta_k_swap_s if a.at_theta_k else 0.0), a)
        elif isinstance(a, S.RefLogProb):
            self._run(a.span, p.ref_s(self._lens(a.groups)), a)
        elif isinstance(a, S.Snapshot):
            self._run(a.span, p.snapshot_s, a)
        elif isinstance(a, S.Update):  # verl's update_actor: forward/backward, then the optimizer step
            self._run(a.span, p.update_s(self._lens(a.groups)), a)
            self._run("optimizer_step", p.optimizer_s, a)
        elif isinstance(a, S.Accumulate):
            self._run(a.span, p.update_s(self._lens(a.groups)), a)
        elif isinstance(a, S.OptimizerStep):
            self._run(a.span, p.optimizer_s, a)
        return None  # BeginUnit, BatchAdvantages, Whiten, FinalAdvantages, LrStep: no cost here


def schedule(mode: str, completions: list[tuple[float, int]], seq_lens, p: TrainerParams,
             groups_per_unit: int, rollout_end: float, granularity: str | None = None) -> TrainPlan:
    """Trainer spans for one step.

    ``completions``: (time, group) of the groups to train, in completion order (the GroupQueue FIFO).
    ``seq_lens(group)`` -> the group's prompt+response lengths. Our modes run the real trainer's schedule
    (verl_pipe.core.schedule) at the variant's granularity (verl_pipe/core/variants.py; ``granularity``: the choice of a
    variant whose granularity is free, cgp_fgd); verl_separate_async is a model of verl's own trainer.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    v = variant(mode)
    if not v.ours:
        return _verl_separate_async(completions, seq_lens, p, groups_per_unit, rollout_end)
    tmode, granularity = v.trainer_schedule(granularity)
    units = max(1, math.ceil(len(completions) / groups_per_unit))  # the steps' units (the real one: configured)
    cost = CostModel(completions, seq_lens, p, groups_per_unit, rollout_end)
    S.drive(S.train_schedule(tmode, granularity, groups_per_unit, units, use_ref=p.use_ref), cost)
    return cost.plan


def _verl_separate_async(completions, seq_lens, p: TrainerParams, groups_per_unit: int,
                         rollout_end: float) -> TrainPlan:
    """verl V1's separate_async trainer: mini-batches, a polling replay buffer, pi_old kept by a CPU model swap."""
    plan = TrainPlan()
    units = [completions[i:i + groups_per_unit] for i in range(0, len(completions), groups_per_unit)]
    for u, members in enumerate(units):
        full = len(members) == groups_per_unit
        plan.units.append((u, [g for _, g in members], members[-1][0] if full else rollout_end))
    tr = _Trainer(plan)
    for u, groups, ready in plan.units:
        # ReplayBuffer.sample checks at once, then every poll_interval after the call
        polls = max(0, math.ceil((ready - tr.free) / p.poll_interval_s - 1e-9))
        tr.free += polls * p.poll_interval_s
        x = [L for g in groups for L in seq_lens(g)]
        # trainer_separate_async._compute_old_log_prob: mini-step 0 saves pi_old; later mini-steps save
        # the current weights, restore pi_old, compute, restore the current weights
        save = p.swap_save_s if p.verl_swap_save_s is None else p.verl_swap_save_s
        restore = p.swap_restore_s if p.verl_swap_restore_s is None else p.verl_swap_restore_s
        tr.run("cpu_swap", ready, save + (restore if u > 0 else 0.0), u)
        tr.run("old_log_prob", ready, p.logprob_s(x), u)
        tr.run("cpu_swap", ready, restore if u > 0 else 0.0, u)
        tr.run("ref_log_prob", ready, p.ref_s(x), u)
        tr.free += p.verl_ministep_gap_s  # verl's advantages and hand-off between the two calls
        tr.run("update", ready, p.update_s(x), u)
        tr.run("optimizer_step", ready, p.optimizer_s, u)
    return plan
