"""``python -m verl_pipe.bench.peer --steps 3 --config onpolicy|default [--bench quick] --out peer.json``

Runs verl's V1 separate_async trainer for real with a bench config's sizing and prints the per-step figures.
"""

from __future__ import annotations

import argparse
import json
import math

from verl_pipe.bench.peer import CONFIGS, bench_spec, run_peer

COLUMNS = ("step_wall_s", "rollout_to_train_end_s", "trainer_wait_ratio", "first_unit_ready_s",
           "first_unit_start_s", "rollout_end_s", "trainer_busy_s", "step_time_s", "weight_sync_s")


def table(result: dict) -> str:
    lines = [f"== {result['mode']} ({result['config']}), start-up {result['startup_s']:.1f}s, "
             f"setting {result.get('setting')}",
             "step " + " ".join(f"{c[:-2] if c.endswith('_s') else c:>22}" for c in COLUMNS) + "  versions"]
    for r in result["steps"]:
        m, wv = r["metrics"], r["weight_versions"]
        vals = " ".join(f"{m.get(c, math.nan):>22.3f}" for c in COLUMNS)
        lines.append(f"{r['step']:>3}{'w' if r.get('warmup') else ' '} {vals}  {wv.get('min_global_steps')}..{wv.get('max_global_steps')}"
                     f" on_policy={wv.get('on_policy')}")
    lines.append("w: warm-up step (discarded by the bench)")
    if result["steps"]:
        for k, why in result["steps"][0]["unavailable"].items():
            lines.append(f"unavailable {k}: {why}")
    return "\n".join(lines)


def main(argv=None) -> None:
    from verl_pipe.bench.run import CONF_DIR, load_config

    ap = argparse.ArgumentParser(prog="python -m verl_pipe.bench.peer", description=__doc__)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="onpolicy")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bench", default="quick", help="bench YAML name in verl_pipe/conf/bench or a path")
    ap.add_argument("--setting", default=None, help="the bench setting whose workload to use (default: first longtail-)")
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="steps run first and marked warmup (default: the bench config's warmup_steps)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--log", default=None, help="write the runner's whole output here")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    path = CONF_DIR / f"{args.bench}.yaml" if not args.bench.endswith(".yaml") else args.bench
    spec = bench_spec(args.config, args.steps, load_config(path), args.setting, args.warmup_steps)
    result = run_peer(spec, timeout_s=args.timeout, log=print, log_path=args.log)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))


if __name__ == "__main__":
    main()
