"""The peer's tuning sweep analysis (lab/verl_pipe_lab/bench/peer/tuning.py): the poll A/B pairs steps on the same workload
whatever the arms' order, knob stacks pair step by step with the tuned stacks' mean, the A/A compares the tuned stacks,
and the table readme_tables renders. Pure."""

import pytest

from verl_pipe_lab.bench import readme_tables as rt
from verl_pipe_lab.bench.peer import tuning


def _step(r2t, poll=None, warmup=False, ready=1.0, start=1.5, wait=0.4):
    return {"warmup": warmup, "poll_interval_s": poll,
            "metrics": {"rollout_to_train_end_s": r2t, "step_wall_s": r2t + 0.2, "trainer_wait_ratio": wait,
                        "first_unit_ready_s": ready, "first_unit_start_s": start}}


def _run(*steps, startup=100.0):
    return {"steps": list(steps), "startup_s": startup}


def test_poll_pairs_follow_the_workload_not_the_order():
    # warm-up, then pairs (0.1, 2), (2, 0.1), (0.1, 2): the 2 s arm is 1 s slower in every pair
    run = _run(_step(50.0, 0.1, warmup=True),
               _step(10.0, 0.1, start=1.1), _step(11.0, 2.0, start=2.0),
               _step(13.0, 2.0, start=2.5), _step(12.0, 0.1, start=1.1),
               _step(9.0, 0.1, start=1.2), _step(10.0, 2.0, start=1.9))
    p = tuning.poll_pairs(run)
    assert p["pairs"] == 3 and p["tuned_first"] == [True, False, True]
    r = p["metrics"]["rollout_to_train_end_s"]
    assert r["diffs"] == [-1.0, -1.0, -1.0] and r["diff_mean"] == -1.0 and r["diff_se"] == 0.0
    lag = p["metrics"]["first_unit_lag_s"]["diffs"]
    assert lag == pytest.approx([-0.9, -1.4, -0.7])


def test_poll_pairs_need_both_arms():
    with pytest.raises(ValueError, match="poll A/B"):
        tuning.poll_pairs(_run(_step(10.0, 0.1), _step(11.0, 0.1)))


def test_knob_runs_pair_with_the_mean_of_the_tuned_stacks_and_aa_compares_them():
    base_a = _run(_step(30.0, warmup=True), _step(10.0), _step(12.0), _step(11.0))
    base_b = _run(_step(30.0, warmup=True), _step(12.0), _step(12.0), _step(13.0))
    knob = _run(_step(30.0, warmup=True), _step(13.0), _step(14.0), _step(14.0))
    a = tuning.analyse({"base_a": base_a, "base_b": base_b, "storage8": knob})
    (c,) = a["comparisons"]
    r = c["metrics"]["rollout_to_train_end_s"]
    assert c["name"] == "storage8" and r["diffs"] == [2.0, 2.0, 2.0]
    assert a["aa"]["metrics"]["rollout_to_train_end_s"]["diffs"] == [2.0, 0.0, 2.0]


def test_table_renders_through_readme_tables():
    run = _run(_step(10.0, 0.1), _step(11.0, 2.0), _step(12.0, 2.0), _step(11.5, 0.1))
    a = tuning.analyse({"poll_ab": run, "base_a": _run(_step(10.0)), "base_b": _run(_step(10.5))})
    assert rt.KINDS["peer_tuning"] is tuning.table
    lines = tuning.table(a)
    assert len(lines) == 2 + 2  # header, rule, the poll A/B, the A/A
    assert "poll 0.1 s vs verl's 2 s" in lines[2] and "| 2 |" in lines[2] and lines[3].startswith("| tuned after")
