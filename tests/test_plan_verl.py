"""The planner's verl peer costed as verl, its recorded-run calibration, its mixture-of-experts model and its
public-figures run: pure tests, no Ray, no vLLM (docs/plan.md).

- verl's trainer fitted on verl's own spans: known costs recovered from simulated peer steps, and the fit
  re-simulates them;
- ``--calibrate`` on a recorded bench run (docs/bench/trainer_gap_quick_steps_2026-12-01.json.gz): the planner's
  fit equals the bench's own calibration recorded in the run's JSON, and verl's peer is fitted on its own spans;
- refusals of steps files the planner cannot calibrate on, naming the file and what to pass;
- the MoE decode model and the per-node overrides of a multi-node split.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from verl_pipe.sim.calib import PaddedWorkload, StepShape, calibration_summary
from verl_pipe.core.workload import lognormal
from verl_pipe.plan.calibrate import calibrate_run, fit_verl_trainer, peer_totals, verl_check
from verl_pipe.sim.engine import CPU_TINY
from verl_pipe.sim.simulate import simulate_step
from verl_pipe.sim.trainer import TrainerParams

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "docs/bench/trainer_gap_quick_steps_2026-12-01.json.gz"
QUICK_JSON = REPO / "docs/bench/trainer_gap_quick_2026-12-01.json"
ENGINE = CPU_TINY.with_(max_num_seqs=32, t0_s=2e-3, per_seq_s=5e-4, prefill_flops_per_token=1.0,
                        prefill_flops_per_s=1 / 2e-4)
# verl's trainer in the fit's own form: update 0.2 s + 5e-4 s/token, old log-prob 0.1 s + 2e-4 s/token
VERL = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1 / 5e-4, efficiency=1.0, linear_flops_per_token=1.0,
                     attn_flops_coef=0.0, call_overhead_s=0.0, microbatch_overhead_s=0.0,
                     max_tokens_per_microbatch=1 << 40, logprob_ratio=0.4, use_ref=False, optimizer_step_s=0.2,
                     swap_save_s=0.0, swap_restore_s=0.0, swap_cycle_s=0.0, opt_snapshot_s=0.0,
                     verl_swap_save_s=0.1, verl_swap_restore_s=0.0)


def _peer_steps(groups_per_unit: int, num_groups: int, seeds=(0, 1, 2)) -> list[dict]:
    """verl peer records as the bench keeps them (train_spans of old_log_prob and update per mini-batch, the
    trained groups' lengths), simulated with VERL: the simulator's cpu_swap / optimizer_step spans are inside
    the old_log_prob / update calls, as verl's hooks time them."""
    out = []
    for seed in seeds:
        wl = lognormal(num_groups, 4, median=60, sigma=0.6, rho=0.7, cap=256, prompt_len=20, seed=seed)
        pw = PaddedWorkload(wl.num_groups, wl.n, wl.lengths, wl.prompt_len)
        tl = simulate_step(pw, ENGINE, VERL, "verl_separate_async", 1, groups_per_unit=groups_per_unit,
                           weight_sync_s=0.0)
        spans, into = [], {"cpu_swap": "old_log_prob", "optimizer_step": "update"}
        for sp in sorted(tl.to_dict()["train_spans"], key=lambda s: s["start"]):
            kind = into.get(sp["kind"], sp["kind"])
            if spans and spans[-1]["kind"] == kind and spans[-1]["unit"] == sp["unit"]:
                spans[-1]["end"] = sp["end"]
            else:
                spans.append({"kind": kind, "start": sp["start"], "end": sp["end"], "unit": sp["unit"]})
        out.append({"setting": "s", "mode": "verl_separate_async", "train_spans": spans, "lengths": wl.lengths,
                    "prompt_len": 20.0, "weight_sync_s": 0.0, "metrics": tl.metrics(), "round": seed})
    return out


def test_verl_fit_recovers_known_costs():
    peer = _peer_steps(2, 8) + _peer_steps(2, 12)  # two mini-batch counts: per call and per token separate
    vf = fit_verl_trainer(peer)
    assert vf.intercepts == "fitted"
    assert vf.update_line == pytest.approx((0.2, 5e-4), rel=1e-6)
    assert vf.logprob_line == pytest.approx((0.1, 2e-4), rel=1e-6)
    shape = StepShape(n=4, groups_per_unit=2, micro_rows=4, max_num_seqs=32, max_num_batched_tokens=2048,
                      kv_capacity_tokens=1 << 40)
    check = verl_check(peer[:3], ENGINE, vf, shape)  # re-simulated with the fit: the measured steps back
    assert check["rel_error"] < 1e-6


def test_verl_fit_with_one_mini_batch_count_takes_our_per_call_cost():
    class Ours:  # our trainer's fit on the same run: only its per-call costs are used
        update_line, logprob_line = (0.2, 9e-4), (0.1, 9e-4)

    peer = _peer_steps(2, 8)
    vf = fit_verl_trainer(peer, Ours())
    assert vf.intercepts == "ours"
    assert vf.update_line == pytest.approx((0.2, 5e-4), rel=1e-6)  # verl's own per-token cost, not ours
    assert vf.logprob_line == pytest.approx((0.1, 2e-4), rel=1e-6)
    u, tok, upd, lp = peer_totals(peer[0])
    assert u == 4 and upd == pytest.approx(0.2 * u + 5e-4 * tok)


def test_calibrate_on_a_recorded_bench_run_is_the_bench_calibration():
    """--calibrate on a run recorded here (the trainer-gap bench, 2026-12-01): the same fit the bench recorded in
    its JSON, and verl's peer fitted on its own spans, re-simulated within 5%."""
    rc = calibrate_run(f"{QUICK}:bench", micro_rows=0, max_num_seqs=0, max_num_batched_tokens=0, train_gpus=1)
    assert rc.modes == {"sync": 3, "cgp": 3, "cgp_group": 3, "cgp_fgd": 3, "verl_separate_async": 3}
    assert (rc.shape.n, rc.shape.groups_per_unit, rc.shape.micro_rows, rc.shape.max_num_seqs) == (8, 2, 8, 16)
    recorded = json.loads(QUICK_JSON.read_text())["sim_validation"]["calibration"]["bench"]
    mine = calibration_summary(rc.cal)
    for part in ("trainer", "engine_alone", "engine_overlapped"):
        for k, v in recorded[part].items():
            if isinstance(v, float):
                assert mine[part][k] == pytest.approx(v, rel=1e-9), (part, k)
    v = rc.verl.summary(rc.cal.trainer)
    assert v["steps"] == 3 and v["intercepts"] == "ours"
    # verl's update per padded token is its own, not ours (docs/trainer_gap.md: verl's rows are not length-sorted)
    assert v["update_s_per_1k_padded_tokens"] > 1.1 * v["ours_update_s_per_1k_padded_tokens"]
    assert rc.self_check["per_mode"]["verl_separate_async"]["rel_error"] < 0.05
    assert rc.self_check["max_rel_error"] < 0.1


def test_calibrate_refuses_what_it_cannot_fit(tmp_path):
    both = tmp_path / "steps.json.gz"
    d = json.loads(gzip.open(QUICK, "rt").read())
    d["shapes"]["quick_arrival"] = dict(d["shapes"]["quick_arrival"], max_num_seqs=64)
    both.write_bytes(gzip.compress(json.dumps(d).encode()))
    kw = dict(micro_rows=0, max_num_seqs=0, max_num_batched_tokens=0, train_gpus=1)
    with pytest.raises(ValueError, match=r"different shapes; name one as .*:SIZE"):
        calibrate_run(both, **kw)
    with pytest.raises(ValueError, match="no steps of model size 'nope'"):
        calibrate_run(f"{both}:nope", **kw)
    peer_only = tmp_path / "peer.json"
    peer_only.write_text(json.dumps({"mode": "verl_separate_async", "steps": [
        s for s in d["steps"] if s["mode"] == "verl_separate_async"]}))
    with pytest.raises(ValueError, match="verl's steps only.*--calibrate-verl"):
        calibrate_run(peer_only, **kw)


def test_cli_calibrated_on_one_config_plans_another(capsys):
    """The quick trainer-gap run calibrates; the paper shape (4x the prompts, units of 4, 256 slots) is planned:
    docs/plan.md's validation compares this with the paper run's measurements."""
    from verl_pipe.plan.__main__ import main

    rc = main(["--calibrate", f"{QUICK}:bench", "--lengths", str(QUICK) + ":bench", "--no-sweep", "--seeds", "1",
               "data.train_batch_size=32", "actor_rollout_ref.rollout.n=8",
               "actor_rollout_ref.actor.ppo_mini_batch_size=4",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.max_num_seqs=256",
               "data.max_response_length=128", "actor_rollout_ref.rollout.max_model_len=208"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "verl's modes are costed with verl's own trainer, fitted on 3 verl steps" in out
    assert "32 prompts x 8, units of 4 prompts" in out


def test_moe_decode_reads_the_experts_its_batch_touches():
    from verl_pipe.plan.hardware import MODELS, MoEEngineParams, profile

    m = MODELS["qwen3.5-35b-a3b"]
    e = profile("h200").engine(m, max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.85)
    assert isinstance(e, MoEEngineParams) and e.weight_bytes == pytest.approx(70e9)
    assert e.dense_bytes + e.expert_bytes == pytest.approx(70e9)
    # one sequence reads the dense part and 8 of 256 experts per layer: the 3B active parameters, in bf16
    assert e.weight_read_bytes(1) == pytest.approx(2 * 3e9, rel=1e-6)
    assert e.weight_read_bytes(256) == pytest.approx(70e9, rel=1e-3)  # a full batch touches nearly every expert
    assert e.step_time(1, 0) < e.step_time(64, 0) < e.step_time(256, 0)
    assert e.with_(max_num_seqs=8).weight_read_bytes(1) == e.weight_read_bytes(1)  # with_ keeps the MoE model
    assert m.kv_bytes_per_token == 2 * 10 * 2 * 256 * 2  # only the 10 softmax-attention layers hold a KV cache


def test_split_overrides_per_node():
    from tests.test_plan import SHAPE
    from verl_pipe.plan.predict import overrides_for

    shape = replace(SHAPE, rollout_gpus=16, train_gpus=16, rollout_nnodes=2, train_nnodes=2)
    rec = {"mode": "cgp", "granularity": "group", "fgd": False, "split": {"rollout_gpus": 20, "train_gpus": 12}}
    assert overrides_for(rec, shape)[-2:] == ["actor_rollout_ref.rollout.n_gpus_per_node=10",
                                              "trainer.n_gpus_per_node=6"]
    rec["split"] = {"rollout_gpus": 21, "train_gpus": 11}
    assert overrides_for(rec, shape)[-4:] == ["actor_rollout_ref.rollout.nnodes=1",
                                              "actor_rollout_ref.rollout.n_gpus_per_node=21", "trainer.nnodes=1",
                                              "trainer.n_gpus_per_node=11"]


def test_validation_costs_verl_as_verl():
    """docs/plan.md's validation: verl's peer predicted with its trainer fitted on its own spans, beside the same
    prediction with our trainer's costs; the kept per-step file is found by its name."""
    from verl_pipe.plan.calibrate import steps_file
    from verl_pipe.plan.validate import in_run_verl, steps_path

    assert steps_path(REPO / "docs/bench", QUICK_JSON.name) == QUICK
    got = in_run_verl(steps_file(QUICK, "bench"))["longtail-quick"]
    assert abs(got["as_verl"]) < 0.05 < abs(got["as_ours"])
