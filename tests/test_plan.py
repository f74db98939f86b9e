"""The planner (verl_pipe/plan): pure tests, no Ray, no vLLM.

- its output for a fixed input (a shape built by hand, the h200 profile, a fixed length spec);
- the calibration round trip: steps simulated with known costs, written by the real trace writer
  (steps.jsonl + step traces), fitted back by ``--calibrate``;
- length sources (a verl rollout dump, our steps.jsonl) and refusals with a message naming the key or record.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from verl_pipe.core.workload import lognormal
from verl_pipe.plan import lengths as L
from verl_pipe.plan.calibrate import calibrate_run
from verl_pipe.plan.hardware import MODELS, profile
from verl_pipe.plan.predict import PlanInputs, ProfileCosts, Rollouts, plan
from verl_pipe.plan.runconfig import CannotModel, Shape, shape_of
from verl_pipe.sim.engine import CPU_TINY
from verl_pipe.sim.simulate import simulate_step
from verl_pipe.sim.trainer import TrainerParams
from verl_pipe.trainer.step_record import step_record, write_trace

SHAPE = Shape(num_groups=16, n=8, groups_per_unit=4, rollout_gpus=2, train_gpus=2, max_num_seqs=64,
              max_num_batched_tokens=8192, max_response_length=4096, max_prompt_length=512,
              gpu_memory_utilization=0.85, micro_rows=8, max_tokens_per_microbatch=24576, recompute=True,
              use_ref=True, padded=False, granularities=("minibatch", "group"), configured_mode="cgp",
              configured_granularity="minibatch", fgd_enabled=True, fgd_window=None, theta_k_store="auto",
              dispatch_order="interleave:8", dispatch_window=None, one_node=True, model_path="Qwen3-1.7B",
              estimator="grpo", cpu=False, unit_fill="completion")


def _plan(shape=SHAPE, spec="lognormal:median=1500,sigma=1.0,rho=0.7,cap=4096", **kw):
    costs = ProfileCosts(profile("h200"), MODELS["qwen3-1.7b"])
    return plan(PlanInputs(shape, costs, L.load(spec, n=shape.n), 300, seeds=(0, 1), **kw))


def test_plan_predicts_the_dispatch_fill_no_faster_than_completion():
    """unit_fill=dispatch waits for the groups dispatched first: never sooner than the completion fill, never later
    than sync on the same rollout (here every request fits in the engines at once, so it gains little)."""
    comp = _plan()["modes"]
    disp = _plan(shape=replace(SHAPE, unit_fill="dispatch"))["modes"]
    for k in ("cgp", "cgp_group"):
        assert comp[k]["rollout_to_train_end_s"] <= disp[k]["rollout_to_train_end_s"] + 1e-9
        assert disp[k]["rollout_to_train_end_s"] <= disp["sync"]["rollout_to_train_end_s"] * 1.01


def test_plan_takes_the_configured_order_beyond_the_frontier():
    # rolloutpipe.fgd.rest_order reaches the planner's FGD rollout (with lengths known: --length-error)
    assert shape_of(_cfg()).fgd_rest_order == "auto"
    assert shape_of(_cfg(**{"rolloutpipe.fgd.rest_order": "longest"})).fgd_rest_order == "longest"
    ro = {order: Rollouts(ProfileCosts(profile("h200"), MODELS["qwen3-1.7b"]),
                          L.load("lognormal:median=1500,sigma=1.0,rho=0.7,cap=4096", n=SHAPE.n), 300, length_error=0.0)
          .get(replace(SHAPE, fgd_rest_order=order), 0, "fgd", window=64, trainer_to_rollout=1.0)
          for order in ("auto", "rank", "longest", "shortest")}
    done = {k: v.completions for k, v in ro.items()}  # (time, group) in completion order
    assert done["auto"] == done["rank"]  # the rule keeps rank at a ratio of 1.0
    assert done["longest"] != done["shortest"] and done["longest"] != done["rank"]


def test_plan_fixed_input():
    p = _plan()
    m = p["modes"]
    assert set(m) == {"sync", "cgp", "cgp_group", "cgp_fgd", "verl_separate_async", "verl_one_step_off",
                      "verl_colocated"}
    # these figures are the simulator's on this input; a change in the simulator or the profile shows here
    assert m["sync"]["rollout_to_train_end_s"] == pytest.approx(33.98, rel=0.01)
    for k in ("cgp", "cgp_group", "cgp_fgd"):
        assert m[k]["rollout_to_train_end_s"] < m["sync"]["rollout_to_train_end_s"]
        assert m[k]["trainer_wait_ratio"] < m["sync"]["trainer_wait_ratio"]
    # the recommendation is the fastest pipelined mode and names overrides that launch it
    rec = p["recommendation"]
    best = min(m[k]["rollout_to_train_end_s"] for k in ("cgp", "cgp_group", "cgp_fgd"))
    assert rec["rollout_to_train_end_s"] <= best + 1e-9
    assert "rolloutpipe.mode=cgp" in rec["overrides"]
    assert f"rolloutpipe.cgp.granularity={rec['granularity']}" in rec["overrides"]
    assert [s["rollout_gpus"] for s in p["splits"]] == [1, 2, 3]
    assert rec["split"]["rollout_gpus"] + rec["split"]["train_gpus"] == 4
    assert p["verdict"]["helps"], p["verdict"]["message"]
    # step time = rollout→train end + the weight sync (one node: 4.06 GB over NVLink)
    assert m["sync"]["step_time_s"] == pytest.approx(m["sync"]["rollout_to_train_end_s"] + 0.0406, abs=1e-3)


def test_plan_says_when_pipelining_will_not_help():
    # equal lengths and every request in the engine at once: all groups finish together, nothing to overlap
    shape = SHAPE
    p = _plan(shape, "equal:4000", sweep_splits=False)
    v = p["verdict"]
    assert not v["helps"]
    assert "will NOT help" in v["message"] and "no tail" in v["message"]
    assert p["recommendation"]["mode"] == "sync" and p["recommendation"]["overrides"][0] == "rolloutpipe.mode=sync"
    p = _plan(shape, "lognormal:median=1500,sigma=1.0,rho=0.7,cap=4096", sweep_splits=False)
    assert p["verdict"]["helps"]


def test_plan_respects_estimator_granularities():
    p = _plan(replace(SHAPE, granularities=("group",)), sweep_splits=False)
    assert "skipped" in p["modes"]["cgp"]
    assert p["recommendation"]["granularity"] == "group"


def _cfg(**over):
    base = {"algorithm": {"adv_estimator": "grpo"}, "data": {"train_batch_size": 16, "max_response_length": 1024,
                                                              "max_prompt_length": 256},
            "actor_rollout_ref": {"rollout": {"name": "vllm", "n": 8, "tensor_model_parallel_size": 1,
                                              "nnodes": 1, "n_gpus_per_node": 4},
                                  "actor": {"ppo_mini_batch_size": 4}, "model": {"path": "Qwen3-1.7B"}},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 4, "device": "cuda"}, "rolloutpipe": {"platform": "gpu"}}
    cfg = OmegaConf.create(base)
    for k, v in over.items():
        OmegaConf.update(cfg, k, v, force_add=True)
    return cfg


@pytest.mark.parametrize("key,value,names", [
    ("algorithm.adv_estimator", "gae", "algorithm.adv_estimator=gae"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", 3, "tensor_model_parallel_size=3: must divide the 4"),
    ("rolloutpipe.oversample", 4, "rolloutpipe.oversample"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", 5, "ppo_mini_batch_size=5"),
    ("actor_rollout_ref.rollout.name", "trtllm", "rollout.name=trtllm"),
])
def test_refuses_what_it_cannot_model(key, value, names):
    assert shape_of(_cfg()).num_groups == 16  # the base config is modelled
    with pytest.raises(CannotModel, match=names.replace(".", r"\.")):
        shape_of(_cfg(**{key: value}))


def test_cli_refuses_cpu_config_and_bad_lengths(capsys):
    from verl_pipe.plan.__main__ import main

    assert main(["--lengths", "equal:100", "--no-sweep"]) == 2  # the CPU default config
    assert "rolloutpipe.platform=cpu" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--lengths lognormal:median=5: lognormal needs sigma"):
        L.load("lognormal:median=5", n=8)
    with pytest.raises(ValueError, match="no such file"):
        L.load("/nonexistent/steps.jsonl", n=8)


def test_verl_dump_keeps_groups(tmp_path):
    dump = tmp_path / "3.jsonl"
    recs = [{"input": f"q{g}", "output": "x" * (40 * (g + 1)), "gts": "1", "score": 0.0, "step": 3}
            for g in range(3) for _ in range(4)]
    dump.write_text("\n".join(json.dumps(r) for r in recs))
    with pytest.raises(ValueError, match="--tokenizer PATH"):
        L.load(str(dump), n=4)
    got = L.load(str(dump), n=4, chars_per_token=4.0)
    assert sorted(got.groups) == [[11] * 4, [21] * 4, [31] * 4]  # 40/80/120 chars / 4 + EOS
    wl = got.workload(10, 4, cap=25, prompt_len=10, seed=0)
    assert all(len(set(g)) == 1 for g in wl.lengths)  # drawn whole: a group's responses stay together
    assert max(max(g) for g in wl.lengths) <= 25
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "q"}))
    with pytest.raises(ValueError, match="record 1 has no 'input'/'output'"):
        L.load(str(bad), n=4)


# ------------------------------------------------------------------------------------ calibration round trip

ENGINE = CPU_TINY.with_(max_num_seqs=32, t0_s=2e-3, per_seq_s=5e-4, prefill_flops_per_token=1.0,
                        prefill_flops_per_s=1 / 2e-4)
TRAINER = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1 / 4e-4, efficiency=1.0, linear_flops_per_token=1.0,
                        attn_flops_coef=0.0, call_overhead_s=0.3, microbatch_overhead_s=0.0,
                        max_tokens_per_microbatch=1 << 40, logprob_ratio=0.4, use_ref=False, optimizer_step_s=0.05,
                        swap_save_s=0.01, swap_restore_s=0.01, swap_cycle_s=0.0, opt_snapshot_s=0.0)


def _record_run(trace_dir, modes=("sync", "cgp", "cgp_group", "sync", "cgp", "cgp_group"), warmup=False):
    """A run's steps.jsonl and traces, simulated with known costs; ``warmup``: a step 0 before them (what a real
    run's first step is to the fit: left out)."""
    from verl_pipe.sim.calib import PaddedWorkload

    for step, mode in enumerate(modes, 0 if warmup else 1):
        wl = lognormal(8, 4, median=60, sigma=0.6, rho=0.7, cap=256, prompt_len=20, seed=step)
        pw = PaddedWorkload(wl.num_groups, wl.n, wl.lengths, wl.prompt_len)
        tl = simulate_step(pw, ENGINE, TRAINER, mode, 1, groups_per_unit=2,
                           granularity="group" if mode == "cgp_group" else "minibatch", weight_sync_s=0.2)
        tm = tl.metrics()
        write_trace(trace_dir, tl, step_record(step, list(range(8)), list(range(8)), tm),
                    {"prompt_length/mean": 20.0, "rolloutpipe/x": 1})


def test_calibration_round_trip(tmp_path):
    _record_run(tmp_path, modes=("sync", "sync", "cgp", "cgp_group", "sync", "cgp", "cgp_group"), warmup=True)
    rc = calibrate_run(tmp_path, micro_rows=4, max_num_seqs=32, max_num_batched_tokens=2048, train_gpus=1)
    assert rc.modes == {"sync": 2, "cgp": 2, "cgp_group": 2}  # the first step (the warm-up) is left out
    assert (rc.shape.n, rc.shape.groups_per_unit, rc.shape.num_replicas) == (4, 2, 1)
    t = rc.cal.trainer.params
    assert 1 / t.flops_per_s_per_gpu == pytest.approx(4e-4, rel=0.15)  # seconds per padded token
    assert t.call_overhead_s == pytest.approx(0.3, rel=0.25)
    assert t.optimizer_step_s == pytest.approx(0.05, abs=0.03)
    e = rc.cal.alone.params
    assert e.step_time(16, 0) == pytest.approx(ENGINE.step_time(16, 0), rel=0.25)
    assert rc.weight_sync_s == pytest.approx(0.2)
    assert rc.self_check["max_rel_error"] < 0.1  # the fit re-simulates its own steps


def test_calibration_refuses_incomplete_run(tmp_path):
    with pytest.raises(ValueError, match="no steps.jsonl"):
        calibrate_run(tmp_path, micro_rows=4, max_num_seqs=32, max_num_batched_tokens=2048, train_gpus=1)
    _record_run(tmp_path, modes=("sync",))
    (tmp_path / "step_00001.json").unlink()
    with pytest.raises(ValueError, match=r"record 1 \(step 1\): its Chrome trace step_00001.json"):
        calibrate_run(tmp_path, micro_rows=4, max_num_seqs=32, max_num_batched_tokens=2048, train_gpus=1)


def test_lengths_from_our_steps(tmp_path):
    _record_run(tmp_path, modes=("sync", "cgp"))
    got = L.load(str(tmp_path), n=4)
    assert len(got.groups) == 16 and all(len(g) == 4 for g in got.groups)
    assert got.prompt_len == 20.0
    want = sorted(sorted(g) for s in (1, 2) for g in lognormal(8, 4, median=60, sigma=0.6, rho=0.7, cap=256,
                                                                 prompt_len=20, seed=s).lengths)
    assert sorted(sorted(g) for g in got.groups) == want


def test_calibration_leaves_the_warm_up_step_out(tmp_path):
    from verl_pipe.plan.calibrate import load_run

    _record_run(tmp_path, modes=("sync", "cgp"))
    steps = load_run(tmp_path)
    lines = [line for line in (tmp_path / "steps.jsonl").read_text().splitlines() if line.strip()]
    assert len(steps) == len(lines) - 1 and steps[0]["step"] != 1
