"""Each gain split into its sources, from a bench results JSON whose setting ran our modes and verl's trainers
(lab/verl_pipe_lab/bench/conf/peer_split_*.yaml; docs/peer.md, "Where the gain comes from").

Pure (reads the results' ``per_run`` figures: rollout→train end per round, rounds in the same order for every mode,
round r = the bench's workload seed + r for ours and verl's alike). Every comparison is paired by round: the
difference B − A of the same round's workload, its mean and the standard error of that mean over the rounds; the
gains are per round too (1 − B/A), so a gain's standard error is that of the per-round gains.

- stack: our sync against verl's own synchronous trainer on the same separate pools (``verl_separate_sync``);
- pipelining: each framework's pipelined mode against its own sync (ours: cgp and cgp+fgd against sync; verl's:
  separate_async on-policy, tuned, against its separate sync), and the difference of the two gains in points;
- admission: cgp+fgd against cgp alone;
- our lead over verl's best pipelined trainer, split exactly into plumbing (the stacks on the same synchronous
  schedule) and pipelining (our pipelining's saving minus verl's), round by round (``lead_sources``);
- split against colocated: on the same two cores, each split trainer against verl's colocated sync
  (``verl_colocated``, main_ppo's default: rollout and training take turns on both cores).

``python -m verl_pipe_lab.bench.peer.split RESULT.json`` prints the tables; readme_tables renders them into docs/peer.md
(kind ``gain_split``).
"""

from __future__ import annotations

import json
import math
import statistics
import sys

KEY = "rollout_to_train_end_s"
OURS_PIPE = "cgp_fgd"
VERL_PIPE = "verl_separate_async_tuned"
VERL_SYNC = "verl_separate_sync"
COLOCATED = "verl_colocated"
TARGET_POINTS = 10.0  # our pipelining gain over our sync must exceed verl's over its own sync by this many points

# (group, label, A, B): the row's question is "B against A", its change (B − A) / A.
COMPARISONS = (
    ("stack", "our sync vs verl's separate sync", VERL_SYNC, "sync"),
    ("pipelining, ours", "cgp vs our sync", "sync", "cgp"),
    ("pipelining, ours", "cgp + fgd vs our sync", "sync", OURS_PIPE),
    ("pipelining, verl", "separate_async on-policy vs verl's separate sync", VERL_SYNC, "verl_separate_async"),
    ("pipelining, verl", "separate_async tuned vs verl's separate sync", VERL_SYNC, VERL_PIPE),
    ("admission", "cgp + fgd vs cgp", "cgp", OURS_PIPE),
    ("split vs colocated", "our sync vs verl colocated", COLOCATED, "sync"),
    ("split vs colocated", "cgp + fgd vs verl colocated", COLOCATED, OURS_PIPE),
    ("split vs colocated", "verl separate sync vs verl colocated", COLOCATED, VERL_SYNC),
    ("split vs colocated", "verl separate_async tuned vs verl colocated", COLOCATED, VERL_PIPE),
    ("absolute", "cgp + fgd vs verl separate_async tuned", VERL_PIPE, OURS_PIPE),
)


def per_round(setting: dict, mode: str) -> list[float] | None:
    """The mode's rollout→train end per round (None: the mode did not run on this setting)."""
    e = setting["modes"].get(mode)
    if not e or "skipped" in e or not e.get("per_run"):
        return None
    return [float(r[KEY]) for r in e["per_run"]]


def _mean_se(xs: list[float]) -> tuple[float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan)


def paired(a: list[float], b: list[float]) -> dict:
    """B − A per round (the first min(len) rounds), its mean and standard error, and the per-round change in %."""
    n = min(len(a), len(b))
    diffs = [b[i] - a[i] for i in range(n)]
    changes = [100.0 * (b[i] / a[i] - 1.0) for i in range(n)]
    mean, se = _mean_se(diffs)
    cmean, cse = _mean_se(changes)
    return {"rounds": n, "a_mean": statistics.mean(a[:n]), "b_mean": statistics.mean(b[:n]), "diffs": diffs,
            "diff_mean": mean, "diff_se": se, "change_pct": cmean, "change_se": cse}


def gain_split(setting: dict) -> dict:
    """The setting's comparisons (those whose two modes ran) and the pipelining target's figures."""
    rows = []
    for group, label, a, b in COMPARISONS:
        ra, rb = per_round(setting, a), per_round(setting, b)
        if ra is None or rb is None:
            continue
        rows.append({"group": group, "label": label, "a": a, "b": b, **paired(ra, rb)})
    out = {"setting": setting["name"], "rows": rows}
    ours = [per_round(setting, m) for m in ("sync", OURS_PIPE)]
    verl = [per_round(setting, m) for m in (VERL_SYNC, VERL_PIPE)]
    if None not in ours and None not in verl:
        n = min(len(x) for x in ours + verl)
        g_ours = [100.0 * (1.0 - ours[1][i] / ours[0][i]) for i in range(n)]
        g_verl = [100.0 * (1.0 - verl[1][i] / verl[0][i]) for i in range(n)]
        d = [g_ours[i] - g_verl[i] for i in range(n)]
        out["pipelining_points"] = {"ours": _mean_se(g_ours), "verl": _mean_se(g_verl), "difference": _mean_se(d),
                                    "target": TARGET_POINTS, "met": statistics.mean(d) >= TARGET_POINTS}
    lead = lead_sources(setting)
    if lead:
        out["lead"] = lead
    absolute = {}
    for other in (VERL_PIPE, COLOCATED):
        ra, rb = per_round(setting, other), per_round(setting, OURS_PIPE)
        if ra is not None and rb is not None:
            p = paired(ra, rb)
            absolute[other] = {"diff_mean": p["diff_mean"], "diff_se": p["diff_se"], "met": p["diff_mean"] < 0}
    out["absolute"] = absolute
    return out


def lead_sources(setting: dict) -> dict | None:
    """Our lead over verl's best pipelined trainer (tuned separate_async − cgp + fgd, per round) split exactly into
    plumbing (verl's separate sync − our sync: the two stacks on the same synchronous schedule) and pipelining
    (what our pipelining saves over our sync minus what verl's saves over its own): lead = plumbing + pipelining in
    every round. Seconds, mean ± standard error over the rounds; None where one of the four modes did not run."""
    runs = [per_round(setting, m) for m in ("sync", OURS_PIPE, VERL_SYNC, VERL_PIPE)]
    if None in runs:
        return None
    n = min(len(r) for r in runs)
    sync, pipe, vsync, vpipe = (r[:n] for r in runs)
    lead = [vpipe[i] - pipe[i] for i in range(n)]
    plumbing = [vsync[i] - sync[i] for i in range(n)]
    pipelining = [(sync[i] - pipe[i]) - (vsync[i] - vpipe[i]) for i in range(n)]
    return {"rounds": n, "lead": _mean_se(lead), "plumbing": _mean_se(plumbing), "pipelining": _mean_se(pipelining),
            "plumbing_share": statistics.mean(plumbing) / statistics.mean(lead) if statistics.mean(lead) else math.nan}


# ------------------------------------------------------------------------------------------------- rendering

MINUS = "\u2212"


def _signed(x: float, spec: str) -> str:
    return format(x, "+" + spec).replace("-", MINUS)


def _pm(mean: float, se: float, spec: str = ".2f", unit: str = " s") -> str:
    se_txt = "–" if math.isnan(se) else format(se, spec)
    return f"{_signed(mean, spec)} ± {se_txt}{unit}"


def split_table(result: dict) -> list[str]:
    """One markdown table per setting of ``result`` (each with its rows and, where both frameworks ran both modes, the
    pipelining target's line). A row: the comparison, A's and B's means, B − A per round (mean ± standard error),
    the per-round change (mean ± standard error)."""
    lines: list[str] = []
    for s in result["settings"]:
        sp = gain_split(s)
        if not sp["rows"]:
            continue
        if lines:
            lines.append("")
        n = max(r["rounds"] for r in sp["rows"])
        lines.append(f"`{s['name']}` ({n} rounds, rollout→train end)")
        lines.append("")
        lines.append("| source | comparison (B vs A) | A | B | B − A per round | change |")
        lines.append("|---|---|---|---|---|---|")
        for r in sp["rows"]:
            lines.append(f"| {r['group']} | {r['label']} | {r['a_mean']:.2f} s | {r['b_mean']:.2f} s | "
                         f"{_pm(r['diff_mean'], r['diff_se'])} | {_pm(r['change_pct'], r['change_se'], '.1f', '%')} |")
        pp = sp.get("pipelining_points")
        if pp:
            lines.append("")
            lines.append(f"Pipelining gain over its own sync: ours (cgp + fgd) {_pm(*pp['ours'], '.1f', ' points')}, "
                         f"verl's (separate_async tuned) {_pm(*pp['verl'], '.1f', ' points')}; difference "
                         f"{_pm(*pp['difference'], '.1f', ' points')} (target ≥ {pp['target']:.0f}: "
                         f"{'met' if pp['met'] else 'missed'}).")
        ld = sp.get("lead")
        if ld:
            lines.append("")
            lines.append(f"Our lead over verl's tuned separate_async (its time − cgp + fgd's): {_pm(*ld['lead'])}, of "
                         f"which plumbing (verl's separate sync − our sync) {_pm(*ld['plumbing'])} and pipelining "
                         f"(our pipelining's saving over our sync − verl's over its own) {_pm(*ld['pipelining'])}: "
                         f"{100 * ld['plumbing_share']:.0f}% of the mean lead is plumbing.")
    return lines


# ------------------------------------------------------------------------------------------------- windows

def combine(results: list[dict], names: list[str] | None = None) -> dict:
    """Results of the same bench config run in several windows (verl's stacks after ours in one, before in the next)
    as one: per setting, each mode's rounds concatenated window after window (round i of every mode is still the
    same workload: every window runs the same seeds), and ``aa`` the A/A of each mode against itself across the
    first two windows (same mode, same workloads, another window), paired as every comparison is."""
    if len(results) < 2:
        raise ValueError("combine: expected the results of at least two windows")
    names = names or [f"window {i + 1}" for i in range(len(results))]
    first = results[0]["settings"]
    settings, aa = [], {}
    for s in first:
        others = [next((o for o in r["settings"] if o["name"] == s["name"]), None) for r in results[1:]]
        if None in others:
            raise ValueError(f"combine: setting {s['name']!r} is not in every window")
        modes = {}
        for mode in s["modes"]:
            runs = [per_round(w, mode) for w in [s] + others]
            if None in runs:
                continue
            modes[mode] = {"per_run": [{KEY: v} for r in runs for v in r], "per_window": runs}
            p = paired(runs[0], runs[1])
            aa.setdefault(s["name"], {})[mode] = p
        settings.append({"name": s["name"], "modes": modes})
    return {"settings": settings, "aa": aa, "windows": names}


def aa_table(combined: dict) -> list[str]:
    """The A/A: each mode against itself in the next window, through the same paired test as the comparisons."""
    lines: list[str] = []
    for name, modes in combined.get("aa", {}).items():
        if lines:
            lines.append("")
        w = combined.get("windows", ["window 1", "window 2"])
        lines.append(f"`{name}`: A/A, each mode against itself ({w[0]} → {w[1]}, same workloads)")
        lines.append("")
        lines.append("| mode | first window | second window | B − A per round | change |")
        lines.append("|---|---|---|---|---|")
        for mode, p in modes.items():
            lines.append(f"| {mode} | {p['a_mean']:.2f} s | {p['b_mean']:.2f} s | {_pm(p['diff_mean'], p['diff_se'])} | "
                         f"{_pm(p['change_pct'], p['change_se'], '.1f', '%')} |")
    return lines


def main(argv: list[str]) -> int:
    """``split RESULT.json…`` prints each one's tables; ``split --combine W1.json W2.json… --out FILE`` writes the
    windows' combined results (``combine``) and prints their tables and the A/A."""
    if argv and argv[0] == "--combine":
        if "--out" not in argv or argv.index("--out") + 1 >= len(argv):
            raise SystemExit("split --combine W1.json W2.json… --out FILE: --out is required")
        i = argv.index("--out")
        out, paths = argv[i + 1], argv[1:i] + argv[i + 2:]
        results = []
        for path in paths:
            with open(path) as f:
                results.append(json.load(f))
        combined = combine(results, paths)
        with open(out, "w") as f:
            json.dump(combined, f, indent=1)
        print("\n".join(split_table(combined) + [""] + aa_table(combined)))
        return 0
    for path in argv:
        with open(path) as f:
            print("\n".join(split_table(json.load(f))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
