"""verl_pipe_lab.bench.learn_budget: the learning bench's step lines read back per run, and the budget per mode."""

import json
import math

import pytest

from verl_pipe_lab.bench.learn_budget import budget, collect, main, runs_of_log, step_metrics, uncontended_step_s


def _line(step, busy, tokens, rollout_end=4.0, first=1.0, left=2.0, total=7.0, prefix="(PipeTaskRunner pid=1) "):
    return (f"{prefix}step:{step} - training/global_step:{step} - actor/pg_loss:np.float64(-0.01) - "
            f"rolloutpipe/rollout_end_s:{rollout_end} - rolloutpipe/rollout_to_train_end_s:{total} - "
            f"rolloutpipe/trainer_busy_s:{busy} - rolloutpipe/trainer_busy_in_rollout_s:1.5 - "
            f"rolloutpipe/first_unit_ready_s:{first} - rolloutpipe/last_unit_cost_s:{left} - "
            f"rolloutpipe/ideal_lower_bound_s:{total} - rolloutpipe/pipeline_efficiency:1.0 - "
            f"rolloutpipe/weight_sync_s:0.1 - rolloutpipe/response_tokens:{tokens} - timing_s/old_log_prob:1.25 - "
            f"val-aux/num_turns/min:np.int32(2)\n")


def _log(mode, seed, busy, tokens, total, steps=2, rollout_end=4.0):
    out = [f"[learn] schedule (1 runs): #0 {mode}@{seed}\n"]
    for s in range(1, steps + 1):
        out.append(_line(s, busy, tokens, total=total, rollout_end=rollout_end))
        out.append(f"Training: {s}/{steps} [learn] {mode} seed {seed} step {s}: val acc 0.3 (9 s of training)\n")
    return out


def test_step_metrics_reads_numbers_including_numpy_reprs():
    m = step_metrics(_line(3, 5.0, 1000))
    assert m["step"] == 3 and m["rolloutpipe/trainer_busy_s"] == 5.0 and m["actor/pg_loss"] == -0.01
    assert m["val-aux/num_turns/min"] == 2 and m["timing_s/old_log_prob"] == 1.25
    assert step_metrics("[verl_pipe] step 3 (cgp): reward 0.2 | step 7.0s") is None


def test_runs_are_split_at_step_one_and_named_by_the_bench_lines_peers_dropped():
    lines = _log("sync", 0, 5.0, 1000, 9.0) + _log("cgp", 0, 5.5, 1000, 7.0, steps=3)
    lines += ["step:1 - training/global_step:1 - critic/score/mean:0.3\n",  # verl's peer: no rolloutpipe timeline
              "[learn] verl_separate_async_tuned seed 0 step 5: val acc 0.3 (9 s of training)\n"]
    runs = runs_of_log(lines)
    assert [(r["mode"], r["seed"], len(r["steps"])) for r in runs] == [("sync", 0, 2), ("cgp", 0, 3)]
    assert runs[1]["steps"][0]["trainer_busy_s"] == 5.5 and runs[1]["steps"][0]["old_log_prob_s"] == 1.25


def test_a_later_log_supersedes_a_run_and_the_budget_pairs_by_seed(tmp_path):
    a, b = tmp_path / "p0.log", tmp_path / "p1.log"
    a.write_text("".join(_log("sync", 0, 5.0, 1000, 9.0) + _log("cgp", 0, 9.0, 1000, 12.0)))
    b.write_text("".join(_log("cgp", 0, 5.5, 1000, 7.2, rollout_end=4.4)))
    kept, superseded = collect([str(a), str(b)])
    assert superseded == [{"mode": "cgp", "seed": 0, "log": "p0.log", "by": "p1.log"}]
    got = budget(kept)
    assert list(got) == ["sync", "cgp"]
    vs = got["cgp"]["vs_sync"]
    assert vs["contention"]["mean"] == pytest.approx(1.1)  # 5.5 against 5.0 s per 1,000 tokens
    assert vs["step_cut_pct"]["mean"] == pytest.approx(-20.0)
    assert vs["rollout_stretch"]["mean"] == pytest.approx(1.1)
    assert vs["response_tokens_pct"]["pairs"] == [pytest.approx(0.0)]
    # uncontended: the bound max(4.4 + 2.0/1.1, 1.0 + 5.5/1.1) = 6.22 s (the tail binds) against 6.5 s as measured,
    # the step 7.2 s scaled by it, against sync's 9.0
    assert vs["uncontended_cut_pct"]["mean"] == pytest.approx(100 * (7.2 * (4.4 + 2.0 / 1.1) / 6.5 / 9.0 - 1))
    assert math.isnan(vs["step_cut_pct"]["se"])  # one pair: no standard error
    out = tmp_path / "b.json"
    assert main([str(a), str(b), "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["modes"]["cgp"]["runs"] == 1 and saved["modes"]["cgp"]["vs_sync"]["step_cut_pct"]["se"] is None


def test_uncontended_step_scales_the_step_by_its_binding_bound():
    s = {"rollout_end_s": 4.0, "last_unit_cost_s": 2.0, "first_unit_ready_s": 1.0, "trainer_busy_s": 6.0,
         "rollout_to_train_end_s": 7.0}
    assert uncontended_step_s(s, 1.0) == 7.0 and uncontended_step_s(s, 2.0) == 5.0
    # a step far from its bound (it waits for particular groups) keeps that distance
    assert uncontended_step_s({**s, "rollout_to_train_end_s": 14.0}, 2.0) == 10.0


def test_no_timeline_in_the_logs_is_an_error(tmp_path, capsys):
    p = tmp_path / "x.log"
    p.write_text("nothing here\n")
    assert main([str(p)]) == 1
    assert "no run with a rolloutpipe timeline" in capsys.readouterr().err


def test_drift_pairs_step_time_and_length_by_seed_per_window():
    from verl_pipe_lab.bench.learn_budget import drift

    def run(mode, seed, step_s, length, arm="main"):
        return {"mode": mode, "seed": seed, "arm": arm,
                "steps": [{"step_s": step_s, "response_length": length}] * 4}

    learn = {"steps": 4, "runs": [run("sync", 0, 10.0, 50.0), run("sync", 1, 10.0, 40.0),
                                  run("cgp", 0, 8.0, 55.0), run("cgp", 1, 9.0, 44.0),
                                  run("sync", 100, 1.0, 1.0, arm="aa")]}
    got = drift(learn, [(0, 2), (2, 4)])
    assert list(got) == ["cgp", "sync (A/A)"]
    assert got["sync (A/A)"][0]["pairs"] == 1 and got["sync (A/A)"][0]["step_time_pct"]["mean"] == pytest.approx(-90.0)
    first = got["cgp"][0]
    assert first["steps"] == [1, 2] and first["pairs"] == 2
    assert first["step_time_pct"]["mean"] == pytest.approx(-15.0) and first["step_time_pct"]["se"] == pytest.approx(5.0)
    assert first["response_length_pct"]["mean"] == pytest.approx(10.0)


def test_a_suffix_keeps_a_differently_configured_parts_runs_apart(tmp_path):
    a, b = tmp_path / "fill_a.log", tmp_path / "fill_b.log"
    a.write_text("".join(_log("sync", 0, 5.0, 1000, 9.0) + _log("cgp_fgd", 0, 5.5, 1000, 9.5)))
    b.write_text("".join(_log("cgp_fgd", 0, 5.5, 1000, 7.0)))
    kept, superseded = collect([str(a), str(b)], {"fill_a.log": "+dispatch"})
    assert superseded == [] and sorted(kept) == [("cgp_fgd", 0), ("cgp_fgd+dispatch", 0), ("sync", 0)]
    assert budget(kept)["cgp_fgd+dispatch"]["vs_sync"]["step_cut_pct"]["mean"] == pytest.approx(100 * (9.5 / 9.0 - 1))
    with pytest.raises(SystemExit):
        main([str(a), "--suffix", "nonsense"])


def test_max_step_compares_runs_over_the_same_steps(tmp_path):
    a = tmp_path / "p.log"
    lines = _log("sync", 0, 5.0, 1000, 9.0, steps=3) + _log("cgp", 0, 5.0, 1000, 7.0, steps=1)
    a.write_text("".join(lines))
    out = tmp_path / "b.json"
    assert main([str(a), "--max-step", "1", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["max_step"] == 1 and saved["modes"]["sync"]["runs"] == 1
    assert runs_of_log(lines)[0]["steps"][2]["step"] == 3
