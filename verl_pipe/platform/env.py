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
        # The cores this run may use, before the launcher confines itself (confine_launcher):
        # a pool pins itself within these, not within the launcher's narrower inherited set.
        "VERL_PIPE_ALL_CORES": os.environ.get("VERL_PIPE_ALL_CORES")
        or ",".join(str(c) for c in sorted(os.sched_getaffinity(0))),
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


def run_cores() -> set[int]:
    """The cores this run may use: the launcher's set from before it confined itself (VERL_PIPE_ALL_CORES),
    else this process's affinity."""
    spec = os.environ.get("VERL_PIPE_ALL_CORES")
    return set(parse_cpu_list(spec)) if spec else os.sched_getaffinity(0)


def pin_current_process(env_key: str) -> list[int] | None:
    """Pin this process (and torch's intra-op threads) to the cores in os.environ[env_key]."""
    spec = os.environ.get(env_key)
    if not spec:
        return None
    cores = parse_cpu_list(spec)
    available = run_cores()
    cores = [c for c in cores if c in available] or sorted(available)
    os.sched_setaffinity(0, cores)
    return cores


def system_core_list(system_cores: str, rollout_cores: str) -> list[int] | None:
    """The cores of everything that is neither pool ('rollout': the rollout pool's; 'all': no confinement)."""
    if system_cores == "all":
        return None
    return parse_cpu_list(rollout_cores if system_cores == "rollout" else system_cores)


def confine_launcher(cores: list[int] | None) -> None:
    """Confine this process before Ray starts, so that Ray's own processes, the driver and every worker
    it spawns (agent-loop and reward workers, the task runner) inherit these cores; the trainer pool
    re-pins itself to its own cores (pin_current_process), so they stay the trainer's alone."""
    if cores:
        os.sched_setaffinity(0, cores)
