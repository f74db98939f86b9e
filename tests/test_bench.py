"""Benchmark logic without Ray or vLLM: summaries, reductions, the JSON schema, tables, the simulator's
calibration from timelines (checked on timelines the simulator itself produced, where the truth is known)."""

import json
import math

import pytest

from verl_pipe_lab.bench import run as bench
from verl_pipe.sim.calib import (PaddedWorkload, StepShape, engine_intervals, fit_engine, fit_trainer, nonneg_lstsq,
                                   padded_tokens, sim_validation, simulate_like, trainer_cost_split,
                                   trainer_span_samples)
from verl_pipe_lab.bench.report import (MODES, REPORTED, check_schema, format_setting, format_sim_validation, format_sweep,
                                    mode_entry, setting_entry, train_to_rollout_ratio)
from verl_pipe.core.workload import from_spec
from verl_pipe.sim.engine import CPU_TINY
from verl_pipe.sim.simulate import simulate_step
from verl_pipe.sim.trainer import TrainerParams


def fake_metrics(r2t, wait, rollout=4.0, busy=6.0, **kw):
    m = {"rollout_to_train_end_s": r2t, "trainer_wait_ratio": wait, "first_unit_ready_s": 1.0,
         "rollout_end_s": rollout, "first_unit_start_s": 1.1, "ideal_lower_bound_s": r2t * 0.9,
         "pipeline_efficiency": 0.9, "step_time_s": r2t + 1.0, "trainer_busy_s": busy, "weight_sync_s": 1.0}
    m.update(kw)
    return m


def fake_setting(name="longtail-lognormal-test", skipped=None):
    per_mode = {
        "sync": [fake_metrics(10.0, 0.4), fake_metrics(12.0, 0.5)],
        "cgp": [fake_metrics(8.0, 0.2), fake_metrics(9.0, 0.1)],
        "cgp_group": [fake_metrics(7.5, 0.1), fake_metrics(8.5, 0.1)],
        "cgp_fgd": [fake_metrics(7.0, 0.1), fake_metrics(8.0, 0.1)],
    }
    if skipped:
        for m in skipped:
            per_mode.pop(m, None)
    return setting_entry(name, per_mode, {m: "not implemented: test" for m in (skipped or [])}
                         | {"verl_separate_async": "needs TransferQueue"})


def fake_result(settings):
    return {"settings": settings, "sim_validation": {"max_rel_error": 0.05},
            "env": {"cpu": "AMD EPYC", "versions": {"verl": "0.9.1", "vllm": "0.29", "torch": "2.13", "ray": "2.6"},
                    "cpu_info": {"model": "AMD EPYC", "flags": {"avx2": True, "avx512_bf16": False},
                                 "native_bf16": False,
                                 "matmul_1thread": {"fp32_gflops": 38.9, "bf16_gflops": 1.0}}}}


# ---------------------------------------------------------------------------------------------- report


def test_mode_entry_means_spread_and_reductions():
    sync = [fake_metrics(10.0, 0.4), fake_metrics(12.0, 0.5)]
    cgp = [fake_metrics(8.0, 0.2), fake_metrics(9.0, 0.1)]
    e = mode_entry(cgp, sync)
    assert e["rollout_to_train_end_s"] == pytest.approx(8.5)
    assert e["runs"] == 2
    assert e["spread"]["rollout_to_train_end_s"] == pytest.approx(1.0)
    assert e["reduction_vs_sync_pct"] == pytest.approx(100 * (1 - 8.5 / 11.0))
    assert e["wait_reduction_vs_sync_pct"] == pytest.approx(100 * (1 - 0.15 / 0.45))
    # paired per-round reductions: 20% and 25% -> spread 5
    assert e["spread"]["reduction_vs_sync_pct"] == pytest.approx(5.0)
    assert [r["rollout_to_train_end_s"] for r in e["per_run"]] == [8.0, 9.0]
    assert "reduction_vs_sync_pct" not in mode_entry(sync)


def test_train_to_rollout_ratio_is_busy_over_rollout_makespan():
    assert train_to_rollout_ratio([fake_metrics(10, 0.4, rollout=4.0, busy=6.0),
                                   fake_metrics(10, 0.4, rollout=5.0, busy=5.0)]) == pytest.approx(1.25)


def test_setting_entry_has_every_mode_and_conforms():
    s = fake_setting()
    assert list(s["modes"])[:4] == list(MODES)
    assert s["modes"]["verl_separate_async"] == {"skipped": "needs TransferQueue"}
    assert s["sync_train_to_rollout_ratio"] == pytest.approx(1.5)
    for mode in MODES:
        for k in REPORTED:
            assert isinstance(s["modes"][mode][k], float)
    assert check_schema(fake_result([s])) == []
    json.dumps(fake_result([s]))  # plain JSON


def test_skipped_mode_is_recorded_with_its_reason():
    s = fake_setting(skipped=["cgp_group"])
    assert s["modes"]["cgp_group"] == {"skipped": "not implemented: test"}
    assert check_schema(fake_result([s])) == []
    assert "skipped: not implemented: test" in format_setting(s)


def test_setting_names_and_baseline_are_enforced():
    with pytest.raises(ValueError, match="longtail-"):
        setting_entry("balanced", {"sync": [fake_metrics(1, 0.1)]})
    with pytest.raises(ValueError, match="no sync runs"):
        setting_entry("notail-x", {"cgp": [fake_metrics(1, 0.1)]})


@pytest.mark.parametrize("mutate, problem", [
    (lambda r: r.pop("env"), "missing top-level key 'env'"),
    (lambda r: r["settings"][0]["modes"].pop("cgp_fgd"), "mode 'cgp_fgd' missing"),
    (lambda r: r["settings"][0]["modes"]["cgp"].pop("pipeline_efficiency"), "cgp: pipeline_efficiency missing"),
    (lambda r: r["settings"][0].update(name="tail-x"), "must start with longtail- or notail-"),
    (lambda r: r["settings"][0]["modes"].update(cgp_magic={"skipped": "x"}), "unknown mode name 'cgp_magic'"),
    (lambda r: r["settings"][0]["modes"].update(sync={"skipped": "x"}), "sync baseline cannot be skipped"),
    (lambda r: r["settings"][0]["modes"].update(cgp={"skipped": ""}), "skipped needs a reason"),
    (lambda r: r["sim_validation"].pop("max_rel_error"), "sim_validation.max_rel_error"),
    (lambda r: r["env"]["versions"].pop("vllm"), "env.versions.vllm missing"),
    (lambda r: r["env"].pop("cpu_info"), "env.cpu_info.flags missing"),
    (lambda r: r["env"]["cpu_info"]["matmul_1thread"].pop("bf16_gflops"), "env.cpu_info.matmul_1thread"),
])
def test_check_schema_finds_each_problem(mutate, problem):
    r = fake_result([fake_setting()])
    mutate(r)
    assert any(problem in p for p in check_schema(r)), check_schema(r)


def test_check_schema_asks_for_the_modes_the_config_listed():
    # a bench config with `modes: [sync, cgp_fgd]`: its settings have those two modes only, and that conforms
    s = setting_entry("longtail-subset", {"sync": [fake_metrics(10.0, 0.4)], "cgp_fgd": [fake_metrics(7.0, 0.1)]})
    assert set(s["modes"]) == {"sync", "cgp_fgd"}
    r = fake_result([s]) | {"config": {"modes": ["sync", "cgp_fgd"]}}
    assert check_schema(r) == []
    # a mode the config listed is still required
    r["config"]["modes"] = ["sync", "cgp", "cgp_fgd"]
    assert check_schema(r) == ["longtail-subset: mode 'cgp' missing"]
    # without the config, every mode is asked for
    assert "longtail-subset: mode 'cgp_group' missing" in check_schema(fake_result([s]))


def test_tables_render():
    s = fake_setting()
    s["tr_sweep"] = True
    txt = format_setting(s)
    for mode in MODES:
        assert mode in txt
    assert "+22.7%" in txt  # cgp: 1 - 8.5/11
    r = fake_result([s])
    assert "longtail-lognormal-test" in format_sweep(r)
    sv = {"max_rel_error": 0.1, "target_rel_error": 0.15, "per_mode": {"sync": {"mean_rel_error": 0.05,
                                                                                 "max_rel_error": 0.1}},
          "rows": [{"setting": "notail-x", "mode": "sync", "measured_s": 10.0, "predicted_s": 11.0, "rel_error": 0.1}]}
    assert "+10.0%" in format_sim_validation(sv)


def test_mode_kwargs_and_config_files():
    assert bench.mode_kwargs("sync") == dict(mode="sync", granularity="minibatch", fgd=False)
    assert bench.mode_kwargs("cgp_group") == dict(mode="cgp", granularity="group", fgd=False)
    assert bench.mode_kwargs("cgp_fgd", "group") == dict(mode="cgp", granularity="group", fgd=True)
    with pytest.raises(ValueError):
        bench.mode_kwargs("async")
    for name in ("default.yaml", "quick.yaml"):
        cfg = bench.load_config(bench.CONF_DIR / name)
        assert cfg["modes"] == list(MODES)
        assert any(s.get("role") == "balanced" for s in cfg["settings"])
        assert all(s["name"].startswith(("longtail-", "notail-")) for s in cfg["settings"])
        for s in cfg["settings"]:
            from_spec(dict(s["workload"]), 8, 8, 0, 0)  # every workload builds


def test_model_size_moves_the_chosen_settings_or_names_what_it_cannot(capsys):
    ap = bench._parser()
    cfg, settings, _ = bench._bench_config(ap, ap.parse_args(["--quick", "--model-size", "tiny", "--out", "x.json"]))
    assert cfg["model_size"] == "tiny" and settings and all("model_size" not in s for s in settings)
    with pytest.raises(SystemExit):
        bench._bench_config(ap, ap.parse_args(["--quick", "--model-size", "huge", "--out", "x.json"]))
    assert "--model-size huge: not one of tiny" in capsys.readouterr().err
    cfg = {"model_size": "bench"}
    with pytest.raises(SystemExit):
        bench._on_model_size(ap, cfg, [{"name": "s", "stack": "big"}], "tiny")
    assert "setting(s) s run on a named stack" in capsys.readouterr().err
    assert cfg["model_size"] == "bench", "nothing changed when it refused"


def test_env_info_names_cpu_and_versions():
    env = bench.env_info()
    assert isinstance(env["cpu"], str) and env["cpu"]
    assert set(env["versions"]) == {"verl", "vllm", "torch", "ray"}
    info = env["cpu_info"]
    assert info["model"] == env["cpu"] and "avx2" in info["flags"]
    assert info["matmul_1thread"]["fp32_gflops"] > 0 and info["matmul_1thread"]["bf16_gflops"] > 0


# ---------------------------------------------------------------------------------------------- calibration


def test_nonneg_lstsq_drops_negative_columns():
    import numpy as np

    X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    y = np.array([3.0, 2.0, 1.0])  # slope -1: clamped to 0, intercept = mean
    c = nonneg_lstsq(X, y)
    assert c[1] == 0 and c[0] == pytest.approx(2.0)


def test_padded_tokens_pads_each_micro_batch_to_its_longest_row():
    lengths = [[1, 5], [2, 2]]
    assert padded_tokens([0, 1], lengths, prompt_len=10, micro_rows=2) == 2 * 15 + 2 * 12
    assert padded_tokens([0, 1], lengths, prompt_len=10, micro_rows=4) == 4 * 15
    wl = PaddedWorkload(2, 2, lengths, 10)
    assert wl.seq_lens(0) == [15, 15] and wl.lengths == lengths


def test_engine_intervals_reconstructs_fcfs_slots():
    # 3 requests submitted at once, 2 slots: the third starts when the first finishes.
    tl = {"requests": [{"t": 100.0, "request_id": f"r{i}", "group": 0, "replica": 0} for i in range(3)],
          "responses": [{"t": 101.0, "request_id": "r0", "group": 0, "num_tokens": 10},
                        {"t": 102.0, "request_id": "r1", "group": 0, "num_tokens": 20},
                        {"t": 103.0, "request_id": "r2", "group": 0, "num_tokens": 10}]}
    iv = {x["request_id"]: x for x in engine_intervals(tl, max_num_seqs=2)}
    assert iv["r0"]["a"] == 0.0 and iv["r1"]["a"] == 0.0
    assert iv["r2"]["a"] == pytest.approx(1.0) and iv["r2"]["f"] == pytest.approx(3.0)


SHAPE = StepShape(n=4, groups_per_unit=2, micro_rows=4, max_num_seqs=8, max_num_batched_tokens=2048,
                  kv_capacity_tokens=1 << 20)
TRUE_ENGINE = CPU_TINY.with_(max_num_seqs=8, t0_s=4e-3, per_seq_s=8e-4, prefill_flops_per_token=1.0,
                             prefill_flops_per_s=2000.0, kv_capacity_tokens=1 << 20)
TRUE_TRAINER = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1 / 7e-4, linear_flops_per_token=1.0, attn_flops_coef=0.0,
                             microbatch_overhead_s=0.1, max_tokens_per_microbatch=1 << 40, logprob_ratio=0.35,
                             use_ref=False, optimizer_step_s=0.05,
                             swap_cycle_s=0.0)  # the θ_k store's pointer swap (the default on CPU): no copy


def simulated_steps(modes=("sync", "cgp", "cgp_fgd"), trainer=TRUE_TRAINER):
    """'Measured' steps produced by the simulator with known parameters (padded trainer, one replica)."""
    steps = []
    specs = {"longtail-a": {"kind": "lognormal", "median": 24, "sigma": 1.0, "rho": 0.7, "cap": 128},
             "notail-b": {"kind": "equal", "length": 40}}
    for name, spec in specs.items():
        for r in range(2):
            wl0 = from_spec(spec, 8, 4, 0, seed=r)
            wl = PaddedWorkload(8, 4, wl0.lengths, 30)
            for mode in modes:
                tl = simulate_step(wl, TRUE_ENGINE, trainer, mode, 1,
                                   window=8 if mode == "cgp_fgd" else None, groups_per_unit=2, weight_sync_s=0.5)
                steps.append({"setting": name, "mode": mode, "round": r,
                              "granularity": "group" if mode == "cgp_group" else "minibatch",
                              "timeline": tl.to_dict(), "lengths": wl.lengths, "prompt_len": 30.0,
                              "weight_sync_s": 0.5, "metrics": tl.metrics()})
    return steps


def test_fit_recovers_known_simulator_parameters():
    steps = simulated_steps()
    eng = fit_engine(steps, SHAPE.max_num_seqs, TRUE_ENGINE.with_(t0_s=1.0, per_seq_s=1.0))
    # The batch is full (8) most of the time, so t0 and per_seq are only jointly identified: check the step
    # time where the runs spend their time, and the prefill cost.
    for b in (6, 8):
        assert eng.params.step_time(b, 0) == pytest.approx(TRUE_ENGINE.step_time(b, 0), rel=0.1)
    assert eng.prefill_s_per_token == pytest.approx(1 / 2000.0, rel=0.1)
    tr = fit_trainer(steps, SHAPE.micro_rows)
    assert tr.update_line[1] == pytest.approx(7e-4, rel=0.05)
    assert tr.params.logprob_ratio == pytest.approx(0.35, abs=0.02)
    assert tr.update_line[0] == pytest.approx(0.15, abs=0.02)  # h + o


def test_fit_and_validation_with_group_bursts():
    # The trainer is slower than the rollout, so with group granularity it takes the groups that arrived
    # meanwhile in one call (one per-call overhead per burst); later units' old log-probs swap theta_k in and out.
    true = TRUE_TRAINER.with_(call_overhead_s=0.1, microbatch_overhead_s=0.0, swap_save_s=0.02, swap_restore_s=0.02)
    steps = simulated_steps(("sync", "cgp", "cgp_group"), true)
    group_steps = [s for s in steps if s["mode"] == "cgp_group"]
    calls = [trainer_span_samples(s, SHAPE.micro_rows) for s in group_steps]
    assert sum(len(c["forward_backward"]) for c in calls) < 8 * len(group_steps)  # some bursts merged groups
    assert all(len(c["old_log_prob_swapped"]) >= 1 and len(c["swap"]) == 1 for c in calls)
    tr = fit_trainer(steps, SHAPE.micro_rows)
    assert tr.swap_s == pytest.approx(0.02)
    assert tr.params.call_overhead_s == pytest.approx(0.1, abs=0.01)
    assert tr.update_line[1] == pytest.approx(7e-4, rel=0.02)
    assert tr.params.logprob_ratio == pytest.approx(0.35, abs=0.02)
    sv, _ = sim_validation(steps, SHAPE)
    assert sv["per_mode"]["cgp_group"]["max_rel_error"] < 0.03, sv["rows"]
    assert sv["max_rel_error"] < 0.05, sv["rows"]


def test_trainer_span_samples_cover_units_and_whole_batch():
    steps = simulated_steps()
    sync = next(s for s in steps if s["mode"] == "sync")
    smp = trainer_span_samples(sync, SHAPE.micro_rows)
    # the simulator records the optimizer step apart, so its update spans count as forward_backward
    assert len(smp["forward_backward"]) == 4 and len(smp["optimizer_step"]) == 4  # 8 groups / 2 per unit
    whole = padded_tokens(list(range(8)), sync["lengths"], 30, 4)
    assert any(x == pytest.approx(whole) for x, _ in smp["old_log_prob"])


def test_trainer_cost_split_prices_calls_during_and_after_the_rollout():
    # two groups of 2 rows, prompt 10, micro-batches of 2 rows: group 0 pads to 2 x (10 + 4) = 28 tokens, group 1 to 26
    resp = lambda rid, g, n, t: {"t": t, "request_id": rid, "group": g, "num_tokens": n}  # noqa: E731
    span = lambda kind, a, b, unit, groups=None: {"kind": kind, "start": a, "end": b, "unit": unit,  # noqa: E731
                                                  "group": None, **({"groups": groups} if groups else {})}
    tl = {"requests": [], "aborts": [], "units_ready": [{"t": 4.0, "unit": 0, "groups": [0]},
                                                        {"t": 10.0, "unit": 1, "groups": [1]}],
          "responses": [resp("a", 0, 4, 3.0), resp("b", 0, 2, 4.0), resp("c", 1, 3, 9.0), resp("d", 1, 3, 10.0)],
          "train_spans": [span("old_log_prob", 4.0, 4.5, 0, [0]), span("snapshot_theta_k", 4.5, 4.6, 0),
                          span("update", 4.6, 6.0, 0), span("old_log_prob", 9.9, 10.4, 1, [1]),
                          span("update", 10.4, 11.4, 1)]}
    step = {"timeline": tl, "lengths": [[4, 2], [3, 3]], "prompt_len": 10}
    split = trainer_cost_split([step, step], micro_rows=2)  # pooled over steps: the same rates
    assert set(split) == {"old_log_prob", "update"}  # the snapshot has no tokens to price
    assert split["update"]["during_rollout"] == pytest.approx(1000 * 1.4 / 28)
    assert split["update"]["after_rollout"] == pytest.approx(1000 * 1.0 / 26)
    # unit 1's log-prob began 0.1 s before the last response and ended after it: neither during nor after
    assert split["old_log_prob"] == pytest.approx({"during_rollout": 1000 * 0.5 / 28, "across_rollout_end": 1000 * 0.5 / 26})


def test_sim_validation_on_simulated_runs_is_nearly_exact():
    steps = simulated_steps()
    sv, cal = sim_validation(steps, SHAPE)
    assert sv["max_rel_error"] < 0.05, sv["rows"]
    assert sv["holdout_max_rel_error"] < 0.1
    assert set(sv["per_mode"]) == {"sync", "cgp", "cgp_fgd"}
    assert sv["within_target"]
    json.dumps(sv)
    # the simulated rollout has no driver contention: both engine fits describe the same engine
    assert sv["calibration"]["rollout_slowdown_when_overlapped"] == pytest.approx(1.0, abs=0.1)
    m = simulate_like(steps[0], "verl_separate_async", "minibatch", cal.engine_for("cgp"), cal.trainer.params, SHAPE)
    assert m["rollout_to_train_end_s"] > 0


def test_build_result_end_to_end_from_simulated_steps(tmp_path):
    steps = simulated_steps()
    settings = [{"name": "longtail-a", "workload": {"kind": "lognormal"}, "role": "balanced", "tr_sweep": True},
                {"name": "notail-b", "workload": {"kind": "equal"}, "tr_sweep": True}]
    res = bench.build_result({}, settings, steps, {"cgp_group": "not implemented: test"}, {"longtail-a": "minibatch"},
                             {"bench": SHAPE}, bench.env_info(), "needs TransferQueue", [0.5, 1.0])
    assert check_schema(res) == []
    s = res["settings"][0]
    assert s["modes"]["cgp_fgd"]["granularity"] == "minibatch"
    assert s["modes"]["verl_separate_async"]["skipped"] == "needs TransferQueue"
    assert "verl_separate_async" in res["sim"]["settings"][0]["modes"]
    assert [p["target_tr"] for p in res["sim"]["tr_sweep"]] == [0.5, 1.0]
    for p in res["sim"]["tr_sweep"]:
        assert p["sync_train_to_rollout_ratio"] == pytest.approx(p["target_tr"], rel=0.05)
    assert not math.isnan(res["sim_validation"]["max_rel_error"])
    # sync's trainer works after the rollout only; the table prints each mode's split
    assert {p for ph in s["modes"]["sync"]["trainer_s_per_1k_padded_tokens"].values() for p in ph} == {"after_rollout"}
    assert "trainer s per 1k padded tokens" in format_setting(s)
    json.dumps(res)
    pytest.importorskip("matplotlib")
    paths = bench.write_charts(res, steps, tmp_path, {"bench": SHAPE}, None)
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths)
    assert any(p.name.startswith("group_cdf_") for p in paths)
    assert sum(p.name.startswith("timeline_") for p in paths) == 3


def test_simulator_is_calibrated_per_model_size():
    fast = TRUE_TRAINER.with_(time_scale=0.3)  # a cheaper trainer on the "tiny" size
    steps = simulated_steps()
    tiny = []
    for s in simulated_steps():
        if s["mode"] == "cgp_fgd":
            continue
        wl = PaddedWorkload(8, 4, s["lengths"], 30)
        tl = simulate_step(wl, TRUE_ENGINE, fast, s["mode"], 1, groups_per_unit=2, weight_sync_s=0.5)
        tiny.append(dict(s, setting=s["setting"] + "-tiny", model_size="tiny", timeline=tl.to_dict(),
                         metrics=tl.metrics()))
    for s in steps:
        s["model_size"] = "bench"
    sv, fits = bench.validate_per_size(steps + tiny, {"bench": SHAPE, "tiny": SHAPE})
    assert set(fits) == {"bench", "tiny"} and set(sv["calibration"]) == {"bench", "tiny"}
    assert sv["max_rel_error"] < 0.05, sv["rows"]
    ratio = fits["tiny"].trainer.update_line[1] / fits["bench"].trainer.update_line[1]
    assert ratio == pytest.approx(0.3, rel=0.1)
    assert {r["model_size"] for r in sv["rows"]} == {"bench", "tiny"}


def test_adaptive_fgd_window_is_recorded_by_name_and_simulated_as_the_trainer_resolves_it():
    from verl_pipe.core.frontier import AdaptiveWindow

    assert bench.window_label(AdaptiveWindow(capacity=8, floor=4)) == "adaptive"
    assert bench.window_label(16) == 16
    shape = StepShape(**dict(SHAPE.__dict__, fgd_window="adaptive"))
    json.dumps(shape.__dict__)  # the results JSON keeps the shapes
    step = simulated_steps(("sync",))[0]
    adaptive = simulate_like(step, "cgp_fgd", "minibatch", TRUE_ENGINE, TRUE_TRAINER, shape)
    # the adaptive window never holds a request back from the engine's 8 slots: as fast as everything at once
    everything = simulate_like(dict(step, fgd_window=10**6), "cgp_fgd", "minibatch", TRUE_ENGINE, TRUE_TRAINER, shape)
    assert adaptive["rollout_end_s"] == pytest.approx(everything["rollout_end_s"], rel=0.02)
    one_group = simulate_like(dict(step, fgd_window=4), "cgp_fgd", "minibatch", TRUE_ENGINE, TRUE_TRAINER, shape)
    assert one_group["rollout_end_s"] > 1.05 * adaptive["rollout_end_s"]


def test_fit_with_a_copying_theta_k_swap():
    """A store that copies (pinned): each later unit's swap costs save + 2 restores, 3 x the snapshot span."""
    true = TRUE_TRAINER.with_(swap_save_s=0.02, swap_restore_s=0.02, swap_cycle_s=None)
    steps = simulated_steps(("sync", "cgp"), true)
    tr = fit_trainer(steps, SHAPE.micro_rows, swap_copies=3)
    assert tr.swap_s == pytest.approx(0.02)
    assert tr.params.theta_k_swap_s == pytest.approx(0.06)
    assert tr.params.logprob_ratio == pytest.approx(0.35, abs=0.02)


def test_bench_configs_name_their_stacks_and_modes(tmp_path):
    import yaml

    from verl_pipe_lab.bench.settings import CONF_DIR, load_config, stack_of

    cfg = load_config(CONF_DIR / "default.yaml")
    paper = [s for s in cfg["settings"] if s.get("stack") == "paper"]
    assert paper and all(stack_of(s, cfg) == "paper" for s in paper)
    assert stack_of({"name": "longtail-x", "model_size": "tiny"}, cfg) == "tiny"
    assert stack_of({"name": "longtail-x"}, cfg) == cfg["model_size"]
    for bad, msg in [({"stack": "nope"}, "stack 'nope' is not under stacks"),
                     ({"modes": ["sync", "fast"]}, "unknown modes \\['fast'\\]"),
                     # refused before any run (it used to fail in the analysis, after the runs)
                     ({"modes": ["cgp_fgd", "cgp"]}, "lack 'sync'")]:
        c = {"model_size": "bench", "stacks": {"paper": {"model_size": "bench"}},
             "settings": [dict({"name": "longtail-a", "workload": {"kind": "equal", "length": 4}}, **bad)]}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(c))
        with pytest.raises(ValueError, match=msg):
            load_config(tmp_path / "c.yaml")


def test_measured_peers_sit_beside_our_modes_validated_not_calibrated():
    """verl's separate_async measured (lab/verl_pipe_lab/bench/peer): on-policy steps are re-simulated by the simulator's
    model of it (its own rollout speed and mini-step gap fitted on them, our modes' fits untouched), the
    one-batch-ahead ones are reported with their staleness only."""
    steps = simulated_steps()
    peers = []
    for s in simulated_steps(modes=("sync",)):
        wl = PaddedWorkload(8, 4, s["lengths"], 30)
        tl = simulate_step(wl, TRUE_ENGINE, TRUE_TRAINER, "verl_separate_async", 1, groups_per_unit=2,
                           weight_sync_s=0.5)
        common = {"setting": s["setting"], "round": s["round"], "granularity": "minibatch", "lengths": s["lengths"],
                  "prompt_len": 30.0, "weight_sync_s": 0.5, "peer": True,
                  "unavailable": {"num_aborted": "not countable from outside"}}
        m = dict(tl.metrics(), wall_s=tl.metrics()["step_time_s"])
        peers.append(dict(common, mode="verl_separate_async", metrics=m,
                          weight_versions={"max_staleness": 0, "on_policy": True}))
        peers.append(dict(common, mode="verl_separate_async_1off", metrics=dict(m, rollout_to_train_end_s=1.0),
                          weight_versions={"max_staleness": 1, "on_policy": False}))
    settings = [{"name": "longtail-a", "workload": {"kind": "lognormal"}, "role": "balanced"},
                {"name": "notail-b", "workload": {"kind": "equal"}}]
    skip = {"cgp_group": "not implemented: test"}
    res = bench.build_result({}, settings, steps + peers, skip, {}, {"bench": SHAPE}, bench.env_info(), "n/a", None)
    assert check_schema(res) == []
    modes = res["settings"][0]["modes"]
    assert modes["verl_separate_async"]["on_policy"] and modes["verl_separate_async"]["max_staleness"] == 0
    assert not modes["verl_separate_async_1off"]["on_policy"] and modes["verl_separate_async_1off"]["max_staleness"] == 1
    assert "num_aborted" in modes["verl_separate_async"]["unavailable"]
    assert "reduction_vs_verl_separate_async_pct" in modes["cgp_fgd"]
    sv = res["sim_validation"]
    assert "verl_separate_async" in sv["per_mode"] and "verl_separate_async_1off" not in sv["per_mode"]
    assert sv["per_mode"]["verl_separate_async"]["max_rel_error"] < 0.05  # the model it was simulated with
    # our modes' engine and trainer fits are the same with and without the peers; the peer's own terms come from its
    # steps, simulated here on our engine without a gap: scale ~1, no gap
    alone = bench.build_result({}, settings, steps, skip, {}, {"bench": SHAPE}, bench.env_info(), "n/a", None)
    cal = dict(res["sim_validation"]["calibration"]["bench"])
    peer = cal.pop("verl_peer")
    assert cal == alone["sim_validation"]["calibration"]["bench"]
    assert "verl_peer" not in alone["sim_validation"]["calibration"]["bench"]
    assert peer["engine_scale"] == pytest.approx(1.0, abs=0.05) and peer["ministep_gap_s"] == 0.0
    assert peer["steps"] == 4
    assert "verl_separate_async: verl's V1 separate_async, exactly on-policy" in format_setting(res["settings"][0])


def test_paper_targets_are_checked_on_the_paper_settings_only():
    from verl_pipe_lab.bench.report import format_targets, paper_targets

    fgd = {"reduction_vs_sync_pct": 45.0, "wait_reduction_vs_sync_pct": 70.0, "pipeline_efficiency": 0.97,
           "reduction_vs_verl_separate_async_pct": 16.0, "step_time_s": 10.0}
    result = {"settings": [
        {"name": "longtail-x", "role": "balanced", "modes": {"cgp_fgd": dict(fgd, reduction_vs_sync_pct=10.0)}},
        {"name": "longtail-p", "role": "paper", "sync_train_to_rollout_ratio": 1.1, "modes": {"cgp_fgd": fgd}},
        {"name": "notail-p", "role": "paper-control",
         "modes": {"sync": {"step_time_s": 10.0}, "cgp_fgd": {"step_time_s": 10.5}}}]}
    t = paper_targets(result)
    assert t["reduction_vs_sync_pct"] == {"value": 45.0, "target": 42.3, "met": True}
    assert t["wait_reduction_vs_sync_pct"]["met"] is False
    assert t["pipeline_efficiency"]["met"] and t["reduction_vs_verl_separate_async_pct"]["met"]
    assert t["notail_step_time_cost_pct"]["value"] == pytest.approx(5.0) and not t["notail_step_time_cost_pct"]["met"]
    assert t["sync_train_to_rollout_ratio"]["met"]
    assert "NOT met" in format_targets(t)
    assert paper_targets({"settings": result["settings"][:1]}) == {}


def test_step_clock_counts_each_requests_batch_in_engine_steps():
    from verl_pipe.sim.calib import step_batch_sums, step_clock_starts

    # r0 (10 tokens) and r1 (20) start at once; r2 (5) takes r0's slot when it finishes at 1 s
    ivs = [{"request_id": "r0", "a": 0.0, "f": 1.0, "tokens": 10},
           {"request_id": "r1", "a": 0.0, "f": 3.0, "tokens": 20},
           {"request_id": "r2", "a": 1.0, "f": 2.0, "tokens": 5}]
    assert step_clock_starts(ivs) == {"r0": 0.0, "r1": 0.0, "r2": pytest.approx(10.0)}
    sums, started = step_batch_sums(ivs)
    assert list(sums) == pytest.approx([20.0, 35.0, 10.0])  # r1's 20 steps: 10 beside r0, 5 beside r2
    assert list(started) == [2, 3, 1]


def test_engine_fit_sees_the_tail_when_every_request_starts_at_once():
    # 256 long-tailed requests submitted together (paper_tiny's shape): the batch shrinks from 256 to 1, and the
    # fixed step cost decides the tail. Counted in steps, the fit recovers it (a time-averaged batch fitted t0 = 0)
    true = CPU_TINY.with_(max_num_seqs=256, t0_s=3e-3, per_seq_s=2e-4, prefill_flops_per_token=1.0,
                          prefill_flops_per_s=1e5, kv_capacity_tokens=1 << 20)
    steps = []
    for seed in range(2):
        wl0 = from_spec({"kind": "lognormal", "median": 48, "sigma": 1.0, "rho": 0.7, "cap": 512}, 32, 8, 0, seed=seed)
        wl = PaddedWorkload(32, 8, wl0.lengths, 35)
        tl = simulate_step(wl, true, TRUE_TRAINER, "sync", 1, groups_per_unit=4)
        steps.append({"timeline": tl.to_dict(), "prompt_len": 35.0})
    eng = fit_engine(steps, 256, true.with_(t0_s=1.0, per_seq_s=1.0))
    assert eng.params.t0_s == pytest.approx(3e-3, rel=0.15)
    assert eng.params.per_seq_s == pytest.approx(2e-4, rel=0.15)


def test_update_rows_in_length_order_pad_less():
    lengths = [[5, 1], [4, 2]]  # prompt 0, micro-batches of 2 rows
    assert padded_tokens([0, 1], lengths, 0, 2) == 2 * 5 + 2 * 4
    assert padded_tokens([0, 1], lengths, 0, 2, order="length") == 2 * 5 + 2 * 2  # [5, 4] [2, 1]
    p = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1.0, linear_flops_per_token=1.0, attn_flops_coef=0.0,
                      microbatch_overhead_s=0.0, max_tokens_per_microbatch=1 << 40, logprob_ratio=1.0, use_ref=False,
                      pad_rows=2, update_order="length")
    assert p.update_s([5, 1, 4, 2]) == pytest.approx(14.0)  # update calls: length order
    assert p.logprob_s([5, 1, 4, 2]) == pytest.approx(18.0)  # log-prob calls: group order
    assert p.with_(pad_rows=0).update_s([5, 1, 4, 2]) == pytest.approx(12.0)  # unpadded
    with pytest.raises(ValueError, match="update_order"):
        p.with_(update_order="random").update_s([1, 2])


def test_modes_flag_picks_a_subset_in_the_configs_order_and_keeps_sync(capsys):
    ap = bench._parser()
    assert bench._chosen_modes(ap, list(MODES), "cgp_fgd, sync") == ["sync", "cgp_fgd"]
    with pytest.raises(SystemExit):
        bench._chosen_modes(ap, list(MODES), "sync,cgp_fast")
    assert "--modes: cgp_fast not in the config's modes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench._chosen_modes(ap, list(MODES), "cgp,cgp_fgd")
    assert "sync must be among them" in capsys.readouterr().err
    args = ap.parse_args(["--quick", "--out", "x.json", "--modes", "sync,cgp_fgd"])
    cfg, _, _ = bench._bench_config(ap, args)
    assert cfg["modes"] == ["sync", "cgp_fgd"]


def test_rotate_stacks_flips_the_peers_side_and_order():
    ap = bench._parser()
    path = "lab/verl_pipe_lab/bench/conf/peer_split_paper_tiny.yaml"
    cfg, settings, _ = bench._bench_config(ap, ap.parse_args(["--config", path, "--out", "x.json"]))
    assert not cfg.get("peers_first") and settings[0]["peers"] == ["separate_sync", "tuned", "colocated"]
    cfg, settings, _ = bench._bench_config(ap, ap.parse_args(["--config", path, "--rotate-stacks", "--out", "x.json"]))
    assert cfg["peers_first"] is True and settings[0]["peers"] == ["colocated", "tuned", "separate_sync"]
