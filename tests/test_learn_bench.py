"""The learning-curve benchmark's pure parts: the pre-registered comparison and the per-step rows."""

import math

import pytest

from verl_pipe.bench.learn import LEARN_MODES, accuracy_curve, compare, run_overrides, step_row, time_to_reach


def _run(mode, seed, rewards, vals, val_before=0.2, val_every=10, step_s=1.0):
    steps = []
    for i, r in enumerate(rewards, start=1):
        row = {"step": i, "wall_s": i * step_s, "reward": r, "rollout_to_train_end_s": step_s}
        if i % val_every == 0:
            row["val_acc"] = vals[i // val_every - 1]
        steps.append(row)
    return {"mode": mode, "seed": seed, "val_before": val_before, "steps": steps}


def _rewards(base, slope, seed, n=40):
    return [base + slope * i + 0.01 * ((i * (seed + 3)) % 5 - 2) for i in range(n)]


def test_same_curves_pass_and_faster_mode_reaches_sooner():
    runs = []
    for seed in range(3):
        runs.append(_run("sync", seed, _rewards(0.2, 0.01, seed), [0.3, 0.4, 0.5 + 0.01 * seed, 0.6 + 0.01 * seed]))
        runs.append(_run("cgp", seed, _rewards(0.2, 0.01, seed + 1), [0.3, 0.4, 0.5, 0.6 + 0.01 * (2 - seed)],
                         step_s=0.8))
    out = compare(runs)
    t = out["tests"]["cgp"]
    assert t["final_within_2se"] and t["per_step_ok"] and t["same_learning"]
    assert t["train_wall_vs_sync"] == pytest.approx(-0.2)
    assert out["summary"]["cgp"]["time_to_sync_final_mean_s"] < out["summary"]["sync"]["time_to_sync_final_mean_s"]


def test_a_mode_that_learns_less_fails_both_tests():
    runs = []
    for seed in range(3):
        runs.append(_run("sync", seed, _rewards(0.2, 0.01, seed), [0.3, 0.4, 0.5, 0.6 + 0.01 * seed]))
        runs.append(_run("cgp_fgd", seed, _rewards(0.2, 0.0, seed), [0.2, 0.2, 0.2, 0.2 + 0.01 * seed]))
    t = compare(runs)["tests"]["cgp_fgd"]
    assert not t["final_within_2se"] and not t["per_step_ok"] and not t["same_learning"]
    assert t["final_diff"] == pytest.approx(-0.4)


def test_compare_needs_sync_and_a_validation():
    with pytest.raises(ValueError, match="sync"):
        compare([_run("cgp", 0, [0.1] * 10, [0.2])])
    with pytest.raises(ValueError, match="no validation"):
        compare([_run("sync", 0, [0.1] * 5, [])])


def test_curves_and_time_to_reach():
    run = _run("sync", 0, [0.1] * 30, [0.3, 0.5, 0.4], val_before=0.1)
    assert accuracy_curve(run) == [(0, 0.0, 0.1), (10, 10.0, 0.3), (20, 20.0, 0.5), (30, 30.0, 0.4)]
    assert time_to_reach(run, 0.45) == 20.0 and time_to_reach(run, 0.9) is None


def test_step_row_reads_the_record():
    rec = {"step": 3, "timeline": {"rollout_to_train_end_s": 1.5, "trainer_wait_ratio": 0.2},
           "metrics": {"critic/score/mean": 0.25, "response_length/mean": 12.0, "timing_s/step": 2.0,
                       "val-core/verl_pipe/digit_math/acc/mean@1": 0.5}}
    row = step_row(rec, 7.0)
    assert row["reward"] == 0.25 and row["val_acc"] == 0.5 and row["wall_s"] == 7.0 and row["step"] == 3
    assert "val_acc" not in step_row({**rec, "metrics": {"critic/score/mean": 0.1}}, 1.0)
    assert math.isnan(float("nan")) and step_row({**rec, "metrics": {}}, 1.0)["reward"] is None


@pytest.mark.parametrize("mode", sorted(LEARN_MODES))
def test_run_overrides_compose(mode):
    from verl_pipe.launch.session import compose

    cfg = compose(run_overrides(mode, 2, 30, 10))
    assert cfg.trainer.total_training_steps == 30 and cfg.trainer.test_freq == 10 and cfg.data.seed == 2
    assert cfg.rolloutpipe.mode == ("sync" if mode == "sync" else "cgp")
    assert cfg.rolloutpipe.fgd.enable == (mode == "cgp_fgd")


def test_reference_runs_are_checked(tmp_path):
    import json

    from verl_pipe.bench.learn import reference_runs

    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"steps": 100, "val_every": 10, "runs": [
        {"mode": "sync", "seed": 0, "steps": []}, {"mode": "cgp", "seed": 0, "steps": []}]}))
    runs = reference_runs(str(ref), 100, [0], 10)
    assert [(r["mode"], r["seed"], r["reference"]) for r in runs] == [("sync", 0, str(ref))]
    with pytest.raises(SystemExit, match="no sync run for seeds \\[1\\]"):
        reference_runs(str(ref), 100, [0, 1], 10)
    with pytest.raises(SystemExit, match="its steps is 100"):
        reference_runs(str(ref), 20, [0], 10)
