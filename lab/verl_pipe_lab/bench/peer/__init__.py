"""verl 0.9.1's own V1 ``separate_async`` trainer as a measured benchmark peer (docs/peer.md).

``run_peer(config, steps, bench_cfg, setting)`` runs it for real (vLLM, FSDP, Ray, TransferQueue) in a
subprocess with its own Ray cluster (``runner``), with the bench's overrides, model size and response-length
workload, and returns a mode entry:

    {"mode": "verl_separate_async" | "verl_separate_async_1off", "config": ..., "startup_s": ...,
     "steps": [{"step": k, "metrics": {metric: value}, "unavailable": {metric: reason},
                "weight_versions": {...}, "verl_timing_s": {...}, "verl_metrics": {...}}, ...]}

Modules: ``configs`` (the two configurations -> Hydra overrides), ``hooks`` (subclasses of verl's trainer and
agent-loop classes that record events), ``metrics`` (pure mapping onto StepTimeline metrics), ``runner`` (the
subprocess), ``__main__`` (CLI).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from verl_pipe_lab.bench.peer.configs import CONFIGS, MODE_NAMES


def bench_spec(config: str, steps: int, bench_cfg: dict, setting: str | None = None,
               warmup_steps: int | None = None, knobs: dict | None = None) -> dict:
    """The runner's spec for one configuration with a bench YAML's sizing (lab/verl_pipe_lab/bench/conf/*.yaml):
    its overrides, model size, seed and the workload of ``setting`` (default: the first longtail- setting).
    ``warmup_steps`` (default: the bench's ``warmup_steps``) run first and come back marked ``warmup``.
    ``knobs``: tuning knobs on top of the configuration's (configs.KNOBS; a tuning A/B)."""
    from verl_pipe_lab.bench.peer.configs import knobs_of

    if config not in CONFIGS:
        raise ValueError(f"--config {config!r}: expected one of {sorted(CONFIGS)}")
    knobs_of(config, knobs)  # unknown or bad knobs fail here, before a stack starts
    if steps < 1:
        raise ValueError(f"--steps {steps}: expected >= 1")
    warmup = int(bench_cfg.get("warmup_steps", 0) if warmup_steps is None else warmup_steps)
    if warmup < 0:
        raise ValueError(f"warmup_steps={warmup}: expected >= 0")
    settings = bench_cfg.get("settings") or []
    if setting is None:
        chosen = next((s for s in settings if s["name"].startswith("longtail-")), settings[0] if settings else None)
    else:
        chosen = next((s for s in settings if s["name"] == setting), None)
        if chosen is None:
            names = [s["name"] for s in settings]
            raise ValueError(f"--setting {setting!r}: not in the bench config (have {names})")
    from verl_pipe_lab.bench.settings import stack_of, stack_overrides

    # the same stack as our modes on that setting (its model size, and a named stack's own overrides)
    stack = stack_of(chosen, bench_cfg) if chosen else bench_cfg.get("model_size", "bench")
    return {"config": config, "steps": int(steps) + warmup, "warmup_steps": warmup,
            "overrides": stack_overrides(bench_cfg, stack), "seed": int(bench_cfg.get("seed", 0)),
            "workload": dict(chosen["workload"]) if chosen else None, "setting": chosen["name"] if chosen else None,
            "model_size": stack, **({"knobs": dict(knobs)} if knobs else {})}


def stop_runner(proc: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM first: the runner then shuts its Ray cluster down (runner.run's finally); after ``grace_s``,
    SIGKILL to its whole session (it was started with start_new_session, so this is only what it started)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_peer(spec: dict, timeout_s: float | None = 1800, log=None, log_path: str | None = None) -> dict:
    """Runs ``runner`` on ``spec`` in a subprocess (its own Ray cluster, torn down when it exits); returns its
    mode entry. ``log`` gets the runner's [peer] lines, ``log_path`` its whole output. Raises RuntimeError
    with the output's tail if it fails."""
    with tempfile.TemporaryDirectory(prefix="verl_pipe_peer_") as d:
        spec_path, out_path = Path(d) / "spec.json", Path(d) / "out.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "verl_pipe_lab.bench.peer.runner", str(spec_path), str(out_path)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ), start_new_session=True)
        tail: list[str] = []
        full = open(log_path, "w") if log_path else None
        try:
            for line in proc.stdout:
                tail = (tail + [line])[-80:]
                if full is not None:
                    full.write(line)
                if log is not None and line.startswith("[peer]"):
                    log(line.rstrip())
            rc = proc.wait(timeout=timeout_s)
        except BaseException:  # interrupted (Ctrl-C, SIGTERM via the CLI) or timed out
            stop_runner(proc)
            raise
        finally:
            if full is not None:
                full.close()
        if rc != 0 or not out_path.exists():
            raise RuntimeError(f"verl peer ({spec['config']}) failed with exit code {rc}:\n"
                               + "".join(tail))
        result = json.loads(out_path.read_text())
    result.update(setting=spec.get("setting"), model_size=spec.get("model_size"))
    return result


__all__ = ["CONFIGS", "MODE_NAMES", "bench_spec", "run_peer"]
