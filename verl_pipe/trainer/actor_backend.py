"""The real executor of the trainer's schedule (verl_pipe/core/schedule.py): its actions on verl's actor worker group.

``train_step`` runs one step's schedule: an ``ActorBackend`` takes groups from the step's GroupQueue, keeps each
trained piece's DataProto, and calls into verl through the trainer's seam (verl_pipe/trainer/seam.py: verl's
``_fit_compute_log_prob``, ``_fit_compute_ref_log_prob``, ``_update_actor``, ``_balance_batch``) and our worker's
RPCs (verl_pipe/trainer/workers.py: ``begin_unit`` / ``accumulate_group`` / ``finish_unit``, the θ_k
store). Its metrics go into the step's outcome; the actor's are the step's as verl's sync step reports them on the
same batch (verl_pipe/trainer/step_metrics.py: the mean over the units, the entropy of all old-log-prob calls), not
the last call's. The LR scheduler steps once per step, as verl's: only the optimizer step the schedule marks
(``lr_step``) steps it, or ``LrStep`` after the last one; ``actor/lr`` is the LR after that step. The simulator's
executor of the same schedule is ``verl_pipe.sim.trainer.CostModel``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf

from verl import DataProto
from verl.utils.metric import reduce_metrics

from verl_pipe import estimators
from verl_pipe.core import schedule as S
from verl_pipe.core.group_queue import Group, GroupQueue
from verl_pipe.core.micro_batches import length_order
from verl_pipe.core.timeline import StepTimeline
from verl_pipe.core.variants import pipelines
from verl_pipe.trainer.knobs import StepKnobs
from verl_pipe.rollout.materialize import advantages
from verl_pipe.trainer.seam import TrainerSeam
from verl_pipe.trainer.step_metrics import ENTROPY, step_entropy, unit_lists
from verl_pipe.trainer.whitening import affine_coefficients, basis_advantages, combination, has_aux_loss


@dataclass
class StepOutcome:
    """What a step's training produced (instead of attributes on the trainer)."""
    trained: list[Group] = field(default_factory=list)  # in training order
    batch: DataProto | None = None  # every trained group, with old (and ref) log-probs and the advantages used
    unit_metrics: list[dict] = field(default_factory=list)  # per unit, in order (grad norm, loss, ...)
    buffered: list[int] = field(default_factory=list)  # groups trained before the batch was complete
    metrics: dict = field(default_factory=dict)  # the step's training metrics, in the order they were produced


def train_step(seam: TrainerSeam, queue: GroupQueue, timeline: StepTimeline, knobs: StepKnobs, *,
               groups_per_unit: int, units: int, use_ref: bool, backend_cls=None) -> StepOutcome:
    """Trains the step's groups from ``queue`` as ``knobs`` say (mode, granularity, coalescing, unit order): the
    pure schedule (verl_pipe/core/schedule.py) executed by ``backend_cls`` (default ActorBackend) on verl's worker
    group. ``units``: the step's units (train_batch_size / groups_per_unit)."""
    how = estimators.streaming(str(seam.config.algorithm.adv_estimator))
    seam.begin_training()
    backend = (backend_cls or ActorBackend)(seam, queue, timeline, order=knobs.unit_order)
    whiten = pipelines(knobs.mode) and knobs.granularity == "group" and how == estimators.AFFINE_BATCH
    steps = S.train_schedule(knobs.mode, knobs.granularity, groups_per_unit, units, use_ref=use_ref, whiten=whiten,
                             batch_normalized=how != estimators.GROUP,
                             order=backend.order_indices if knobs.unit_order is not None else None,
                             coalesce=knobs.coalesce_log_probs)
    outcome = backend.outcome(S.drive(steps, backend), knobs.mode)
    if whiten:
        outcome.metrics["rolloutpipe/groups_trained_before_batch_complete"] = len(outcome.buffered)
    return outcome


class _AccumulateInsteadOfUpdate:
    """A worker group whose ``update_actor`` is our ``accumulate_group``: verl's _update_actor preprocessing
    (no-padding layout, entropy/loss flags) feeding group granularity's per-group forward/backward."""

    def __init__(self, worker_group):
        self._wg = worker_group

    def update_actor(self, batch_td):
        return self._wg.accumulate_group(batch_td)

    def __getattr__(self, name):
        return getattr(self._wg, name)


class ActorBackend:
    """Executes one step's schedule on the actor worker group, through the trainer's seam (which keeps whether θ_k
    is saved and the actor stepped, for a replica restart and a failed step's rollback)."""

    def __init__(self, seam: TrainerSeam, queue: GroupQueue, timeline: StepTimeline, order=None):
        self.actor, self.queue, self.timeline = seam, queue, timeline
        self.config, self.n = seam.config, seam.n
        self.order = order  # list[Group] -> list[Group] (the step's knobs.unit_order)
        self.groups: dict[int, Group] = {}
        self.pieces: dict[tuple[int, ...], DataProto] = {}  # trained pieces, in the order they were computed
        self.into_buffers: set[tuple[int, ...]] = set()
        self.whole_batches: set[tuple[int, ...]] = set()
        self.final: tuple[dict, dict] | None = None  # (advantages by group, buffer coefficients) once whitened
        self.unit_metrics: list[dict] = []
        self.metrics: dict = {}  # the step's training metrics (StepOutcome.metrics)
        self.entropies: list[tuple[float, list[int]]] = []  # per old-log-prob call: verl's entropy, response tokens
        self.unit_tokens = 0

    # ------------------------------------------------------------------ the schedule's actions

    def __call__(self, a):
        return getattr(self, type(a).__name__)(a)

    def _arrived(self, groups: list[Group], closed: bool = False) -> S.Arrivals:
        for g in groups:
            self.groups[g.index] = g
        return S.Arrivals(tuple(g.index for g in groups), closed)

    def order_indices(self, indices: list[int]) -> list[int]:
        """The schedule's order hook over group indices, from the trainer's hook over Groups."""
        return [g.index for g in self.order([self.groups[i] for i in indices])]

    def Take(self, a: S.Take) -> S.Arrivals:
        got = self.queue.take(a.max_k, need=a.need)
        return self._arrived(got, self.queue.closed)

    def Drain(self, a: S.Drain) -> S.Arrivals:
        return self._arrived(self.queue.drain(), True)

    def WaitRest(self, a: S.WaitRest) -> tuple[int, ...]:
        rest = self.queue.wait_rest()  # left queued: later takes return them
        for g in rest:
            self.groups[g.index] = g
        return tuple(g.index for g in rest)

    def UnitReady(self, a: S.UnitReady) -> None:
        self.timeline.unit_ready(a.unit, list(a.groups))

    def BatchAdvantages(self, a: S.BatchAdvantages) -> None:
        self.pieces[a.groups] = advantages(self._concat(a.groups), self.config, self.n)  # as verl, over the batch

    def OldLogProb(self, a: S.OldLogProb) -> None:
        batch = self.pieces[a.groups] if a.groups in self.pieces else self._concat(a.groups)
        if a.unit is None:
            self.whole_batches.add(a.groups)  # sync: the units are slices of it
        self.actor.metrics.pop(ENTROPY, None)  # verl's call writes this call's (none with bypass_mode)
        with self.actor.lock, self._span(a):  # at θ_k: earlier units' steps moved the actor past it
            batch = self.actor.old_log_prob(batch, at_theta_k=a.at_theta_k)
        self.pieces[a.groups] = batch
        self._entropy_of_call(batch)

    def RefLogProb(self, a: S.RefLogProb) -> None:
        with self.actor.lock, self._span(a):
            self.pieces[a.groups] = self.actor.ref_log_prob(self.pieces[a.groups])

    def Snapshot(self, a: S.Snapshot) -> None:
        """Before the step's first optimizer step: θ_k (for later units' old log-probs, a restarted replica, a
        rollback) and, for a rollback, the optimizer state, in the worker's store (rolloutpipe.theta_k.store)."""
        with self.actor.lock, self._span(a):
            info = self.actor.save_train_state()
        self.metrics.update({f"rolloutpipe/{k}": v for k, v in info.items()})

    def Update(self, a: S.Update) -> None:
        batch = self.actor.with_token_counts(self._rows_of(a.groups))
        with self.actor.lock, self._span(a):
            self.actor.stepped = True
            out = self.update_unit(batch, lr_step=a.lr_step)
        self._unit_done(out)

    def BeginUnit(self, a: S.BeginUnit) -> None:
        with self.actor.lock:
            self.actor.workers.begin_unit()
        self.unit_tokens = 0

    def Accumulate(self, a: S.Accumulate) -> None:
        batch = self.pieces[a.groups]
        with self.actor.lock, self._span(a):
            if a.into_buffers:
                self._accumulate_basis(batch)
                self.into_buffers.add(a.groups)
            else:
                if a.final_advantages:
                    self._set_final_advantages(batch, a.groups)
                self._accumulate(batch)
        self.unit_tokens += int(batch.batch["response_mask"].sum())

    def Whiten(self, a: S.Whiten) -> None:
        """verl's advantages over the whole batch, and the coefficients of the gradient buffers."""
        batch = advantages(DataProto.concat([self.groups[g].data for g in a.groups]), self.config, self.n)
        adv = batch.batch["advantages"]
        by_group = {g: adv[i * self.n:(i + 1) * self.n] for i, g in enumerate(a.groups)}
        alpha, beta = affine_coefficients(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                                          batch.non_tensor_batch["uid"])
        self.final = by_group, combination(alpha, beta, has_aux_loss(self.config.actor_rollout_ref.actor))

    def OptimizerStep(self, a: S.OptimizerStep) -> None:
        loss_agg_mode = self.config.actor_rollout_ref.actor.loss_agg_mode
        with self.actor.lock, self._span(a):
            self.actor.stepped = True
            out = self.actor.workers.finish_unit(loss_agg_mode, self.unit_tokens, len(a.groups) * self.n,
                                                 self.final[1] if a.buffered else None, lr_step=a.lr_step)[0]
        self._unit_done(out)

    def LrStep(self, a: S.LrStep) -> None:
        """The step's LR-scheduler step after its last optimizer step (the step ran out of groups at a unit
        boundary): its LR goes with the last unit's metrics, as verl's last mini-batch reports it."""
        with self.actor.lock:
            out = self.actor.workers.step_lr_schedule()[0]
        self.unit_metrics[-1].update(out)
        self._reduce_unit_metrics()

    def FinalAdvantages(self, a: S.FinalAdvantages) -> None:
        for groups in self.into_buffers:  # the advantages they were trained with, for metrics and checks
            self._set_final_advantages(self.pieces[groups], groups)

    # ------------------------------------------------------------------ the step's actor metrics

    def _unit_done(self, out: dict) -> None:
        """A unit's update metrics: kept per unit (``unit_metrics``), and the step's so far as verl's sync step has
        them. verl seam: ``_update_actor``'s ``meta_info["metrics"]`` holds one value per key per PPO mini-batch
        (verl 0.9.1's engine worker, ``train_mini_batch``), reduced by ``reduce_metrics``; a unit is one mini-batch,
        so the step's is ``reduce_metrics`` over the units' values (verl_pipe/trainer/step_metrics.py), not the last
        unit's."""
        self.unit_metrics.append(out)
        self._reduce_unit_metrics()

    def _reduce_unit_metrics(self) -> None:
        self.metrics.update(reduce_metrics(unit_lists(self.unit_metrics)))

    def _entropy_of_call(self, batch: DataProto) -> None:
        """verl seam: ``_fit_compute_log_prob`` (verl 0.9.1, SeparateRayPPOTrainer) writes its batch's
        ``actor/entropy`` (agg_loss over the response mask, the actor's loss_agg_mode) into the trainer's metrics,
        each call over the last. The step's is the entropy of all its calls' rows: sync's single call on the batch."""
        value = self.actor.metrics.get(ENTROPY)
        if value is None:
            return
        self.entropies.append((float(value), batch.batch["response_mask"].sum(-1).tolist()))
        self.metrics[ENTROPY] = step_entropy(self.entropies, self.config.actor_rollout_ref.actor.loss_agg_mode)

    # ------------------------------------------------------------------ verl calls

    def update_unit(self, unit_batch: DataProto, lr_step: bool = True) -> dict:
        """One PPO mini-batch through verl's _update_actor (forward/backward + optimizer step); its metrics.
        ``lr_step``: the step's last optimizer step, which steps the LR scheduler (verl's worker does it with the
        call's last mini-batch, the last of its ppo_epochs); the others hold it."""
        if self.config.trainer.balance_batch:
            # verl's DP balancing (RayPPOTrainer._balance_batch) over this unit only: a unit is one PPO
            # mini-batch, so reordering its rows across DP ranks moves no row to another optimizer step and
            # the gradient is the same sum (exact up to float summation order). verl's whole-batch balancing
            # would move rows between mini-batches, which CGP cannot do before the batch is complete.
            dp = self.actor.dp_size()
            if dp > 1 and len(unit_batch) % dp == 0:  # a short last unit that does not split evenly stays as is
                self.actor.balance(unit_batch, self.metrics)
        config = self.config
        groups = len(unit_batch) // self.n
        if groups != int(config.actor_rollout_ref.actor.ppo_mini_batch_size):
            # a short last unit (the zero-variance filter left fewer trainable groups than the batch needs) is
            # still one optimizer step: verl's _update_actor reads the mini-batch size from the config it is given
            config = OmegaConf.merge(config, {"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": groups}}})
        return reduce_metrics(self._verl_update(unit_batch, None, config, lr_step).meta_info["metrics"])

    def _verl_update(self, batch: DataProto, worker_group, config, lr_step: bool | None = None) -> DataProto:
        """verl's RayPPOTrainer._update_actor (or a subclass's) with the worker group (None: verl's) and the config
        given explicitly, on the rows in ``rolloutpipe.micro_batch_order`` (verl_pipe/core/micro_batches.py);
        ``lr_step``: TrainerSeam.update_actor's."""
        return self.actor.update_actor(self._in_micro_batch_order(batch), config, worker_group, lr_step=lr_step)

    def _in_micro_batch_order(self, batch: DataProto) -> DataProto:
        """The rows sorted by length within each DP rank's share (a new DataProto; the trained piece keeps its
        order), so verl's fixed-size micro-batches pad less. Same rows, same mini-batch: only the float summation
        order of the gradient changes, the same way in sync and CGP."""
        if self.config.rolloutpipe.micro_batch_order != "length":
            return batch
        lengths = batch.batch["attention_mask"].sum(-1).tolist()
        dp = self.actor.dp_size()
        order = length_order(lengths, dp if len(lengths) % dp == 0 else 1)
        return batch if order == sorted(order) else batch.select_idxs(order)

    def _accumulate(self, batch: DataProto) -> None:
        """verl's _update_actor preprocessing (no-padding layout, entropy/loss flags), sent to accumulate_group
        instead of update_actor; the worker drops the mini-batch keys."""
        self._verl_update(batch, _AccumulateInsteadOfUpdate(self.actor.update_workers), self.config)

    def _accumulate_basis(self, batch: DataProto) -> None:
        """The gradient passes of a group trained before the batch is complete (verl_pipe.trainer.whitening), each into
        its own buffer on the worker."""
        own = batch.batch["advantages"]
        passes = basis_advantages(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                                  batch.non_tensor_batch["uid"], has_aux_loss(self.config.actor_rollout_ref.actor))
        try:
            for name, adv in passes.items():
                batch.batch["advantages"] = adv.to(own.dtype)
                batch.meta_info["grad_buffer"] = name
                self._accumulate(batch)
        finally:
            batch.batch["advantages"] = own
            batch.meta_info.pop("grad_buffer", None)

    # ------------------------------------------------------------------ data

    def _span(self, a):
        groups = getattr(a, "groups", None)
        return self.timeline.span(a.span, unit=a.unit, group=a.tag, groups=None if groups is None else list(groups))

    def _set_final_advantages(self, batch: DataProto, groups) -> None:
        adv = torch.cat([self.final[0][g] for g in groups])
        batch.batch["advantages"] = adv
        batch.batch["returns"] = adv.clone()

    def _concat(self, groups) -> DataProto:
        return self.actor.with_token_counts(DataProto.concat([self.groups[g].data for g in groups]))

    def _rows_of(self, groups: tuple[int, ...]) -> DataProto:
        """The piece of ``groups``: their own, or their rows of the pieces they were computed in (sync's whole
        batch, mini-batch CGP's coalesced log-prob calls), contiguous runs sliced and concatenated in order."""
        if groups in self.pieces and groups not in self.whole_batches:
            return self.pieces[groups]
        where = {g: key for key in self.pieces for g in key}  # the last piece a group was computed in
        runs: list[list] = []  # [piece, first row, end row]
        for g in groups:
            if g not in where:
                raise KeyError(f"groups {groups} were not computed (group {g})")
            key = where[g]
            start = key.index(g) * self.n
            if runs and runs[-1][0] == key and runs[-1][2] == start:
                runs[-1][2] += self.n
            else:
                runs.append([key, start, start + self.n])
        parts = [self.pieces[key].slice(a, b) for key, a, b in runs]
        if len(parts) == 1:
            return parts[0]
        # the pieces' meta_info differ in their token counts (DataProto.concat refuses conflicting values):
        # the first piece's, without them; Update recounts the unit's tokens (with_token_counts)
        meta = {k: v for k, v in parts[0].meta_info.items() if k != "global_token_num"}
        rows = DataProto.concat([DataProto(batch=p.batch, non_tensor_batch=p.non_tensor_batch, meta_info={})
                                 for p in parts])
        rows.meta_info = meta
        return rows

    def outcome(self, planned: S.ScheduleOutcome, mode: str) -> StepOutcome:
        pieces = list(self.pieces.values())
        if not pieces:
            batch = None
        elif not pipelines(mode):
            batch = pieces[0]  # the whole batch, as verl trains it
        else:
            batch = DataProto.concat([DataProto(batch=p.batch, non_tensor_batch=p.non_tensor_batch, meta_info={})
                                      for p in pieces])
        return StepOutcome([self.groups[g] for g in planned.trained], batch, self.unit_metrics, planned.buffered,
                           self.metrics)
