"""Descriptive: cgp_fgd vs cgp_group per window of steps (paired by seed), from the learning bench's JSON."""
import json, statistics as st, sys
r = json.load(open(sys.argv[1]))
runs = {(x["mode"], x["seed"]): x for x in r["runs"]}
seeds = sorted({s for (_, s) in runs})
def mean(run, key, lo, hi):
    if key == "step_s_per_1k_tokens":  # the step over the window's response tokens (a length-normalized step)
        return 1000 * mean(run, "step_s", lo, hi) / mean(run, "response_tokens", lo, hi)
    v = [s[key] for s in run["steps"] if lo <= s["step"] <= hi and s.get(key) is not None]
    return sum(v) / len(v) if v else float("nan")
for key in ("step_s", "rollout_end_s", "first_unit_ready_s", "trainer_busy_s", "last_unit_cost_s", "response_length", "response_tokens",
            "step_s_per_1k_tokens"):
    for lo, hi in ((1, 8), (9, 16), (1, 16)):
        d = [100 * (mean(runs["cgp_fgd", s], key, lo, hi) / mean(runs["cgp_group", s], key, lo, hi) - 1) for s in seeds]
        a = [mean(runs["cgp_group", s], key, lo, hi) for s in seeds]
        b = [mean(runs["cgp_fgd", s], key, lo, hi) for s in seeds]
        print(f"{key:<20} steps {lo:>2}-{hi:<2}: cgp_group {st.mean(a):.3f}, cgp_fgd {st.mean(b):.3f}, "
              f"per-seed ratio {st.mean(d):+.1f}% ± {st.stdev(d) / len(d) ** 0.5:.1f}% ({', '.join(f'{x:+.1f}' for x in d)})")
