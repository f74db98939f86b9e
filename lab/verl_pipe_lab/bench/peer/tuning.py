"""The tuning sweep of verl's separate_async, analysed (tools/peer_tuning.sh runs it; docs/peer.md, "Tuning verl's
separate_async").

Pure: reads the peer runner's result JSONs (``python -m verl_pipe_lab.bench.peer --out``). Two kinds of comparison, both
paired on the same workload:

- ``poll``: the poll interval as a within-stack A/B (one stack, ``--workload-cycle 2``: consecutive measured steps
  share a workload, the arms alternating): per pair, the step at the tuned poll (0.1 s) minus the step at verl's
  (2 s);
- ``knob``: a knob's own stack against the tuned configuration's stacks run before and after it in the same window,
  measured step i of each on workload seed + i: per step, the knob's figure minus the mean of the two tuned stacks'.
  The two tuned stacks against each other (after − before) is the A/A: how far the window drifts on its own.

``python -m verl_pipe_lab.bench.peer.tuning DIR [--day DAY] --out OUT.json`` reads DIR/peer_tuning_{poll_ab,base_a,
storage8,workers8,base_b}_DAY.json, writes the comparisons and prints their table; readme_tables renders it into
docs/peer.md (kind ``peer_tuning``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from verl_pipe_lab.bench.peer.split import _pm, paired

METRICS = ("rollout_to_train_end_s", "step_wall_s", "trainer_wait_ratio")
KNOB_RUNS = {"storage8": "storage_units=8 (verl's default)", "workers8": "agent_workers=8 (verl's default)"}


def measured(result: dict) -> list[dict]:
    """The result's measured steps (warm-up dropped), in order."""
    return [r for r in result["steps"] if not r.get("warmup")]


def _first_unit_lag(m: dict) -> float:
    """Seconds between the first mini-batch's groups being done and its training starting (the poll's delay)."""
    return float(m["first_unit_start_s"]) - float(m["first_unit_ready_s"])


def _figure(step: dict, metric: str) -> float:
    return _first_unit_lag(step["metrics"]) if metric == "first_unit_lag_s" else float(step["metrics"][metric])


def poll_pairs(result: dict, cycle: int = 2, tuned: float = 0.1, verl: float = 2.0) -> dict:
    """The within-stack poll A/B: measured steps grouped by workload (``cycle`` consecutive steps each); in each group
    the step polled at ``tuned`` and the one at ``verl``. Per metric: B (tuned) − A (verl) per pair, paired."""
    steps = measured(result)
    pairs = []
    for i in range(0, len(steps) - cycle + 1, cycle):
        group = steps[i:i + cycle]
        by_poll = {float(s["poll_interval_s"]): s for s in group if s.get("poll_interval_s") is not None}
        if tuned in by_poll and verl in by_poll:
            first = float(group[0]["poll_interval_s"])
            pairs.append({"tuned": by_poll[tuned], "verl": by_poll[verl], "tuned_first": first == tuned})
    if not pairs:
        raise ValueError(f"poll A/B: no workload has a step at {tuned} s and one at {verl} s "
                         f"(steps' poll_interval_s: {[s.get('poll_interval_s') for s in steps]})")
    out = {"pairs": len(pairs), "tuned_first": [p["tuned_first"] for p in pairs], "a": f"poll {verl:g} s",
           "b": f"poll {tuned:g} s", "metrics": {}}
    for metric in METRICS + ("first_unit_lag_s",):
        out["metrics"][metric] = paired([_figure(p["verl"], metric) for p in pairs],
                                        [_figure(p["tuned"], metric) for p in pairs])
    return out


def knob_vs_base(knob: dict, bases: list[dict]) -> dict:
    """A knob's stack against the mean of the tuned stacks, measured step by measured step (same workload)."""
    runs = [measured(r) for r in bases]
    ks = measured(knob)
    n = min([len(ks)] + [len(r) for r in runs])
    if n == 0:
        raise ValueError("knob vs tuned: a run has no measured step")
    out = {"steps": n, "metrics": {}}
    for metric in METRICS + ("first_unit_lag_s",):
        base = [statistics.mean(_figure(r[i], metric) for r in runs) for i in range(n)]
        out["metrics"][metric] = paired(base, [_figure(ks[i], metric) for i in range(n)])
    return out


def analyse(runs: dict[str, dict]) -> dict:
    """``runs``: name → result (poll_ab, base_a, base_b, and any of KNOB_RUNS). The comparisons and the A/A."""
    out: dict = {"comparisons": []}
    if "poll_ab" in runs:
        out["comparisons"].append({"name": "poll_interval_s", "what": "poll 0.1 s vs verl's 2 s (within one stack)",
                                   **poll_pairs(runs["poll_ab"])})
    bases = [runs[b] for b in ("base_a", "base_b") if b in runs]
    if bases:
        for name, what in KNOB_RUNS.items():
            if name in runs:
                out["comparisons"].append({"name": name, "what": f"{what} vs tuned", **knob_vs_base(runs[name], bases)})
    if len(bases) == 2:
        a, b = (measured(r) for r in bases)
        n = min(len(a), len(b))
        out["aa"] = {"what": "tuned after the knobs vs tuned before them", "steps": n,
                     "metrics": {m: paired([_figure(a[i], m) for i in range(n)], [_figure(b[i], m) for i in range(n)])
                                 for m in METRICS + ("first_unit_lag_s",)}}
    out["startup_s"] = {k: r.get("startup_s") for k, r in runs.items()}
    return out


def table(analysis: dict) -> list[str]:
    """One row per comparison (the A/A last): rollout→train end, first unit's lag, trainer wait."""
    lines = ["| comparison (B vs A) | pairs | A r→train end | B r→train end | B − A | change | first-unit lag B − A "
             "| wait ratio B − A |", "|---|---|---|---|---|---|---|---|"]
    rows = list(analysis["comparisons"]) + ([dict(analysis["aa"], name="A/A")] if "aa" in analysis else [])
    for c in rows:
        r, lag, wait = (c["metrics"][m] for m in ("rollout_to_train_end_s", "first_unit_lag_s", "trainer_wait_ratio"))
        lines.append(f"| {c['what']} | {r['rounds']} | {r['a_mean']:.2f} s | {r['b_mean']:.2f} s | "
                     f"{_pm(r['diff_mean'], r['diff_se'])} | {_pm(r['change_pct'], r['change_se'], '.1f', '%')} | "
                     f"{_pm(lag['diff_mean'], lag['diff_se'])} | {_pm(wait['diff_mean'], wait['diff_se'], '.3f', '')} |")
    return lines


def load_dir(directory: str | Path, day: str) -> dict[str, dict]:
    runs = {}
    for name in ("poll_ab", "base_a", "base_b", *KNOB_RUNS):
        path = Path(directory) / f"peer_tuning_{name}_{day}.json"
        if path.exists():
            with open(path) as f:
                runs[name] = json.load(f)
    if not runs:
        raise SystemExit(f"tuning: no peer_tuning_*_{day}.json in {directory}")
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.peer.tuning", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--day", required=True, help="the DATE of tools/peer_tuning.sh's file names")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    analysis = analyse(load_dir(args.dir, args.day))
    analysis["source"] = {"dir": str(args.dir), "day": args.day}
    with open(args.out, "w") as f:
        json.dump(analysis, f, indent=1)
    print("\n".join(table(analysis)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
