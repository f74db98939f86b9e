"""The soak benchmark: a long CGP+FGD run, with checkpoints and traces, that samples every process's resident memory
and the step time after each step, and reports how they grow per step (docs/reliability.md).

    python -m verl_pipe_lab.bench --soak 60 --out soak.json [hydra overrides ...]

One live stack (``PipeSession``: Ray, the vLLM server and engine, verl's workers) runs ``STEPS`` steps on the tiny
CPU default in ``rolloutpipe.mode=cgp`` with FGD and a long-tailed workload, saving a checkpoint every
``--save-freq`` steps and a Chrome trace per step. After every step it reads the RSS of this process and every
descendant (Ray's raylet and workers, vLLM's processes), summed per process kind. The first ``--skip`` steps
(allocator warm-up) are left out of the fit. A least-squares slope per kind, in MiB per step, with its standard
error; "flat" when the growth it predicts over the fitted steps is within 2 standard errors of zero or under 1% of
the kind's mean. The same for the step time (s per step). A benchmark, not a test: it prints figures, it asserts
nothing.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from pathlib import Path

SOAK_OVERRIDES = [
    "rolloutpipe.tiny_assets.warm_start.steps=0",  # lengths are forced (workload): the base model does
    "rolloutpipe.mode=cgp",
    "rolloutpipe.fgd.enable=true",
    "rolloutpipe.workload={kind: lognormal, median: 12, sigma: 0.8, rho: 0.7, cap: 32, seed: 0}",
    "trainer.test_freq=-1",
    "trainer.logger=[console]",
    "trainer.total_training_steps=100000",
    "trainer.max_actor_ckpt_to_keep=2",
]


# ---------------------------------------------------------------------------------------------- pure parts


def process_kind(name: str, cmdline: list[str]) -> str:
    """A stable label for a process: Ray's ``ray::<Actor>`` and vLLM's ``VLLM::<Proc>`` titles, else the program."""
    title = " ".join(cmdline) if cmdline else name
    m = re.match(r"^(ray::\w+|VLLM::\w+)", title)
    if m:
        return m.group(1)
    for part in cmdline[:3]:
        base = os.path.basename(part)
        if base in ("raylet", "gcs_server") or base.endswith(".py"):
            return base
        if part in ("-m",):
            continue
    return os.path.basename(cmdline[0]) if cmdline else name


def fit(xs: list[float], ys: list[float]) -> dict:
    """Least-squares line through (xs, ys): slope, its standard error, intercept, mean, growth over the range."""
    n = len(xs)
    if n < 3:
        raise ValueError(f"a slope needs at least 3 points, got {n}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("all x are equal")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    resid = [y - (intercept + slope * x) for x, y in zip(xs, ys)]
    se = math.sqrt(sum(r * r for r in resid) / (n - 2) / sxx)
    growth = slope * (max(xs) - min(xs))
    flat = abs(slope) <= 2 * se or abs(growth) <= 0.01 * abs(my)
    return {"slope": slope, "slope_se": se, "intercept": intercept, "mean": my, "growth_over_run": growth,
            "points": n, "flat": flat}


def analyze(samples: list[dict], skip: int) -> dict:
    """``samples``: per step {"step", "step_time_s", "rss_mib": {kind: MiB}}. The fits after the first ``skip``."""
    used = [s for s in samples[skip:]]
    if len(used) < 3:
        raise ValueError(f"{len(samples)} steps with --skip {skip} leave {len(used)} to fit; run more steps")
    steps = [float(s["step"]) for s in used]
    kinds = sorted({k for s in used for k in s["rss_mib"]})
    per_kind = {}
    for k in kinds:
        pts = [(st, s["rss_mib"][k]) for st, s in zip(steps, used) if k in s["rss_mib"]]
        if len(pts) >= 3:
            per_kind[k] = fit([p[0] for p in pts], [p[1] for p in pts])
    total = fit(steps, [sum(s["rss_mib"].values()) for s in used])
    step_time = fit(steps, [s["step_time_s"] for s in used])
    return {"fitted_steps": len(used), "skipped_steps": skip, "rss_total_mib": total, "rss_mib_by_kind": per_kind,
            "step_time_s": step_time, "memory_flat": total["flat"] and all(f["flat"] for f in per_kind.values())}


def format_report(result: dict) -> str:
    a = result["analysis"]
    lines = [f"[soak] {result['steps']} steps ({a['fitted_steps']} fitted after {a['skipped_steps']}), "
             f"cgp+fgd, checkpoint every {result['save_freq']} steps; slopes per step (± 1 s.e.)",
             f"  {'process kind':<32}{'mean MiB':>10}{'MiB/step':>12}{'± s.e.':>9}{'growth':>9}  flat"]
    rows = sorted(a["rss_mib_by_kind"].items(), key=lambda kv: -kv[1]["mean"])
    for kind, f in rows + [("TOTAL", a["rss_total_mib"])]:
        lines.append(f"  {kind:<32}{f['mean']:>10.1f}{f['slope']:>12.3f}{f['slope_se']:>9.3f}"
                     f"{f['growth_over_run']:>9.1f}  {'yes' if f['flat'] else 'NO'}")
    st = a["step_time_s"]
    lines.append(f"  step time: mean {st['mean']:.2f}s, slope {st['slope'] * 1000:+.1f} ± {st['slope_se'] * 1000:.1f} "
                 f"ms/step ({'flat' if st['flat'] else 'NOT flat'})")
    lines.append(f"  memory flat within noise: {'yes' if a['memory_flat'] else 'NO'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the run


def sample_rss() -> dict[str, float]:
    """MiB of resident memory of this process and all its descendants, summed per process kind."""
    import psutil

    me = psutil.Process()
    out: dict[str, float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            kind = "driver" if p.pid == me.pid else process_kind(p.name(), p.cmdline())
            out[kind] = out.get(kind, 0.0) + p.memory_info().rss / 2**20
        except psutil.Error:
            continue
    return out


def run_soak(steps: int, save_freq: int, overrides: list[str], log=print, provenance: dict | None = None) -> list[dict]:
    """``steps`` CGP+FGD steps on one live session, sampled after each. ``provenance``, when given, gets the
    composed config (``config``: provenance.stack_record) and the machine (``env``: provenance.env_info)."""
    from verl_pipe.launch.session import PipeSession, compose
    from verl_pipe.trainer.step_record import learning_metrics

    work = Path(tempfile.mkdtemp(prefix="verl_pipe_soak_"))
    composed = SOAK_OVERRIDES + [f"trainer.save_freq={save_freq}", f"trainer.default_local_dir={work / 'ckpt'}",
                                 f"rolloutpipe.trace_dir={work / 'trace'}", *overrides]
    cfg = compose(composed)
    if provenance is not None:
        from verl_pipe_lab.bench.provenance import env_info, stack_record

        provenance.update(config=stack_record(cfg, composed), env=env_info())
    session = PipeSession(cfg)
    log(f"[soak] stack up in {session.startup_s:.1f}s; checkpoints and traces in {work}")
    samples = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            rec = session.step()
            samples.append({"step": rec["step"], "step_time_s": time.perf_counter() - t0, "rss_mib": sample_rss(),
                            "learning": learning_metrics(rec["metrics"])})
            s = samples[-1]
            log(f"[soak] step {s['step']}: {s['step_time_s']:.2f}s, RSS total {sum(s['rss_mib'].values()):.0f} MiB")
    finally:
        session.close()
    return samples


def cli(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench --soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--soak", type=int, required=True, metavar="STEPS", help="steps to run (>= 40 for the report)")
    ap.add_argument("--out", required=True, help="write the samples and fits (JSON) here")
    ap.add_argument("--save-freq", type=int, default=10, help="checkpoint every this many steps")
    ap.add_argument("--skip", type=int, default=5, help="first steps left out of the fits (warm-up)")
    ap.add_argument("overrides", nargs="*", help="hydra overrides of the tiny CPU default")
    args = ap.parse_args(argv)
    return main(args.soak, args.out, args.save_freq, args.skip, args.overrides)


def main(steps: int, out: str, save_freq: int = 10, skip: int = 5, overrides: list[str] | None = None) -> int:
    if steps < skip + 3:
        raise SystemExit(f"--soak {steps}: needs at least --skip ({skip}) + 3 steps to fit a slope; >= 40 for the report")
    os.environ.setdefault("VERL_PIPE_CACHE", str(Path(__file__).resolve().parents[3] / ".cache" / "verl_pipe"))
    t0 = time.perf_counter()
    made: dict = {}
    samples = run_soak(steps, save_freq, overrides or [], provenance=made)
    result = {"steps": steps, "save_freq": save_freq, "overrides": SOAK_OVERRIDES + (overrides or []),
              "elapsed_s": time.perf_counter() - t0, "samples": samples, "analysis": analyze(samples, skip),
              **made}  # config: the composed rolloutpipe node and overrides; env: the machine
    print(format_report(result))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"[soak] wrote {out}")
    return 0
