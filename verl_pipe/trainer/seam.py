"""TrainerSeam: what the step's executor, a failed step's rollback, a replica restart and the step's record use of
RolloutPipeTrainer, and nothing more.

It owns the actor's lock (the trainer thread and a mid-step replica restart share the actor) and the state of the
step in training (``saved``: θ_k and the optimizer's rollback state are in the worker's store; ``stepped``: an
optimizer step of it has run), and forwards the calls into verl. Its users: ``verl_pipe.trainer.actor_backend.ActorBackend``
(the schedule's executor), ``verl_pipe.trainer.rollback`` (a step that fails for good), ``verl_pipe.trainer.step_record`` (verl's
step metrics) and ``RolloutPipeTrainer._push_weights`` (a restarted replica's weights).

verl seams (verl 0.9.1, methods of RayPPOTrainer / SeparateRayPPOTrainer on the trainer): ``_fit_compute_log_prob``
and ``_fit_compute_ref_log_prob`` (they write the trainer's ``metrics`` and ``timing_raw``), ``_update_actor`` and
``_save_checkpoint`` (run on ``_VerlView``: the values of one call given explicitly), ``_balance_batch``,
``_get_dp_size``, ``_fit_collect_metrics``; on verl's actor worker group (``actor_wg``) our worker's RPCs
(verl_pipe/trainer/workers.py): the θ_k store (``save_train_state``, ``enter_theta_k`` / ``leave_theta_k``,
``restore_train_state``, ``drop_train_state``) and group granularity's ``begin_unit`` / ``finish_unit``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext

import torch
from omegaconf import OmegaConf

from verl import DataProto

# The non-tensor key of an update's data that says whether its call steps the LR scheduler (our worker's
# update_actor, verl_pipe/trainer/workers.py; absent: verl's behaviour, its last mini-batch steps it).
LR_STEP_KEY = "rolloutpipe_lr_step"


def with_token_counts(batch: DataProto, temperature) -> DataProto:
    """The meta_info verl's actor reads: each row's token count, the sampling temperature, no images."""
    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
    batch.meta_info["temperature"] = temperature
    batch.meta_info.setdefault("images_seqlens", [])
    return batch


def for_actor_worker(batch: DataProto, keys) -> DataProto:
    """``batch`` as verl's actor worker needs it: its tensors and meta_info (shared, not copied) and only the
    non-tensor columns in ``keys``. verl 0.9.1's ``_compute_old_log_prob``, ``_compute_ref_log_prob`` and
    ``_update_actor`` turn the whole DataProto into a TensorDict (``DataProto.to_tensordict``: one ``NonTensorData``
    object per row of every non-tensor column: docs/cpu.md, "Two more cuts", 7) and ship it to the worker,
    whose engine reads no per-row non-tensor column but ``multi_modal_inputs``; the prompts, reward-model entries,
    uids and agent-loop fields the rollout left there travel for nothing, pickled by the trainer's loop and unpickled
    on the trainer's core. Same tensors, so the same numbers."""
    if all(k in keys for k in batch.non_tensor_batch):
        return batch
    return DataProto(batch=batch.batch, meta_info=batch.meta_info,
                     non_tensor_batch={k: v for k, v in batch.non_tensor_batch.items() if k in keys})


class _VerlView:
    """The trainer, seen by one of verl's RayPPOTrainer methods with a few attributes given explicitly.

    Seam: verl 0.9.1's ``_update_actor`` reads only ``self.config``, ``self.distillation_config`` and
    ``self.actor_rollout_wg``, and ``_save_checkpoint`` only plain attributes (``global_steps``,
    ``train_dataloader``, ``config``, the worker groups); neither calls another method on ``self``. So they run
    on this view with the values for one call, and the trainer's own state is never overwritten."""

    def __init__(self, trainer, **given):
        self._trainer = trainer
        self.__dict__.update(given)

    def __getattr__(self, name):
        return getattr(self._trainer, name)


class DataStateAt:
    """A data loader whose state_dict is a given one (a checkpoint of an earlier point of the run)."""

    def __init__(self, loader, state):
        self._loader, self._state = loader, state

    def state_dict(self):
        return self._state

    def __getattr__(self, name):
        return getattr(self._loader, name)


class TrainerSeam:
    def __init__(self, trainer):
        self._trainer = trainer
        self.lock = threading.RLock()
        self.saved = False  # θ_k and the optimizer's rollback state are in the worker's store
        self.stepped = False  # an optimizer step of the step in training has run

    @property
    def config(self):
        return self._trainer.config

    @property
    def n(self) -> int:
        return self._trainer.n

    @property
    def workers(self):
        """verl's actor worker group, with our worker's RPCs (verl_pipe/trainer/workers.py)."""
        return self._trainer.actor_wg

    @property
    def update_workers(self):
        """The worker group verl's ``_update_actor`` sends its batch to (``actor_rollout_wg``)."""
        return self._trainer.actor_rollout_wg

    @property
    def metrics(self) -> dict:
        """verl's step metrics (the trainer's ``metrics``: verl's ``_fit_*`` pieces write into it)."""
        return self._trainer.metrics

    # ------------------------------------------------------------------ the step in training

    def begin_training(self) -> None:
        """A new executor trains: nothing of it is saved or stepped yet (a snapshot of an earlier one that nobody
        dropped is overwritten by its own)."""
        self.saved = self.stepped = False

    def save_train_state(self) -> dict:
        """θ_k and (for a rollback) the optimizer state into the worker's store (rolloutpipe.theta_k.store)."""
        rp = self.config.rolloutpipe
        info = self.workers.save_train_state(rp.theta_k.store, rp.theta_k.auto_margin_gib,
                                             bool(rp.fault.checkpoint_on_failure))[0]
        self.saved = True
        return info

    def drop_train_state(self) -> None:
        if self.saved:
            with self.lock:
                self.workers.drop_train_state()
                self.saved = False

    def restore_train_state(self) -> None:
        self.workers.restore_train_state()

    @contextmanager
    def at_theta_k(self):
        """The actor holds θ_k (from the worker's store) inside the block, its current weights again after."""
        self.workers.enter_theta_k()
        try:
            yield
        finally:
            self.workers.leave_theta_k()

    # ------------------------------------------------------------------ verl's calls

    def old_log_prob(self, batch: DataProto, at_theta_k: bool = False) -> DataProto:
        """verl's old log-probs; ``at_theta_k``: earlier units' steps moved the actor past θ_k, so θ_k is swapped in
        and back (rolloutpipe.theta_k.store=device: a pointer swap; pinned: two host copies into preallocated
        buffers). With bypass_mode the old log-probs are vLLM's: no actor pass, no swap."""
        bypass = OmegaConf.select(self.config, "algorithm.rollout_correction.bypass_mode", default=False)
        with self.at_theta_k() if at_theta_k and not bypass else nullcontext():
            return self._trainer._fit_compute_log_prob(batch)

    def ref_log_prob(self, batch: DataProto) -> DataProto:
        return self._trainer._fit_compute_ref_log_prob(batch)

    def update_actor(self, batch: DataProto, config, worker_group=None, lr_step: bool | None = None) -> DataProto:
        """verl's RayPPOTrainer._update_actor (or a subclass's) with the config and the worker group given.
        ``lr_step`` (None: not said, verl's behaviour): whether this call steps the LR scheduler, sent to the worker
        in the data's meta_info (``LR_STEP_KEY``; verl's _update_actor ships meta_info as non-tensor data) of a
        shallow copy, so the trained piece's meta_info is left alone."""
        view = _VerlView(self._trainer, config=config, actor_rollout_wg=worker_group or self.update_workers)
        batch = for_actor_worker(batch, self._trainer.actor_non_tensor_keys)
        if lr_step is not None:
            batch = DataProto(batch=batch.batch, non_tensor_batch=batch.non_tensor_batch,
                              meta_info={**batch.meta_info, LR_STEP_KEY: bool(lr_step)})
        return type(self._trainer)._update_actor(view, batch)

    def dp_size(self) -> int:
        return self._trainer._get_dp_size(self.update_workers, "actor")

    def balance(self, batch: DataProto, metrics: dict) -> None:
        """verl's DP balancing (RayPPOTrainer._balance_batch) of ``batch``, its metrics into ``metrics``."""
        self._trainer._balance_batch(batch, metrics=metrics)

    def with_token_counts(self, batch: DataProto) -> DataProto:
        return with_token_counts(batch, self.config.actor_rollout_ref.rollout.temperature)

    def collect_verl_metrics(self, batch: DataProto) -> None:
        """verl's step metrics (data, timing_s/*, throughput, variance proxy) on ``batch``, into ``metrics``."""
        self._trainer._fit_collect_metrics(self.with_token_counts(batch))

    def loader_state(self):
        return self._trainer.train_dataloader.state_dict()

    def save_checkpoint(self, step: int, data_state) -> None:
        """verl's checkpoint, labelled ``step``, with the given data-loader state (no trainer state overwritten)."""
        t = self._trainer
        type(t)._save_checkpoint(_VerlView(t, global_steps=step, train_dataloader=DataStateAt(t.train_dataloader,
                                                                                            data_state)))
