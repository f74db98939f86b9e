"""RolloutPipeTrainer: on-policy GRPO with rollout and training on separate pools.

One step reads top to bottom like the algorithm:

    admission ─► rollout (fixed θ_k) ─► materialize groups ─► train units ─► sync θ_{k+1}

- ``sync`` mode: the trainer waits for the whole rollout, then trains the units (the Slime-like baseline).
- ``cgp`` mode: each trainable complete group goes to a FIFO the moment it is materialized, and the trainer trains
  a unit (one PPO mini-batch) as soon as its groups are in, while later groups are still being generated.

Both modes run the same code: the same admission, the same per-group reward and advantage (verl's core_algos), the
same per-unit calls into verl's actor worker. Only *when* a unit is trained differs. Weights move to the rollout pool
only after the step's last unit, so every sample trained in step k was generated with θ_k (asserted per group).

A step runs as its knobs say (verl_pipe/trainer/knobs.py: mode, granularity, FGD and its window, ...; default the config's).
The trainer's parts live beside it, one job each: the run around the steps (verl_pipe/trainer/run_loop.py), the step's
training plan (verl_pipe/core/schedule.py) and its executor on verl's worker group (verl_pipe/trainer/actor_backend.py), the
failed step's rollback (verl_pipe/trainer/rollback.py), the completed step's metrics, record, trace and summary
(verl_pipe/trainer/step_record.py), the weights into the rollout pool (verl_pipe/trainer/weight_sync.py). The executor, the rollback
and the record see the trainer only through its seam (verl_pipe/trainer/seam.py).

verl's ``OneStepOffRayTrainer`` is the ``SeparateRayPPOTrainer`` that wires the separate pools (actor on the trainer
pool, standalone vLLM replicas on their own pools, a checkpoint engine between them); we keep that wiring and replace
its one-step-off-policy loop with this on-policy one.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from verl import DataProto
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

from verl_pipe.trainer.actor_backend import ActorBackend, StepOutcome, train_step
from verl_pipe.config import ConfigError, cgp_estimator_problem, groups_per_unit
from verl_pipe.core.admission import StepAdmission, TrainerRatio, load_policy, rest_order
from verl_pipe.core.frontier import FCFSPolicy
from verl_pipe.core.lengths import LengthHistory, StepLengths
from verl_pipe.core.minibatch_order import step_permutation
from verl_pipe.data_check import bad_record_metrics, dataset_row
from verl_pipe.core.group_filter import GroupFilters
from verl_pipe.core.group_queue import Group, GroupQueue
from verl_pipe.core.release import DispatchOrderRelease
from verl_pipe.core.timeline import StepTimeline
from verl_pipe.core.variants import pipelines
from verl_pipe.trainer.knobs import StepKnobs, step_knobs
from verl_pipe.trainer.rollback import StepFailedError, drop_train_state_snapshot, fail_step
from verl_pipe.rollout.materialize import is_trainable, materialize_group, weight_versions
from verl_pipe.rollout.replicas import ReplicaSupervisor
from verl_pipe.rollout.stream import StepRequest, StreamingRollout, group_rows
from verl_pipe.trainer.run_loop import RunLoop
from verl_pipe.trainer.step_record import StepHistory, record_step
from verl_pipe.trainer.seam import TrainerSeam, for_actor_worker
from verl_pipe.trainer.weight_sync import RolloutWeights

logger = logging.getLogger(__name__)

__all__ = ["RolloutPipeTrainer", "StepFailedError"]  # StepFailedError lives in verl_pipe/trainer/rollback.py


def dataset_index(batch: DataProto | None, num_groups: int) -> list:
    """Each group's dataset row (``data_check.dataset_row`` of the step batch's row), None where unknown."""
    nt = batch.non_tensor_batch if batch is not None else {}
    columns = {k: nt[k] for k in ("index", "extra_info") if k in nt}
    if not columns:
        return [None] * num_groups
    rows = len(next(iter(columns.values())))
    return [dataset_row({k: v[g] for k, v in columns.items()}) for g in range(rows)]


class RolloutPipeTrainer(GroupFilters, RunLoop, OneStepOffRayTrainer):
    backend_cls = ActorBackend  # executes the step's schedule on verl's worker group (fit_step can be given another)
    # Extension hooks: the admission policy class of a step without FGD (verl_pipe.core.frontier; FGD's is
    # rolloutpipe.fgd.policy), the policies' extra constructor arguments from ``admission_kwargs`` (docs/extending.md).
    baseline_policy_cls = FCFSPolicy
    # The per-row non-tensor columns verl's actor worker is sent (trainer_seam.for_actor_worker): verl's engine reads
    # only these; a subclass whose loss reads another (e.g. "uid") adds it here.
    actor_non_tensor_keys: tuple[str, ...] = ("multi_modal_inputs",)

    def __init__(self, *args, stop_check=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_check = stop_check  # () -> bool: the launcher asked the run to stop (RunLoop.stop_requested)
        self.n = int(self.config.actor_rollout_ref.rollout.n)
        self.groups_per_unit = groups_per_unit(self.config)
        self.filter_zero_variance = bool(self.config.rolloutpipe.filter_zero_variance)
        self.configured_knobs = step_knobs(self.config)  # a step's knobs unless fit_step is given others
        self.actor_seam = TrainerSeam(self)  # what the executor, the rollback and the record use of the trainer
        self.history = StepHistory()
        self.last_outcome = StepOutcome()
        # per prompt, its groups' lengths in earlier epochs: the length predictions FGD orders by (not checkpointed:
        # a resumed run starts from the prior)
        self.length_history = LengthHistory()
        self.last_lengths: StepLengths | None = None  # the latest step's predictions, observed lengths and record
        self._step_keys: list[tuple] = []  # the latest step's (prompt, epoch) per group
        self.trainer_ratio = TrainerRatio()  # trainer work over rollout duration: FGD's order beyond the frontier
        self.last_admission: dict = {}  # the latest step's policy class, order beyond the frontier and its ratio
        self._batch_order: tuple = (None, [])  # (the step's batch, its dataloader positions in training order)

    @property
    def timelines(self):
        return self.history.timelines  # the last steps' (step_record.KEEP_TIMELINES)

    @property
    def last_step_record(self) -> dict:
        return self.history.last_record

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

    # Seam: verl's _fit_compute_log_prob / _fit_compute_ref_log_prob call these with the whole batch and merge their
    # results into it; the worker gets the batch without the columns it never reads (trainer_seam.for_actor_worker).
    def _compute_old_log_prob(self, batch: DataProto):
        return super()._compute_old_log_prob(for_actor_worker(batch, self.actor_non_tensor_keys))

    def _compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        return super()._compute_ref_log_prob(for_actor_worker(batch, self.actor_non_tensor_keys))

    def init_workers(self):
        t0 = time.perf_counter()
        super().init_workers()
        logger.info("workers and engines initialized in %.1fs", time.perf_counter() - t0)
        fault, mgr = self.config.rolloutpipe.fault, self.llm_server_manager
        servers = list(zip(mgr.server_addresses, mgr.server_handles, strict=True))
        reward_handles = self.reward_loop_manager.reward_loop_workers
        self.rollout = StreamingRollout(self.config, servers, reward_handles, mgr.global_load_balancer)
        self.weights = RolloutWeights(self.config, self.checkpoint_manager, self.actor_seam)
        self.rollout.supervisor = ReplicaSupervisor(
            mgr, self.checkpoint_manager, self._push_weights, self.rollout.client.set_servers,
            timeout_s=fault.replica_restart_timeout_s, restart=bool(fault.replica_restart),
            probe_timeout_s=fault.get("health_check_timeout_s", 30))

    # ------------------------------------------------------------------ the step

    def fit_step(self, batch_dict=None, knobs: StepKnobs | None = None, backend_cls=None):
        """One step as ``knobs`` say (default: ``configured_knobs``); ``backend_cls``: the schedule's executor for
        this step (default: the class's ``backend_cls``)."""
        knobs = knobs or self.configured_knobs
        if pipelines(knobs.mode):
            problem = cgp_estimator_problem(str(self.config.algorithm.adv_estimator), knobs.granularity)
            if problem:
                raise ConfigError(f"algorithm.adv_estimator: {problem}")
        self.metrics = {"training/global_step": self.global_steps, "training/epoch": self.epoch,
                        **bad_record_metrics(self.train_dataset)}  # records of this batch skipped (on_bad_record)
        self.timing_raw = {}
        self.reward_extra_infos_dict = {}  # verl's _fit_dump_data reads it
        self._fit_prepare_step()
        self._fit_start_profile()  # verl's (global_profiler.steps): the trainer pool's workers
        version, t_step, outcome = self.global_steps - 1, time.perf_counter(), None  # θ_k: synced by the last step
        drop_train_state_snapshot(self.actor_seam)  # left over if the previous attempt at a step failed
        self.actor_seam.begin_training()
        supervisor = self.rollout.supervisor
        supervisor.begin_step()
        try:
            supervisor.heal(version, "step_start")  # a replica that died since the last sync comes back with θ_k
            batch = self.order_minibatches(self._fit_get_batch(batch_dict), knobs)  # sync's partition, every mode
            index = batch.non_tensor_batch.get("index")
            data_index = [int(i) for i in index] if index is not None else []  # the dataset rows, in order
            timeline = StepTimeline(self.global_steps, self.groups_per_unit)
            queue = GroupQueue(weight_version=version)
            rollout = self._start_rollout(batch, timeline, queue, version, knobs)  # admission + generation
            outcome = self.train(queue, timeline, knobs, backend_cls=backend_cls)  # the mode's schedule
            self.metrics.update(outcome.metrics)
            rollout_result = rollout.result()
            self._learn_lengths()
            tm = timeline.metrics()
            self.trainer_ratio.update(tm.get("trainer_busy_s"), tm.get("rollout_end_s"))
            sync_start = time.perf_counter()
            self.metrics.update(self.weights.sync(supervisor, self.global_steps))  # θ_{k+1} → rollout pool
            timeline.weight_sync(sync_start, time.perf_counter())
        except Exception as e:  # roll back to the last completed step, checkpoint, raise
            fail_step(self.actor_seam, e, outcome is not None, self.global_steps, self._data_state)
        drop_train_state_snapshot(self.actor_seam)
        self.last_outcome = outcome
        self.timing_raw["step"] = time.perf_counter() - t_step
        if outcome.batch is not None:
            self._fit_dump_data(outcome.batch)  # verl's trainer.rollout_data_dir dump
        self._fit_validate()
        self._fit_save_checkpoint()
        self._fit_stop_profile()
        self._data_state = self.train_dataloader.state_dict()
        record = record_step(self.actor_seam, self.history, step=self.global_steps, knobs=knobs, outcome=outcome,
                             timeline=timeline, rollout_result=rollout_result, data_index=data_index,
                             step_s=self.timing_raw["step"], health=supervisor.health,
                             lengths=self.last_lengths.record() if self.last_lengths is not None else None)
        record["admission"] = self.last_admission  # the order beyond FGD's frontier and why (the simulator replays it)
        record["minibatch_order"] = self._positions(batch, len(batch))  # the dataloader positions in training order
        self._fit_postprocess_step()

    def train(self, queue: GroupQueue, timeline: StepTimeline, knobs: StepKnobs | None = None, backend_cls=None,
              **changes) -> StepOutcome:
        """Trains the step's groups from ``queue`` as ``knobs`` (default: ``configured_knobs``) with ``changes``
        (StepKnobs fields, e.g. ``mode``, ``granularity``, ``unit_order``) say: verl_pipe/trainer/actor_backend.py."""
        knobs = (knobs or self.configured_knobs).replace(**changes)
        return train_step(self.actor_seam, queue, timeline, knobs, groups_per_unit=self.groups_per_unit,
                          units=self._units_per_step(), use_ref=bool(self.use_reference_policy),
                          backend_cls=backend_cls or self.backend_cls)

    def _units_per_step(self) -> int:
        return int(self.config.data.train_batch_size) // self.groups_per_unit

    # ------------------------------------------------------------------ rollout side

    def admission_kwargs(self, batch: DataProto | None, knobs: StepKnobs) -> dict:
        """Extra keyword arguments for the step's admission policy class (``rolloutpipe.fgd.policy`` when
        ``knobs.fgd``, else ``baseline_policy_cls``), from the step's batch (group g is row g, with verl's non-tensor
        keys such as ``extra_info``). Default: none."""
        return {}

    def _make_policy(self, num_groups: int, batch: DataProto | None, knobs: StepKnobs):
        """The step's admission policy: ``rolloutpipe.fgd.policy`` (``knobs.fgd_policy``) with FGD on, else
        ``baseline_policy_cls``, built by its ``for_step`` from the step's ``StepAdmission``
        (verl_pipe/core/admission.py), with the groups' length predictions (``_step_lengths``). Its class, whether it
        orders by the predictions and its order beyond the frontier go into the step record's ``admission``."""
        fgd = self.config.rolloutpipe.fgd
        self.last_lengths = self._step_lengths(num_groups, batch, knobs)
        step = StepAdmission(num_groups=num_groups, n=self.n, groups_per_unit=self.groups_per_unit,
                             target_groups=int(self.config.data.train_batch_size),
                             replicas=self.rollout.live_replicas(), fgd_window=knobs.fgd_window,
                             frontier_groups=fgd.frontier_groups, slack=int(fgd.slack),
                             baseline_window=knobs.baseline_window, baseline_order=knobs.baseline_order,
                             unit_fill=knobs.unit_fill, lengths=self.last_lengths,
                             order_by_length=knobs.fgd_lengths != "off", extra=self.admission_kwargs(batch, knobs),
                             rest_order=rest_order(knobs.unit_fill, self.trainer_ratio.value, knobs.granularity,
                                                   knobs.fgd_rest_order))
        cls = load_policy(knobs.fgd_policy) if knobs.fgd else self.baseline_policy_cls
        by_length = bool(knobs.fgd and step.order_by_length)  # what the step asks of FGD's policy
        self.last_admission = {"policy": f"{cls.__module__}:{cls.__qualname__}", "order_by_length": by_length,
                               "rest_order": step.rest_order if by_length else None,
                               "trainer_to_rollout": self.trainer_ratio.value}
        return cls.for_step(step)

    def order_minibatches(self, batch: DataProto, knobs: StepKnobs) -> DataProto:
        """The step's prompts in training order, before the rollout, in every mode: verl splits a batch into PPO
        mini-batches by position, so the order decides which prompts share an optimizer step
        (``rolloutpipe.minibatch_order``, verl_pipe/core/minibatch_order.py). Seam: the batch verl's
        ``_fit_get_batch`` returns (uids assigned), reordered in place by DataProto.reorder; the permutation stays with
        the trainer, kept for that batch: a forced-length workload's per-position lengths and length keys follow it."""
        keys = self._length_keys(len(batch), batch, knobs)
        predicted = [p.log_tokens for p in self.length_history.predict_step(keys)]
        order = step_permutation(knobs.minibatch_order, predicted)
        if order != sorted(order):
            batch.reorder(torch.tensor(order))
        self._batch_order = (batch, order)
        return batch

    def _positions(self, batch: DataProto | None, num_groups: int) -> list[int]:
        """Each group's dataloader position: ``order_minibatches``' permutation of this batch, else the identity."""
        ordered, order = self._batch_order
        return list(order) if batch is not None and batch is ordered else list(range(num_groups))

    def _length_keys(self, num_groups: int, batch: DataProto | None, knobs: StepKnobs) -> list[tuple]:
        """(prompt, epoch) per group: the knobs' (a forced-length workload's own prompts), else the batch's dataset
        index and this epoch ((None, epoch) where the batch has no index: no history)."""
        keys = knobs.length_keys
        if keys is None and knobs.sampling_overrides is None and knobs.workload and knobs.workload.get("prompts"):
            from verl_pipe.core.workload import length_keys

            keys = length_keys(self._workload(num_groups, knobs))  # its lengths follow its own prompts
        if keys is not None:
            if len(keys) != num_groups:
                raise ValueError(f"length_keys name {len(keys)} groups, the step has {num_groups}")
            return [tuple(keys[i]) for i in self._positions(batch, num_groups)]
        return [(k, int(self.epoch)) for k in dataset_index(batch, num_groups)]

    def _step_lengths(self, num_groups: int, batch: DataProto | None, knobs: StepKnobs) -> StepLengths:
        """The step's length predictions from the run's history (verl_pipe/core/lengths.py); ``fgd_lengths=shuffled``
        gives each group another prompt's (the control)."""
        self._step_keys = self._length_keys(num_groups, batch, knobs)
        shuffle = self.global_steps if knobs.fgd_lengths == "shuffled" else None
        return StepLengths(self.length_history.predict_step(self._step_keys, shuffle_seed=shuffle), self.n)

    def _learn_lengths(self) -> None:
        """After the rollout: every group whose n responses finished goes into the length history."""
        lengths = self.last_lengths
        if lengths is None:
            return
        for g, (key, epoch) in enumerate(self._step_keys):
            got = lengths.lengths(g)
            if got is not None:
                self.length_history.record(key, epoch, got)

    def _start_rollout(self, batch: DataProto, timeline: StepTimeline, queue: GroupQueue, version: int,
                       knobs: StepKnobs | None = None) -> Future:
        knobs, rp = knobs or self.configured_knobs, self.config.rolloutpipe
        gen_batch = self._get_gen_batch(batch)  # leaves the reward keys and uid in `batch`

        def on_group(g: int, gen_out: DataProto) -> bool:
            piece = materialize_group(group_rows(batch, g), gen_out, self.config)
            versions = weight_versions(piece)
            if versions != {version}:
                raise RuntimeError(f"step {self.global_steps}: group {g} has weight versions {versions}, "
                                   f"expected exactly {{{version}}} (off-policy sample)")
            trainable = self.keeps_group(g, piece)
            if trainable:
                group = Group(g, piece, version, time.perf_counter())
                queue.put(group) if release is None else release.hold(g, group)
            return trainable

        # unit_fill=dispatch: groups reach the FIFO in dispatch order, so units are sync's mini-batches
        # (verl_pipe/core/release.py); completion: as they complete
        release = DispatchOrderRelease(queue.put, len(gen_batch)) if knobs.unit_fill == "dispatch" else None
        request = StepRequest(step=self.global_steps, gen_batch=gen_batch, n=self.n,
                              policy=self._make_policy(len(gen_batch), batch, knobs), timeline=timeline,
                              on_group=on_group, sampling_overrides=self._sampling_overrides(batch, knobs),
                              request_timeout_s=float(rp.request_timeout_s) if rp.request_timeout_s else None,
                              max_retries=int(rp.fault.max_request_retries),
                              on_request_failure=str(rp.fault.on_request_failure), weight_version=version,
                              reward_timeout_s=rp.reward.get("timeout_s"),
                              on_reward_failure=str(rp.reward.get("on_failure", "fail")),
                              on_group_ended=None if release is None else lambda g, how: release.ended(g))
        future = self.rollout.start(request)
        if release is not None:  # before the queue closes: done-callbacks run in the order they were added
            future.add_done_callback(lambda f: f.exception() is None and release.flush())
        queue.end_with(future)  # closed when the rollout ends, failed with its error
        return future

    def group_is_trainable(self, group: int, piece: DataProto) -> bool:
        """Extension hook: whether a materialized group enters the trainer's FIFO.

        Default: DAPO dynamic sampling when rolloutpipe.filter_zero_variance is on (a group whose rewards are all
        equal has zero advantages and carries no signal). An untrainable group is replaced by the next one
        (oversampled prompts, rolloutpipe.oversample). A caller's filter for some steps: ``filtering_groups``
        (verl_pipe/core/group_filter.py)."""
        return is_trainable(piece, self.filter_zero_variance)

    def _sampling_overrides(self, batch: DataProto, knobs: StepKnobs):
        """Per-request sampling overrides: the knobs' own, else a controlled workload's lengths (knobs.workload);
        indexed by the dataloader's positions, so they follow ``order_minibatches``' permutation."""
        overrides = knobs.sampling_overrides
        if overrides is None and knobs.workload:
            from verl_pipe.core.workload import exact_lengths

            overrides = exact_lengths(self._workload(len(batch), knobs))
        positions = self._positions(batch, len(batch))
        if overrides is None or positions == list(range(len(batch))):
            return overrides
        return lambda g, i: overrides(positions[g], i)

    def _workload(self, num_groups: int, knobs: StepKnobs):
        """This step's controlled workload (``knobs.workload``): over repeated prompts (its ``prompts``) the run's step
        of that pool, else fresh lengths seeded by the step."""
        from verl_pipe.core.workload import from_spec

        seed = int(knobs.workload.get("seed", 0))
        if knobs.workload.get("prompts") is not None:
            return from_spec(knobs.workload, num_groups, self.n, prompt_len=0, seed=seed, step=self.global_steps)
        return from_spec(knobs.workload, num_groups, self.n, prompt_len=0, seed=seed + self.global_steps)

    def _push_weights(self, replica, version: int) -> None:
        """Weights ``version`` into one restarted replica (the supervisor's push_weights): θ_k during the step."""
        self.weights.push(replica, version, theta_k=version == self.global_steps - 1)
