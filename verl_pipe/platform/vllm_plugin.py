"""vLLM general plugin (group ``vllm.general_plugins``), run in every vLLM process.

Only acts on CPU runs started by verl_pipe (``VERL_PLATFORM=cpu``):
- asks for AMX permission before vLLM's CPU attention kernels run (else SIGILL);
- pins the process to the rollout pool's cores;
- keeps linear weights reloadable (see ``_keep_linear_weights_for_reload``);
- returns the memory a weight update freed to the OS (see ``_trim_after_weight_updates``).
"""

import os


def _keep_linear_weights_for_reload() -> None:
    """Let verl reload weights into vLLM-CPU, and repack them after each reload.

    On CPU, vLLM packs each linear layer's weight for oneDNN/SGL kernels and then
    replaces ``layer.weight`` by an empty Parameter (``remove_weight=True``). A
    weight update then fails in ``load_weights`` ('Parameter' object has no
    attribute 'weight_loader'). Keeping the original parameter lets the update
    land in it; verl calls ``process_weights_after_loading`` after every update,
    which runs this dispatch again and repacks the new weights, so generation
    keeps the packed kernels. The cost is a second copy of the linear weights.
    """
    import vllm.model_executor.layers.utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_verl_pipe_patched", False):
        return

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        return original(layer, remove_weight=False)

    dispatch_cpu_unquantized_gemm._verl_pipe_patched = True
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def malloc_trim() -> bool:
    """glibc's ``malloc_trim(0)``: give freed heap pages back to the OS. False where there is no glibc."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _trim_after_weight_updates() -> None:
    """After every weight update, ``malloc_trim(0)`` in the vLLM worker.

    Each update lands new weights and repacks every linear layer (above): a few MiB of tensors freed and
    allocated again per step, and glibc keeps the freed pages in its arenas. Measured (`python -m verl_pipe.bench
    --soak 45`, tiny model): the VLLM::Worker process grew 2.3 MiB per step without it. verl seam: the worker
    extension's ``update_weights_from_ipc`` (verl's ``vLLMColocateWorkerExtension``, the ``worker_extension_cls``
    of every replica), wrapped to trim after it returns.
    """
    try:
        from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as ext
    except ImportError:
        return
    original = ext.update_weights_from_ipc
    if getattr(original, "_verl_pipe_trim", False):
        return

    def update_weights_from_ipc(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            malloc_trim()

    update_weights_from_ipc._verl_pipe_trim = True
    ext.update_weights_from_ipc = update_weights_from_ipc


def register() -> None:
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        return
    from verl_pipe.platform.amx import request_amx_permission
    from verl_pipe.platform.env import pin_current_process

    request_amx_permission()
    pin_current_process("VERL_PIPE_ROLLOUT_CORES")
    _keep_linear_weights_for_reload()
    _trim_after_weight_updates()
