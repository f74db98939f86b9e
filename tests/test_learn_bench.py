"""The learning comparison's pure parts (lab/verl_pipe_lab/bench/learn.py, lab/verl_pipe_lab/bench/peer/learn.py): the
pre-registered analysis over runs, the per-step rows of our modes and of verl's peer, merging parts, the CLI's
refusals. No Ray."""

import json
import math
from pathlib import Path

import pytest

from verl_pipe_lab.bench import learn_stats as st
from verl_pipe_lab.bench.learn_charts import HEADLINE_MODES
from verl_pipe_lab.bench.learn import (LEARN_MODES, PEER_MODE, STEP_KEYS, VAL_KEY, compare,
                                   length_prediction, merge, run_overrides, sd_estimates, step_row, val_key)
from verl_pipe.core.variants import BASE, variant
from verl_pipe_lab.bench.variants import peer_config


def _run(mode, seed, vals, step_s=1.0, val_every=5, before=0.3, arm="main"):
    steps = []
    for i in range(1, val_every * len(vals) + 1):
        row = {"step": i, "wall_s": i * step_s, "reward": 0.5, "rollout_to_train_end_s": step_s}
        if i % val_every == 0:
            row["val_acc"] = vals[i // val_every - 1]
            row["val_s"] = 3.0
        steps.append(row)
    return {"mode": mode, "seed": seed, "arm": arm, "val_before": before, "steps": steps}


CURVE = [0.45, 0.6, 0.7, 0.75, 0.76, 0.77]  # validations at steps 5..30


def _noise(seed, k):
    return 0.004 * (((seed * 7 + k * 3) % 5) - 2)


def _curve(seed, shift=0.0):
    return [v + shift + _noise(seed, k) for k, v in enumerate(CURVE)]


def _runs(modes=("sync", "cgp_fgd"), speed=None, shift=None, aa=True, seeds=range(5)):
    speed, shift = speed or {}, shift or {}
    runs = []
    for s in seeds:
        for m in modes:
            runs.append(_run(m, s, _curve(s + 10 * len(m), shift.get(m, 0.0)), step_s=speed.get(m, 1.0)))
        if aa:
            runs.append(_run("sync", s + st.AA_SEED_OFFSET, _curve(s + 50), arm="aa"))
    return runs


def test_an_equivalent_faster_mode_passes_and_reaches_sooner():
    out = compare(_runs(speed={"cgp_fgd": 0.7}))
    t = out["tests"]["cgp_fgd"]
    assert t["tost"]["equivalent"] and t["n"] == 5
    assert t["step_time"]["relative"] == pytest.approx(-0.3)
    assert t["time_to_target"]["relative"] == pytest.approx(-0.3, abs=0.02)
    assert t["censored"] == [0, 0] and t["sooner_shown"]
    assert out["aa"]["passes"] and out["aa"]["seeds"][0] == [0, 100]
    # the target: sync's final (mean over seeds of the mean of the last two validations) less the margin
    f = sum(st.final_accuracy(r) for r in _runs(aa=False) if r["mode"] == "sync") / 5
    assert out["sync_final_mean"] == pytest.approx(f) and out["target_val_acc"] == pytest.approx(f - st.MARGIN)
    assert not out["notes"]


def test_fgds_own_gain_over_cgp_is_paired_beside_the_tests_and_reported():
    from verl_pipe_lab.bench.learn import format_report

    runs = _runs(("sync", "cgp", "cgp_fgd"), speed={"cgp": 0.8, "cgp_fgd": 0.6})
    lp = {"history": {"groups": 96, "rank_correlation": 0.71}, "siblings": {"groups": 128, "rank_correlation": 0.8},
          "prior": {"groups": 32, "rank_correlation": None}}
    for r in runs:
        r["length_prediction"] = lp if r["mode"] == "cgp_fgd" else None
    out = compare(runs)
    b = out["secondary"]["cgp_fgd vs cgp"]
    assert b["n"] == 5 and b["seeds"][0] == [0, 0]
    assert b["step_time"]["relative"] == pytest.approx(0.6 / 0.8 - 1)
    assert set(out["tests"]) == {"cgp", "cgp_fgd"}  # the pre-registered tests stay mode vs sync
    assert out["summary"]["cgp_fgd"]["length_prediction"] == [lp] * 5
    report = format_report({"steps": 30, "seeds": [0, 1, 2, 3, 4], "val_every": 5, "val_size": 512,
                            "comparison": out})
    assert "cgp_fgd vs cgp (descriptive) (n=5)" in report and "cgp_fgd vs sync (n=5)" in report
    assert "history 0.71 (96 groups)" in report
    assert compare(_runs(("sync", "cgp")))["secondary"] == {}
    # at group granularity the FIFO arm is cgp_group: cgp_fgd is paired with it (FGD alone, same granularity)
    grp = compare(_runs(("sync", "cgp_group", "cgp_fgd"), speed={"cgp_group": 0.8, "cgp_fgd": 0.6}))["secondary"]
    assert list(grp) == ["cgp_fgd vs cgp_group"] and grp["cgp_fgd vs cgp_group"]["n"] == 5


def test_a_mode_that_learns_less_fails_the_equivalence_test_and_never_reaches():
    out = compare(_runs(shift={"cgp_fgd": -0.12}, speed={"cgp_fgd": 0.7}))
    t = out["tests"]["cgp_fgd"]
    assert not t["tost"]["equivalent"] and t["tost"]["mean"] == pytest.approx(-0.12, abs=0.01)
    assert t["censored"][0] == 5 and not t["sooner_shown"]  # censored runs never count as reaching sooner
    assert out["summary"]["cgp_fgd"]["reached_target"] == [False] * 5


def test_an_aa_that_differs_fails():
    runs = _runs()
    for r in runs:
        if r["arm"] == "aa":
            for row in r["steps"]:
                if "val_acc" in row:
                    row["val_acc"] += 0.08
    assert not compare(runs)["aa"]["passes"]


def test_compare_needs_sync_the_same_cadence_and_final_points():
    with pytest.raises(ValueError, match="sync"):
        compare([_run("cgp", 0, CURVE)])
    with pytest.raises(ValueError, match="different steps"):
        compare([_run("sync", 0, CURVE), _run("cgp", 0, CURVE, val_every=4)])
    with pytest.raises(ValueError, match="needs 2"):
        compare([_run("sync", 0, [0.5])])
    out = compare(_runs(aa=False, seeds=range(3)))
    assert any("pre-registration asks >= 5" in n for n in out["notes"])
    assert any("A/A" in n for n in out["notes"]) and out["aa"] is None


def test_sd_estimates_take_the_between_run_spread_and_the_aa_differences():
    runs = _runs()
    est = sd_estimates(runs, val_size=512)
    assert est["runs"] == 15 and est["between_run"]["df"] == 12
    assert est["between_run"]["paired_sd"] == pytest.approx(math.sqrt(2) * est["between_run"]["sd_run"])
    assert est["aa"]["df"] == 4 and len(est["aa"]["diffs"]) == 5
    p = est["mean_final"]
    assert est["binomial"]["paired_sd"] == pytest.approx(math.sqrt(2 * p * (1 - p) / 512))
    # the spread here is far below the binomial floor at 512: the projection is that floor
    assert est["projected"]["train_sd"] == 0.0
    assert est["projected"]["paired_sd"] == pytest.approx(est["binomial"]["paired_sd_at_design"])


def test_the_aa_differences_are_main_minus_partner_whatever_order_the_parts_list_them():
    runs = _runs(("sync",))
    for r in runs:  # the A/A seeds learn 0.02 less: every difference is +0.02
        if r["arm"] == "aa":
            r["steps"] = _run("sync", r["seed"], [v - 0.02 for v in _curve(r["seed"] - 100)])["steps"]
    expect = sd_estimates(runs, val_size=512)["aa"]
    # a merge lists some A/A runs before their main seed's run (as the rotated parts do)
    swapped = runs[1:2] + runs[0:1] + runs[2:]
    got = sd_estimates(swapped, val_size=512)["aa"]
    assert got["diffs"] == pytest.approx([0.02] * 5) and got["diffs"] == pytest.approx(expect["diffs"])
    assert got["paired_sd"] == pytest.approx(0.0, abs=1e-9)


def test_step_row_reads_the_record():
    rec = {"step": 3, "timeline": {"rollout_to_train_end_s": 1.5, "trainer_wait_ratio": 0.2},
           "metrics": {"critic/score/mean": 0.25, "response_length/mean": 12.0, "timing_s/step": 2.0,
                       VAL_KEY: 0.5, "timing_s/testing": 4.0}}
    row = step_row(rec, 7.0)
    assert row["reward"] == 0.25 and row["val_acc"] == 0.5 and row["wall_s"] == 7.0 and row["val_s"] == 4.0
    assert "val_acc" not in step_row({**rec, "metrics": {"critic/score/mean": 0.1}}, 1.0)
    assert "trainer_busy_s" not in row  # the timeline had none
    timed = step_row({**rec, "timeline": {**rec["timeline"], "trainer_busy_s": 3.0, "first_unit_ready_s": 0.5}}, 7.0)
    assert timed["trainer_busy_s"] == 3.0 and timed["first_unit_ready_s"] == 0.5
    assert step_row({**rec, "metrics": {}}, 1.0)["reward"] is None


def test_val_key_finds_the_tasks_accuracy():
    assert val_key({VAL_KEY: 0.1, "val-aux/x": 1}) == VAL_KEY
    assert val_key({"val-core/other/acc/mean@1": 0.2}) == "val-core/other/acc/mean@1"
    assert val_key({"critic/score/mean": 0.1}) is None
    with pytest.raises(ValueError, match="several"):
        val_key({"val-core/a/acc/mean@1": 0.1, "val-core/b/acc/mean@1": 0.2})


def test_the_modes_come_from_the_variant_table():
    assert LEARN_MODES[0] == BASE and PEER_MODE in LEARN_MODES and set(HEADLINE_MODES) <= set(LEARN_MODES)
    assert not variant(PEER_MODE).ours and all(variant(m).ours for m in LEARN_MODES if m != PEER_MODE)


def test_the_default_fifo_arm_runs_the_recipes_granularity():
    # cgp_fgd takes the recipe's granularity; the FIFO arm it is compared with must run the same one, or
    # "cgp_fgd vs the FIFO arm" measures FGD and granularity together
    from verl_pipe_lab.bench.learn import compose_task, default_modes

    assert default_modes("minibatch") == (BASE, "cgp", "cgp_fgd", PEER_MODE)
    assert default_modes("group") == (BASE, "cgp_group", "cgp_fgd", PEER_MODE)
    assert set(default_modes("group")) <= set(LEARN_MODES)
    with pytest.raises(ValueError, match="'token'.*minibatch, group"):
        default_modes("token")
    chain = compose_task([], recipe="tiny_cpu_chain")
    fifo = default_modes(chain.rolloutpipe.cgp.granularity)[1]
    assert fifo == "cgp_group"
    assert compose_task(run_overrides(fifo, 0, 10, 5), recipe="tiny_cpu_chain").rolloutpipe.cgp.granularity == "group"
    # the same recipe's cgp_fgd keeps the recipe's granularity
    assert compose_task(run_overrides("cgp_fgd", 0, 10, 5),
                        recipe="tiny_cpu_chain").rolloutpipe.cgp.granularity == "group"


@pytest.mark.parametrize("mode", [m for m in LEARN_MODES if variant(m).ours])
def test_run_overrides_compose(mode):
    from verl_pipe.launch.session import compose

    cfg = compose(run_overrides(mode, 2, 30, 5))
    assert cfg.trainer.total_training_steps == 30 and cfg.trainer.test_freq == 5 and cfg.data.seed == 2
    assert cfg.trainer.val_before_train and cfg.actor_rollout_ref.rollout.seed == 1002
    v = variant(mode)
    assert cfg.rolloutpipe.mode == v.mode and cfg.rolloutpipe.fgd.enable == v.fgd


@pytest.mark.parametrize("mode", [m for m in LEARN_MODES if variant(m).ours])
def test_the_variant_decides_the_mode_whatever_the_recipe(mode):
    # tiny_cpu_cgp_fgd turns CGP and FGD on; each run's mode is its variant's
    from verl_pipe_lab.bench.learn import compose_task

    cfg = compose_task(["rolloutpipe.workload=null", *run_overrides(mode, 0, 10, 5)], recipe="tiny_cpu_cgp_fgd")
    v = variant(mode)
    assert cfg.rolloutpipe.mode == v.mode and cfg.rolloutpipe.fgd.enable == v.fgd


def test_the_task_must_let_the_model_decide_lengths_and_exist():
    from omegaconf import OmegaConf

    from verl_pipe_lab.bench.learn import TASK_KEY, compose_task, task_overrides
    from verl_pipe.launch.session import compose

    with pytest.raises(ValueError, match="rolloutpipe.workload"):
        compose_task([], recipe="tiny_cpu_cgp_fgd")
    # the long-tail task's recipe (docs/learning.md: the comparison's task) is one the bench can run
    chain = compose_task([], recipe="tiny_cpu_chain")
    assert OmegaConf.select(chain, TASK_KEY) == "chain" and chain.data.max_response_length >= 200
    assert task_overrides(None) == [] and task_overrides("x") == [f"{TASK_KEY}=x"]
    current = OmegaConf.select(compose([]), TASK_KEY)
    if current is None:  # a checkout without tiny tasks: --task names the missing setting
        with pytest.raises(ValueError, match="tiny_assets.task"):
            compose_task(task_overrides("chain"))
    else:
        assert OmegaConf.select(compose_task(task_overrides(current)), TASK_KEY) == current


def test_peer_spec_puts_the_learning_keys_after_the_peers_own():
    from verl_pipe_lab.bench.learn import run_keys
    from verl_pipe_lab.bench.peer.learn import LEARN_CONFIG, TRAINER_CLS, learn_spec
    from verl_pipe_lab.bench.peer.runner import compose_spec

    spec = learn_spec([], run_keys(PEER_MODE, 3, 20, 5), 20, 3, config=peer_config(PEER_MODE))
    assert spec["config"] == LEARN_CONFIG and spec["workload"] is None and spec["trainer_cls"] == TRAINER_CLS
    cfg = compose_spec(spec)
    # the peer's speed-bench settings turn validation off; the learning run's keys win
    assert cfg.trainer.test_freq == 5 and cfg.trainer.val_before_train and cfg.data.seed == 3
    assert cfg.trainer.total_training_steps == 20 and cfg.trainer.total_epochs == 20
    assert cfg.trainer.v1.trainer_mode == "separate_async" and cfg.trainer.use_v1
    assert cfg.actor_rollout_ref.rollout.seed == 1003 and spec["config_name"] is None
    # the task's recipe reaches the peer as it reaches our modes
    spec = learn_spec(["rolloutpipe.workload=null"], run_keys(PEER_MODE, 3, 20, 5), 20, 3,
                      config=peer_config(PEER_MODE), config_name="tiny_cpu_cgp_fgd")
    assert compose_spec(spec).rolloutpipe.fgd.window == 32  # set by that recipe only
    # verl's parameter_sync_step follows the recipe's own batch shape (the chain recipe: 32 prompts, mini-batches of 8)
    spec = learn_spec([], run_keys(PEER_MODE, 0, 40, 5), 40, 0, config=peer_config(PEER_MODE),
                      config_name="tiny_cpu_chain")
    cfg = compose_spec(spec)
    sync_step = cfg.trainer.v1.separate_async.parameter_sync_step
    assert sync_step * cfg.actor_rollout_ref.actor.ppo_mini_batch_size == cfg.data.train_batch_size == 32
    with pytest.raises(ValueError, match="steps=0"):
        learn_spec([], [], 0, 0)


def test_peer_rows_take_verls_metrics_and_exclude_validation_time():
    from verl_pipe_lab.bench.peer.learn import learn_rows

    def rec(step, t_end, val_total, val=None, val_s=None, before=None):
        return {"step": step, "metrics": {"rollout_to_train_end_s": 2.0, "trainer_wait_ratio": 0.1,
                                          "step_wall_s": 3.0},
                "verl_metrics": {"critic/score/mean": 0.4, "response_length/mean": 30.0, "timing_s/step": 2.9},
                "learn": {"t_end": t_end, "train_t0": 100.0, "val_s_total": val_total, "val": val, "val_s": val_s,
                          "val_before": before}}

    records = [rec(1, 103.0, 0.0, before={VAL_KEY: 0.3}), rec(2, 110.0, 4.0, val={VAL_KEY: 0.5}, val_s=4.0),
               rec(3, 113.0, 4.0)]
    before, rows = learn_rows(records, val_key, STEP_KEYS)
    assert before == 0.3
    assert [r["wall_s"] for r in rows] == [3.0, 6.0, 9.0]  # 110 - 100 - 4 s of validation
    assert rows[1]["val_acc"] == 0.5 and rows[1]["val_s"] == 4.0 and "val_acc" not in rows[0]
    assert rows[0]["reward"] == 0.4 and rows[0]["step_s"] == 2.9 and rows[0]["rollout_to_train_end_s"] == 2.0


def test_merge_joins_parts_and_refuses_mismatches():
    a = {"steps": 30, "val_every": 5, "task": {"val_sha256_16": "x"}, "runs": _runs(("sync",), seeds=[0, 1])}
    b = {"steps": 30, "val_every": 5, "task": {"val_sha256_16": "x"}, "runs": _runs(("cgp_fgd",), aa=False,
                                                                                    seeds=[0, 1])}
    m = merge([a, b])
    assert len(m["runs"]) == 6 and m["seeds"] == [0, 1] and set(m["modes"]) == {"sync", "cgp_fgd"}
    with pytest.raises(ValueError, match="appears twice"):
        merge([a, a])
    with pytest.raises(ValueError, match="val_every"):
        merge([a, dict(b, val_every=10)])
    with pytest.raises(ValueError, match="task"):
        merge([a, dict(b, task={"val_sha256_16": "y"})])
    # a key the bench records since a later version: an older part that lacks it still merges, the value is kept
    g = dict(b, task={"val_sha256_16": "x", "granularity": "group"})
    assert merge([a, g])["task"] == {"val_sha256_16": "x", "granularity": "group"}
    with pytest.raises(ValueError, match="task"):
        merge([dict(a, task={"val_sha256_16": "x", "granularity": "minibatch"}), g])
    with pytest.raises(ValueError, match="task"):
        merge([a, dict(b, task={"val_sha256_16": "x", "max_response_length": 320})])
    # parts of one comparison share the schedule's design (a part without the record ran the cyclic one)
    assert merge([a, b])["design"] == "cyclic" and merge([a, dict(b, design="cyclic")])["design"] == "cyclic"
    with pytest.raises(ValueError, match="design"):
        merge([a, dict(b, design="williams")])
    # and the base they compare with (a part without the record compared with sync), kept for the analysis
    assert merge([a, dict(b, base="sync")])["base"] == "sync"
    assert merge([dict(a, base="cgp_group"), dict(b, base="cgp_group")])["base"] == "cgp_group"
    with pytest.raises(ValueError, match="bases"):
        merge([a, dict(b, base="cgp_group")])


def test_merge_replaces_a_named_run_by_a_later_parts_rerun_and_keeps_the_old_one():
    from verl_pipe_lab.bench.learn import parse_supersede

    a = {"steps": 30, "val_every": 5, "task": {"val_sha256_16": "x"}, "out": "p0.json",
         "runs": _runs(("sync", "cgp_fgd"), seeds=[0, 1])}
    b = {"steps": 30, "val_every": 5, "task": {"val_sha256_16": "x"}, "out": "p1.json",
         "runs": [dict(r, rerun=True) for r in _runs(("cgp_fgd",), aa=False, seeds=[0])]}
    why = parse_supersede("cgp_fgd@0", "the history fault")
    assert why == {("cgp_fgd", 0): "the history fault"}
    m = merge([a, b], why)
    fgd = [r for r in m["runs"] if r["mode"] == "cgp_fgd"]
    assert len(m["runs"]) == len(a["runs"]) and len(fgd) == 2
    assert [r.get("rerun", False) for r in sorted(fgd, key=lambda r: r["seed"])] == [True, False]
    (old,) = m["superseded"]
    assert (old["mode"], old["seed"], old["part"], old["by_part"], old["reason"]) == (
        "cgp_fgd", 0, "p0.json", "p1.json", "the history fault")
    assert not old["run"].get("rerun") and old["run"]["seed"] == 0
    with pytest.raises(ValueError, match="appears twice"):  # a rerun not named still refused
        merge([a, b])
    with pytest.raises(ValueError, match="cgp_fgd@1: no later part reruns it"):
        merge([a, b], parse_supersede("cgp_fgd@0,cgp_fgd@1", "x"))
    with pytest.raises(ValueError, match="needs --supersede-reason"):
        parse_supersede("cgp_fgd@0", " ")
    with pytest.raises(ValueError, match="MODE@SEED"):
        parse_supersede("fgd@0", "x")
    with pytest.raises(ValueError, match="without --supersede"):
        parse_supersede(None, "x")


def test_cli_refuses_too_few_validations_and_unknown_modes(tmp_path):
    from verl_pipe_lab.bench.learn import cli

    with pytest.raises(SystemExit):
        cli(["--learn", "--out", str(tmp_path / "x.json"), "--modes", "sync,nope"])
    with pytest.raises(SystemExit):
        cli(["--learn", "--out", str(tmp_path / "x.json"), "--steps", "5", "--val-every", "5"])


def test_cli_reanalyzes_a_saved_comparison(tmp_path, capsys):
    from verl_pipe_lab.bench.learn import cli

    saved = tmp_path / "in.json"
    saved.write_text(json.dumps({"steps": 30, "seeds": [0, 1, 2, 3, 4], "val_every": 5, "val_size": 512,
                                 "runs": _runs(speed={"cgp_fgd": 0.7})}))
    out = tmp_path / "out.json"
    assert cli(["--learn", "--reanalyze", str(saved), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["comparison"]["tests"]["cgp_fgd"]["tost"]["equivalent"]
    assert "A/A PASSES" in capsys.readouterr().out


def test_cli_pairs_against_another_base_and_refuses_one_not_run(tmp_path, capsys, monkeypatch):
    # --base cgp_group: FGD against FIFO admission (issue 41), every mode paired with the base, no A/A arm
    from verl_pipe_lab.bench import learn
    from verl_pipe_lab.bench.learn import cli

    saved = tmp_path / "in.json"
    saved.write_text(json.dumps({"steps": 30, "seeds": [0, 1, 2, 3, 4], "val_every": 5, "val_size": 512,
                                 "runs": _runs(modes=("cgp_group", "cgp_fgd"), speed={"cgp_fgd": 0.9}, aa=False)}))
    out = tmp_path / "out.json"
    assert cli(["--learn", "--reanalyze", str(saved), "--out", str(out), "--base", "cgp_group"]) == 0
    result = json.loads(out.read_text())
    cmp = result["comparison"]
    assert result["base"] == cmp["base"] == "cgp_group" and set(cmp["tests"]) == {"cgp_fgd"}
    assert cmp["tests"]["cgp_fgd"]["step_time"]["relative"] == pytest.approx(-0.1) and cmp["aa"] is None
    printed = capsys.readouterr().out
    assert "cgp_fgd vs cgp_group (n=5)" in printed and "(cgp_group's final" in printed
    assert "no A/A arm against the base cgp_group" in printed
    # a reanalysis without --base keeps the base the runs recorded
    assert cli(["--learn", "--reanalyze", str(out), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["comparison"]["base"] == "cgp_group"
    # the base must be one of the modes run, refused before the task is composed (composing it may build its
    # assets: minutes on a fresh machine)
    monkeypatch.setattr(learn, "task_info", lambda *a, **k: pytest.fail("the task was composed"))
    with pytest.raises(SystemExit):
        cli(["--learn", "--out", str(tmp_path / "x.json"), "--modes", "sync,cgp_fgd", "--base", "cgp_group",
             "--dry-run"])
    assert "--base cgp_group: not among the modes run" in capsys.readouterr().err


def test_a_slice_of_the_schedule_keeps_its_order():
    from verl_pipe_lab.bench.learn import slice_plan

    plan = list(enumerate(st.schedule([0, 1], ["sync", "cgp"], "sync")))
    assert slice_plan(plan, "1:4") == plan[1:4] and slice_plan(plan, "4:") == plan[4:]
    with pytest.raises(ValueError, match="START:END"):
        slice_plan(plan, "3")
    with pytest.raises(ValueError, match="no run"):
        slice_plan(plan, "9:")


def test_one_seed_two_modes_go_from_runs_to_json_report_and_charts(tmp_path, capsys):
    # the smoke's shape (docs/learning.md): 1 seed, sync and cgp_fgd, 2 steps validated every step; no TOST (one
    # pair), but the report, the times, the JSON and both charts
    from verl_pipe_lab.bench.learn import analyze_and_write

    runs = [_run("sync", 0, [0.55, 0.6], val_every=1, before=0.5),
            _run("cgp_fgd", 0, [0.6, 0.62], step_s=0.8, val_every=1, before=0.5)]
    out = tmp_path / "smoke.json"
    result = analyze_and_write({"steps": 2, "seeds": [0], "val_every": 1, "val_size": 128, "runs": runs}, out,
                               tmp_path / "charts")
    saved = json.loads(out.read_text())
    t = saved["comparison"]["tests"]["cgp_fgd"]
    assert t["n"] == 1 and "tost" not in t and t["step_time"]["relative"] == pytest.approx(-0.2)
    assert saved["comparison"]["sync_final_mean"] == pytest.approx(0.575)
    assert any("pre-registration asks" in n for n in saved["comparison"]["notes"])
    assert [Path(p).name for p in result["charts"]] == ["learning_acc_vs_wall.png", "learning_val_acc.png"]
    assert all(Path(p).stat().st_size > 10_000 for p in result["charts"])
    assert "too few pairs for the TOST" in capsys.readouterr().out


# Real-stack outputs of the bench, kept in docs/bench (docs/learning.md): every mode and the A/A arm, 3 steps.
KEPT = [Path(__file__).resolve().parents[1] / "docs" / "bench" / "learn_plumbing_digit_math_2026-12-03.json"]


@pytest.mark.parametrize("path", KEPT, ids=lambda p: p.name)
def test_a_kept_real_run_reanalyzes_to_what_it_saved(path, tmp_path):
    # the real stack's JSON goes through today's analysis and charts: a change to the run records, to compare or
    # to the charts that would break --merge/--reanalyze of the full comparison's parts fails here
    from verl_pipe_lab.bench.learn import cli

    kept = json.loads(path.read_text())
    assert {r["mode"] for r in kept["runs"]} >= {BASE, "cgp_fgd"} and kept["task"]["val_size"] >= 128
    assert all(r["provenance"]["git"]["commit"] and r["config"] for r in kept["runs"])
    out = tmp_path / "again.json"
    assert cli(["--learn", "--reanalyze", str(path), "--out", str(out), "--charts", str(tmp_path)]) == 0
    again = json.loads(out.read_text())
    assert again["comparison"]["summary"].keys() == kept["comparison"]["summary"].keys()
    for mode, s in kept["comparison"]["summary"].items():
        assert again["comparison"]["summary"][mode]["final_val_acc"] == s["final_val_acc"]
        assert again["comparison"]["summary"][mode]["time_to_target_s"] == s["time_to_target_s"]
    assert all(Path(p).stat().st_size > 10_000 for p in again["charts"])


def test_length_prediction_summarizes_a_runs_group_records_per_source():
    """A run of a length-aware FGD mode keeps, per source, how its predictions ranked the groups' real lengths (issue
    41 on the natural-tail task); a mode that records no predictions keeps None."""
    from verl_pipe.core.lengths import Prediction, StepLengths

    step = StepLengths([Prediction(3.0, "history", 1.0), Prediction(4.0, "history", 1.0),
                        Prediction(None, "prior", 0.25), Prediction(2.0, "history", 1.0)], 2)
    for g, (a, b) in enumerate([(20, 30), (60, 50), (10, 12), (5, 8)]):
        step.observe(g, a)
        step.observe(g, b)
    wrong = StepLengths([Prediction(2.0, "history", 1.0), Prediction(3.0, "history", 1.0),
                         Prediction(4.0, "history", 1.0)], 2)
    for g, (a, b) in enumerate([(90, 80), (40, 50), (5, 6)]):  # predicted in the reverse order
        wrong.observe(g, a)
        wrong.observe(g, b)
    good = length_prediction(step.record())
    assert good["history"] == {"groups": 3, "rank_correlation": 1.0} and good["prior"]["groups"] == 1
    assert good["siblings"]["groups"] == 4
    assert length_prediction(wrong.record())["history"]["rank_correlation"] == -1.0
    assert length_prediction(step.record() + wrong.record())["history"]["groups"] == 6
    assert length_prediction([]) is None


def test_the_readme_chart_puts_comparisons_side_by_side_and_refuses_a_part(tmp_path, capsys):
    # python -m verl_pipe_lab.bench.learn_charts: one panel per merged comparison; a part with no comparison is refused
    # with its path named, nothing written
    from verl_pipe_lab.bench.learn import analyze_and_write
    from verl_pipe_lab.bench.learn_charts import main, panel_title

    paths = []
    for i, step_s in enumerate((1.0, 1.5)):
        runs = [_run("sync", 0, [0.55, 0.6], step_s=step_s, val_every=1, before=0.5),
                _run("cgp_fgd", 0, [0.6, 0.62], step_s=0.8 * step_s, val_every=1, before=0.5)]
        paths.append(tmp_path / f"cmp{i}.json")
        analyze_and_write({"steps": 2, "seeds": [0], "val_every": 1, "val_size": 128, "runs": runs,
                           "design": "williams"}, paths[-1])
    out = tmp_path / "readme" / "chart.png"
    main([str(p) for p in paths] + ["--out", str(out)])
    assert out.stat().st_size > 10_000
    assert panel_title(paths[0], json.loads(paths[0].read_text())).endswith(
        "1 seeds a mode, williams order, 128 questions, 2 steps")
    part = tmp_path / "part.json"
    part.write_text(json.dumps({"runs": [], "comparison": {"skipped": "no sync"}}))
    with pytest.raises(SystemExit, match="part.json: no comparison to draw"):
        main([str(paths[0]), str(part), "--out", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()
