"""Can this host run the trainer and the rollout side by side? A two-core contention probe.

CGP and FGD shorten the step by running trainer work while the rollout runs. That pays only if the two pools'
cores really work in parallel. On a VM the "cores" may be hyperthreads of one physical core, or share a memory
bus and cache that one compute-bound process already fills; then each slows down when the other runs, and work
moved into the overlap costs about as much as it saves.

``probe_pair`` measures it the simplest way: one single-thread process pinned to each of two cores, each alone and
then both at once, for two kinds of work: ``compute`` (fp32 512 x 512 matmuls, in cache) and ``memory`` (copying a
128 MiB tensor: what a decode step reading a large KV cache, or a trainer streaming activations, is limited by).
``overlap_capacity`` is the sum of the two speeds together relative to alone: 2.0 = two independent cores (overlap
is free), 1.0 = together they do no more work than one alone (overlap buys nothing: a second of trainer work during
the rollout slows the engine by as much as it saves). The bench records
it in its JSON ``env`` (``core_pair``) beside the stack's own overlap figures
(``rollout_slowdown_when_overlapped``, the trainer's cost per padded token during vs after the rollout).

``python -m verl_pipe.platform.core_pair [--cores 0,1] [--seconds 3]`` prints the report as JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

MATMUL_N = 512
COPY_FLOATS = 32 * 1024 * 1024  # 128 MiB of fp32: far beyond any L3 cache
KINDS = ("compute", "memory")


def unit_of_work(kind: str):
    """(one unit of work, its size: GFLOP for compute, GB moved for memory)."""
    import torch

    if kind == "compute":
        a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
        return (lambda: a @ b), 2 * MATMUL_N ** 3 / 1e9
    src = torch.randn(COPY_FLOATS)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * 4 * COPY_FLOATS / 1e9


def spin(kind: str, core: int, seconds: float, start, out=None, nice: int = 0) -> None:
    """In a child process: pinned to ``core`` at ``nice``, one thread, ``kind`` of work for ``seconds`` from
    ``start.wait()`` (a barrier or an event); puts ``(core, rate)`` on ``out`` when given. Also the stand-in load of
    lab/verl_pipe_lab/bench/tools/overlap_probe.py."""
    import torch

    os.sched_setaffinity(0, {core})
    os.nice(nice)
    torch.set_num_threads(1)
    step, size = unit_of_work(kind)
    step()  # warm-up (kernel selection, first touch), before the common start
    start.wait()
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step()
        k += 1
    if out is not None:
        out.put((core, size * k / (time.perf_counter() - t0)))


def _run(kind: str, cores: list[int], seconds: float) -> dict[int, float]:
    """The rate per core (GFLOP/s or GB/s) with one spinning process on each of ``cores`` at the same time."""
    ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited torch thread pool or affinity
    start, out = ctx.Barrier(len(cores) + 1), ctx.Queue()
    procs = [ctx.Process(target=spin, args=(kind, c, seconds, start, out)) for c in cores]
    for p in procs:
        p.start()
    start.wait(timeout=120)
    speeds = dict(out.get(timeout=120 + seconds) for _ in cores)
    for p in procs:
        p.join()
    return speeds


def overlap_capacity(alone: dict[int, float], together: dict[int, float]) -> float:
    """Sum over the cores of (speed together / speed alone): 2.0 for independent cores, 1.0 for one shared."""
    missing = set(alone) ^ set(together)
    if missing or not alone:
        raise ValueError(f"alone and together must cover the same cores; differ in {sorted(missing)}")
    if any(v <= 0 for v in alone.values()):
        raise ValueError(f"a core's speed alone is not positive: {alone}")
    return sum(together[c] / alone[c] for c in alone)


def probe_pair(cores: tuple[int, int] = (0, 1), seconds: float = 1.0) -> dict:
    """Per kind of work: each core alone, then both together; the rates (``compute`` GFLOP/s, ``memory`` GB/s)
    and the overlap capacity. About 6 x ``seconds`` plus the child processes' start-ups."""
    cores = list(cores)
    usable = os.sched_getaffinity(0)
    if len(set(cores)) != 2 or not set(cores) <= usable:
        raise ValueError(f"core_pair needs two distinct usable cores, got {cores} (usable: {sorted(usable)})")
    out = {"cores": cores, "seconds": seconds, "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    for kind in KINDS:
        alone = {c: _run(kind, [c], seconds)[c] for c in cores}
        together = _run(kind, cores, seconds)
        out[kind] = {"alone": {str(c): round(v, 2) for c, v in alone.items()},
                     "together": {str(c): round(v, 2) for c, v in together.items()},
                     "overlap_capacity": round(overlap_capacity(alone, together), 3)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", default="0,1", help="two cores, e.g. the rollout's and the trainer's (default 0,1)")
    ap.add_argument("--seconds", type=float, default=2.0, help="per measurement (six measurements)")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    cores = tuple(int(c) for c in args.cores.split(","))
    for _ in range(args.repeats):
        print(json.dumps(probe_pair(cores, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
