"""Where a learning run's steps go: the per-step timeline of each run, read back from the learning bench's logs.

The learning bench (lab/verl_pipe_lab/bench/learn.py) keeps a few figures per step in its JSON; every step's whole metrics
line (verl's ``step:N - key:value - ...``, our ``rolloutpipe/*`` timeline among them: docs/metrics.md) is in the
part's log. This reads those lines back, labels each run by the bench's own ``[learn] MODE seed S step N`` lines,
and reports per mode what bounds the step:

- the rollout's end, the trainer's busy time (all of it, and the part while the rollout still ran), the first unit's
  readiness, the work left after the rollout (``last_unit_cost_s``), the step's ideal bound and its efficiency;
- the trainer's cost per 1,000 response tokens, against the same seed's sync run (``contention``: > 1 where work
  done beside the rollout costs more than sync's after it);
- ``uncontended_cut_pct``: the step the pipelined run would take if its trainer work cost what sync's costs,
  against sync's step: the step scaled by its bound with the trainer's time divided by the contention over its
  bound as measured (the bound ``max(rollout end + left-over work, first unit ready + busy)``, the timeline's ideal
  bound; the rollout as measured; the step's distance from its bound kept). An estimate of what the host's
  sharing costs the pipeline, not a measurement.

With ``--learn-json`` (the merged comparison), per window of steps and pipelined mode: the paired differences
against sync of the step time and of the mean response length (``drift``): a mode whose policy writes longer
responses gives each step more work, which eats into what pipelining saves.

Runs of a log that a later log reruns (same mode and seed) are superseded by the later one, as the bench's
``--merge --supersede`` does. verl's peer prints no ``rolloutpipe/*`` timeline and is left out.

    python -m verl_pipe_lab.bench.learn_budget docs/bench/logs/learn_chain_p0*_*.log --out budget.json
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from verl_pipe_lab.bench.learn_stats import AA_SEED_OFFSET, mean_sd
from verl_pipe.core.variants import BASE
from verl_pipe.plan.verl_log import parse_line

# per-step figures read from a metrics line: our name -> the metric's key
FIELDS = {
    "rollout_end_s": "rolloutpipe/rollout_end_s",
    "rollout_to_train_end_s": "rolloutpipe/rollout_to_train_end_s",
    "trainer_busy_s": "rolloutpipe/trainer_busy_s",
    "trainer_busy_in_rollout_s": "rolloutpipe/trainer_busy_in_rollout_s",
    "first_unit_ready_s": "rolloutpipe/first_unit_ready_s",
    "last_unit_cost_s": "rolloutpipe/last_unit_cost_s",
    "ideal_lower_bound_s": "rolloutpipe/ideal_lower_bound_s",
    "pipeline_efficiency": "rolloutpipe/pipeline_efficiency",
    "weight_sync_s": "rolloutpipe/weight_sync_s",
    "response_tokens": "rolloutpipe/response_tokens",
    "old_log_prob_s": "timing_s/old_log_prob",
}
_LABEL = re.compile(r"\[learn\] (\S+) seed (\d+) step \d+:")


def step_metrics(line: str) -> dict[str, float] | None:
    """The numeric metrics of one ``step:N - key:value - ...`` line, its step as ``step`` (None: not such a line);
    verl's console format, read as the planner reads a verl log (verl_pipe/plan/verl_log.py)."""
    parsed = parse_line(line)
    if parsed is None:
        return None
    return {**parsed[1], "step": float(parsed[0])}


def runs_of_log(lines) -> list[dict]:
    """The runs of one part's log, in order: {"mode", "seed", "steps": [per-step FIELDS]}; a run starts at its step 1
    and is named by the next ``[learn] MODE seed S`` line. Runs with no ``rolloutpipe/*`` timeline are dropped."""
    runs: list[dict] = []
    current: dict | None = None
    for line in lines:
        m = step_metrics(line)
        if m is not None:
            if m["step"] == 1 or current is None:
                current = {"mode": None, "seed": None, "steps": []}
                runs.append(current)
            if FIELDS["trainer_busy_s"] in m:
                current["steps"].append({"step": int(m["step"]), **{k: m.get(key, math.nan) for k, key in FIELDS.items()}})
        label = _LABEL.search(line)
        if label and current is not None and current["mode"] is None:
            current["mode"], current["seed"] = label.group(1), int(label.group(2))
    return [r for r in runs if r["steps"] and r["mode"] is not None]


def collect(paths: list[str], suffixes: dict[str, str] | None = None
            ) -> tuple[dict[tuple[str, int], dict], list[dict]]:
    """Every run of the logs by (mode, seed), a later log's run superseding an earlier one's; the superseded.
    ``suffixes``: a log's file name -> a suffix for its pipelined modes' names (a part run with other overrides,
    e.g. ``rolloutpipe.cgp.unit_fill=dispatch``, kept apart from the same mode's runs in other logs)."""
    kept: dict[tuple[str, int], dict] = {}
    superseded: list[dict] = []
    for path in paths:
        suffix = (suffixes or {}).get(Path(path).name, "")
        with open(path, errors="replace") as f:
            for run in runs_of_log(f):
                run["log"] = Path(path).name
                if run["mode"] != BASE:
                    run["mode"] += suffix
                key = (run["mode"], run["seed"])
                if key in kept:
                    old = kept[key]
                    superseded.append({"mode": old["mode"], "seed": old["seed"], "log": old["log"],
                                       "by": run["log"]})
                kept[key] = run
    return kept, superseded


def _finite_values(xs) -> list[float]:
    return [x for x in xs if not math.isnan(x)]


def _mean(xs) -> float:
    xs = _finite_values(xs)
    return mean_sd(xs)[0] if xs else math.nan


def _se(xs) -> float:
    xs = _finite_values(xs)
    return mean_sd(xs)[1] / math.sqrt(len(xs)) if len(xs) >= 2 else math.nan


def run_summary(run: dict) -> dict[str, float]:
    """A run's means over its steps, its trainer cost per 1,000 response tokens."""
    steps = run["steps"]
    out = {k: _mean(s[k] for s in steps) for k in FIELDS}
    out["trainer_s_per_1k_tokens"] = 1000 * _mean(s["trainer_busy_s"] / s["response_tokens"] for s in steps
                                                  if s["response_tokens"] > 0)
    return out


def _bound(s: dict[str, float], contention: float = 1.0) -> float:
    return max(s["rollout_end_s"] + s["last_unit_cost_s"] / contention,
               s["first_unit_ready_s"] + s["trainer_busy_s"] / contention)


def uncontended_step_s(s: dict[str, float], contention: float) -> float:
    """The step with the trainer's time divided by ``contention`` (the rollout as measured), at the step's measured
    distance from its bound."""
    return s["rollout_to_train_end_s"] * _bound(s, contention) / _bound(s)


def budget(kept: dict[tuple[str, int], dict]) -> dict:
    """Per mode: the means over its runs (± se over runs) and, for the pipelined modes, the paired figures against
    the same seed's sync run."""
    summaries = {key: run_summary(run) for key, run in kept.items()}
    modes = sorted({m for m, _ in summaries}, key=lambda m: (m != BASE, m))
    out: dict = {}
    for mode in modes:
        seeds = sorted(s for m, s in summaries if m == mode)
        rows = [summaries[(mode, s)] for s in seeds]
        entry = {"seeds": seeds, "runs": len(rows),
                 "mean": {k: _mean(r[k] for r in rows) for k in rows[0]},
                 "se": {k: _se([r[k] for r in rows]) for k in rows[0]}}
        if mode != BASE:
            paired = [(summaries[(mode, s)], summaries[(BASE, s)]) for s in seeds if (BASE, s) in summaries]
            if paired:
                contention = [p["trainer_s_per_1k_tokens"] / b["trainer_s_per_1k_tokens"] for p, b in paired]
                cut = [100 * (p["rollout_to_train_end_s"] / b["rollout_to_train_end_s"] - 1) for p, b in paired]
                bound = [100 * (uncontended_step_s(p, c) / b["rollout_to_train_end_s"] - 1)
                         for (p, b), c in zip(paired, contention)]
                stretch = [p["rollout_end_s"] / b["rollout_end_s"] for p, b in paired]
                tokens = [100 * (p["response_tokens"] / b["response_tokens"] - 1) for p, b in paired]
                entry["vs_sync"] = {
                    "pairs": len(paired),
                    "contention": {"mean": _mean(contention), "se": _se(contention)},
                    "rollout_stretch": {"mean": _mean(stretch), "se": _se(stretch)},
                    "step_cut_pct": {"mean": _mean(cut), "se": _se(cut)},
                    "response_tokens_pct": {"mean": _mean(tokens), "se": _se(tokens), "pairs": tokens},
                    "uncontended_cut_pct": {"mean": _mean(bound), "se": _se(bound)},
                }
        out[mode] = entry
    return out


AA = f"{BASE} (A/A)"  # drift's row of the A/A arm: sync at seed s + AA_SEED_OFFSET against sync at seed s


def drift(learn: dict, windows: list[tuple[int, int]]) -> dict:
    """Per pipelined mode (and the A/A arm, ``AA``) and window of steps [a, b) (0-based): the paired % differences
    against sync at the same seed (main arm) of the summed step time and the mean response length; mean and se over
    the seeds."""
    runs = {(r["mode"], r["seed"]): r for r in learn["runs"] if r.get("arm", "main") == "main"}
    aa = [r for r in learn["runs"] if r.get("arm") == "aa"]
    for r in aa:
        runs[(AA, int(r["seed"]) - AA_SEED_OFFSET)] = r
    out: dict = {}
    for mode in sorted({m for m, _ in runs if m != BASE}, key=lambda m: (m == AA, m)):
        seeds = sorted(s for m, s in runs if m == mode and (BASE, s) in runs)
        rows = []
        for a, b in windows:
            step, length = [], []
            for seed in seeds:
                p, q = runs[(mode, seed)]["steps"][a:b], runs[(BASE, seed)]["steps"][a:b]
                if not p or len(p) != len(q):
                    continue
                step.append(100 * (sum(x["step_s"] for x in p) / sum(x["step_s"] for x in q) - 1))
                length.append(100 * (sum(x["response_length"] for x in p) / sum(x["response_length"] for x in q) - 1))
            rows.append({"steps": [a + 1, b], "pairs": len(step),
                         "step_time_pct": {"mean": _mean(step), "se": _se(step)},
                         "response_length_pct": {"mean": _mean(length), "se": _se(length)}})
        out[mode] = rows
    return out


def _finite(x):
    """NaN (a figure with too few runs, e.g. the se of one pair) as JSON null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.learn_budget", description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+", help="the learning bench's part logs, in the order they ran")
    ap.add_argument("--out", help="write the budget as JSON here")
    ap.add_argument("--suffix", action="append", default=[], metavar="LOG=SUFFIX",
                    help="name the pipelined modes of log file LOG with SUFFIX appended (repeatable)")
    ap.add_argument("--max-step", type=int, help="only steps 1..N of every run (runs cut short compared alike)")
    ap.add_argument("--learn-json", help="the merged learning comparison: the step-time and length drift per window")
    ap.add_argument("--window", type=int, default=10, help="steps per drift window (default 10)")
    args = ap.parse_args(argv)
    bad = [x for x in args.suffix if "=" not in x]
    if bad:
        ap.error(f"--suffix: {bad[0]!r} is not LOG=SUFFIX")
    kept, superseded = collect(args.logs, dict(x.split("=", 1) for x in args.suffix))
    if args.max_step is not None:
        for run in kept.values():
            run["steps"] = [st for st in run["steps"] if st["step"] <= args.max_step]
    if not kept:
        print("no run with a rolloutpipe timeline in the logs", file=sys.stderr)
        return 1
    result = {"logs": [Path(p).name for p in args.logs], "suffixes": args.suffix, "max_step": args.max_step,
              "superseded": superseded,
              "modes": budget(kept)}
    for mode, e in result["modes"].items():
        m = e["mean"]
        line = (f"{mode:8s} runs {e['runs']}: step {m['rollout_to_train_end_s']:.2f}s | rollout end "
                f"{m['rollout_end_s']:.2f}s | trainer busy {m['trainer_busy_s']:.2f}s ({m['trainer_busy_in_rollout_s']:.2f}s "
                f"in the rollout; old log-probs {m['old_log_prob_s']:.2f}s) | first unit {m['first_unit_ready_s']:.2f}s | "
                f"left after the rollout {m['last_unit_cost_s']:.2f}s | efficiency {m['pipeline_efficiency']:.3f} | "
                f"{m['response_tokens']:.0f} response tokens, {m['trainer_s_per_1k_tokens']:.3f} trainer s per 1k")
        vs = e.get("vs_sync")
        if vs:
            line += (f"\n         vs sync (n={vs['pairs']}): contention x{vs['contention']['mean']:.2f} ± "
                     f"{vs['contention']['se']:.2f}, rollout x{vs['rollout_stretch']['mean']:.2f}, response tokens "
                     f"{vs['response_tokens_pct']['mean']:+.1f}%, step "
                     f"{vs['step_cut_pct']['mean']:+.1f}% ± {vs['step_cut_pct']['se']:.1f}%, uncontended "
                     f"{vs['uncontended_cut_pct']['mean']:+.1f}% ± {vs['uncontended_cut_pct']['se']:.1f}%")
        print(line)
    if args.learn_json:
        learn = json.loads(Path(args.learn_json).read_text())
        steps = int(learn["steps"])
        windows = [(a, min(a + args.window, steps)) for a in range(0, steps, args.window)] + [(0, steps)]
        result["learn_json"] = Path(args.learn_json).name
        result["drift"] = drift(learn, windows)
        for mode, rows in result["drift"].items():
            for r in rows:
                print(f"{mode:8s} steps {r['steps'][0]}-{r['steps'][1]} vs sync (n={r['pairs']}): step time "
                      f"{r['step_time_pct']['mean']:+.1f}% ± {r['step_time_pct']['se']:.1f}%, response length "
                      f"{r['response_length_pct']['mean']:+.1f}% ± {r['response_length_pct']['se']:.1f}%")
    if args.out:
        Path(args.out).write_text(json.dumps(_finite(result), indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
