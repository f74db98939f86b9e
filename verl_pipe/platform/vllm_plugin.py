"""vLLM general plugin (group ``vllm.general_plugins``), run in every vLLM process.

Only acts on CPU runs started by verl_pipe (``VERL_PLATFORM=cpu``):
- asks for AMX permission before vLLM's CPU attention kernels run (else SIGILL);
- pins the process to the rollout pool's cores;
- keeps linear weights reloadable (see ``_keep_linear_weights_for_reload``);
- returns the memory a weight update freed to the OS (see ``_trim_after_weight_updates``).
"""

import os

from verl_pipe.platform.env import malloc_trim


def _keep_linear_weights_for_reload() -> None:
    """Let verl reload weights into vLLM-CPU: linear layers compute with torch's own linear on their weight.

    On CPU, vLLM packs each linear layer's weight for oneDNN/SGL kernels (a handler holding a packed copy) and
    then replaces ``layer.weight`` by an empty Parameter (``remove_weight=True``). A weight update then fails
    in ``load_weights`` ('Parameter' object has no attribute 'weight_loader'). We keep the parameter and, after
    the first load, do not repack: verl calls ``process_weights_after_loading`` after every update, and each
    repack left the previous packed copy behind (``python -m verl_pipe_lab.bench --soak``: the VLLM::Worker process
    grew by about one copy of the weights per update; with torch's linear on reloads it is flat and the steps are
    faster: docs/reliability.md, "Long runs: memory and step time (soak)").
    torch's linear on the fp32 CPU default uses ATen's GEMM; the weight updated in place by ``load_weights``
    is what it reads. The first load keeps vLLM's own dispatch (its start-up checks run through it).
    vLLM seam: ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``, called per linear layer by
    ``UnquantizedLinearMethod.process_weights_after_loading``.
    """
    import torch
    import vllm.model_executor.layers.utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(original, "_verl_pipe_patched", False):
        return

    def dispatch_cpu_unquantized_gemm(layer, remove_weight: bool) -> None:
        if getattr(layer, "_verl_pipe_dispatched", False):  # a reload: no new packed copy
            layer.cpu_linear = _torch_linear
            return
        layer._verl_pipe_dispatched = True
        return original(layer, remove_weight=False)

    def _torch_linear(x, weight, bias):
        return torch.nn.functional.linear(x, weight, bias)

    dispatch_cpu_unquantized_gemm._verl_pipe_patched = True
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def _trim_after_weight_updates() -> None:
    """After every weight update, ``malloc_trim(0)`` in the vLLM worker: the update's buckets and temporaries are
    freed heap that glibc would otherwise keep in its arenas (with the per-update repack still on, it took away
    part of the worker's growth; the repack was the rest, above: docs/reliability.md). verl seam: the worker
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
