"""Pooling the registered attempts of a learning comparison (lab/verl_pipe_lab/bench/learn_pool.py): the figure the README
quotes is recomputed from the committed attempts, and the stratified arithmetic is the stated one."""

import json
import math
from pathlib import Path

import pytest

from verl_pipe_lab.bench import learn_pool

ROOT = Path(__file__).resolve().parent.parent
POOLED = ROOT / "docs/bench/learn_pooled_chain_2026-12-07.json"


def _result(pairs: list[tuple[float, float]], cpu: str = "X") -> dict:
    """A merged learning result: per seed (cgp_fgd, sync) time to target; steps and elapsed scale with it."""
    runs, by_run = [], {}
    for seed, (a, b) in enumerate(pairs):
        for mode, t in (("cgp_fgd", a), ("sync", b)):
            runs.append({"mode": mode, "seed": seed, "arm": "main", "elapsed_s": 2 * t, "unit_fill": "dispatch",
                         "steps": [{"wall_s": t / 2}, {"wall_s": t}]})
            by_run[f"{mode}/main/{seed}"] = {"time_to_target_s": t, "steps_to_target": t / 10, "reached": True}
    return {"runs": runs, "comparison": {"runs": by_run, "target_val_acc": 0.4}, "env": {"cpu": cpu}}


def test_pooled_is_the_pair_weighted_mean_of_the_attempts_with_their_errors_combined():
    a = learn_pool.attempt(_result([(80, 100), (90, 100), (70, 100)]), "cgp_fgd", name="a")
    b = learn_pool.attempt(_result([(100, 100), (95, 100)], cpu="Y"), "cgp_fgd", name="b")
    assert (a["n"], b["n"]) == (3, 2) and a["time_to_target"]["relative"] == pytest.approx(-0.2)
    pool = learn_pool.pooled([a, b])
    t = pool["time_to_target"]
    assert t["estimate"] == pytest.approx((3 * -0.2 + 2 * -0.025) / 5)
    se = math.sqrt((3 / 5) ** 2 * a["time_to_target"]["relative_se"] ** 2
                   + (2 / 5) ** 2 * b["time_to_target"]["relative_se"] ** 2)
    assert t["se"] == pytest.approx(se) and t["range"] == pytest.approx([-0.2, -0.025])
    assert t["se_between"] == pytest.approx(abs(-0.2 + 0.025) / 2)  # sd of two values / sqrt(2)
    assert pool["steps_to_target"]["scale"] == "steps"
    assert pool["steps_to_target"]["estimate"] == pytest.approx((3 * -2.0 + 2 * -0.25) / 5)
    assert pool["end_to_end"]["estimate"] == pytest.approx(t["estimate"])  # elapsed is 2x here


def test_an_attempt_without_two_pairs_is_refused_by_name():
    with pytest.raises(ValueError, match="v9: 1 pairs of cgp_fgd and sync"):
        learn_pool.attempt(_result([(80, 100)]), "cgp_fgd", name="v9")


def test_the_committed_pooled_figure_is_recomputed_from_its_attempts():
    report = json.loads(POOLED.read_text())
    attempts = [learn_pool.attempt(json.loads((ROOT / a["name"]).read_text()), report["mode"], report["base"],
                                   name=a["name"]) for a in report["per_attempt"]]
    again = learn_pool.pooled(attempts)
    for fig in learn_pool.FIGURES:
        for key in ("estimate", "se", "se_between"):
            assert again[fig][key] == pytest.approx(report["pooled"][fig][key]), (fig, key)
    assert report["pooled"]["pairs"] >= 18
