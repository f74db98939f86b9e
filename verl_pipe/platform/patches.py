"""The monkeypatches verl 0.9.1 needs on CPU, all in one place.

Each patch names the verl code it works around and why no extension point
covers it. They are applied only when ``VERL_PLATFORM=cpu`` (see ``plugin``), and
only once per process.
"""

import functools
import logging

logger = logging.getLogger(__name__)
_applied = False


def _patch_process_group_backend() -> None:
    # verl/utils/distributed.py builds f"cpu:gloo,{device}:{backend}", i.e.
    # "cpu:gloo,cpu:gloo" on CPU, which torch.distributed rejects (duplicate device).
    import verl.utils.distributed as dist_utils

    original = dist_utils.initialize_global_process_group_ray
    if getattr(original, "_verl_pipe_patched", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None or backend.replace(" ", "") in ("cpu:gloo,cpu:gloo", "cpu:gloo"):
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    initialize_global_process_group_ray._verl_pipe_patched = True
    dist_utils.initialize_global_process_group_ray = initialize_global_process_group_ray


def _patch_cpu_snapshots_copy() -> None:
    # verl/utils/fsdp_utils.py:fsdp2_sharded_save_to_cpu snapshots each shard with ``.cpu()``,
    # which copies off a GPU but is a no-op on CPU: the "snapshot" aliases the live parameters
    # and follows every later optimizer step. DetachActorWorker.save_model_to_cpu would then restore the
    # updated weights. Clone so it is a real copy. (The trainer keeps θ_k in verl_pipe.trainer.theta_store; tests
    # still use save_model_to_cpu to hold weights.)
    import verl.utils.fsdp_utils as fsdp_utils

    original = fsdp_utils.fsdp2_sharded_save_to_cpu
    if getattr(original, "_verl_pipe_patched", False):
        return

    @functools.wraps(original)
    def fsdp2_sharded_save_to_cpu(model):
        state, spec = original(model)
        return {name: (t.clone(), s) for name, (t, s) in state.items()}, spec

    fsdp2_sharded_save_to_cpu._verl_pipe_patched = True
    fsdp_utils.fsdp2_sharded_save_to_cpu = fsdp2_sharded_save_to_cpu


def _patch_ref_offload_policy() -> None:
    # verl/workers/engine/fsdp/transformer_impl.py hard-codes CPUOffloadPolicy(pin_memory=True) for
    # forward-only models (the reference policy). Pinned memory needs an accelerator; on CPU the
    # parameters already live in host memory, so "offload to CPU" is FSDP2's no-offload policy.
    import verl.workers.engine.fsdp.transformer_impl as impl
    from torch.distributed.fsdp import OffloadPolicy

    if getattr(impl.CPUOffloadPolicy, "_verl_pipe_patched", False):
        return

    def host_memory_policy(*args, **kwargs):
        return OffloadPolicy()

    host_memory_policy._verl_pipe_patched = True
    impl.CPUOffloadPolicy = host_memory_policy


class _DropFlushKwarg(logging.LoggerAdapter):
    """A logger that ignores print()'s ``flush=`` keyword, which logging.Logger rejects."""

    def process(self, msg, kwargs):
        kwargs.pop("flush", None)
        return msg, kwargs


SEPARATE_ASYNC_MODULE = "verl.trainer.ppo.v1.trainer_separate_async"


def patch_separate_async_logger(module=None) -> None:
    # verl/trainer/ppo/v1/trainer_separate_async.py: PPOTrainerSeparateAsync._setup calls
    # ``logger.info(..., flush=True)`` when actor_rollout_ref.hybrid_engine=False (separate pools, our only
    # layout): logging.Logger.info has no ``flush`` and raises TypeError, so the trainer cannot start. The
    # module logger is replaced by an adapter that drops the keyword (same logger, same level and handlers).
    # Not a platform matter (it fails on GPU too), but applied with the CPU patches because that is where
    # verl_pipe runs separate_async (the benchmark peer, lab/verl_pipe_lab/bench/peer). Importing the module needs
    # transfer_queue, so apply_cpu_patches only patches it when it is already imported; the peer's hooks call
    # this right after importing it.
    if module is None:
        import importlib

        module = importlib.import_module(SEPARATE_ASYNC_MODULE)
    if isinstance(module.logger, _DropFlushKwarg):
        return
    module.logger = _DropFlushKwarg(module.logger, {})


def apply_cpu_patches() -> None:
    global _applied
    if _applied:
        return
    _patch_process_group_backend()
    _patch_cpu_snapshots_copy()
    _patch_ref_offload_policy()
    import sys

    if SEPARATE_ASYNC_MODULE in sys.modules:
        patch_separate_async_logger(sys.modules[SEPARATE_ASYNC_MODULE])
    _applied = True
