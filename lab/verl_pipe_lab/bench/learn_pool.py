"""Every registered attempt of a learning comparison, pooled: the figure a headline may quote.

    python -m verl_pipe_lab.bench.learn_pool A.json B.json ... [--mode cgp_fgd] [--base sync] --out POOLED.json

The A/A (sync against sync at seed + 100) goes through the same arithmetic: the noise floor of each figure.
Each input is one registered attempt's merged result (``python -m verl_pipe_lab.bench --learn``): its runs paired by seed,
``mode`` against ``base``, on its own host. Per attempt, as the bench reports it (learn_stats.paired: the relative
difference of the means with its delta-method standard error): time to the attempt's target (sync's final accuracy
less the margin), training time per step, end-to-end time (start-up, training and validation: the run's elapsed time)
and steps to the target. Pooled: stratified by attempt (each attempt's own host and target), weighted by its pairs,
    pooled = sum(n_i r_i) / N,   se = sqrt(sum((n_i / N)^2 se_i^2)),
beside the spread of the attempts (the host is a block: figures differ between hosts) and the standard error of the
attempts' unweighted mean from their own scatter (``se_between``: the honest one when the attempts disagree by more
than their standard errors). Pure: reads JSONs.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from verl_pipe_lab.bench import learn_stats as st

FIGURES = ("time_to_target", "step_time", "end_to_end", "steps_to_target")


def _host(result: dict) -> dict:
    env = result.get("env") or {}
    info = env.get("cpu_info") or {}
    flags = [k for k, v in (info.get("flags") or {}).items() if v]
    return {"cpu": env.get("cpu"), "flags": flags,
            "fp32_gflops_1thread": (info.get("matmul_1thread") or {}).get("fp32_gflops")}


def attempt(result: dict, mode: str, base: str = "sync", name: str | None = None, aa: bool = False) -> dict:
    """One attempt's paired figures, ``mode`` against ``base`` (main arms, paired by seed); ``aa``: the A/A instead,
    ``base``'s A/A arm (seed s + 100) against its main arm (seed s), through the same arithmetic."""
    main = [r for r in result["runs"] if r.get("arm", "main") == "main"]
    if aa:
        mode = base
        theirs = [r for r in result["runs"] if r.get("arm") == "aa" and r["mode"] == base]
        pairs = [(a, b) for b, a in st.pair_by_seed([r for r in main if r["mode"] == base], theirs,
                                                     offset=st.aa_seed(0))]
    else:
        pairs = st.pair_by_seed([r for r in main if r["mode"] == mode], [r for r in main if r["mode"] == base])
    if len(pairs) < 2:
        raise ValueError(f"{name or 'attempt'}: {len(pairs)} pairs of {mode} and {base} (need >= 2)")
    by_run = result["comparison"]["runs"]

    def ttt(r):
        return by_run[f"{r['mode']}/{r.get('arm', 'main')}/{r['seed']}"]

    out = {"name": name, "aa": aa, "n": len(pairs), "seeds": [a["seed"] for a, _ in pairs], "host": _host(result),
           "target_val_acc": result["comparison"].get("target_val_acc"),
           "unit_fill": sorted({str(a.get("unit_fill")) for a, _ in pairs}),
           "censored": sum(not ttt(r)["reached"] for p in pairs for r in p)}
    out["time_to_target"] = st.paired([ttt(a)["time_to_target_s"] for a, _ in pairs],
                                      [ttt(b)["time_to_target_s"] for _, b in pairs])
    out["steps_to_target"] = st.paired([ttt(a)["steps_to_target"] for a, _ in pairs],
                                       [ttt(b)["steps_to_target"] for _, b in pairs])
    out["step_time"] = st.paired([st.step_time_s(a) for a, _ in pairs], [st.step_time_s(b) for _, b in pairs])
    out["end_to_end"] = st.paired([float(a["elapsed_s"]) for a, _ in pairs], [float(b["elapsed_s"]) for _, b in pairs])
    return out


def pooled(attempts: list[dict]) -> dict:
    """Stratified over attempts: each figure's relative difference (and, for steps to target, the difference in
    steps), weighted by pairs, its standard error, and the attempts' range."""
    total = sum(a["n"] for a in attempts)
    out = {"attempts": len(attempts), "pairs": total}
    for fig in FIGURES:
        key, se_key = ("diff", "diff_se") if fig == "steps_to_target" else ("relative", "relative_se")
        vals = [(a["n"], a[fig][key], a[fig][se_key]) for a in attempts]
        k = len(vals)
        between = st.mean_sd([v for _, v, _ in vals])[1] / math.sqrt(k) if k > 1 else float("nan")
        out[fig] = {"estimate": sum(n * v for n, v, _ in vals) / total,
                    "se": math.sqrt(sum((n / total) ** 2 * se ** 2 for n, _, se in vals)), "se_between": between,
                    "range": [min(v for _, v, _ in vals), max(v for _, v, _ in vals)],
                    "scale": "steps" if fig == "steps_to_target" else "relative"}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.learn_pool", description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+", help="each registered attempt's merged learning JSON")
    p.add_argument("--mode", default="cgp_fgd")
    p.add_argument("--base", default="sync")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    attempts = [attempt(json.loads(Path(f).read_text()), args.mode, args.base, name=f) for f in args.results]
    aas = [attempt(json.loads(Path(f).read_text()), args.mode, args.base, name=f, aa=True) for f in args.results]
    report = {"mode": args.mode, "base": args.base, "method": "stratified by attempt, weighted by pairs",
              "per_attempt": attempts, "pooled": pooled(attempts), "aa_per_attempt": aas, "aa_pooled": pooled(aas)}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for a in attempts:
        print(f"{a['name']}: n={a['n']} ({a['host']['cpu']}) time to target {a['time_to_target']['relative']:+.1%} "
              f"± {a['time_to_target']['relative_se']:.1%}, step {a['step_time']['relative']:+.1%} ± "
              f"{a['step_time']['relative_se']:.1%}, end to end {a['end_to_end']['relative']:+.1%} ± "
              f"{a['end_to_end']['relative_se']:.1%}")
    for label, pool in (("pooled", report["pooled"]), ("A/A pooled", report["aa_pooled"])):
        print(f"{label} ({pool['pairs']} pairs, {pool['attempts']} attempts): " + ", ".join(
            f"{f} {pool[f]['estimate']:+.3g} ± {pool[f]['se']:.2g} (between attempts ± {pool[f]['se_between']:.2g}) "
            f"[{pool[f]['range'][0]:+.3g}, {pool[f]['range'][1]:+.3g}]" for f in FIGURES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
