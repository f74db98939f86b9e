"""The trainer-pool worker: verl's DetachActorWorker, pinned, plus per-group gradient accumulation.

``DetachActorWorker`` (verl/experimental/separation) is verl's actor worker for
separate pools. CGP computes later units' old log-probs under the step's rollout
weights θ_k after earlier units already moved the actor: θ_k and the optimizer's
rollback snapshot live in verl_pipe.trainer.theta_store (``rolloutpipe.theta_k.store``:
on the device with a pointer swap, or in pinned host buffers allocated once),
instead of verl's ``save_model_to_cpu`` / ``restore_model_from_cpu`` (a fresh
pageable host copy per call). On a CPU machine the worker pins itself
to ``VERL_PIPE_TRAINER_CORES`` so the trainer pool and the rollout pool run on
disjoint cores, like separate GPUs.

Group granularity (``rolloutpipe.cgp.granularity=group``) splits verl's
``train_batch`` (zero_grad → forward/backward → optimizer step) into
``begin_unit`` → ``accumulate_group`` per arriving group → ``finish_unit``. The
loss of a mini-batch is normalized by totals of the whole mini-batch (tokens for
token-mean, sequences for seq-mean), which are unknown while groups still
arrive. Every verl loss aggregation is linear in that normalizer, so each group
runs with a provisional normalizer of 1 and ``finish_unit`` scales the
accumulated gradient by 1/total before clipping and the optimizer step: the
gradient equals the mini-batch one.

A batch-whitened estimator (verl_pipe.trainer.whitening) also trains groups before its
batch statistics exist: those passes go into named gradient buffers (``grad_buffer``
in the data) instead of the parameters' ``.grad``, and ``finish_unit`` adds them in
with the coefficients the whole batch gives.

The LR schedule steps once per training step, as in verl (verl_pipe/core/schedule.py: the step's last optimizer
step carries ``lr_step``): ``update_actor`` with ``rolloutpipe_lr_step=False`` in its data holds verl's scheduler
step for every mini-batch of the call, ``finish_unit(lr_step=False)`` skips it, and ``step_lr_schedule`` steps it
alone (a step that ran out of groups at a unit boundary).
"""

import copy
import os
from contextlib import contextmanager

import torch
from tensordict import NonTensorData, TensorDict

from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.tensordict_utils import maybe_fix_3d_position_ids
from verl.workers.utils.padding import no_padding_2_padding

from verl_pipe.trainer import worker_log
from verl_pipe.platform.env import malloc_trim, pin_current_process, renice_current_process
from verl_pipe.trainer.seam import LR_STEP_KEY
from verl_pipe.trainer.theta_store import KEY as THETA_KEY
from verl_pipe.trainer.theta_store import OptimizerSnapshot, ThetaStore, save_step_state

# Keys of verl's mini-batch iterator that a single accumulated micro-batch does not use.
_ITERATOR_KEYS = ("mini_batch_size", "num_mini_batch", "epochs", "seed", "dataloader_kwargs",
                  "disable_auto_offload", "global_batch_size")


def unit_loss_scale(loss_agg_mode: str, num_tokens: int, num_seqs: int) -> float:
    """1 / the normalizer verl's agg_loss uses for a whole mini-batch."""
    if loss_agg_mode == "token-mean":
        return 1.0 / num_tokens
    if loss_agg_mode == "token-sum":
        return 1.0
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        return 1.0 / num_seqs
    raise ValueError(f"actor_rollout_ref.actor.loss_agg_mode: unknown mode {loss_agg_mode!r}")


class PipeActorWorker(DetachActorWorker):
    def __init__(self, config, role, **kwargs):
        cores = pin_current_process("VERL_PIPE_TRAINER_CORES")
        if cores:
            # One intra-op thread per pinned core: more would only time-slice.
            torch.set_num_threads(len(cores))
            os.environ["OMP_NUM_THREADS"] = str(len(cores))
        # rolloutpipe.cpu.trainer_nice: the trainer yields its cores to the floating orchestration (docs/cpu.md)
        renice_current_process("VERL_PIPE_TRAINER_NICE")
        super().__init__(config, role, **kwargs)

    # verl seam: the actor side of every weight sync (CheckpointEngineManager.update_weights calls it once per step,
    # whatever the backend). The sync's buckets and the step's temporaries are freed heap that glibc keeps in its
    # arenas; trimming after the sync gives them back (most of this worker's growth per step: docs/reliability.md,
    # "Long runs: memory and step time (soak)").
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int = None, mode: str = "auto"):
        try:
            return await super().update_weights(global_steps=global_steps, mode=mode)
        finally:
            malloc_trim()

    # verl seam: the engine worker's update_actor and compute_log_prob, which verl's V1 trainer (TransferQueue
    # metadata, fetched by verl's tqbridge before this body runs) and ours (a TensorDict through Ray) both call. With
    # VERL_PIPE_WORKER_LOG set, each call appends its time inside the worker and its rows' lengths to that file
    # (verl_pipe/trainer/worker_log.py): the span-by-span comparison of the two trainers (docs/trainer_gap.md).
    #
    # ``rolloutpipe_lr_step`` (LR_STEP_KEY, set by TrainerSeam.update_actor; absent: verl's behaviour): False holds
    # the LR scheduler for the whole call, True lets verl step it with the call's last mini-batch (of its last epoch).
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: TensorDict) -> TensorDict:
        lr_step = tu.pop(data, key=LR_STEP_KEY, default=True) if isinstance(data, TensorDict) else True
        with worker_log.call("update_actor", data, self.actor.engine_config.micro_batch_size_per_gpu), \
                _lr_schedule_held(self.actor, hold=not lr_step):
            return super().update_actor(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: TensorDict) -> TensorDict:
        with worker_log.call("compute_log_prob", data, self.actor.engine_config.infer_micro_batch_size_per_gpu):
            return super().compute_log_prob(data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_sync_nbytes(self) -> int:
        """Bytes of the full model at the actor's parameter dtype: what the trainer sizes the weight sync's deadline
        by (verl_pipe/trainer/weight_sync.py). FSDP2 parameters are DTensors whose numel is the full tensor's; fp32 master
        weights count 4 bytes where the sync may send 2 (bf16), which only makes the deadline longer."""
        return int(sum(p.numel() * p.element_size() for p in self.actor.engine.module.parameters()))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def actor_state(self) -> dict:
        """The actor's full (unsharded) parameters on CPU, by HF name: for checks and tests."""
        params, _ = self.actor.engine.get_per_tensor_param()
        return {name: t.detach().to("cpu", copy=True) for name, t in params}

    # ------------------------------------------------------------------ group granularity

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def begin_unit(self) -> None:
        self.actor.engine.optimizer_zero_grad()
        self._grad_buffers: dict[str, list] = {}

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def accumulate_group(self, data: TensorDict) -> TensorDict:
        """Forward/backward of one group (or a few) into the unit's gradient; no optimizer step."""
        actor = self.actor
        maybe_fix_3d_position_ids(data)
        buffer = tu.pop(data, key="grad_buffer", default=None)
        for key in _ITERATOR_KEYS:
            tu.pop(data, key=key, default=None)
        global_token_num = data["input_ids"].offsets().diff().tolist()
        gathered = [None] * torch.distributed.get_world_size(actor.engine.get_data_parallel_group())
        torch.distributed.all_gather_object(gathered, global_token_num, actor.engine.get_data_parallel_group())
        tu.assign_non_tensor(data, global_token_num=NonTensorData([x for xs in gathered for x in xs]))
        defaults = dict(
            use_remove_padding=actor.model_config.get("use_remove_padding", False),
            use_dynamic_bsz=actor.engine_config.use_dynamic_bsz,
            max_token_len_per_gpu=actor.engine_config.max_token_len_per_gpu,
            micro_batch_size_per_gpu=actor.engine_config.micro_batch_size_per_gpu,
            use_fused_kernels=actor.engine_config.use_fused_kernels,
        )
        for key, val in defaults.items():
            if key not in data.keys():
                tu.assign_non_tensor(data, **{key: val})
        loss_fn = actor.loss_fn

        def provisional_loss(model_output, data, dp_group=None):
            # Normalizer 1 now; finish_unit applies 1/total of the unit (the loss is linear in it).
            tu.assign_non_tensor(data, batch_num_tokens=1, global_batch_size=1)
            if buffer is not None:
                _check_ratio_unclipped(loss_fn.keywords["config"], model_output, data)
            return loss_fn(model_output=model_output, data=data, dp_group=dp_group)

        # zero_grad_on_exit=False: the gradient must survive until the unit's last group.
        with worker_log.call("accumulate_group", data, actor.engine_config.micro_batch_size_per_gpu), \
                actor.engine.train_mode(disable_auto_offload=True, zero_grad_on_exit=False), \
                self._gradient_into(buffer):
            actor.engine.forward_backward_batch(data, loss_function=provisional_loss, forward_only=False)
        # The per-group loss metrics use the provisional normalizer; the unit's are in finish_unit.
        # ("mfu" is the one key verl's _update_actor expects from the worker.)
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.0}})

    @contextmanager
    def _gradient_into(self, buffer: str | None):
        """Backward passes inside accumulate into the named buffer instead of the parameters' .grad."""
        if buffer is None:
            yield
            return
        params = list(self.actor.engine.module.parameters())
        bufs = self._grad_buffers.setdefault(buffer, [None] * len(params))
        held = [p.grad for p in params]
        for p, b in zip(params, bufs, strict=True):
            p.grad = b
        try:
            yield
        finally:
            for i, p in enumerate(params):
                bufs[i], p.grad = p.grad, held[i]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def finish_unit(self, loss_agg_mode: str, num_tokens: int, num_seqs: int,
                    buffer_coeffs: dict[str, float] | None = None, lr_step: bool = True) -> dict:
        """Add the gradient buffers with their coefficients, scale to the unit's normalizer, clip,
        step; ``lr_step`` (the step's last optimizer step): advance the LR schedule and report the LR, as verl's
        train_batch does with ``update_lr_scheduler``."""
        with worker_log.call("finish_unit", None, None):
            return self._finish_unit(loss_agg_mode, num_tokens, num_seqs, buffer_coeffs, lr_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step_lr_schedule(self) -> dict:
        """The step's LR-scheduler step alone (the step ran out of groups after an optimizer step that held it)."""
        return {"actor/lr": _lr_value(self.actor.engine.lr_scheduler_step())}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def lr_schedule_state(self) -> dict:
        """The LR scheduler's steps so far (``last_epoch``) and current LR (None: no scheduler): for checks and
        tests."""
        scheduler = self.actor.engine.lr_scheduler
        if scheduler is None:
            return {"steps": None, "lr": None}
        return {"steps": int(scheduler.last_epoch), "lr": float(scheduler.get_last_lr()[0])}

    def _finish_unit(self, loss_agg_mode: str, num_tokens: int, num_seqs: int,
                     buffer_coeffs: dict[str, float] | None, lr_step: bool = True) -> dict:
        engine = self.actor.engine
        scale = unit_loss_scale(loss_agg_mode, num_tokens, num_seqs)
        buffers = getattr(self, "_grad_buffers", {})
        missing = set(buffers) - set(buffer_coeffs or {})
        if missing:
            raise RuntimeError(f"finish_unit: gradient buffers {sorted(missing)} have no coefficient")
        with torch.no_grad():
            for i, p in enumerate(engine.module.parameters()):
                for name, coeff in (buffer_coeffs or {}).items():
                    b = buffers[name][i] if name in buffers else None
                    if b is None:
                        continue
                    if p.grad is None:
                        p.grad = b.mul_(coeff)
                    else:
                        p.grad.add_(b, alpha=coeff)
                if p.grad is not None:
                    p.grad.mul_(scale)
        self._grad_buffers = {}
        with engine.train_mode(disable_auto_offload=True):  # zero-grads on exit, like train_batch
            grad_norm = engine.optimizer_step()
        out = {"actor/grad_norm": float(grad_norm)}
        if lr_step:
            out["actor/lr"] = _lr_value(engine.lr_scheduler_step())
        return out

    # ------------------------------------------------------------------ θ_k and the rollback snapshot

    def _train_state_stores(self, placement: str, margin_gib: float | None) -> tuple[ThetaStore, OptimizerSnapshot]:
        """The θ_k store and the optimizer snapshot (verl_pipe.trainer.theta_store), built on first use: their buffers
        are allocated once and reused every step. Seam: verl's FSDP engine exposes the FSDP2 module and the
        torch optimizer as ``actor.engine.module`` / ``actor.engine.optimizer``."""
        stores = getattr(self, "_stores", None)
        if stores is None or stores[0].requested != placement:
            strategy = self.config.actor.strategy
            if strategy != "fsdp2":
                raise RuntimeError(f"{THETA_KEY}: keeps FSDP2 shards; actor_rollout_ref.actor.strategy is {strategy!r}")
            engine = self.actor.engine
            margin = None if margin_gib is None else int(float(margin_gib) * (1 << 30))
            stores = (ThetaStore(engine.module, placement, margin_bytes=margin),
                      OptimizerSnapshot(engine.optimizer, placement, margin_bytes=margin))
            self._stores = stores
        return stores

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_train_state(self, placement: str, margin_gib: float | None, optimizer: bool) -> dict:
        """Before the step's first optimizer step: θ_k := the live weights (later units' old log-probs, a
        restarted replica, a rollback) and, with ``optimizer``, the optimizer and LR-schedule state (this rank's
        shards) for a rollback of a step that fails for good. ``placement``: rolloutpipe.theta_k.store."""
        theta, opt = self._train_state_stores(placement, margin_gib)
        save_step_state(theta, opt if optimizer else None)  # the per-step snapshot (docs/reliability.md: its cost)
        self._lr_snapshot = None
        if optimizer:
            scheduler = self.actor.engine.lr_scheduler
            self._lr_snapshot = copy.deepcopy(scheduler.state_dict()) if scheduler else None
        return {"theta_k_on_device": float(theta.placement == "device"), "theta_k_bytes": float(theta.nbytes),
                "optimizer_snapshot_on_device": float(opt.placement == "device"),
                "optimizer_snapshot_bytes": float(opt.stats.nbytes if optimizer else 0)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def train_state_stats(self) -> dict:
        """The store's placement, swap kind, bytes and counts of saves and swaps so far (for checks and tests)."""
        theta, opt = self._stores
        return {"placement": theta.placement, "swap": theta.stats.swap, "theta_k_bytes": theta.nbytes,
                "saves": len(theta.stats.save_s), "swaps": len(theta.stats.swap_s),
                "optimizer_placement": opt.placement, "optimizer_bytes": opt.stats.nbytes}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def enter_theta_k(self) -> None:
        """The actor computes at θ_k until leave_theta_k (a pointer swap with ``device``, copies with ``pinned``)."""
        self._stores[0].swap_in()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def leave_theta_k(self) -> None:
        """The live weights again, bit for bit."""
        self._stores[0].swap_out()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def restore_train_state(self) -> None:
        """Roll back to the saved state: θ_k into the live weights and, if it was saved, the optimizer state."""
        theta, opt = self._stores
        theta.restore()
        if opt.valid:
            opt.restore()
            if self._lr_snapshot is not None:
                self.actor.engine.lr_scheduler.load_state_dict(self._lr_snapshot)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def drop_train_state(self) -> None:
        """The step is over: forget θ_k and the optimizer snapshot (the buffers stay for the next step)."""
        stores = getattr(self, "_stores", None)
        if stores is not None:
            theta, opt = stores
            theta.invalidate()
            opt.clear()
        self._lr_snapshot = None


def _lr_value(lr) -> float:
    """An engine's ``lr_scheduler_step()`` result (a number, or one per parameter group: the first, as verl's)."""
    return float(lr[0] if isinstance(lr, list) else lr)


@contextmanager
def _lr_schedule_held(actor, hold: bool):
    """verl seam: ``TrainingWorker.train_mini_batch`` (verl 0.9.1, verl/workers/engine_workers.py) sets verl's own
    ``update_lr_scheduler`` flag on each mini-batch it hands to ``self.train_batch`` (True on its last iteration),
    and ``train_batch`` steps the scheduler (and reports ``lr``) when it is set. ``hold``: inside the block the flag is
    False on every mini-batch (the instance's ``train_batch`` wraps the class's for the call)."""
    if not hold:
        yield
        return
    train_batch = actor.train_batch

    def without_lr_step(data: TensorDict) -> TensorDict:
        tu.assign_non_tensor(data, update_lr_scheduler=False)
        return train_batch(data)

    actor.train_batch = without_lr_step
    try:
        yield
    finally:
        del actor.train_batch


def _check_ratio_unclipped(actor_config, model_output, data) -> None:
    """A gradient-buffer pass relies on the policy gradient being linear in the advantages, which
    holds while no token's ratio π_θ/π_old leaves the clip range (at θ_k it is 1 up to rounding)."""
    log_prob = no_padding_2_padding(model_output["log_probs"], data).detach()
    padded = data.select("response_mask", "old_log_probs").to_padded_tensor()
    mask = padded["response_mask"].to(bool)
    ratio = torch.exp(log_prob - padded["old_log_probs"])[mask]
    clip = float(actor_config.clip_ratio)
    low = float(actor_config.clip_ratio_low) if actor_config.clip_ratio_low is not None else clip
    high = float(actor_config.clip_ratio_high) if actor_config.clip_ratio_high is not None else clip
    if ratio.numel() and (ratio.min() <= 1 - low or ratio.max() >= 1 + high):
        raise RuntimeError(
            f"reinforce_plus_plus_baseline in CGP: a group trained before the batch statistics exist has a PPO "
            f"ratio in [{float(ratio.min()):.4f}, {float(ratio.max()):.4f}], outside the clip range "
            f"[{1 - low}, {1 + high}]; its gradient would not be linear in the advantages. Old log-probs must be "
            "the actor's under θ_k (algorithm.rollout_correction.bypass_mode=false)")
