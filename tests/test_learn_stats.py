"""The learning comparison's pre-registered statistics (lab/verl_pipe_lab/bench/learn_stats.py): pure, no Ray."""

import math
import random

import pytest

from verl_pipe_lab.bench import learn_stats as st


def test_t_distribution_matches_tables():
    # two-sided 95% and 90% critical values from the usual tables
    assert st.t_ppf(0.975, 4) == pytest.approx(2.776, abs=1e-3)
    assert st.t_ppf(0.95, 4) == pytest.approx(2.132, abs=1e-3)
    assert st.t_ppf(0.95, 9) == pytest.approx(1.833, abs=1e-3)
    assert st.t_ppf(0.95, 1) == pytest.approx(6.314, abs=1e-3)
    assert st.t_ppf(0.05, 7) == pytest.approx(-st.t_ppf(0.95, 7))
    assert st.t_cdf(0.0, 3) == pytest.approx(0.5)
    assert st.t_cdf(2.228, 10) == pytest.approx(0.975, abs=1e-4)
    assert st.t_ppf(0.95, 10_000) == pytest.approx(1.645, abs=1e-3)  # the normal's


def test_tost_passes_inside_the_margin_and_fails_outside():
    same = st.tost([0.01, -0.012, 0.004, 0.0, -0.006], margin=0.05)
    assert same["equivalent"] and same["p"] < 0.05
    assert -0.05 < same["ci"][0] < same["mean"] < same["ci"][1] < 0.05
    shifted = st.tost([0.06, 0.05, 0.07, 0.065, 0.055], margin=0.05)  # a real gap of 0.06
    assert not shifted["equivalent"] and shifted["p"] > 0.5
    noisy = st.tost([0.08, -0.09, 0.07, -0.06, 0.0], margin=0.05)  # centred, but too noisy to show equivalence
    assert not noisy["equivalent"]
    # the interval is the 90% one: t_{0.95, 4} standard errors either side
    assert same["ci"][1] - same["mean"] == pytest.approx(st.t_ppf(0.95, 4) * same["se"])
    with pytest.raises(ValueError, match=">= 2"):
        st.tost([0.01])


def test_tost_with_identical_differences():
    assert st.tost([0.01, 0.01, 0.01], margin=0.05)["equivalent"]
    assert not st.tost([0.07, 0.07], margin=0.05)["equivalent"]


def test_power_matches_a_simulation():
    rng = random.Random(7)
    n, sd, margin = 5, 0.03, 0.05
    trials = 4000
    hits = sum(st.tost([rng.gauss(0.0, sd) for _ in range(n)], margin)["equivalent"] for _ in range(trials))
    assert st.tost_power(n, sd, margin) == pytest.approx(hits / trials, abs=0.025)
    hits = sum(st.tost([rng.gauss(0.02, sd) for _ in range(8)], margin)["equivalent"] for _ in range(trials))
    assert st.tost_power(8, sd, margin, true_diff=0.02) == pytest.approx(hits / trials, abs=0.025)


def test_power_grows_with_seeds_and_margin_and_falls_with_sd():
    p = [st.tost_power(n, 0.03, 0.05) for n in (3, 5, 8, 12)]
    assert p == sorted(p) and p[0] < 0.5 < p[-1]
    assert st.tost_power(5, 0.03, 0.08) > st.tost_power(5, 0.03, 0.05)
    assert st.tost_power(5, 0.05, 0.05) < st.tost_power(5, 0.02, 0.05)
    assert st.tost_power(5, 0.03, 0.05, true_diff=0.05) < 0.06  # at the margin: the test's size, <= alpha


def test_detectable_margin_and_seeds_needed_agree():
    sd = 0.03
    m5 = st.detectable_margin(5, sd)
    assert st.tost_power(5, sd, m5) == pytest.approx(0.80, abs=0.002)
    assert st.detectable_margin(10, sd) < m5
    n = st.seeds_needed(sd, 0.04)
    assert st.detectable_margin(n, sd) <= 0.04 < st.detectable_margin(n - 1, sd)
    # the normal approximation (t_{1-a} + t_{1-b/2}) sd / sqrt(n) is close to the exact margin
    approx = (st.t_ppf(0.95, 9) + st.t_ppf(0.90, 9)) * sd / math.sqrt(10)
    assert st.detectable_margin(10, sd) == pytest.approx(approx, rel=0.05)
    assert st.seeds_needed(0.001) == st.MIN_SEEDS  # never fewer than the pre-registered minimum


def test_paired_difference_and_its_relative_standard_error():
    mode, base = [80.0, 90.0, 70.0, 85.0], [100.0, 110.0, 95.0, 105.0]
    p = st.paired(mode, base)
    assert p["diff"] == pytest.approx(-21.25)
    d = [a - b for a, b in zip(mode, base)]
    assert p["diff_se"] == pytest.approx(st.mean_sd(d)[1] / 2)
    assert p["relative"] == pytest.approx(81.25 / 102.5 - 1)
    r = 81.25 / 102.5
    assert p["relative_se"] == pytest.approx(st.mean_sd([a - r * b for a, b in zip(mode, base)])[1] / (2 * 102.5))
    exact = st.paired([0.8 * b for b in base], base)  # a constant ratio: no uncertainty in it
    assert exact["relative"] == pytest.approx(-0.2) and exact["relative_se"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        st.paired([1.0], [1.0, 2.0])


def _run(vals, step_s=2.0, val_every=5, before=0.3):
    steps = []
    for i in range(1, val_every * len(vals) + 1):
        row = {"step": i, "wall_s": i * step_s}
        if i % val_every == 0:
            row["val_acc"] = vals[i // val_every - 1]
        steps.append(row)
    return {"mode": "sync", "seed": 0, "val_before": before, "steps": steps}


def test_final_accuracy_is_the_mean_of_the_last_two_validations():
    assert st.final_accuracy(_run([0.4, 0.5, 0.6, 0.7])) == pytest.approx(0.65)
    with pytest.raises(ValueError, match="needs 2"):
        st.final_accuracy(_run([0.4]))


def test_time_to_target_is_linear_in_wall_clock_between_validations():
    curve = st.accuracy_curve(_run([0.4, 0.5, 0.6, 0.7]))  # validations at 10, 20, 30, 40 s
    assert curve[0] == (0, 0.0, 0.3) and curve[-1] == (20, 40.0, 0.7)
    t, ok = st.crossing(curve, 0.55)  # between 0.5 at 20 s and 0.6 at 30 s, half-way
    assert ok and t == pytest.approx(25.0)
    s, _ = st.crossing(curve, 0.55, x=0)  # the same on the step axis: steps 10 -> 15
    assert s == pytest.approx(12.5)
    assert st.crossing(curve, 0.6) == (30.0, True)  # exactly at a validation
    assert st.crossing(curve, 0.2) == (0.0, True)  # already there before training
    # a dip does not count as reaching: the first crossing is taken
    t, ok = st.crossing([(0, 0.0, 0.3), (5, 10.0, 0.6), (10, 20.0, 0.4), (15, 30.0, 0.7)], 0.5)
    assert ok and t == pytest.approx(10.0 * (0.2 / 0.3))


def test_a_run_that_never_reaches_the_target_is_censored_at_its_last_validation():
    t, ok = st.crossing(st.accuracy_curve(_run([0.4, 0.5, 0.45, 0.5])), 0.6)
    assert not ok and t == 40.0


def test_step_time_excludes_nothing_but_what_wall_s_excludes():
    run = _run([0.4, 0.5], step_s=3.0)
    assert st.train_wall_s(run) == 30.0 and st.step_time_s(run) == 3.0


def test_schedule_rotates_the_modes_over_seeds_and_adds_the_aa_run():
    modes = ["sync", "cgp", "cgp_fgd", "peer"]
    plan = st.schedule([0, 1, 2, 3, 4], modes, "sync")
    assert len(plan) == 25
    blocks = [plan[i:i + 5] for i in range(0, 25, 5)]
    assert [(s, m) for s, m, _ in blocks[0]] == [(0, "sync"), (0, "cgp"), (0, "cgp_fgd"), (0, "peer"), (100, "sync")]
    assert [m for _, m, _ in blocks[1]] == ["cgp", "cgp_fgd", "peer", "sync", "sync"]
    assert blocks[1][-2] == (101, "sync", "aa") and blocks[1][-1] == (1, "sync", "main")
    # over 5 consecutive seeds every arm takes every position once
    arms = [[(m, a) for _, m, a in b] for b in blocks]
    for pos in range(5):
        assert len({b[pos] for b in arms}) == 5
    # a block's order depends on its seed only: a part run alone keeps it
    assert st.schedule([3], modes, "sync") == blocks[3]
    assert st.schedule([0, 1], ["sync", "cgp"], "sync", aa=False) == [
        (0, "sync", "main"), (0, "cgp", "main"), (1, "cgp", "main"), (1, "sync", "main")]
    with pytest.raises(ValueError, match="A/A seeds"):
        st.schedule([0, 100], modes, "sync")


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_williams_rows_balance_position_and_the_arm_before(k):
    from collections import Counter
    rows = st.williams_rows(k)
    assert len(rows) == (2 * k if k % 2 else k) and all(sorted(r) == list(range(k)) for r in rows)
    for pos in range(k):
        assert Counter(r[pos] for r in rows) == {a: len(rows) // k for a in range(k)}
    pairs = Counter((r[i], r[i + 1]) for r in rows for i in range(k - 1))
    assert set(pairs) == {(a, b) for a in range(k) for b in range(k) if a != b}
    assert set(pairs.values()) == {2 if k % 2 else 1}


def test_a_williams_schedule_varies_what_runs_before_the_aa_arm():
    modes = ["sync", "cgp", "cgp_fgd", "peer"]
    plan = st.schedule(list(range(10)), modes, "sync", design="williams")
    blocks = [plan[i:i + 5] for i in range(0, 50, 5)]
    before_aa = {b[[a for _, _, a in b].index("aa") - 1][1:] for b in blocks if b[0][2] != "aa"}
    assert len(before_aa) == 4  # every other arm runs just before it in some block (cyclic: always the peer)
    cyclic = st.schedule(list(range(10)), modes, "sync")
    assert {b[[a for _, _, a in b].index("aa") - 1][1] for b in (cyclic[i:i + 5] for i in range(0, 50, 5))
            if b[0][2] != "aa"} == {"peer"}
    assert st.schedule([7], modes, "sync", design="williams") == blocks[7]
    with pytest.raises(ValueError, match="design"):
        st.schedule([0], modes, "sync", design="latin")


def test_aa_pairs_seed_s_with_seed_s_plus_offset():
    a = [{"seed": s} for s in (2, 0, 1)]
    b = [{"seed": s} for s in (100, 101, 102, 7)]
    pairs = st.pair_by_seed(a, b, offset=st.AA_SEED_OFFSET)
    assert [(x["seed"], y["seed"]) for x, y in pairs] == [(0, 100), (1, 101), (2, 102)]
    assert [(x["seed"], y["seed"]) for x, y in st.pair_by_seed(a, [{"seed": 1}])] == [(1, 1)]
