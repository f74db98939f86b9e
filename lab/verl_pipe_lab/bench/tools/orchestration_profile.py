"""Where the run's own orchestration spends its CPU, on the real stack, and what the rollout's cuts save.

    python -m verl_pipe_lab.bench orchestration_profile [--config lab/verl_pipe_lab/bench/conf/cpu_tiny.yaml] [--rounds 3] --out FILE.json
        [--pyspy-dir DIR]

Starts the bench config's first setting's stack (real Ray, vLLM, verl workers; the bench's own step, workload and
/proc sampler: lab/verl_pipe_lab/bench), runs a warm-up step, then

1. with ``--pyspy-dir``: one cgp step per variant under ``py-spy record`` (raw collapsed stacks, 100 Hz,
   non-blocking) of the driver (this process), the vLLM server actor and a reward worker, and a summary of where
   each spends its samples (these steps are left out of the figures below: py-spy shares the cores);
2. ``--rounds`` rounds of cgp steps, one per variant, the order rotating, each round on its own workload seed:
   CPU-seconds per step per process kind (cpu_sampler.step_cpu_seconds), rollout time, rollout->train end.

Variants, switched between steps on the live stack: ``verl`` (verl's and vLLM's defaults: vLLM detokenizes every
generated token and makes a cumulative output per engine step, verl pads through ``tokenizer.pad``), ``streamed``
(docs/cpu.md's first cuts: ``detokenize=False``, torch padding; outputs still per engine step) and ``cut`` (the
rollout as shipped, verl_pipe/rollout: also vLLM's final output only). Start-up settings (Ray's dashboard) cannot be
switched on a live stack; the bench before/after measures them (docs/cpu.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from verl_pipe_lab.bench.settings import CONF_DIR

VARIANTS = ("verl", "streamed", "cut")
PROFILED = ("driver", "ray::vLLMHttpServer", "ray::RewardLoopWorker")


def set_variant(session, variant: str) -> None:
    """Switches the live rollout between verl's defaults and the shipped cuts (same samples either way)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from vllm.sampling_params import RequestOutputKind

    rollout = session.trainer.rollout
    for key in ("detokenize", "output_kind"):
        rollout.sampling_params.pop(key, None)
    rollout.worker.__dict__.pop("_pad_token_ids", None)
    if variant in ("verl", "streamed"):
        rollout.sampling_params["output_kind"] = RequestOutputKind.CUMULATIVE
    if variant == "verl":
        rollout.sampling_params["detokenize"] = True
        rollout.worker._pad_token_ids = types.MethodType(AgentLoopWorker._pad_token_ids, rollout.worker)


def pids_of(kinds) -> dict[str, int]:
    from verl_pipe_lab.bench.cpu_sampler import DRIVER, snapshot

    out = {}
    for pid, _, kind, _ in snapshot(os.getpid()):
        if kind in kinds and kind not in out:
            out[kind] = pid
    out[DRIVER] = os.getpid()
    return out


def summarize_raw(path: Path, top: int = 25) -> dict:
    """Self and inclusive sample counts per function from py-spy's raw (collapsed) output (gzipped: ``.gz``)."""
    import gzip

    self_c, incl, total = collections.Counter(), collections.Counter(), 0
    text = gzip.open(path, "rt").read() if str(path).endswith(".gz") else Path(path).read_text()
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        frames = stack.split(";")
        total += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    return {"samples": total, "self": self_c.most_common(top), "inclusive": incl.most_common(top)}


def profiled_step(runner, session, wl, variant: str, out_dir: Path) -> dict:
    pyspy = str(Path(sys.executable).with_name("py-spy"))
    procs = {}
    for kind, pid in pids_of(PROFILED).items():
        f = out_dir / f"{variant}_{kind.replace('::', '_')}.txt"
        procs[kind] = (f, subprocess.Popen([pyspy, "record", "--pid", str(pid), "--rate", "100", "--nonblocking",
                                            "--format", "raw", "--threads", "-o", str(f)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(2.0)  # py-spy attached
    res = runner._step(session, "cgp", wl)
    out = {}
    for kind, (f, p) in procs.items():
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        out[kind] = summarize_raw(f) if f.exists() else {"error": "no output"}
    return {"variant": variant, "wall_s": res["metrics"]["wall_s"], "profiles": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench orchestration_profile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(CONF_DIR / "cpu_tiny.yaml"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pyspy-dir", default=None)
    args = ap.parse_args(argv)

    from verl_pipe_lab.bench.cpu_sampler import SamplerProcess, step_cpu_seconds
    from verl_pipe_lab.bench.run import BenchRunner
    from verl_pipe_lab.bench.settings import load_config, stack_of, stack_overrides, workload_for
    from verl_pipe.launch.session import PipeSession, compose

    cfg = load_config(args.config)
    setting = cfg["settings"][0]
    ckpt = tempfile.mkdtemp(prefix="verl_pipe_orch_")
    session = PipeSession(compose(stack_overrides(cfg, stack_of(setting, cfg)) + [f"trainer.default_local_dir={ckpt}"]))
    c = session.config
    B, n = int(c.data.train_batch_size), int(c.actor_rollout_ref.rollout.n)
    runner = BenchRunner(cfg, 1)
    sampler = SamplerProcess(os.getpid(), Path(ckpt) / "cpu_samples.jsonl")
    sampler.start()
    result = {"config": args.config, "setting": setting["name"], "rounds": args.rounds, "profiles": [], "steps": []}
    try:
        runner._step(session, "sync", workload_for(setting["workload"], B, n, seed=10_000))  # warm-up
        if args.pyspy_dir:
            out_dir = Path(args.pyspy_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            for v in VARIANTS:
                set_variant(session, v)
                result["profiles"].append(profiled_step(runner, session, workload_for(
                    setting["workload"], B, n, seed=20_000), v, out_dir))
        for r in range(args.rounds):
            wl = workload_for(setting["workload"], B, n, seed=int(cfg.get("seed", 0)) + r)
            for v in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:  # each variant in each place
                set_variant(session, v)
                res = runner._step(session, "cgp", wl)
                m = res["metrics"]
                result["steps"].append({"variant": v, "round": r, "wall_window": res["wall_window"],
                                        "rollout_s": m.get("rollout_end_s"), "wall_s": m["wall_s"],
                                        "rollout_to_train_end_s": m.get("rollout_to_train_end_s")})
                print(f"[orch] round {r} {v:5s} rollout {m.get('rollout_end_s', 0):.2f}s rollout->train end "
                      f"{m.get('rollout_to_train_end_s', 0):.2f}s", flush=True)
    finally:
        samples = sampler.stop()
        session.close()
    for st in result["steps"]:
        st["cpu_s"] = step_cpu_seconds(samples, [st["wall_window"]])
    result["summary"] = summary(result["steps"])
    result["loadavg_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return 0


def summary(steps: list[dict]) -> dict:
    """Per variant: mean CPU-s per step per process kind, rollout time, rollout->train end."""
    out = {}
    for v in VARIANTS:
        mine = [s for s in steps if s["variant"] == v]
        if not mine:
            continue
        kinds = {k for s in mine for k in s["cpu_s"]}
        out[v] = {"steps": len(mine),
                  "cpu_s_per_step": {k: sum(s["cpu_s"].get(k, 0.0) for s in mine) / len(mine) for k in sorted(kinds)},
                  "rollout_s": sum(s["rollout_s"] or 0.0 for s in mine) / len(mine),
                  "rollout_to_train_end_s": sum(s["rollout_to_train_end_s"] or 0.0 for s in mine) / len(mine)}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
