"""Environment variables of a CPU run, in one place.

They must reach every process: the launcher sets them in ``os.environ`` before
Ray starts and passes the same dict in Ray's ``runtime_env`` so that workers and
the vLLM servers they spawn inherit them.
"""

import os

# KV cache of each vLLM-CPU replica, GiB: the tiny models need far less than the default 4.
DEFAULT_KV_CACHE_GIB = 1


def cpu_env(rollout_cores: str, trainer_cores: str, kv_cache_gib: int = DEFAULT_KV_CACHE_GIB) -> dict[str, str]:
    """Variables that select the CPU platform and pin the pools to disjoint cores.

    rollout_cores / trainer_cores: Linux cpu lists ("0", "1", "0-3", "4,5").
    """
    return {
        "VERL_PLATFORM": "cpu",
        # verl's engine registry knows FSDP only for cuda/npu; this is its own override knob.
        "VERL_ENGINE_DEVICE": "cuda",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        # vLLM binds its OMP threads to these cores: the rollout pool.
        "VLLM_CPU_OMP_THREADS_BIND": rollout_cores,
        "VERL_PIPE_ROLLOUT_CORES": rollout_cores,
        "VERL_PIPE_TRAINER_CORES": trainer_cores,
        "TOKENIZERS_PARALLELISM": "false",
        # Ray would otherwise hide the "GPUs" it assigns and verl reads CUDA_VISIBLE_DEVICES.
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    }


def parse_cpu_list(spec: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]; raises ValueError naming the bad spec."""
    cores: list[int] = []
    try:
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = part.split("-")
                cores.extend(range(int(lo), int(hi) + 1))
            else:
                cores.append(int(part))
    except ValueError:
        raise ValueError(f"bad CPU core list {spec!r}: expected e.g. '0', '0-3' or '0,2'") from None
    if not cores:
        raise ValueError(f"bad CPU core list {spec!r}: empty")
    return sorted(set(cores))


def pin_current_process(env_key: str) -> list[int] | None:
    """Pin this process (and torch's intra-op threads) to the cores in os.environ[env_key]."""
    spec = os.environ.get(env_key)
    if not spec:
        return None
    cores = parse_cpu_list(spec)
    available = os.sched_getaffinity(0)
    cores = [c for c in cores if c in available] or sorted(available)
    os.sched_setaffinity(0, cores)
    return cores
