"""The learning comparison's statistics, fixed before any run (docs/learning.md, "Pre-registration").

Pure Python (no numpy/scipy, no Ray): the Student t distribution, the paired equivalence test (TOST) and its power,
the run-level quantities the comparison reads (final accuracy, time to a target accuracy with its interpolation and
censoring, mean step time), the run schedule (modes rotated over seeds, the A/A seeds) and the A/A pairing.

The pre-registered analysis (``PREREGISTERED`` holds its constants; ``lab/verl_pipe_lab/bench/learn.py:compare`` applies it):

1. Final accuracy of a run: the mean of its last ``FINAL_POINTS`` validations (greedy accuracy on the held-out set).
   Equivalence of a mode with sync: TOST on the differences paired by seed (mode - sync, seed s with seed s), margin
   ``MARGIN``, each one-sided test at ``ALPHA`` (equivalent iff the 90% confidence interval of the mean difference
   lies inside (-MARGIN, +MARGIN)).
2. A/A: sync on the main seeds against sync on the A/A seeds (seed s paired with ``s + AA_SEED_OFFSET``), through
   the same test; it must pass.
3. Time to sync's final accuracy: the target is ``T = F_sync - MARGIN``, F_sync the mean over sync's (main) seeds of
   their final accuracies: the accuracy the equivalence test cannot tell from sync's final (see docs/learning.md for
   why not F_sync itself). A run's time is interpolated linearly in training wall-clock between the validation before
   and the first validation at or above T (0 if the validation before training is already there); a run that never
   reaches T is censored at its last validation's training wall-clock (a lower bound of its time, flagged). Paired
   differences (mode - sync) with their standard error, and the relative difference mean(mode)/mean(sync) - 1 with a
   delta-method standard error; a mode with a censored run is "not shown to reach sooner".
4. Step time: a run's training wall-clock (validation excluded) over its steps; paired as in 3.
"""

from __future__ import annotations

import functools
import math

ALPHA = 0.05  # each one-sided test of the TOST (a 90% two-sided confidence interval)
MARGIN = 0.05  # equivalence margin on final accuracy (absolute accuracy)
POWER = 0.80  # the power at which the margin is stated
FINAL_POINTS = 2  # a run's final accuracy: the mean of its last two validations
AA_SEED_OFFSET = 100  # the A/A partner of main seed s is sync at seed s + AA_SEED_OFFSET
MIN_SEEDS = 5  # per mode, paired by seed
MIN_VAL_SIZE = 512  # held-out questions

PREREGISTERED = {"alpha": ALPHA, "margin": MARGIN, "power": POWER, "final_points": FINAL_POINTS,
                 "aa_seed_offset": AA_SEED_OFFSET, "min_seeds": MIN_SEEDS, "min_val_size": MIN_VAL_SIZE,
                 "time_target": "sync_final_mean_minus_margin", "interpolation": "linear_in_training_wall_clock",
                 "censoring": "at_last_validation_wall_clock_flagged"}


# ------------------------------------------------------------------------------------- distributions (pure Python)


def norm_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1.0 - x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbeta) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbeta) * _betacf(b, a, 1.0 - x) / b


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df={df}: expected > 0")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x >= 0 else tail


@functools.lru_cache(maxsize=1024)
def t_ppf(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on t_cdf; |error| < 1e-10)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p}: expected in (0, 1)")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------------------------- paired statistics


def mean_sd(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        raise ValueError("no values")
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def tost(diffs: list[float], margin: float = MARGIN, alpha: float = ALPHA) -> dict:
    """Two one-sided t tests on paired differences: H0 |mean| >= margin against H1 |mean| < margin.

    Equivalent iff both one-sided tests reject at ``alpha``, i.e. the (1 - 2 alpha) confidence interval of the mean
    difference lies inside (-margin, +margin). Needs >= 2 differences (a standard error)."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"TOST needs >= 2 paired differences, got {n}")
    mean, sd = mean_sd(diffs)
    se = sd / math.sqrt(n)
    df = n - 1
    tcrit = t_ppf(1.0 - alpha, df)
    lo, hi = mean - tcrit * se, mean + tcrit * se
    if se > 0:
        p_lower = 1.0 - t_cdf((mean + margin) / se, df)  # H0: mean <= -margin
        p_upper = t_cdf((mean - margin) / se, df)  # H0: mean >= +margin
    else:  # every difference equal: the interval is a point
        p_lower = 0.0 if mean > -margin else 1.0
        p_upper = 0.0 if mean < margin else 1.0
    return {"n": n, "mean": mean, "sd": sd, "se": se, "df": df, "t_crit": tcrit, "ci": [lo, hi],
            "ci_level": 1.0 - 2.0 * alpha, "margin": margin, "p_lower": p_lower, "p_upper": p_upper,
            "p": max(p_lower, p_upper), "equivalent": bool(lo > -margin and hi < margin)}


def tost_power(n: int, sd: float, margin: float = MARGIN, true_diff: float = 0.0, alpha: float = ALPHA,
               grid: int = 2000) -> float:
    """P(TOST says equivalent) with ``n`` paired differences drawn N(true_diff, sd^2).

    Exact up to quadrature: with u = S / sd (u^2 ~ chi^2_{n-1} / (n-1)), the test passes iff
    |mean - 0| + t_crit S / sqrt(n) < margin, so power = E_u[Phi((margin - t u sd/sqrt n - theta) / (sd/sqrt n))
    - Phi((-margin + t u sd/sqrt n - theta) / (sd/sqrt n))] over u < margin sqrt(n) / (t sd), integrated with
    Simpson's rule on ``grid`` intervals."""
    if n < 2:
        raise ValueError(f"n={n}: TOST needs >= 2")
    if sd <= 0:
        return 1.0 if abs(true_diff) < margin else 0.0
    df = n - 1
    tcrit = t_ppf(1.0 - alpha, df)
    se = sd / math.sqrt(n)
    u_max = margin / (tcrit * se)
    log_norm = math.log(2.0) + (df / 2.0) * math.log(df / 2.0) - math.lgamma(df / 2.0)

    def density(u: float) -> float:  # of u = S / sd
        if u <= 0.0:
            return 0.0
        return math.exp(log_norm + (df - 1) * math.log(u) - df * u * u / 2.0)

    def integrand(u: float) -> float:
        half = margin - tcrit * u * se
        if half <= 0:
            return 0.0
        return (norm_cdf((half - true_diff) / se) - norm_cdf((-half - true_diff) / se)) * density(u)

    grid += grid % 2
    h = u_max / grid
    total = integrand(0.0) + integrand(u_max)
    for i in range(1, grid):
        total += (4 if i % 2 else 2) * integrand(i * h)
    return min(1.0, max(0.0, total * h / 3.0))


def detectable_margin(n: int, sd: float, power: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest equivalence margin the TOST shows with probability ``power`` when the true difference is 0,
    with ``n`` paired differences of standard deviation ``sd`` (bisection on tost_power)."""
    if sd <= 0:
        return 0.0
    lo, hi = 0.0, sd
    while tost_power(n, sd, hi, 0.0, alpha) < power:
        hi *= 2.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if tost_power(n, sd, mid, 0.0, alpha) < power:
            lo = mid
        else:
            hi = mid
    return hi


def seeds_needed(sd: float, margin: float = MARGIN, power: float = POWER, alpha: float = ALPHA,
                 n_min: int = MIN_SEEDS, n_max: int = 200) -> int | None:
    """The fewest seeds (>= n_min) whose TOST shows ``margin`` with ``power``; None beyond n_max."""
    for n in range(max(2, n_min), n_max + 1):
        if tost_power(n, sd, margin, 0.0, alpha) >= power:
            return n
    return None


def paired(mode: list[float], base: list[float]) -> dict:
    """Paired comparison of per-seed values (same order): the mean difference mode - base with its standard error,
    and the relative difference R - 1 = mean(mode) / mean(base) - 1 with its delta-method standard error
    sd(mode_i - R base_i) / (sqrt(n) mean(base))."""
    if len(mode) != len(base) or not mode:
        raise ValueError(f"paired values: {len(mode)} against {len(base)}")
    n = len(mode)
    d = [a - b for a, b in zip(mode, base)]
    mean_d, sd_d = mean_sd(d)
    mean_m, mean_b = sum(mode) / n, sum(base) / n
    out = {"n": n, "mean_mode": mean_m, "mean_base": mean_b, "diff": mean_d,
           "diff_se": sd_d / math.sqrt(n) if n > 1 else float("nan")}
    if mean_b != 0:
        r = mean_m / mean_b
        resid = [a - r * b for a, b in zip(mode, base)]
        out.update(relative=r - 1.0,
                   relative_se=mean_sd(resid)[1] / (math.sqrt(n) * abs(mean_b)) if n > 1 else float("nan"))
    else:
        out.update(relative=float("nan"), relative_se=float("nan"))
    return out


# ---------------------------------------------------------------------------------------------- run-level values


def validations(run: dict) -> list[dict]:
    """A run's validations after training steps (not the one before training), in step order."""
    return [r for r in run["steps"] if r.get("val_acc") is not None]


def final_accuracy(run: dict, points: int = FINAL_POINTS) -> float:
    """The mean of the run's last ``points`` validations."""
    vals = validations(run)
    if len(vals) < points:
        raise ValueError(f"run {run.get('mode')} seed {run.get('seed')}: {len(vals)} validations after training, "
                         f"its final accuracy needs {points}")
    return sum(v["val_acc"] for v in vals[-points:]) / points


def accuracy_curve(run: dict) -> list[tuple[int, float, float]]:
    """(step, training wall-clock s, accuracy) at step 0 (the validation before training, at 0 s) and after every
    validated step."""
    out = [(0, 0.0, run["val_before"])] if run.get("val_before") is not None else []
    return out + [(r["step"], r["wall_s"], r["val_acc"]) for r in validations(run)]


def crossing(curve: list[tuple[int, float, float]], target: float, x: int = 1) -> tuple[float, bool]:
    """When ``curve`` first reaches ``target`` on axis ``x`` (1: training wall-clock, 0: step).

    Linear between the last point below the target and the first at or above it: x_{j-1} + (T - a_{j-1}) /
    (a_j - a_{j-1}) (x_j - x_{j-1}); the first point itself if it is already there. Never reached: (x of the last
    point, False), a censored value (a lower bound of the time it would take)."""
    if not curve:
        raise ValueError("an empty accuracy curve")
    prev = None
    for pt in curve:
        if pt[2] >= target:
            if prev is None:
                return float(pt[x]), True
            frac = (target - prev[2]) / (pt[2] - prev[2])
            return float(prev[x] + frac * (pt[x] - prev[x])), True
        prev = pt
    return float(curve[-1][x]), False


def train_wall_s(run: dict) -> float:
    """The run's training wall-clock (validation excluded) at its last step."""
    return float(run["steps"][-1]["wall_s"])


def step_time_s(run: dict) -> float:
    """Mean training wall-clock per step (validation excluded)."""
    return train_wall_s(run) / len(run["steps"])


# ------------------------------------------------------------------------------------------ schedule and pairing


def aa_seed(seed: int) -> int:
    return seed + AA_SEED_OFFSET


# How a block's arms are ordered (schedule): "cyclic" rotates one fixed order by the seed (each arm takes every
# position equally often, but always follows the same arm); "williams" takes the block's row of a Williams design,
# which also balances what runs just before each arm (first-order carry-over: every arm follows every other arm
# equally often over k blocks, 2k where the number of arms k is odd). Why it matters: docs/learning.md, "Seven blocks".
DESIGNS = ("cyclic", "williams")


def williams_rows(k: int) -> list[list[int]]:
    """The rows of a Williams design for ``k`` arms (a Latin square, two for odd k, whose rows are arm orders): over
    all rows every arm runs in every position equally often, and every ordered pair of distinct arms is adjacent
    equally often (once for even k, twice for odd k)."""
    first = [(j + 1) // 2 if j % 2 else (k - j // 2) % k for j in range(k)]
    rows = [[(x + r) % k for x in first] for r in range(k)]
    return rows + ([row[::-1] for row in rows] if k % 2 else [])


def schedule(seeds: list[int], modes: list[str], base: str, aa: bool = True,
             design: str = "cyclic") -> list[tuple[int, str, str]]:
    """The runs in the order they run: (seed, mode, arm) with arm "main" or "aa".

    One block per main seed s: its modes and (``aa``) the A/A run of ``base`` at ``aa_seed(s)``, the block's
    arms ordered by s: ``cyclic`` rotates them by s (arms[s % k:] + arms[:s % k]), so each mode runs first, second,
    ... equally often over consecutive seeds and a slow phase of the machine does not always hit the same mode;
    ``williams`` takes row s of ``williams_rows(k)`` (cyclically), which balances the arm that runs just before too.
    The order of a block depends on its seed only, so a part run alone keeps it."""
    if design not in DESIGNS:
        raise ValueError(f"design: got {design!r}; allowed: {', '.join(DESIGNS)}")
    arms = [(m, "main") for m in modes] + ([(base, "aa")] if aa else [])
    if len(set(arms)) != len(arms):
        raise ValueError(f"modes {modes}: each once")
    if aa and any(aa_seed(s) in seeds for s in seeds):
        raise ValueError(f"seeds {seeds}: the A/A seeds (seed + {AA_SEED_OFFSET}) must not be main seeds")
    rows = williams_rows(len(arms))
    out = []
    for s in seeds:
        k = s % len(arms)
        block = arms[k:] + arms[:k] if design == "cyclic" else [arms[i] for i in rows[s % len(rows)]]
        for mode, arm in block:
            out.append((aa_seed(s) if arm == "aa" else s, mode, arm))
    return out


def pair_by_seed(a: list[dict], b: list[dict], offset: int = 0) -> list[tuple[dict, dict]]:
    """Runs of ``a`` and ``b`` paired by seed (a's seed s with b's seed s + offset), in a's seed order; a seed
    without its partner is left out."""
    by_seed = {r["seed"]: r for r in b}
    return [(r, by_seed[r["seed"] + offset]) for r in sorted(a, key=lambda r: r["seed"])
            if r["seed"] + offset in by_seed]
