"""RolloutPipeTrainer: on-policy GRPO with rollout and training on separate pools.

One step reads top to bottom like the algorithm:

    admission ─► rollout (fixed θ_k) ─► materialize groups ─► train units ─► sync θ_{k+1}

- ``sync`` mode: the trainer waits for the whole rollout, then trains the units
  (the Slime-like baseline).
- ``cgp`` mode: each trainable complete group goes to a FIFO the moment it is
  materialized, and the trainer trains a unit (one PPO mini-batch) as soon as
  its groups are in, while later groups are still being generated.

Both modes run the same code: the same admission, the same per-group reward and
advantage (verl's core_algos), the same per-unit calls into verl's actor worker.
Only *when* a unit is trained differs. Weights move to the rollout pool only
after the step's last unit, so every sample trained in step k was generated
with θ_k (asserted per group).

verl's ``OneStepOffRayTrainer`` is the ``SeparateRayPPOTrainer`` that wires the
separate pools (actor on the trainer pool, standalone vLLM replicas on their
own pools, a checkpoint engine between them); we keep that wiring and replace
its one-step-off-policy loop with this on-policy one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from omegaconf import OmegaConf, open_dict

from verl import DataProto
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.utils.metric import reduce_metrics

from verl_pipe import estimators
from verl_pipe.config import ConfigError, cgp_estimator_problem, groups_per_unit
from verl_pipe.data_check import skip_metrics
from verl_pipe.deadline import call_with_deadline
from verl_pipe.frontier import FCFSPolicy, FrontierPolicy
from verl_pipe.group_queue import Group, GroupQueue
from verl_pipe.rollout.materialize import advantages, is_trainable, materialize_group, weight_versions
from verl_pipe.rollout.replicas import ReplicaSupervisor
from verl_pipe.rollout.stream import StepRequest, StreamingRollout, group_rows
from verl_pipe.timeline import StepTimeline, write_chrome_trace
from verl_pipe.whitening import affine_coefficients, basis_advantages, combination, has_aux_loss

logger = logging.getLogger(__name__)



def _verl_dispatch_order(config) -> str:
    workers = int(config.actor_rollout_ref.rollout.agent.num_workers)
    return f"interleave:{workers}" if workers > 1 else "group_major"


class _AccumulateInsteadOfUpdate:
    """Routes RayPPOTrainer._update_actor's worker call to ``accumulate_group``.

    _update_actor turns a DataProto into the worker's TensorDict (no-padding layout,
    entropy/loss flags, mini-batch keys); reusing it keeps group granularity on exactly
    verl's preprocessing instead of a copy of it.
    """

    def __init__(self, worker_group):
        self._wg = worker_group

    def update_actor(self, batch_td):
        return self._wg.accumulate_group(batch_td)

    def __getattr__(self, name):
        return getattr(self._wg, name)


class StepFailedError(RuntimeError):
    """A step failed for good; the message says which checkpoint the run resumes from."""


class _DataStateAt:
    """The train dataloader as it was before a step drew its batch (for a rolled-back checkpoint)."""

    def __init__(self, loader, state):
        self._loader, self._state = loader, state

    def state_dict(self):
        return self._state

    def __getattr__(self, name):
        return getattr(self._loader, name)


class RolloutPipeTrainer(OneStepOffRayTrainer):
    def init_workers(self):
        super().init_workers()
        rp = self.config.rolloutpipe
        # Run-time knobs (a session may switch them between steps on the same workers).
        self.mode = rp.mode
        self.granularity = rp.cgp.granularity
        self.fgd_enabled = bool(rp.fgd.enable)
        self.fgd_window = rp.fgd.window
        self.filter_zero_variance = bool(rp.filter_zero_variance)
        # Without FGD, requests reach vLLM the way verl's own rollout sends them: the batch is
        # chunked over rollout.agent.num_workers agent-loop workers that submit concurrently, so
        # the engine sees the chunks interleaved ("interleave:k"); all at once, no client window.
        self.baseline_order = rp.dispatch.order or _verl_dispatch_order(self.config)
        self.baseline_window = rp.dispatch.window
        wl = rp.get("workload")
        self.workload_spec = OmegaConf.to_container(wl, resolve=True) if wl else None
        self.groups_per_unit = groups_per_unit(self.config)
        self.n = int(self.config.actor_rollout_ref.rollout.n)
        mgr = self.llm_server_manager
        servers = list(zip(mgr.server_addresses, mgr.server_handles, strict=True))
        reward_handles = self.reward_loop_manager.reward_loop_workers
        # The trainer thread and a mid-step replica restart (which loads θ_k from the actor) share the actor.
        self._actor_lock = threading.RLock()
        self._theta_k_saved = False  # θ_k (and the optimizer state before the step) are in the worker's store
        self._stepped = False  # an optimizer step of the current step has run
        self.rollout = StreamingRollout(self.config, servers, reward_handles, mgr.global_load_balancer)
        fault = rp.fault
        self.rollout.supervisor = ReplicaSupervisor(
            mgr, self.checkpoint_manager, self._push_theta_k, self.rollout.client.set_servers,
            timeout_s=fault.replica_restart_timeout_s, restart=bool(fault.replica_restart))
        self.timelines: list[StepTimeline] = []
        # Test hook: a function (list[Group]) -> list[Group] that fixes the order groups
        # are trained in, so sync and CGP can be compared unit for unit.
        self.unit_order_hook = None
        self.sampling_overrides = None  # (group, index) -> dict, e.g. the benchmark's lengths
        self.last_step_record: dict = {}

    # ------------------------------------------------------------------ the run

    def fit(self):
        self.begin()
        if self.config.trainer.get("val_only", False):  # verl's val_only: validate (in begin) and stop
            self.end()
            return
        # On resume, go on in the epoch the checkpoint is in (verl's fit: global_steps // len(dataloader)).
        first_epoch = (self.global_steps - 1) // max(1, len(self.train_dataloader))
        for epoch in range(first_epoch, self.config.trainer.total_epochs):
            for batch_dict in self.train_dataloader:
                self.epoch = epoch
                self.fit_step(batch_dict)
                if self.is_last_step:
                    self.end()
                    return
        self.end()

    def begin(self) -> None:
        """Before the first step: logger, checkpoint, θ_0 into the rollout pool, optional validation."""
        from tqdm import tqdm

        from verl.utils.tracking import Tracking

        self.logger = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self.global_steps = 0
        self._load_checkpoint()
        self._data_state = self.train_dataloader.state_dict()  # before the next step draws its batch
        self.checkpoint_manager.update_weights(self.global_steps)
        if self.config.trainer.get("val_before_train", True):
            val_metrics = self._validate()
            self.logger.log(data=val_metrics, step=self.global_steps)
        self.progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training")
        self.global_steps += 1
        self.last_val_metrics = None
        self.max_steps_duration = 0
        # verl's profiler state (SeparateRayPPOTrainer.fit), read by its _fit_start_profile/_fit_stop_profile.
        steps = self.config.global_profiler.get("steps")
        self.prev_step_profile = False
        self.curr_step_profile = self.global_steps in steps if steps is not None else False
        self.next_step_profile = False

    def end(self) -> None:
        if self.progress_bar is not None:
            self.progress_bar.close()
        if getattr(self, "_dump_executor", None) is not None:
            self._shutdown_dump_executor()  # verl's: the rollout-data dumps (trainer.rollout_data_dir) are written
        self.rollout.shutdown()

    # ------------------------------------------------------------------ the step

    def fit_step(self, batch_dict=None):
        if self.mode == "cgp":  # a session can switch mode and granularity between steps
            problem = cgp_estimator_problem(str(self.config.algorithm.adv_estimator), self.granularity)
            if problem:
                raise ConfigError(f"algorithm.adv_estimator: {problem}")
        self.metrics = {"training/global_step": self.global_steps, "training/epoch": self.epoch}
        self.timing_raw = {}
        self.reward_extra_infos_dict = {}  # verl's _fit_dump_data reads it
        self._fit_prepare_step()
        self._fit_start_profile()  # verl's (global_profiler.steps): the trainer pool's workers
        version = self.global_steps - 1  # θ_k: synced at the end of the previous step
        t_step = time.perf_counter()
        self._drop_train_state_snapshot()  # left over if the previous attempt at a step failed
        self._stepped = self._training_done = False
        self._trained_batch = None

        try:
            batch = self._fit_get_batch(batch_dict)
            index = batch.non_tensor_batch.get("index")
            self._step_data_index = [int(i) for i in index] if index is not None else []
            timeline = StepTimeline(self.global_steps, self.groups_per_unit)
            queue = GroupQueue(weight_version=version)
            rollout = self._start_rollout(batch, timeline, queue, version)        # admission + generation
            if self.mode == "sync":
                trained = self._train_after_rollout(queue, timeline)               # baseline
            elif self.granularity == "group":
                trained = self._train_each_group_as_it_arrives(queue, timeline)    # CGP, group granularity
            else:
                trained = self._train_while_rollout_runs(queue, timeline)          # CGP, mini-batch units
            self._training_done = True
            rollout_result = rollout.result()
            self._sync_weights(timeline)                                           # θ_{k+1} → rollout pool
        except Exception as e:
            self._fail_step(e)  # roll back to the last completed step, checkpoint it, raise
        self._drop_train_state_snapshot()

        self.timing_raw["step"] = time.perf_counter() - t_step
        if self._trained_batch is not None:
            self._fit_dump_data(self._trained_batch)  # verl's trainer.rollout_data_dir dump
        self._fit_validate()
        self._fit_save_checkpoint()
        self._fit_stop_profile()
        self._data_state = self.train_dataloader.state_dict()
        self._record_step(trained, timeline, rollout_result)
        self._fit_postprocess_step()

    # ------------------------------------------------------------------ faults

    def _snapshot_train_state(self) -> None:
        """Before the step's first optimizer step: θ_k (for later units' old log-probs, a restarted
        replica, a rollback) and, for a rollback, the optimizer state, in the worker's store
        (rolloutpipe.theta_k.store, verl_pipe/theta_store.py)."""
        rp = self.config.rolloutpipe
        info = self.actor_wg.save_train_state(rp.theta_k.store, rp.theta_k.auto_margin_gib,
                                              bool(rp.fault.checkpoint_on_failure))[0]
        self.metrics.update({f"rolloutpipe/{k}": v for k, v in info.items()})
        self._theta_k_saved = True

    def _drop_train_state_snapshot(self) -> None:
        if self._theta_k_saved:
            with self._actor_lock:
                self.actor_wg.drop_train_state()
                self._theta_k_saved = False

    def _push_theta_k(self, replica, version: int) -> None:
        """Loads θ_k into one (restarted) replica, without touching the others' in-flight requests."""
        # Without a snapshot the actor has not stepped past θ_k yet and holds it already.
        with self._actor_lock, (self._at_theta_k() if self._theta_k_saved else nullcontext()):
            manager = type(self.checkpoint_manager)(config=self.checkpoint_manager.config,
                                                    actor_wg=self.checkpoint_manager.actor_wg,
                                                    replicas=[replica])
            call_with_deadline(lambda: manager.update_weights(version),
                               self.config.rolloutpipe.get("weight_sync_timeout_s"),
                               f"loading θ_{version} into a restarted replica",
                               "rolloutpipe.weight_sync_timeout_s")

    @staticmethod
    def _describe(exc: BaseException) -> str:
        """The error and its cause (the trainer sees the rollout's error wrapped by the queue)."""
        text = f"{type(exc).__name__}: {exc}"
        cause = exc.__cause__
        return text if cause is None else f"{text} ({type(cause).__name__}: {cause})"

    def _fail_step(self, exc: Exception):
        """A step failed for good. Roll the trainer back to the end of the last completed step (θ_k and the
        optimizer state from the CPU snapshot; nothing to undo if no optimizer step ran yet), save a checkpoint
        there with the data loader as it was before this step's batch, and raise. Resuming
        (trainer.resume_mode=auto) re-runs this step on the same prompts; no partial step is in the checkpoint."""
        step, last = self.global_steps, self.global_steps - 1
        where = self.config.trainer.default_local_dir
        if not self.config.rolloutpipe.fault.checkpoint_on_failure:
            raise StepFailedError(f"step {step} failed: {self._describe(exc)} "
                                  f"(no checkpoint written: rolloutpipe.fault.checkpoint_on_failure=false)") from exc
        if self._training_done:  # only the weight sync failed: the trainer holds a complete step k
            self._save_checkpoint_at(step, self.train_dataloader.state_dict())
            raise StepFailedError(f"step {step} failed after training: {self._describe(exc)}. Saved "
                                  f"{os.path.join(str(where), f'global_step_{step}')}; run again with "
                                  f"trainer.resume_mode=auto to go on at step {step + 1}") from exc
        try:
            with self._actor_lock:
                if self._stepped:
                    if not self._theta_k_saved:
                        raise RuntimeError("the step's first optimizer step ran without a snapshot to undo it")
                    self.actor_wg.restore_train_state()
                self._save_checkpoint_at(last, self._data_state)
        except Exception as save_error:
            raise StepFailedError(f"step {step} failed: {self._describe(exc)}; rolling back to step {last} "
                                  f"failed too ({type(save_error).__name__}: {save_error}); resume from the "
                                  f"latest checkpoint in {where}, if any") from exc
        raise StepFailedError(
            f"step {step} failed: {self._describe(exc)}. Rolled back to the end of step {last} and saved "
            f"{os.path.join(str(where), f'global_step_{last}')}; run again with trainer.resume_mode=auto to "
            f"resume at step {step} with the same data") from exc

    def _save_checkpoint_at(self, step: int, data_state) -> None:
        """verl's checkpoint, labelled ``step``, with the given data-loader state."""
        loader, steps = self.train_dataloader, self.global_steps
        self.train_dataloader, self.global_steps = _DataStateAt(loader, data_state), step
        try:
            self._save_checkpoint()
        finally:
            self.train_dataloader, self.global_steps = loader, steps

    # ------------------------------------------------------------------ rollout side

    # Extension hooks: the admission policy classes a step is built with (verl_pipe.frontier), and
    # extra constructor arguments for them from the step's batch (docs/extending.md).
    fgd_policy_cls = FrontierPolicy
    baseline_policy_cls = FCFSPolicy

    def admission_kwargs(self, batch: DataProto | None) -> dict:
        """Extra keyword arguments for the step's admission policy class, from the step's batch (group g
        is row g, with verl's non-tensor keys such as ``extra_info``). Default: none."""
        return {}

    def _make_policy(self, num_groups: int, batch: DataProto | None = None):
        rp = self.config.rolloutpipe
        replicas = self.rollout.live_replicas()
        target = int(self.config.data.train_batch_size)
        common = dict(num_groups=num_groups, n=self.n, groups_per_unit=self.groups_per_unit,
                      target_groups=target, replicas=replicas, **self.admission_kwargs(batch))
        if self.fgd_enabled:
            window = self.fgd_window or int(self.config.actor_rollout_ref.rollout.max_num_seqs)
            return self.fgd_policy_cls(**common, window=window, frontier_groups=rp.fgd.frontier_groups,
                                       slack=int(rp.fgd.slack))
        return self.baseline_policy_cls(**common, window=self.baseline_window, order=self.baseline_order)

    def _start_rollout(self, batch: DataProto, timeline: StepTimeline, queue: GroupQueue, version: int) -> Future:
        gen_batch = self._get_gen_batch(batch)  # leaves the reward keys and uid in `batch`
        rp = self.config.rolloutpipe

        def on_group(g: int, gen_out: DataProto) -> bool:
            piece = materialize_group(group_rows(batch, g), gen_out, self.config)
            versions = weight_versions(piece)
            if versions != {version}:
                raise RuntimeError(f"step {self.global_steps}: group {g} has weight versions {versions}, "
                                   f"expected exactly {{{version}}} (off-policy sample)")
            trainable = self.group_is_trainable(g, piece)
            if trainable:
                queue.put(Group(g, piece, version, time.perf_counter()))
            return trainable

        request = StepRequest(step=self.global_steps, gen_batch=gen_batch, n=self.n,
                              policy=self._make_policy(len(gen_batch), batch), timeline=timeline, on_group=on_group,
                              sampling_overrides=self._sampling_overrides(len(gen_batch)),
                              request_timeout_s=float(rp.request_timeout_s) if rp.request_timeout_s else None,
                              max_retries=int(rp.fault.max_request_retries),
                              on_request_failure=str(rp.fault.on_request_failure), weight_version=version)
        future = self.rollout.start(request)

        def finished(f: Future) -> None:
            if f.exception() is not None:
                queue.fail(f.exception())
            else:
                queue.close()

        future.add_done_callback(finished)
        return future

    def group_is_trainable(self, group: int, piece: DataProto) -> bool:
        """Extension hook: whether a materialized group enters the trainer's FIFO.

        Default: DAPO dynamic sampling when rolloutpipe.filter_zero_variance is on (a group whose
        rewards are all equal has zero advantages and carries no signal). An untrainable group is
        replaced by the next one (oversampled prompts, rolloutpipe.oversample)."""
        return is_trainable(piece, self.filter_zero_variance)

    def _sampling_overrides(self, num_groups: int):
        """Per-request response lengths of a controlled workload (rolloutpipe.workload), if any."""
        if self.sampling_overrides is not None:
            return self.sampling_overrides
        spec = self.workload_spec
        if not spec:
            return None
        from verl_pipe.workload import from_spec

        workload = from_spec(spec, num_groups, self.n, prompt_len=0, seed=int(spec.get("seed", 0)) + self.global_steps)

        def overrides(group: int, index: int) -> dict:
            # EOS ignored: the response is exactly this long, the same in every mode.
            return {"max_tokens": int(workload.lengths[group][index]), "ignore_eos": True}

        return overrides

    # ------------------------------------------------------------------ trainer side

    def _train_after_rollout(self, queue: GroupQueue, timeline: StepTimeline) -> list[Group]:
        """Sync mode: wait for every group, old log-probs for the whole batch, then each unit."""
        self.unit_metrics: list[dict] = []  # per unit, in training order (grad norm, loss, ...)
        groups = sorted(queue.drain(), key=lambda g: g.index)  # dispatch order, like verl
        groups = self._ordered(groups)
        units = [groups[i:i + self.groups_per_unit] for i in range(0, len(groups), self.groups_per_unit)]
        if not units:
            return []
        batch = self._concat(groups)
        if estimators.streaming(str(self.config.algorithm.adv_estimator)) != estimators.GROUP:
            batch = advantages(batch, self.config, self.n)  # normalized across the whole batch, as verl
        with timeline.span("old_log_prob"):
            batch = self._fit_compute_log_prob(batch)  # θ_k: nothing has been updated yet
        if self.use_reference_policy:
            with timeline.span("ref_log_prob"):
                batch = self._fit_compute_ref_log_prob(batch)
        offset = 0
        for u, unit in enumerate(units):
            rows = len(unit) * self.n
            timeline.unit_ready(u, [g.index for g in unit])
            unit_batch = self._with_token_counts(batch.slice(offset, offset + rows))
            offset += rows
            with timeline.span("update", unit=u):
                self._stepped = True
                self._update_unit(unit_batch)
        self._trained_batch = batch
        return groups

    def _train_while_rollout_runs(self, queue: GroupQueue, timeline: StepTimeline) -> list[Group]:
        """CGP: train each unit as soon as its groups are in the FIFO."""
        self.unit_metrics: list[dict] = []  # per unit, in training order (grad norm, loss, ...)
        trained: list[Group] = []
        pieces = []
        u = 0
        snapshot = self._units_per_step() > 1
        while True:
            unit = queue.take(self.groups_per_unit)
            if not unit:
                break
            unit = self._ordered(unit)
            timeline.unit_ready(u, [g.index for g in unit])
            unit_batch = self._concat(unit)
            with self._actor_lock:
                with timeline.span("old_log_prob", unit=u):
                    if u == 0:
                        unit_batch = self._fit_compute_log_prob(unit_batch)  # the actor still holds θ_k
                    else:
                        unit_batch = self._old_log_prob_at_theta_k(unit_batch)
                if self.use_reference_policy:
                    with timeline.span("ref_log_prob", unit=u):
                        unit_batch = self._fit_compute_ref_log_prob(unit_batch)
                if u == 0 and snapshot:
                    # Keep θ_k for later units' old log-probs (the worker's θ_k store).
                    with timeline.span("snapshot_theta_k", unit=u):
                        self._snapshot_train_state()
                with timeline.span("update", unit=u):
                    self._stepped = True
                    self._update_unit(unit_batch)
            trained.extend(unit)
            pieces.append(unit_batch)
            u += 1
        self._trained_batch = DataProto.concat([self._without_meta(p) for p in pieces]) if pieces else None
        return trained

    def _train_each_group_as_it_arrives(self, queue: GroupQueue, timeline: StepTimeline) -> list[Group]:
        """CGP, group granularity: each arriving group is a micro-batch of the unit's gradient
        accumulation; the optimizer steps when the unit's last group is in.

        A batch-whitened estimator (reinforce_plus_plus_baseline, verl_pipe.whitening) trains the
        groups that arrive before the batch is complete into gradient buffers, and the first
        unit's step waits for the end of the rollout, when the batch's coefficients exist."""
        self.unit_metrics: list[dict] = []  # per unit, in training order (grad norm, loss, ...)
        trained: list[Group] = []
        pieces: list[tuple[list[Group], DataProto, bool]] = []  # groups, their batch, trained into buffers
        snapshot = self._units_per_step() > 1
        loss_agg_mode = self.config.actor_rollout_ref.actor.loss_agg_mode
        whiten = estimators.streaming(str(self.config.algorithm.adv_estimator)) == estimators.AFFINE_BATCH
        target = self._units_per_step() * self.groups_per_unit
        seen: list[Group] = []  # every group taken this step
        final = None  # (advantages by group index, buffer coefficients) once the batch is complete
        for u in range(self._units_per_step()):
            self.actor_wg.begin_unit()
            unit: list[Group] = []
            tokens = 0
            buffered = False
            while len(unit) < self.groups_per_unit:
                # Whatever has arrived, up to the unit's remainder: one θ_k swap for a burst of groups.
                got = self._ordered(queue.take_available(self.groups_per_unit - len(unit)))
                if not got:
                    break
                seen.extend(got)
                if whiten and final is None and (len(seen) == target or queue.closed):
                    final = self._whiten_batch(seen, queue, target)  # the batch is complete
                last = got[-1].index
                batch = self._concat(got)
                with self._actor_lock:
                    with timeline.span("old_log_prob", unit=u, group=last):
                        batch = (self._fit_compute_log_prob(batch) if u == 0
                                 else self._old_log_prob_at_theta_k(batch))
                    if self.use_reference_policy:
                        with timeline.span("ref_log_prob", unit=u, group=last):
                            batch = self._fit_compute_ref_log_prob(batch)
                    into_buffers = whiten and final is None
                    with timeline.span("forward_backward", unit=u, group=last):
                        if into_buffers:
                            self._accumulate_basis(batch)
                            buffered = True
                        else:
                            if whiten:
                                self._set_final_advantages(batch, got, final[0])
                            self._accumulate(batch)
                tokens += int(batch.batch["response_mask"].sum())
                unit.extend(got)
                pieces.append((got, batch, into_buffers))
            if not unit:
                break
            timeline.unit_ready(u, [g.index for g in unit])
            if buffered and final is None:
                # Trained before the batch was complete: the step needs the whole batch's statistics.
                final = self._whiten_batch(seen, queue, target)
            with self._actor_lock:
                if u == 0 and snapshot:
                    with timeline.span("snapshot_theta_k", unit=u):
                        self._snapshot_train_state()
                with timeline.span("optimizer_step", unit=u):
                    self._stepped = True
                    out = self.actor_wg.finish_unit(loss_agg_mode, tokens, len(unit) * self.n,
                                                    final[1] if buffered else None)[0]
            self.unit_metrics.append(out)
            self.metrics.update(out)
            trained.extend(unit)
        if whiten:
            buffered_pieces = [(got, batch) for got, batch, into in pieces if into]
            self.metrics["rolloutpipe/groups_trained_before_batch_complete"] = sum(len(g) for g, _ in buffered_pieces)
            for got, batch in buffered_pieces:  # the advantages they were trained with, for metrics and checks
                self._set_final_advantages(batch, got, final[0])
        self._trained_batch = DataProto.concat([self._without_meta(p) for _, p, _ in pieces]) if pieces else None
        return trained

    def _whiten_batch(self, seen: list[Group], queue: GroupQueue, target: int) -> tuple[dict, dict]:
        """verl's advantages over the whole batch (the first ``target`` groups taken or still queued, in sync
        mode's order; waits for the end of the rollout unless ``target`` were taken), and the coefficients
        of the gradient buffers of groups trained before it was complete."""
        groups = (seen + (queue.wait_rest() if len(seen) < target else []))[:target]
        ordered = self._ordered(sorted(groups, key=lambda g: g.index))
        batch = advantages(DataProto.concat([g.data for g in ordered]), self.config, self.n)
        adv = batch.batch["advantages"]
        by_group = {g.index: adv[i * self.n:(i + 1) * self.n] for i, g in enumerate(ordered)}
        alpha, beta = affine_coefficients(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                                          batch.non_tensor_batch["uid"])
        return by_group, combination(alpha, beta, has_aux_loss(self.config.actor_rollout_ref.actor))

    def _set_final_advantages(self, batch: DataProto, groups: list[Group], by_group: dict) -> None:
        adv = torch.cat([by_group[g.index] for g in groups])
        batch.batch["advantages"] = adv
        batch.batch["returns"] = adv.clone()

    def _accumulate_basis(self, batch: DataProto) -> None:
        """The gradient passes of a group trained before the batch is complete (verl_pipe.whitening),
        each into its own buffer on the worker."""
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

    def _accumulate(self, batch: DataProto) -> None:
        """verl's _update_actor preprocessing, sent to accumulate_group instead of update_actor."""
        real = self.actor_rollout_wg
        self.actor_rollout_wg = _AccumulateInsteadOfUpdate(real)
        try:
            self._update_actor(batch)
        finally:
            self.actor_rollout_wg = real

    def _units_per_step(self) -> int:
        return int(self.config.data.train_batch_size) // self.groups_per_unit

    def _old_log_prob_at_theta_k(self, unit_batch: DataProto) -> DataProto:
        # Earlier units' optimizer steps moved the actor past θ_k. Swap θ_k in, compute, swap back: with
        # rolloutpipe.theta_k.store=device a pointer swap on the device (no copy), with pinned two host copies
        # into preallocated buffers. With bypass_mode the old log-probs are vLLM's: no actor pass, no swap.
        bypass = OmegaConf.select(self.config, "algorithm.rollout_correction.bypass_mode", default=False)
        with nullcontext() if bypass else self._at_theta_k():
            return self._fit_compute_log_prob(unit_batch)

    @contextmanager
    def _at_theta_k(self):
        """The actor holds θ_k (from the worker's store) inside the block, its current weights again after."""
        self.actor_wg.enter_theta_k()
        try:
            yield
        finally:
            self.actor_wg.leave_theta_k()

    def _update_unit(self, unit_batch: DataProto) -> None:
        if self.config.trainer.balance_batch:
            # verl's DP balancing (RayPPOTrainer._balance_batch) over this unit only: a unit is one PPO
            # mini-batch, so reordering its rows across DP ranks moves no row to another optimizer step and
            # the gradient is the same sum (exact up to float summation order). verl's whole-batch balancing
            # would move rows between mini-batches, which CGP cannot do before the batch is complete.
            dp = self._get_dp_size(self.actor_rollout_wg, "actor")
            if dp > 1 and len(unit_batch) % dp == 0:  # a short last unit that does not split evenly stays as is
                self._balance_batch(unit_batch, metrics=self.metrics)
        with self._mini_batch_of(len(unit_batch) // self.n):
            out = reduce_metrics(self._update_actor(unit_batch).meta_info["metrics"])
        self.unit_metrics.append(out)
        self.metrics.update(out)

    @contextmanager
    def _mini_batch_of(self, groups: int):
        """A short last unit (the zero-variance filter left fewer trainable groups than the batch
        needs) is still one optimizer step: verl's _update_actor reads the mini-batch size from
        the config, so it is set to the unit's size for that call only."""
        actor = self.config.actor_rollout_ref.actor
        if groups == self.groups_per_unit:
            yield
            return
        with open_dict(actor):
            actor.ppo_mini_batch_size = groups
            try:
                yield
            finally:
                actor.ppo_mini_batch_size = self.groups_per_unit

    def _concat(self, groups: list[Group]) -> DataProto:
        return self._with_token_counts(DataProto.concat([g.data for g in groups]))

    def _with_token_counts(self, batch: DataProto) -> DataProto:
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch.meta_info.setdefault("images_seqlens", [])
        return batch

    @staticmethod
    def _without_meta(batch: DataProto) -> DataProto:
        return DataProto(batch=batch.batch, non_tensor_batch=batch.non_tensor_batch, meta_info={})

    def _ordered(self, groups: list[Group]) -> list[Group]:
        return self.unit_order_hook(groups) if self.unit_order_hook is not None else groups

    # ------------------------------------------------------------------ weight sync and metrics

    def _sync_weights(self, timeline: StepTimeline) -> None:
        start = time.perf_counter()
        sync_metrics = call_with_deadline(
            lambda: self.checkpoint_manager.update_weights(self.global_steps),
            self.config.rolloutpipe.get("weight_sync_timeout_s"), f"step {self.global_steps}'s weight sync",
            "rolloutpipe.weight_sync_timeout_s")
        end = time.perf_counter()
        timeline.weight_sync(start, end)
        if sync_metrics:
            self.metrics.update(sync_metrics)

    def _record_step(self, trained: list[Group], timeline: StepTimeline, rollout_result) -> None:
        self.timelines.append(timeline)
        tm = timeline.metrics()
        self.metrics.update({f"rolloutpipe/{k}": v for k, v in tm.items()})
        self.metrics["rolloutpipe/failed_request_attempts"] = rollout_result.failed_attempts
        self.metrics["rolloutpipe/aborted_requests"] = rollout_result.aborted
        self.metrics["rolloutpipe/untrainable_groups"] = rollout_result.untrainable
        self.metrics["rolloutpipe/late_groups_dropped"] = rollout_result.late_groups
        self.metrics["rolloutpipe/failed_groups_dropped"] = rollout_result.dropped_groups
        self.metrics["rolloutpipe/replica_failures"] = rollout_result.replica_failures
        self.metrics["rolloutpipe/replica_restarts"] = rollout_result.replica_restarts
        self.metrics["rolloutpipe/requeued_requests"] = rollout_result.requeued_requests
        if rollout_result.recovery_s:
            self.metrics["rolloutpipe/replica_recovery_s"] = max(rollout_result.recovery_s)
        self.metrics["rolloutpipe/trained_groups"] = len(trained)
        self.metrics.update(skip_metrics(self.config))  # records the launcher's data check skipped
        batch = getattr(self, "_trained_batch", None)
        if batch is not None:
            # verl's own step metrics (data, timing_s/*, throughput, variance proxy) on the trained groups.
            self._fit_collect_metrics(self._with_token_counts(batch))
        self.metrics["timing_s/step"] = self.timing_raw["step"]
        self.last_step_record = {
            "step": self.global_steps,
            "data_index": self._step_data_index,  # the dataset rows the step drew, in order
            "trained_groups": [g.index for g in trained],
            "timeline": tm,
        }
        trace_dir = self.config.rolloutpipe.trace_dir
        if trace_dir:
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
            write_chrome_trace([timeline], Path(trace_dir) / f"step_{self.global_steps:05d}.json")
            record = dict(self.last_step_record, metrics={k: float(v) for k, v in self.metrics.items()
                                                          if isinstance(v, (int, float))})
            with open(Path(trace_dir) / "steps.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        print(self._summary_line(tm), flush=True)

    def _summary_line(self, tm: dict) -> str:
        m = self.metrics
        train_s = tm["trainer_busy_s"]
        return (f"[verl_pipe] step {self.global_steps} ({self.mode}): "
                f"reward {m.get('critic/score/mean', float('nan')):.3f} | "
                f"resp_len {m.get('response_length/mean', float('nan')):.1f} | "
                f"rollout {tm['rollout_end_s']:.2f}s | train {train_s:.2f}s | "
                f"weight_sync {tm['weight_sync_s']:.2f}s | step {tm['step_time_s']:.2f}s | "
                f"rollout→train_end {tm['rollout_to_train_end_s']:.2f}s | "
                f"trainer_wait {tm['trainer_wait_ratio']:.2f}")
