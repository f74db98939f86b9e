"""Environment variables of a CPU run, in one place.

They must reach every process: the launcher sets them in ``os.environ`` before
Ray starts and passes the same dict in Ray's ``runtime_env`` so that workers and
the vLLM servers they spawn inherit them.
"""

import os

# KV cache of each vLLM-CPU replica, GiB: the tiny models need far less than the default 4.
DEFAULT_KV_CACHE_GIB = 1


def cpu_env(rollout_cores: str, trainer_cores: str, kv_cache_gib: int = DEFAULT_KV_CACHE_GIB,
            trainer_nice: int = 0) -> dict[str, str]:
    """Variables that select the CPU platform and pin the pools to disjoint cores.

    rollout_cores / trainer_cores: Linux cpu lists ("0", "1", "0-3", "4,5"). trainer_nice: the trainer worker's
    nice value (renice_current_process).
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
        "VERL_PIPE_TRAINER_NICE": str(int(trainer_nice)),
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


def _thread_ids(pid: int | str = "self") -> set[int]:
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:  # not Linux procfs: the calling thread is all we can name
        return {0}


def _each_thread(apply) -> None:
    """``apply(tid)`` on every thread of this process, repeated until no new thread appeared meanwhile (one created
    by a thread not yet reached inherits that thread's old attribute); a thread that exited meanwhile is skipped."""
    done: set[int] = set()
    for _ in range(10):
        todo = _thread_ids() - done
        if not todo:
            return
        for tid in todo:
            try:
                apply(tid)
            except (ProcessLookupError, PermissionError):  # the thread has exited meanwhile
                pass
        done |= todo


def pin_all_threads(cores: list[int]) -> None:
    """Set the affinity of EVERY thread of this process, not just the caller's.

    ``os.sched_setaffinity(0, ...)`` changes the calling thread only; threads that already exist (Ray's
    gRPC and event-loop threads, torch's pools) keep their old mask, and a thread inherits the mask of the
    thread that creates it. So: set the mask on every task in /proc/self/task (``_each_thread``)."""
    _each_thread(lambda tid: os.sched_setaffinity(tid, cores))


def pin_current_process(env_key: str) -> list[int] | None:
    """Pin this whole process (every thread, torch's intra-op pool included) to the cores in os.environ[env_key]."""
    spec = os.environ.get(env_key)
    if not spec:
        return None
    cores = parse_cpu_list(spec)
    available = run_cores()
    cores = [c for c in cores if c in available] or sorted(available)
    pin_all_threads(cores)
    return cores


def renice_current_process(env_key: str) -> int | None:
    """Give every thread of this process the nice value in os.environ[env_key] (none: leave it).

    On Linux a nice value belongs to a thread, like the affinity mask (``pin_all_threads``): ``os.nice`` changes
    the caller only, so each task in /proc/self/task gets ``setpriority``; later threads inherit it. Raising it
    needs no privilege."""
    spec = os.environ.get(env_key)
    if not spec or int(spec) == 0:
        return None
    value = int(spec)
    _each_thread(lambda tid: os.setpriority(os.PRIO_PROCESS, tid, value))
    return value


def _per_thread(pid: int, name: str, read) -> dict:
    """``read(text)`` of /proc/<pid>/task/<tid>/<name> for every thread of a live process, by thread id; a thread
    that exited meanwhile (or whose file has no such field) is left out."""
    out = {}
    for tid in _thread_ids(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                out[tid] = read(f.read())
        except (OSError, IndexError, ValueError, StopIteration):
            pass
    return out


def thread_nice(pid: int) -> dict[int, int]:
    """The nice value of every thread of a live process, by thread id (for checks and tests)."""
    return _per_thread(pid, "stat", lambda text: int(text.rsplit(")", 1)[1].split()[16]))  # field 19: nice


def thread_affinities(pid: int) -> dict[int, str]:
    """Cpus_allowed_list of every thread of a live process, by thread id (for checks and tests)."""
    return _per_thread(pid, "status", lambda text: next(line.split(":", 1)[1].strip() for line in text.splitlines()
                                                        if line.startswith("Cpus_allowed_list:")))


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
        pin_all_threads(cores)


def malloc_trim() -> bool:
    """glibc's ``malloc_trim(0)``: give freed heap pages back to the OS. False where there is no glibc. Called after
    every weight update in the vLLM worker (platform/vllm_plugin.py) and the trainer worker (verl_pipe/trainer/workers.py)."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False
