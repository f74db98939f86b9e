"""Does work on the trainer's core slow the rollout? The real stack's rollout beside a pinned stand-in load.

On a shared host CGP and FGD move trainer work into the rollout, and the bench finds the rollout slower while the
trainer runs (``rollout_slowdown_when_overlapped`` in its JSON). Two things run beside the engine then: the trainer
on its own core, and the orchestration that floats (the driver's Ray calls and DataProto handling for the trainer).
This separates them. It runs **sync** steps of the paper-shaped stack (lab/verl_pipe_lab/bench/conf/paper_tiny.yaml: vLLM, Ray and
verl's workers for real; in sync the trainer is idle while the rollout runs) with, on the trainer's core only, one
of: nothing, a compute-bound process (fp32 512 x 512 matmuls, in cache) or a memory-streaming process (copying a
128 MiB tensor), the stand-ins of ``verl_pipe.platform.core_pair``. If the memory stand-in alone slows the rollout
as much as the trainer does, the host's shared memory bandwidth is the cost of overlap; if neither does, the
orchestration is.

    flock /tmp/verl_pipe_ray.lock python -m verl_pipe_lab.bench overlap_probe --rounds 3 \
        | tee docs/bench/logs/overlap_probe_DATE.log

Prints one line per step and a summary per load: rollout end (s) and generated tokens per second of rollout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

LOADS = ("none", "compute", "memory")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench overlap_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "conf" / "paper_tiny.yaml"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides on top of the stack's, e.g. "
                    "rolloutpipe.cpu.system_cores=0 (the orchestration on the rollout's core)")
    ap.add_argument("--hog-nice", type=int, default=0, help="the stand-in load's nice value (as a niced trainer)")
    ap.add_argument("--hog-factor", type=float, default=2.0,
                    help="the stand-in load runs this many warm-up rollouts' time from each step's start")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    from verl_pipe_lab.bench.run import mode_kwargs
    from verl_pipe_lab.bench.settings import load_config, stack_of, stack_overrides, workload_for
    from verl_pipe.core.workload import exact_lengths
    from verl_pipe.platform.core_pair import spin  # the probe's stand-in load, on a timer
    from verl_pipe.launch.session import PipeSession, compose

    cfg = load_config(args.config)
    setting = cfg["settings"][0]
    stack = stack_of(setting, cfg)
    ckpt = tempfile.mkdtemp(prefix="overlap_")
    overrides = stack_overrides(cfg, stack) + list(args.overrides) + [f"trainer.default_local_dir={ckpt}"]
    session = PipeSession(compose(overrides))
    c = session.config
    trainer_core = int(str(c.rolloutpipe.cpu.trainer_cores).split(",")[0].split("-")[0])
    groups, n = int(c.data.train_batch_size), int(c.actor_rollout_ref.rollout.n)
    print(f"stack {stack} up; rollout cores {c.rolloutpipe.cpu.rollout_cores}, trainer cores "
          f"{c.rolloutpipe.cpu.trainer_cores}; loads go to core {trainer_core}", flush=True)
    ctx = mp.get_context("spawn")
    results: dict[str, list] = {k: [] for k in LOADS}
    try:
        wl = workload_for(setting["workload"], groups, n, seed=int(cfg.get("seed", 0)))
        warm = session.step(**mode_kwargs("sync"), sampling_overrides=exact_lengths(wl))  # warm-up, discarded
        # the load stops on a timer, not at the rollout's end: left on, it would time-slice the trainer's own core
        hog_s = args.hog_factor * warm["timeline"]["rollout_end_s"]
        print(f"warm-up rollout {warm['timeline']['rollout_end_s']:.2f}s; loads run {hog_s:.2f}s from each step's "
              "start", flush=True)
        for r in range(args.rounds):
            wl = workload_for(setting["workload"], groups, n, seed=int(cfg.get("seed", 0)) + 1 + r)
            for load in LOADS[r % 3:] + LOADS[:r % 3]:  # the order rotates, so drift hits every load alike
                go, proc = ctx.Event(), None
                if load != "none":
                    proc = ctx.Process(target=spin, args=(load, trainer_core, hog_s, go, None, args.hog_nice))
                    proc.start()
                    time.sleep(3.0)  # its interpreter and torch are up, waiting for the step
                go.set()
                try:
                    rec = session.step(**mode_kwargs("sync"), sampling_overrides=exact_lengths(wl))
                finally:
                    if proc is not None:
                        proc.join()
                tl = rec["timeline"]
                tokens = sum(sum(g) for g in wl.lengths)
                row = {"round": r, "load": load, "rollout_end_s": round(tl["rollout_end_s"], 3),
                       "tokens_per_s": round(tokens / tl["rollout_end_s"], 1)}
                results[load].append(row)
                print(json.dumps(row), flush=True)
    finally:
        session.close()
    base = statistics.mean(r["rollout_end_s"] for r in results["none"])
    for load in LOADS:
        mean = statistics.mean(r["rollout_end_s"] for r in results[load])
        print(json.dumps({"summary": load, "rollout_end_s_mean": round(mean, 3),
                          "vs_none": round(mean / base, 3), "rounds": len(results[load])}), flush=True)


if __name__ == "__main__":
    main()
