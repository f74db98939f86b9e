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

The trainer's parts live beside it, one job each: the step's training plan (verl_pipe/schedule.py) and its
executor on verl's worker group (verl_pipe/actor_backend.py), the failed step's rollback
(verl_pipe/rollback.py), and the completed step's metrics, record, trace and summary (verl_pipe/step_record.py).

verl's ``OneStepOffRayTrainer`` is the ``SeparateRayPPOTrainer`` that wires the
separate pools (actor on the trainer pool, standalone vLLM replicas on their
own pools, a checkpoint engine between them); we keep that wiring and replace
its one-step-off-policy loop with this on-policy one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext

import ray
import torch
from omegaconf import OmegaConf

from verl import DataProto
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

from verl_pipe import estimators
from verl_pipe.actor_backend import ActorBackend, StepOutcome
from verl_pipe.config import ConfigError, cgp_estimator_problem, groups_per_unit
from verl_pipe.frontier import FCFSPolicy, FrontierPolicy, resolve_window
from verl_pipe.group_queue import Group, GroupQueue
from verl_pipe.rollout.materialize import is_trainable, materialize_group, weight_versions
from verl_pipe.rollout.replicas import ReplicaSupervisor
from verl_pipe.rollback import StepFailedError, drop_train_state_snapshot, fail_step, theta_k_saved
from verl_pipe.rollout.stream import StepRequest, StreamingRollout, group_rows
from verl_pipe.schedule import drive, train_schedule
from verl_pipe.step_record import record_step
from verl_pipe.timeline import StepTimeline
from verl_pipe.weight_sync import WeightSync, abort_all_ranks, sync_deadline

logger = logging.getLogger(__name__)

KEEP_TIMELINES = 16  # the last steps' StepTimelines kept in memory (trainer.timelines)

__all__ = ["RolloutPipeTrainer", "StepFailedError"]  # StepFailedError lives in verl_pipe/rollback.py


def _verl_dispatch_order(config) -> str:
    workers = int(config.actor_rollout_ref.rollout.agent.num_workers)
    return f"interleave:{workers}" if workers > 1 else "group_major"


class RolloutPipeTrainer(OneStepOffRayTrainer):
    backend_cls = ActorBackend  # executes the step's schedule on verl's worker group (tests wrap it to inject faults)

    # Start-up: the trainer pool's model init (load, FSDP wrap, optimizer) and the rollout pool's vLLM start-up use
    # disjoint devices (or cores), so they overlap. Seams: verl's init_workers calls _init_models, then
    # _init_reward_loop and _init_async_rollout_manager, and only then builds the CheckpointEngineManager over
    # the actor; verl's own blocking _init_models runs in a thread and is joined before that.
    def _init_models(self):
        self._models_ready = ThreadPoolExecutor(1, thread_name_prefix="init_models").submit(super()._init_models)

    def _init_async_rollout_manager(self):
        try:
            super()._init_async_rollout_manager()
        except BaseException:
            self._models_ready.exception()  # the trainer's init finishes first; the rollout's error is the one raised
            raise
        self._models_ready.result()

    def init_workers(self):
        t0 = time.perf_counter()
        super().init_workers()
        logger.info("workers and engines initialized in %.1fs", time.perf_counter() - t0)
        rp = self.config.rolloutpipe
        # Run-time knobs (a session may switch them between steps on the same workers).
        self.mode = rp.mode
        self.granularity = rp.cgp.granularity
        self.coalesce_log_probs = bool(rp.cgp.coalesce_log_probs)
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
            mgr, self.checkpoint_manager, self._push_weights, self.rollout.client.set_servers,
            timeout_s=fault.replica_restart_timeout_s, restart=bool(fault.replica_restart),
            probe_timeout_s=fault.get("health_check_timeout_s", 30))
        # The last steps' timelines (tests, the bench); a long run keeps them bounded: the full history goes to
        # rolloutpipe.trace_dir and the logger. steps_run counts every completed step.
        self.timelines: deque[StepTimeline] = deque(maxlen=KEEP_TIMELINES)
        self.steps_run = 0
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
                if self.stop_requested():
                    print(f"[verl_pipe] stop requested: no step after {self.global_steps - 1}", flush=True)
                    self.end()
                    return
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
        self.initial_val_metrics = {}  # the validation before training, for the run's summary
        if self.config.trainer.get("val_before_train", True):
            val_metrics = self.initial_val_metrics = self._validate()
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

    # The launcher touches this file when it is signalled (verl_pipe/main_grpo.py): Ray's workers run in process
    # groups of their own, so a signal to the launcher's group does not reach this loop, which would otherwise go on
    # with new steps until the teardown ends it. Best effort: the file is on the launcher's node.
    stop_file: str | None = None

    def stop_requested(self) -> bool:
        return bool(self.stop_file) and os.path.exists(self.stop_file)

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
        drop_train_state_snapshot(self)  # left over if the previous attempt at a step failed
        self._current, outcome = None, None
        supervisor = self.rollout.supervisor
        supervisor.begin_step()

        try:
            supervisor.heal(version, "step_start")  # a replica that died since the last sync comes back with θ_k
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
            fail_step(self, e, trained=outcome is not None)  # roll back to the last completed step, checkpoint, raise
        drop_train_state_snapshot(self)
        self.last_outcome = outcome

        self.timing_raw["step"] = time.perf_counter() - t_step
        if outcome.batch is not None:
            self._fit_dump_data(outcome.batch)  # verl's trainer.rollout_data_dir dump
        self._fit_validate()
        self._fit_save_checkpoint()
        self._fit_stop_profile()
        self._data_state = self.train_dataloader.state_dict()
        record_step(self, outcome, timeline, rollout_result, data_index)  # metrics, last_step_record, trace, summary
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
                               order=backend.order_indices if self.unit_order_hook is not None else None,
                               coalesce=self.coalesce_log_probs)
        outcome = backend.outcome(drive(steps, backend), mode)
        if whiten:
            self.metrics["rolloutpipe/groups_trained_before_batch_complete"] = len(outcome.buffered)
        return outcome

    # ------------------------------------------------------------------ faults (the failed step: verl_pipe/rollback.py)

    def _push_weights(self, replica, version: int) -> None:
        """Loads weights ``version`` into one (restarted) replica, without touching the others' in-flight requests:
        θ_k during the step (from the worker's store once the actor has stepped past it), θ_{k+1} (the actor's
        current weights) after the step's weight sync."""
        at_theta_k = version == self.global_steps - 1 and theta_k_saved(self)
        with self._actor_lock, (self._at_theta_k() if at_theta_k else nullcontext()):
            manager = type(self.checkpoint_manager)(config=self.checkpoint_manager.config,
                                                    actor_wg=self.checkpoint_manager.actor_wg,
                                                    replicas=[replica])
            self._weight_sync().run(manager, version, f"loading weights version {version} into a restarted replica")

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
            window = resolve_window(self.fgd_window, self.groups_per_unit, self.n,
                                    int(self.config.actor_rollout_ref.rollout.max_num_seqs))
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
        queue.end_with(future)  # closed when the rollout ends, failed with its error
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
        from verl_pipe.workload import exact_lengths, from_spec

        seed = int(spec.get("seed", 0)) + self.global_steps
        return exact_lengths(from_spec(spec, num_groups, self.n, prompt_len=0, seed=seed))

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

    # ------------------------------------------------------------------ weight sync (then verl_pipe/step_record.py)

    def _sync_weights(self, timeline: StepTimeline) -> None:
        """θ_{k+1} into every live replica; a replica found dead before or during the sync is synced apart (restarted
        with θ_{k+1}, or retired) instead of failing the run (ReplicaSupervisor.sync_weights)."""
        start = time.perf_counter()
        sync_metrics = self.rollout.supervisor.sync_weights(lambda: self._weight_sync().run(
            self.checkpoint_manager, self.global_steps, f"step {self.global_steps}'s weight sync"), self.global_steps)
        end = time.perf_counter()
        timeline.weight_sync(start, end)
        if sync_metrics:
            self.metrics.update(sync_metrics)

    def _weight_sync(self) -> WeightSync:
        """The sync's deadline and teardown (verl_pipe/weight_sync.py), built at the first sync: a backend that tears
        its group down at a deadline (the NCCL engine of verl_pipe/platform/nccl_engine.py) gets one sized to the
        actor's weight bytes, which its engines on the actor ranks learn here (the master hands it to the rest)."""
        ws = getattr(self, "_weight_sync_plan", None)
        if ws is not None:
            return ws
        rp = self.config.rolloutpipe
        bounded = hasattr(self.checkpoint_manager.backend_cls, "abort_sync")
        nbytes = int(self.actor_wg.weight_sync_nbytes()[0]) if bounded else None
        deadline = sync_deadline(rp, bounded, nbytes)
        if bounded:
            n = self.actor_wg.world_size
            ray.get(self.actor_wg.execute_checkpoint_engine(["set_sync_deadline"] * n, [deadline.seconds] * n))
            logger.info("weight sync deadline %s s (%s)", deadline.seconds, deadline.hint)
            # the actor ranks outside the broadcast wait in FSDP gathers for rank 0 up to the deadline; past
            # torch.distributed's own timeout torch ends them instead of the watchdog freeing rank 0
            torch_timeout = self.config.actor_rollout_ref.get("nccl_timeout")
            if deadline.seconds and torch_timeout and deadline.seconds >= float(torch_timeout):
                logger.warning("weight sync deadline %.0f s >= actor_rollout_ref.nccl_timeout %s s: a sync stuck on a "
                               "dead replica ends the actor's ranks before its own teardown; lower the deadline "
                               "(rolloutpipe.nccl_sync) or raise nccl_timeout", deadline.seconds, torch_timeout)
        setup = (rp.get("nccl_sync") or {}).get("setup_s")
        self._weight_sync_plan = WeightSync(deadline, teardown_wait_s=setup,
                                            abort=abort_all_ranks if bounded else None)
        return self._weight_sync_plan
