"""``python -m verl_pipe_lab.bench.peer --steps 3 --config onpolicy|default [--bench quick] --out peer.json``

Runs verl's V1 separate_async trainer for real with a bench config's sizing and prints the per-step figures.
"""

from __future__ import annotations

import argparse
import json
import math
import signal

from verl_pipe_lab.bench.peer import CONFIGS, bench_spec, run_peer

# (metric, column header)
COLUMNS = (("step_wall_s", "wall"), ("rollout_to_train_end_s", "r→train"), ("trainer_wait_ratio", "wait"),
           ("first_unit_ready_s", "1st_ready"), ("first_unit_start_s", "1st_start"), ("rollout_end_s", "r_end"),
           ("trainer_busy_s", "busy"), ("step_time_s", "step"), ("weight_sync_s", "sync"),
           ("data_latency_s", "data_lat"))


def table(result: dict) -> str:
    lines = [f"== {result['mode']} ({result['config']}), start-up {result['startup_s']:.1f}s, "
             f"setting {result.get('setting')} (seconds; w: warm-up step, discarded by the bench)",
             "step " + "".join(f"{h:>10}" for _, h in COLUMNS) + "  versions"]
    for r in result["steps"]:
        m, wv = r["metrics"], r["weight_versions"]
        vals = "".join(f"{m.get(c, math.nan):>10.3f}" for c, _ in COLUMNS)
        versions = f"{wv.get('min_global_steps')}..{wv.get('max_global_steps')} on_policy={wv.get('on_policy')}"
        lines.append(f"{r['step']:>3}{'w' if r.get('warmup') else ' '} {vals}  {versions}")
    if result["steps"]:
        for k, why in result["steps"][0]["unavailable"].items():
            lines.append(f"unavailable {k}: {why}")
    return "\n".join(lines)


def _stop_on(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv=None) -> None:
    from verl_pipe_lab.bench.settings import CONF_DIR, load_config

    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.peer", description=__doc__)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="onpolicy")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bench", default="quick", help="bench YAML name in lab/verl_pipe_lab/bench/conf or a path")
    ap.add_argument("--setting", default=None,
                    help="the bench setting whose workload to use (default: the first longtail- one)")
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="steps run first and marked warmup (default: the bench config's warmup_steps)")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="a tuning knob on top of the configuration's (poll_interval_s, storage_units, agent_workers)")
    ap.add_argument("--workload-cycle", type=int, default=1,
                    help="consecutive measured steps that share a workload (an A/B whose arms cycle over the steps)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--log", default=None, help="write the runner's whole output here")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on)  # run_peer then stops the runner and its Ray cluster
    path = CONF_DIR / f"{args.bench}.yaml" if not args.bench.endswith(".yaml") else args.bench
    knobs = {}
    for kv in args.knob:
        k, sep, v = kv.partition("=")
        if not sep:
            ap.error(f"--knob {kv!r}: expected NAME=VALUE")
        # poll_interval_s=2,0.1: a list, cycled over the steps (warm-up included): a within-stack A/B
        knobs[k] = ([float(x) for x in v.split(",")] if "," in v else float(v)) if k == "poll_interval_s" else int(v)
    try:
        spec = bench_spec(args.config, args.steps, load_config(path), args.setting, args.warmup_steps, knobs or None)
    except ValueError as e:
        ap.error(str(e))
    if args.workload_cycle > 1:
        spec["workload_cycle"] = args.workload_cycle
    try:
        result = run_peer(spec, timeout_s=args.timeout, log=print, log_path=args.log)
    except KeyboardInterrupt as e:  # run_peer has stopped the runner and its Ray cluster
        print(f"[peer] stopped ({e or 'SIGINT'}): the runner and its Ray cluster are shut down", flush=True)
        raise SystemExit(130) from None
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))


if __name__ == "__main__":
    main()
