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
from omegaconf import OmegaConf

from verl import DataProto
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

from verl_pipe import estimators
from verl_pipe.actor_backend import ActorBackend, StepOutcome, save_checkpoint_at
from verl_pipe.config import ConfigError, cgp_estimator_problem, groups_per_unit
from verl_pipe.data_check import skip_metrics
from verl_pipe.deadline import call_with_deadline
from verl_pipe.frontier import FCFSPolicy, FrontierPolicy
from verl_pipe.group_queue import Group, GroupQueue
from verl_pipe.rollout.materialize import is_trainable, materialize_group, weight_versions
from verl_pipe.rollout.replicas import ReplicaSupervisor
from verl_pipe.rollout.stream import StepRequest, StreamingRollout, group_rows
from verl_pipe.schedule import drive, train_schedule
from verl_pipe.timeline import StepTimeline, write_chrome_trace

logger = logging.getLogger(__name__)



def _verl_dispatch_order(config) -> str:
    workers = int(config.actor_rollout_ref.rollout.agent.num_workers)
    return f"interleave:{workers}" if workers > 1 else "group_major"


class StepFailedError(RuntimeError):
    """A step failed for good; the message says which checkpoint the run resumes from."""


class RolloutPipeTrainer(OneStepOffRayTrainer):
    backend_cls = ActorBackend  # executes the step's schedule on verl's worker group (tests wrap it to inject faults)

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
        self._current: ActorBackend | None = None  # the step in training: does the worker's store hold θ_k, ...
        self.last_outcome = StepOutcome()
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
        # verl's rollout-data dump writer (trainer.rollout_data_dir): RayPPOTrainer.__init__ makes it, the
        # separate-pool trainer we build on does not; fit() re-makes a shut-down one, as here.
        if getattr(self, "_dump_executor", None) is None or self._dump_executor._shutdown:
            self._init_dump_executor()
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
        self._current, outcome = None, None

        try:
            batch = self._fit_get_batch(batch_dict)
            index = batch.non_tensor_batch.get("index")
            data_index = [int(i) for i in index] if index is not None else []  # the dataset rows, in order
            timeline = StepTimeline(self.global_steps, self.groups_per_unit)
            queue = GroupQueue(weight_version=version)
            rollout = self._start_rollout(batch, timeline, queue, version)         # admission + generation
            outcome = self.train(queue, timeline)                                  # the mode's schedule
            rollout_result = rollout.result()
            self._sync_weights(timeline)                                           # θ_{k+1} → rollout pool
        except Exception as e:
            self._fail_step(e, trained=outcome is not None)  # roll back to the last completed step, checkpoint, raise
        self._drop_train_state_snapshot()
        self.last_outcome = outcome

        self.timing_raw["step"] = time.perf_counter() - t_step
        if outcome.batch is not None:
            self._fit_dump_data(outcome.batch)  # verl's trainer.rollout_data_dir dump
        self._fit_validate()
        self._fit_save_checkpoint()
        self._fit_stop_profile()
        self._data_state = self.train_dataloader.state_dict()
        self._record_step(outcome, timeline, rollout_result, data_index)
        self._fit_postprocess_step()

    def train(self, queue: GroupQueue, timeline: StepTimeline, mode: str | None = None,
              granularity: str | None = None) -> StepOutcome:
        """Trains the step's groups from ``queue`` in ``mode`` / ``granularity`` (default: the trainer's): the pure
        schedule (verl_pipe/schedule.py) executed on verl's worker group (verl_pipe/actor_backend.py)."""
        mode, granularity = mode or self.mode, granularity or self.granularity
        how = estimators.streaming(str(self.config.algorithm.adv_estimator))
        backend = self._current = self.backend_cls(self, queue, timeline, order=self.unit_order_hook)
        whiten = mode == "cgp" and granularity == "group" and how == estimators.AFFINE_BATCH
        steps = train_schedule(mode, granularity, self.groups_per_unit, self._units_per_step(),
                               use_ref=bool(self.use_reference_policy), whiten=whiten,
                               batch_normalized=how != estimators.GROUP,
                               order=backend.order_indices if self.unit_order_hook is not None else None)
        outcome = backend.outcome(drive(steps, backend), mode)
        if whiten:
            self.metrics["rolloutpipe/groups_trained_before_batch_complete"] = len(outcome.buffered)
        return outcome

    # ------------------------------------------------------------------ faults

    def _theta_k_saved(self) -> bool:
        """The worker's store holds θ_k and the optimizer state from before the step's first optimizer step."""
        return self._current is not None and self._current.saved

    def _drop_train_state_snapshot(self) -> None:
        if self._theta_k_saved():
            with self._actor_lock:
                self.actor_wg.drop_train_state()
                self._current.saved = False

    def _push_theta_k(self, replica, version: int) -> None:
        """Loads θ_k into one (restarted) replica, without touching the others' in-flight requests."""
        # Without a snapshot the actor has not stepped past θ_k yet and holds it already.
        with self._actor_lock, (self._at_theta_k() if self._theta_k_saved() else nullcontext()):
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

    def _fail_step(self, exc: Exception, trained: bool):
        """A step failed for good. Roll the trainer back to the end of the last completed step (θ_k and the
        optimizer state from the CPU snapshot; nothing to undo if no optimizer step ran yet), save a checkpoint
        there with the data loader as it was before this step's batch, and raise. Resuming
        (trainer.resume_mode=auto) re-runs this step on the same prompts; no partial step is in the checkpoint."""
        step, last = self.global_steps, self.global_steps - 1
        where = self.config.trainer.default_local_dir
        if not self.config.rolloutpipe.fault.checkpoint_on_failure:
            raise StepFailedError(f"step {step} failed: {self._describe(exc)} "
                                  f"(no checkpoint written: rolloutpipe.fault.checkpoint_on_failure=false)") from exc
        if trained:  # only the weight sync failed: the trainer holds a complete step k
            save_checkpoint_at(self, step, self.train_dataloader.state_dict())
            raise StepFailedError(f"step {step} failed after training: {self._describe(exc)}. Saved "
                                  f"{os.path.join(str(where), f'global_step_{step}')}; run again with "
                                  f"trainer.resume_mode=auto to go on at step {step + 1}") from exc
        try:
            with self._actor_lock:
                if self._current is not None and self._current.stepped:
                    if not self._theta_k_saved():
                        raise RuntimeError("the step's first optimizer step ran without a snapshot to undo it")
                    self.actor_wg.restore_train_state()
                save_checkpoint_at(self, last, self._data_state)
        except Exception as save_error:
            raise StepFailedError(f"step {step} failed: {self._describe(exc)}; rolling back to step {last} "
                                  f"failed too ({type(save_error).__name__}: {save_error}); resume from the "
                                  f"latest checkpoint in {where}, if any") from exc
        raise StepFailedError(
            f"step {step} failed: {self._describe(exc)}. Rolled back to the end of step {last} and saved "
            f"{os.path.join(str(where), f'global_step_{last}')}; run again with trainer.resume_mode=auto to "
            f"resume at step {step} with the same data") from exc

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

    # ------------------------------------------------------------------ trainer side (verl_pipe/actor_backend.py)

    def _units_per_step(self) -> int:
        return int(self.config.data.train_batch_size) // self.groups_per_unit

    @contextmanager
    def _at_theta_k(self):
        """The actor holds θ_k (from the worker's store) inside the block, its current weights again after."""
        self.actor_wg.enter_theta_k()
        try:
            yield
        finally:
            self.actor_wg.leave_theta_k()

    def _with_token_counts(self, batch: DataProto) -> DataProto:
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch.meta_info.setdefault("images_seqlens", [])
        return batch

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

    def _record_step(self, outcome: StepOutcome, timeline: StepTimeline, rollout_result, data_index: list) -> None:
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
        self.metrics["rolloutpipe/trained_groups"] = len(outcome.trained)
        self.metrics.update(skip_metrics(self.config))  # records the launcher's data check skipped
        if outcome.batch is not None:
            # verl's own step metrics (data, timing_s/*, throughput, variance proxy) on the trained groups.
            self._fit_collect_metrics(self._with_token_counts(outcome.batch))
        self.metrics["timing_s/step"] = self.timing_raw["step"]
        self.last_step_record = {
            "step": self.global_steps,
            "data_index": data_index,  # the dataset rows the step drew, in order
            "trained_groups": [g.index for g in outcome.trained],
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
