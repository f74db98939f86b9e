"""verl's colocated default in the simulator and the planner, and the planner's one command from a verl log.

Pure tests (no Ray, no vLLM). The verl logs are written by verl's own formatting code (``tests/verl_logs.py``:
``concat_dict_to_str`` and ``FileLogger`` from the installed verl's source) with the metrics verl's V1 synchronous
trainer logs, their values simulated by ``verl_pipe.sim.colocated`` on the h200 profile scaled by known factors.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.verl_logs import ColocatedRun, colocated_metrics, console_log, file_log
from verl_pipe.core.variants import variant
from verl_pipe.core.workload import lognormal
from verl_pipe.plan import lengths as L
from verl_pipe.plan.hardware import MODELS, PROFILES, model_shape, profile
from verl_pipe.plan.predict import ProfileCosts
from verl_pipe.sim.colocated import ColocatedParams, colocated_step, simulate_colocated
from verl_pipe.sim.engine import CPU_TINY
from verl_pipe.sim.simulate import rollout_for_mode, timeline_for
from verl_pipe.sim.trainer import TrainerParams

RECIPE = ["--config-name", "qwen3_1p7b_gsm8k_4x4", "actor_rollout_ref.rollout.n=8",
          "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.use_kl_loss=false"]


# ------------------------------------------------------------------------------------------- the model

def _tiny():
    wl = lognormal(8, 4, median=40, sigma=0.8, rho=0.7, cap=256, prompt_len=20, seed=3)
    tr = TrainerParams(num_gpus=2, flops_per_s_per_gpu=2e6, linear_flops_per_token=100.0, attn_flops_coef=0.0,
                       microbatch_overhead_s=0.01, use_ref=False, optimizer_step_s=0.05)
    return wl, CPU_TINY.with_(max_num_seqs=16), tr


def test_the_variant_table_knows_the_colocated_peer():
    v = variant("verl_colocated")
    assert v.colocated and not v.ours and not v.overlapped and not v.simulated and v.schedule_as == "sync"


def test_a_colocated_step_lays_its_phases_end_to_end():
    wl, eng, tr = _tiny()
    ro = rollout_for_mode("sync", wl, eng, 2, 2, None)
    free = colocated_step(ro, wl, tr, 2, ColocatedParams())
    sync = timeline_for(ro, wl, tr, "sync", 2, 0.0).metrics()
    # with no transition cost, the colocated step's training is our sync's schedule on the same rollout
    assert free["rollout_to_train_end_s"] == pytest.approx(sync["rollout_to_train_end_s"])
    assert free["trainer_busy_s"] == pytest.approx(sync["trainer_busy_s"])
    p = ColocatedParams(sleep_s=0.7, update_weights_s=1.9)
    m = colocated_step(ro, wl, tr, 2, p)
    assert m["first_unit_ready_s"] == pytest.approx(ro.rollout_end + 0.7)
    assert m["rollout_to_train_end_s"] == pytest.approx(free["rollout_to_train_end_s"] + 0.7)
    assert m["step_time_s"] == pytest.approx(ro.rollout_end + 0.7 + m["train_s"] + 1.9)
    assert m["train_s"] == pytest.approx(free["train_s"]) and p.transition_s == pytest.approx(2.6)
    with pytest.raises(ValueError, match="update_weights_s must be >= 0"):
        ColocatedParams(update_weights_s=-1)
    # more replicas: a shorter rollout (every device rolls out)
    assert simulate_colocated(wl, eng, tr, 4, 2, p)["rollout_end_s"] < m["rollout_end_s"]


def _plan(spec="lognormal:median=1500,sigma=1.0,rho=0.7,cap=4096", costs=None, **kw):
    from tests.test_plan import SHAPE
    from verl_pipe.plan.predict import PlanInputs, plan

    costs = costs or ProfileCosts(profile("h200"), MODELS["qwen3-1.7b"])
    return plan(PlanInputs(kw.pop("shape", SHAPE), costs, L.load(spec, n=8), 300, seeds=(0,), sweep_seeds=(0,),
                           **kw))


class _Costs(ProfileCosts):
    def __init__(self, reload_s):
        super().__init__(profile("h200"), MODELS["qwen3-1.7b"])
        self.reload_s = reload_s

    def colocated_params(self, shape):
        return dict(super().colocated_params(shape), update_weights_s=self.reload_s, sleep_s=0.0)


def test_the_plan_compares_the_best_split_with_colocated():
    p = _plan()
    c, vc = p["colocated"], p["versus_colocated"]
    assert c["gpus"] == 4 and c["replicas"] == 4 and p["modes"]["verl_colocated"]["step_time_s"] == c["step_time_s"]
    best = min(min(s["sync_step_s"], s["recommended_step_s"]) for s in p["splits"])
    assert vc["step_time_s"] == pytest.approx(best)
    assert vc["gain_pct"] == pytest.approx(100 * (1 - best / c["step_time_s"]))
    assert vc["split"] == (vc["gain_pct"] >= 5.0) and vc["uncertainty_pt"] > 0
    want = f"split {vc['rollout_gpus']} + {vc['train_gpus']}" if vc["split"] else "stay colocated"
    assert vc["decision"] == want and vc["rollout_gpus"] + vc["train_gpus"] == 4


def test_the_recommendation_follows_the_cost_of_taking_turns():
    # no tail and no transition cost: taking turns on all GPUs is as good as any split (linear scaling)
    p = _plan("equal:1500", costs=_Costs(0.0))
    assert p["versus_colocated"]["decision"] == "stay colocated", p["versus_colocated"]["message"]
    # a weight reload as long as a step: a split wins
    p = _plan("equal:1500", costs=_Costs(60.0))
    assert p["versus_colocated"]["split"] and p["versus_colocated"]["decision"].startswith("split ")


# ------------------------------------------------------------------------------- one command from a verl log

def _main(argv, capsys):
    from verl_pipe.plan.__main__ import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_one_command_from_a_colocated_verl_log(tmp_path, capsys):
    run = ColocatedRun()
    metrics = colocated_metrics(run, 5)
    log = console_log(tmp_path / "verl.log", metrics)
    rc, out, err = _main(RECIPE + ["--calibrate-verl-log", str(log), "--seeds", "1",
                                   "--out", str(tmp_path / "p.json")], capsys)
    assert rc == 0, err
    assert "split (rollout+trainer GPUs)" in out and "Recommendation vs colocated:" in out
    assert "verl colocated (8 GPUs take turns)" in out
    got = json.loads((tmp_path / "p.json").read_text())
    inp, p = got["inputs"], got["plan"]
    # lengths, prompt length, batch and GPU count from the log
    assert inp["lengths"]["source"].startswith("verl log ") and inp["prompt_len"] == run.prompt_len
    assert "prompt_length/mean" in inp["prompt_len_src"]
    assert inp["shape"]["num_groups"] == run.num_groups  # the recipe's 128 prompts: the log's 256 rows / n=8
    assert inp["shape"]["rollout_gpus"] + inp["shape"]["train_gpus"] == run.gpus
    fit = inp["hardware"]["verl_log"]
    assert fit["engine_scale"] == pytest.approx(run.engine_x, rel=0.06)
    assert fit["update_weights_s"] == pytest.approx(run.update_weights_s)
    # the colocated model on the log's own shape against its measured steps (in-sample: the scales are the log's)
    c = p["colocated"]
    assert c["update_weights_s"] == pytest.approx(run.update_weights_s) and c["log_step_s"]
    assert abs(c["step_time_s"] / c["log_step_s"] - 1) < 0.15
    vc = p["versus_colocated"]
    assert vc["decision"] in out and f"{vc['gain_pct']:+.1f}% ± {vc['uncertainty_pt']:.0f} pt" in out
    assert got["elapsed_s"] < 120


def test_a_file_logger_log_and_the_gpu_count_from_global_seqlen(tmp_path, capsys):
    run = ColocatedRun(gpus=4)
    log = file_log(tmp_path / "exp.jsonl", colocated_metrics(run, 3, drop=("perf/throughput",)))
    rc, out, err = _main(RECIPE + ["--calibrate-verl-log", str(tmp_path), "--seeds", "1", "--no-sweep",
                                   "--out", str(tmp_path / "p.json")], capsys)
    assert rc == 0, err
    inp = json.loads((tmp_path / "p.json").read_text())["inputs"]
    assert inp["shape"]["rollout_gpus"] + inp["shape"]["train_gpus"] == 4
    assert "global_seqlen/mean" in out and "costs from verl's file logger log" in out


def test_refusals_name_the_missing_key_and_the_flag_that_supplies_it(tmp_path, capsys):
    no_prompt = console_log(tmp_path / "a.log", colocated_metrics(ColocatedRun(), 3, drop=("prompt_length/mean",)))
    base = RECIPE + ["--seeds", "1", "--no-sweep"]
    rc, _, err = _main(base + ["--calibrate-verl-log", str(no_prompt)], capsys)
    assert rc == 2
    assert "--calibrate-verl-log " in err and "prompt_length/mean (--prompt-len N supplies it)" in err
    assert "--calibrate " not in err.replace("--calibrate-verl-log ", "")  # the flag that was passed, only
    rc, _, err = _main(base + ["--calibrate-verl-log", str(no_prompt), "--prompt-len", "220"], capsys)
    assert rc == 0, err
    no_len = console_log(tmp_path / "b.log", colocated_metrics(ColocatedRun(), 3,
                                                               drop=("response_length/mean", "response_length/max")))
    rc, _, err = _main(base + ["--calibrate-verl-log", str(no_len)], capsys)
    assert rc == 2 and "response_length/mean (--lengths SPEC supplies the lengths)" in err
    rc, out, err = _main(base + ["--calibrate-verl-log", str(no_len), "--lengths",
                                 "lognormal:median=900,sigma=0.8,rho=0.7,cap=4096"], capsys)
    assert rc == 0, err
    assert "lengths for the fit: drawn from --lengths" in out
    # --calibrate on a verl log without timing keys: refused as a verl log, not read as our steps.jsonl
    no_timing = console_log(tmp_path / "c.log", colocated_metrics(
        ColocatedRun(), 2, drop=("timing_s/gen", "timing_s/update_actor", "timing_s/old_log_prob", "timing_s/step",
                                 "timing_s/update_weights", "timing_s/reward", "timing_s/adv")))
    rc, _, err = _main(base + ["--calibrate", str(no_timing)], capsys)
    assert rc == 2 and "not JSON" not in err
    assert "--calibrate " in err and "timing_s/gen (no flag supplies it: the log must have it)" in err


def test_a_one_step_log_says_its_step_was_fitted(tmp_path, capsys):
    log = console_log(tmp_path / "one.log", colocated_metrics(ColocatedRun(), 1))
    rc, out, err = _main(RECIPE + ["--calibrate-verl-log", str(log), "--seeds", "1", "--no-sweep"], capsys)
    assert rc == 0, err
    assert "left out as warm-up" not in out
    assert "its only training step, fitted with the engines' warm-up in it" in out


def test_the_log_is_a_lengths_source(tmp_path, capsys):
    run = ColocatedRun()
    log = console_log(tmp_path / "verl.log", colocated_metrics(run, 4))
    got = L.load(str(log), n=run.n, cap=run.cap)
    assert got.spec["kind"] == "lognormal" and 0.5 < got.spec["sigma"] < 1.1 and got.prompt_len == run.prompt_len
    st = got.stats(run.cap, run.n)
    assert st["mean"] == pytest.approx(1180, rel=0.15)  # the logged response_length/mean
    rc, out, err = _main(RECIPE + ["--lengths", str(log), "--hardware", "h200", "--seeds", "1", "--no-sweep"], capsys)
    assert rc == 0, err
    assert "lengths: verl log" in out


def test_sglang_is_planned_at_its_fitted_speed(tmp_path, capsys):
    log = console_log(tmp_path / "sgl.log", colocated_metrics(ColocatedRun(), 3))
    argv = RECIPE + ["actor_rollout_ref.rollout.name=sglang", "--seeds", "1", "--no-sweep"]
    rc, out, err = _main(argv + ["--calibrate-verl-log", str(log)], capsys)
    assert rc == 0, err
    assert "rollout.name=sglang: the engine's speed is fitted on the log" in out
    rc, out, err = _main(argv + ["--lengths", "equal:500", "--hardware", "h100"], capsys)
    assert rc == 0, err
    assert "Calibrate on the sglang run's log (--calibrate-verl-log LOG)" in out


def test_an_asynchronous_trainers_log_is_refused(tmp_path, capsys):
    log = console_log(tmp_path / "async.log", colocated_metrics(
        ColocatedRun(), 2, extra={"timing_s/sync_rollout_weights": 0.4}))
    rc, _, err = _main(RECIPE + ["--calibrate-verl-log", str(log), "--seeds", "1", "--no-sweep"], capsys)
    assert rc == 2 and "--calibrate-verl-log" in err and "asynchronous trainer" in err


# ---------------------------------------------------------------------------------- GPUs and model shapes

@pytest.mark.parametrize("name", ["h100", "h200", "gh200", "gh200-144g", "a100", "b200"])
def test_every_profile_tags_and_sources_its_figures(name):
    hw = profile(name)
    figs = hw.figures()
    assert {f["tag"] for f in figs.values()} <= {"measured", "published", "derived", "assumed"}
    for k in ("mem_bytes", "hbm_Bps", "bf16_flops"):
        assert figs[k]["tag"] == "published" and figs[k]["source"], (name, k)
    assert hw.engine(MODELS["qwen3-1.7b"], max_num_seqs=256, max_num_batched_tokens=8192,
                     gpu_memory_utilization=0.85).kv_capacity_tokens > 100_000


def test_public_profiles_figures():
    assert profile("b200").hbm_Bps.v == 8.0e12 and profile("b200").bf16_flops.v == 2250e12
    assert profile("gh200").mem_bytes.v == 96e9 and profile("gh200-144g").hbm_Bps.v == 4.9e12
    assert set(PROFILES) >= {"h100", "h200", "gh200", "a100", "b200"}


# published totals, billions (the model cards): the config.json shapes' parameter counts come within 2%
PUBLISHED_B = {"Qwen2.5-0.5B": 0.49, "Qwen2.5-1.5B": 1.54, "Qwen2.5-3B": 3.09, "Qwen2.5-7B": 7.61,
               "Qwen2.5-14B": 14.7, "Qwen2.5-32B": 32.5, "Qwen3-0.6B": 0.6, "Qwen3-8B": 8.2, "Qwen3-14B": 14.8,
               "Qwen3-32B": 32.8, "Llama-3-8B": 8.03, "Llama-3-70B": 70.6}


@pytest.mark.parametrize("name,billions", sorted(PUBLISHED_B.items()))
def test_model_shapes_from_public_configs(name, billions):
    m = model_shape(f"/no/such/dir/{name}")
    assert m.name == name and m.params / 1e9 == pytest.approx(billions, rel=0.02)
    assert m.src.startswith("huggingface.co/") and m.attention_heads > 0


def test_model_names_as_published():
    assert model_shape("Qwen/Qwen2.5-7B-Instruct").name == "Qwen2.5-7B"
    assert model_shape("meta-llama/Llama-3.1-70B-Instruct").name == "Llama-3-70B"
    assert model_shape("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B").name == "Qwen2.5-1.5B"
    assert model_shape("Qwen3-4B-Instruct-2507").name == "Qwen3-4B"


def test_tensor_parallelism_is_planned_or_refused_with_why():
    from tests.test_plan import SHAPE

    costs = ProfileCosts(profile("h100"), MODELS["llama-3-70b"])
    big = replace(SHAPE, rollout_gpus=8, train_gpus=24, model_path="Llama-3-70B", tp=1)
    with pytest.raises(ValueError, match=r"leave no KV cache .*tensor_model_parallel_size=4"):
        costs.check(big)
    costs.check(replace(big, tp=4))  # 2 replicas of 4 H100s
    e1 = ProfileCosts(profile("h100"), MODELS["qwen3-8b"]).engine(replace(SHAPE, tp=1), "sync")
    e2 = ProfileCosts(profile("h100"), MODELS["qwen3-8b"]).engine(replace(SHAPE, tp=2), "sync")
    assert e2.bw_eff_Bps == pytest.approx(2 * e1.bw_eff_Bps) and e2.kv_capacity_tokens > 2 * e1.kv_capacity_tokens
    with pytest.raises(ValueError, match=r"at least 17 trainer GPUs"):
        costs.check(replace(big, tp=4, train_gpus=8))
    with pytest.raises(ValueError, match="14 attention heads do not split evenly over 4"):
        ProfileCosts(profile("h100"), MODELS["qwen2.5-0.5b"]).check(replace(SHAPE, rollout_gpus=4, tp=4))


# ----------------------------------------------------------------------------- against measured colocated steps

def _records(k=6, engine_x=1.3, sleep=0.4, reload=1.1, gpu=2):
    """Colocated steps as the bench's peer records them (lengths, trainer spans with verl's one update call,
    phases, measured step), made by the model itself with known costs."""
    from verl_pipe.sim.calib import PaddedWorkload
    from verl_pipe.sim.trainer import schedule
    from verl_pipe.plan.verl_log import scale_engine

    eng = scale_engine(CPU_TINY.with_(max_num_seqs=64), engine_x)
    tr = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1 / 2e-4, linear_flops_per_token=1.0, attn_flops_coef=0.0,
                       microbatch_overhead_s=0.0, max_tokens_per_microbatch=1 << 40, logprob_ratio=0.3,
                       use_ref=False, optimizer_step_s=0.0, pad_rows=4)
    out = []
    for i in range(k):
        w = lognormal(8, 4, median=60, sigma=0.9, rho=0.7, cap=512, prompt_len=30, seed=200 + i)
        wl = PaddedWorkload(w.num_groups, w.n, w.lengths, w.prompt_len)
        ro = rollout_for_mode("sync", wl, eng, 1, gpu, None)
        m = colocated_step(ro, wl, tr, gpu, ColocatedParams(sleep_s=sleep, update_weights_s=reload))
        plan = schedule("sync", ro.completions, wl.seq_lens, tr, gpu, ro.rollout_end + sleep)
        lp = [s for s in plan.spans if s[0] == "old_log_prob"][0]
        upd = [s for s in plan.spans if s[0] in ("update", "optimizer_step")]
        spans = [{"kind": "old_log_prob", "start": lp[1], "end": lp[2], "unit": 0},
                 {"kind": "update", "start": min(s[1] for s in upd), "end": max(s[2] for s in upd), "unit": 0}]
        out.append({"mode": "verl_colocated", "step": i, "round": i % 3, "lengths": w.lengths, "prompt_len": 30.0,
                    "groups_per_unit": gpu, "train_spans": spans,
                    "metrics": {"rollout_end_s": ro.rollout_end, "step_time_s": m["step_time_s"]},
                    "phases": [{"phase": "sleep", "start": ro.rollout_end, "end": ro.rollout_end + sleep},
                               {"phase": "weight_reload", "start": m["rollout_to_train_end_s"],
                                "end": m["step_time_s"]}]})
    return out


def test_the_colocated_check_recovers_a_known_model(tmp_path):
    import gzip

    from verl_pipe.plan import colocated_check as CC

    recs = _records()
    f = CC.fit(recs, max_num_seqs=64)
    assert f.engine_scale == pytest.approx(1.3, rel=0.05)
    assert f.params.sleep_s == pytest.approx(0.4) and f.params.update_weights_s == pytest.approx(1.1)
    got = CC.check(recs, max_num_seqs=64)
    assert got["held_out"] == "round" and got["max_abs_rel_error"] < 0.05
    # two settings at other engine speeds: each is fitted on its own steps
    other = [dict(r, setting="b") for r in _records(engine_x=2.0)]
    got = CC.check([dict(r, setting="a") for r in recs] + other, max_num_seqs=64)
    assert got["held_out"] == "round (per setting)" and got["max_abs_rel_error"] < 0.05
    path = tmp_path / "bench_colocated_steps.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"steps": recs + [dict(recs[0], mode="sync")]}, fh)
    assert len(CC.colocated_records(path)) == len(recs)


def _peer_colocated_files():
    from pathlib import Path

    from verl_pipe.plan import colocated_check as CC

    bench = Path(__file__).resolve().parents[1] / "docs" / "bench"
    out = []
    for f in sorted(bench.glob("*.json*")) + sorted(bench.glob("peer/*.json*")):  # peer/: the peer CLI's outputs
        try:
            if CC.colocated_records(f):
                out.append(f)
        except (ValueError, OSError, EOFError):
            continue
    return out


def test_the_colocated_model_within_15pct_of_the_measured_cpu_runs():
    """The colocated peer's real CPU runs (issue 40's bench, kept in docs/bench): each step predicted by a fit on
    the other rounds (or steps), and the run's step time (the mean over its steps, what the planner predicts) within
    15% of the measured one. A single step is held to 40%: the same workload's steps differ by more than 15% on the
    shared 2-core machine (docs/plan.md, Against the real colocated CPU runs), so a per-step bound of 15% would test
    the machine, not the model; 40% still fails a model off by a phase."""
    from verl_pipe.plan import colocated_check as CC

    files = _peer_colocated_files()
    if not files:
        pytest.skip("no verl_colocated steps kept in docs/bench yet (the bench's colocated peer, issue 40)")
    for f in files:
        got = CC.check(CC.colocated_records(f))
        assert abs(got["run_rel_error"]) < 0.15, (f.name, got["run_rel_error"], got["rows"])
        assert got["max_abs_rel_error"] < 0.40, (f.name, got["rows"])


def test_the_public_colocated_figures():
    """verl's fully_async README's colocate-sync rows (Qwen2.5-Math-7B on 32 / 64 / 128 H20): the model's reload,
    derived from the 128-GPU row's residual, leaves the 32- and 64-GPU rows within 0.1% (their phases are the
    published ones: this checks the transition's size and that it does not grow with N, not the phases)."""
    from verl_pipe.plan import colocated_check as CC

    reload_s = profile("h200").colocated(model_shape("Qwen2.5-Math-7B"))["update_weights_s"]
    assert reload_s == pytest.approx(10.72, rel=0.01)
    rows = CC.public_check(reload_s)
    assert [r["gpus"] for r in rows] == [32, 64, 128]
    assert all(abs(r["rel_error"]) < 0.002 for r in rows)
    assert max(r["residual_s"] for r in rows) - min(r["residual_s"] for r in rows) < 0.5


def test_a_large_unmeasured_reload_is_flagged():
    from tests.test_plan import SHAPE
    from verl_pipe.plan.predict import versus_colocated

    coloc = {"step_time_s": 100.0, "sleep_s": 0.5, "update_weights_s": 40.0,
             "update_weights_from": "h100 profile: 141.1 GB bf16 at 1.42 GB/s (derived)"}
    split = [{"rollout_gpus": 1, "train_gpus": 3, "sync_step_s": 90.0, "recommended_step_s": 70.0}]
    conf = {"mode": "cgp", "label": "cgp (group)"}
    vc = versus_colocated(coloc, split, SHAPE, conf, {})
    assert vc["decision"] == "split 1 + 3" and vc["gain_pct"] == pytest.approx(30.0)
    assert "reload are 40% of it" in vc["message"] and "--calibrate-verl-log" in vc["message"]
    measured = dict(coloc, update_weights_from="the log's timing_s/update_weights (4 GPUs)")
    assert "would settle it" not in versus_colocated(measured, split, SHAPE, conf, {})["message"]
