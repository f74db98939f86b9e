"""verl platform for CPU-only machines.

verl 0.9.1 registers nvidia, npu and rocm and falls back to CUDA (upstream issue
#3266). This platform keeps verl's device-agnostic code paths intact:

- device ``cpu``, collective backend ``gloo``;
- Ray resource name ``GPU``: the launcher starts Ray with *logical* GPUs, one per
  pinned core set, so verl's resource pools (which always ask for GPUs) place
  exactly as on a cluster;
- no CUDA IPC: vLLM takes weight updates through shared memory;
- a ``device_module`` whose memory/RNG/device calls are no-ops or CPU equivalents.
"""

import types
from contextlib import contextmanager
from typing import Any, Optional

import torch

from verl.plugin.platform.platform_base import PlatformBase


def _noop(*args, **kwargs):
    return None


def _zero(*args, **kwargs):
    return 0


def _make_device_module() -> types.ModuleType:
    """torch.cpu plus the torch.cuda-style calls verl makes on its device module."""
    mod = types.ModuleType("verl_pipe_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(mod, name, getattr(torch.cpu, name))
    for name in ("empty_cache", "set_device", "reset_peak_memory_stats", "reset_max_memory_allocated",
                 "ipc_collect", "set_per_process_memory_fraction"):
        setattr(mod, name, _noop)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(mod, name, _zero)
    mod.manual_seed = torch.manual_seed
    mod.manual_seed_all = torch.manual_seed
    mod.seed = torch.seed
    mod.get_rng_state = torch.get_rng_state
    mod.set_rng_state = torch.set_rng_state
    mod.current_device = lambda: "cpu"
    mod.device_count = lambda: 1
    mod.is_available = lambda: True
    mod.synchronize = _noop
    mod.memory_stats = lambda *a, **k: {}
    # verl's MFU estimate looks the peak FLOPS up by device name; "CPU" has none (MFU reported as 0).
    mod.get_device_name = lambda *a, **k: "CPU"

    def mem_get_info(*args, **kwargs):
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    mod.mem_get_info = mem_get_info

    class _Memory(types.SimpleNamespace):
        pass

    mod.memory = _Memory(_set_allocator_settings=_noop, _record_memory_history=_noop, _dump_snapshot=_noop)
    return mod


_DEVICE_MODULE = _make_device_module()


class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never auto-selected: a CPU run is asked for explicitly (VERL_PLATFORM=cpu).
        return False

    def current_device(self) -> str:
        # verl mostly uses this as a ``.to(device)`` target; an index would mean "accelerator 0".
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets this for actors that hold logical GPUs; on CPU it is harmless.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"}

    def get_collective_module(self) -> Any:
        return None

    def cudart(self) -> Any:
        return None
