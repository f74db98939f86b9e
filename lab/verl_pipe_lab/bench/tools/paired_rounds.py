"""Per-round paired differences between two modes of a bench run, from its steps file.

The bench interleaves the modes within each round on the same workload, so the difference of two modes in the
same round cancels most of the host's drift between rounds; this prints, per setting, those differences of
``rollout_to_train_end_s`` (B minus A), their mean (also relative to A's mean), the standard error of the mean, and
vLLM's preemptions per step of both where they were counted. ``docs/fgd.md`` quotes its output. With ``--lengths``,
also the length predictions' rank correlation against the actual group means, per setting and source, pooled over
every step of the setting (the steps' ``length_predictions``, verl_pipe/core/lengths.py). With ``--across A,B``, the
differences of each mode between two settings run in the same bench (setting B minus setting A, round by round, e.g.
``rolloutpipe.fgd.lengths`` predicted against off), instead of between two modes.

    python -m verl_pipe_lab.bench paired_rounds docs/bench/bench_queue_rotated_steps_2026-12-02.json.gz \
        [--a cgp --b cgp_fgd]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics


def load_steps(path: str) -> list[dict]:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)["steps"]


def paired(steps: list[dict], a: str, b: str, key: str = "rollout_to_train_end_s") -> dict[str, dict]:
    """{setting: {"diffs": [b - a per round], "mean", "rel_pct", "se", "preemptions": [(a, b) per round]}}."""
    by = {(st["setting"], st["round"], st["mode"]): st["metrics"] for st in steps}
    out = {}
    for name in sorted({k[0] for k in by}):
        rounds = sorted(r for (s, r, m) in by if s == name and m == a and (s, r, b) in by)
        if not rounds:
            continue
        diffs = [by[(name, r, b)][key] - by[(name, r, a)][key] for r in rounds]
        base = statistics.mean(by[(name, r, a)][key] for r in rounds)
        se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
        out[name] = {"rounds": rounds, "diffs": diffs, "mean": statistics.mean(diffs),
                     "rel_pct": 100 * statistics.mean(diffs) / base, "se": se,
                     "preemptions": [tuple(by[(name, r, m)].get("vllm_preemptions") for m in (a, b)) for r in rounds]}
    return out


def across(steps: list[dict], a: str, b: str, key: str = "rollout_to_train_end_s") -> dict[str, dict]:
    """{mode: paired differences of setting ``b`` minus setting ``a`` per round} (``paired``'s fields)."""
    by_mode = [dict(st, setting=st["mode"], mode=st["setting"]) for st in steps if st["setting"] in (a, b)]
    return paired(by_mode, a, b, key)


def length_quality(steps: list[dict]) -> dict[str, dict]:
    """{setting: prediction_quality over its steps' groups} (steps recorded with ``length_predictions``)."""
    from verl_pipe.core.lengths import prediction_quality

    out: dict[str, list] = {}
    for st in steps:
        out.setdefault(st["setting"], []).extend(st.get("length_predictions") or [])
    return {name: prediction_quality(recs) for name, recs in out.items() if recs}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench paired_rounds", description=__doc__.splitlines()[0])
    ap.add_argument("steps_file")
    ap.add_argument("--a", default="cgp")
    ap.add_argument("--b", default="cgp_fgd")
    ap.add_argument("--across", metavar="A,B", help="each mode's setting B minus setting A instead of two modes")
    ap.add_argument("--lengths", action="store_true", help="also the length predictions' rank correlation per source")
    args = ap.parse_args(argv)
    steps = load_steps(args.steps_file)
    if args.lengths:
        for name, q in length_quality(steps).items():
            print(f"{name}: rank correlation predicted vs actual: " + ", ".join(
                f"{src} {v['rank_correlation']:.2f} ({v['groups']} groups)" if v["rank_correlation"] is not None
                else f"{src} - ({v['groups']} groups)" for src, v in q.items()))
    a, b = args.across.split(",") if args.across else (args.a, args.b)
    if args.across and not {a, b} <= {st["setting"] for st in steps}:
        raise SystemExit(f"--across: settings {a!r}, {b!r} are not both in {args.steps_file}")
    for name, p in (across(steps, a, b) if args.across else paired(steps, a, b)).items():
        print(f"{name}: {b} - {a} per round {[round(x, 2) for x in p['diffs']]} s; mean {p['mean']:+.2f} s "
              f"({p['rel_pct']:+.1f}%), standard error {p['se']:.2f} s; preemptions per step ({a}, {b}) "
              f"{p['preemptions']}")


if __name__ == "__main__":
    main()
