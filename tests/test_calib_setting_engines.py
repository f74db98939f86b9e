"""Each setting at its own engine speed (``calib.with_setting_engines``): the per-request engine fit pools a stack's
settings, while the host's engine runs at a different speed in each (the trainer's nice level, the batch's shape,
drift). A setting with enough requests of its own gets the pooled engine scaled to its own rollout figures; the
leave-one-setting-out holdout still predicts each setting from the others only, at the pooled speed."""

import pytest

from verl_pipe.sim import calib
from verl_pipe.sim.calib import (PaddedWorkload, StepShape, calibrate, sim_validation, simulate_like,
                                   with_setting_engines)
from verl_pipe.sim.peer_fit import scaled
from verl_pipe.core.workload import from_spec
from verl_pipe.sim.engine import CPU_TINY
from verl_pipe.sim.simulate import simulate_step
from verl_pipe.sim.trainer import TrainerParams

SHAPE = StepShape(n=4, groups_per_unit=2, micro_rows=4, max_num_seqs=8, max_num_batched_tokens=2048,
                  kv_capacity_tokens=1 << 20)
ENGINE = CPU_TINY.with_(max_num_seqs=8, t0_s=4e-3, per_seq_s=8e-4, prefill_flops_per_token=1.0,
                        prefill_flops_per_s=2000.0, kv_capacity_tokens=1 << 20)
TRAINER = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1 / 7e-4, linear_flops_per_token=1.0, attn_flops_coef=0.0,
                        microbatch_overhead_s=0.1, max_tokens_per_microbatch=1 << 40, logprob_ratio=0.35,
                        use_ref=False, optimizer_step_s=0.05, swap_cycle_s=0.0)
# two settings of one stack; the host's engine runs 1.4x slower in the second (say, beside a niced trainer)
SPEED = {"longtail-fast": 1.0, "longtail-slow": 1.4}


def measured_steps(rounds=3):
    """'Measured' steps from the simulator: the same engine at each setting's speed (32 requests a step)."""
    steps = []
    for name, speed in SPEED.items():
        for r in range(rounds):
            wl0 = from_spec({"kind": "lognormal", "median": 24, "sigma": 1.0, "rho": 0.7, "cap": 128}, 8, 4, 0,
                            seed=r)
            wl = PaddedWorkload(8, 4, wl0.lengths, 30)
            for mode in ("sync", "cgp", "cgp_fgd"):
                tl = simulate_step(wl, scaled(ENGINE, speed), TRAINER, mode, 1, window=8 if mode == "cgp_fgd" else None,
                                   groups_per_unit=2, weight_sync_s=0.5)
                steps.append({"setting": name, "mode": mode, "round": r, "granularity": "minibatch",
                              "timeline": tl.to_dict(), "lengths": wl.lengths, "prompt_len": 30.0,
                              "weight_sync_s": 0.5, "metrics": tl.metrics()})
    return steps


def test_each_setting_gets_its_own_speed_over_the_pooled_engine():
    steps = measured_steps()
    cal = calibrate(steps, SHAPE)
    own = with_setting_engines(cal, steps, SHAPE, min_requests=64)
    scales = {name: {kind: fit.scale for kind, fit in fits.items()} for name, fits in own.per_setting.items()}
    assert set(scales) == set(SPEED) and all(set(k) == {"alone", "overlapped"} for k in scales.values())
    for kind in ("alone", "overlapped"):  # the pooled fit sits between the two; the ratio is the hosts' speeds'
        assert scales["longtail-slow"][kind] / scales["longtail-fast"][kind] == pytest.approx(1.4, rel=0.05)
        assert scales["longtail-fast"][kind] < 1.0 < scales["longtail-slow"][kind]
    # each setting's rollout is reproduced at its own speed, much better than at the pooled one
    for name in SPEED:
        for mode in ("sync", "cgp"):
            mine = [s for s in steps if s["setting"] == name and s["mode"] == mode]
            meas = sum(s["metrics"]["rollout_end_s"] for s in mine)
            err = {}
            for which, c in (("pooled", cal), ("own", own)):
                pred = sum(simulate_like(s, mode, "minibatch", c.engine_for(mode, name), c.trainer.params,
                                         SHAPE)["rollout_end_s"] for s in mine)
                err[which] = abs(pred / meas - 1)
            assert err["own"] < 0.05 and err["own"] < err["pooled"] / 2, (name, mode, err)
    # a setting the calibration has no speed for, and verl's peer, run on the pooled engines
    assert own.engine_for("sync", "unknown") == cal.alone.params == own.engine_for("sync")
    assert own.engine_for("cgp", None) == cal.overlapped.params


def test_too_few_requests_keep_the_pooled_engine():
    steps = measured_steps(rounds=2)  # per setting: 64 requests alone (sync), 128 overlapped (cgp, cgp_fgd)
    cal = calibrate(steps, SHAPE)
    assert with_setting_engines(cal, steps, SHAPE, min_requests=129).per_setting == {}
    some = with_setting_engines(cal, steps, SHAPE, min_requests=65).per_setting
    assert {name: set(fits) for name, fits in some.items()} == {name: {"overlapped"} for name in SPEED}
    assert some["longtail-slow"]["overlapped"].scale > 1.0 and some["longtail-fast"]["overlapped"].scale < 1.0
    assert with_setting_engines(cal, steps, SHAPE, min_requests=65).engine_for("sync", "longtail-slow") \
        == cal.alone.params  # the kind without enough requests of its own: pooled
    assert calib.MIN_SETTING_REQUESTS >= 256  # a bench setting's few rounds of a whole step, not a stray step


def test_sim_validation_uses_own_speeds_in_sample_and_the_pooled_one_held_out(monkeypatch):
    steps = measured_steps()
    pooled_sv, _ = sim_validation(steps, SHAPE)  # 96 or 192 requests per setting and kind: below the bench's minimum
    assert "engine_scale_per_setting" not in pooled_sv["calibration"]
    monkeypatch.setattr(calib, "MIN_SETTING_REQUESTS", 64)
    sv, cal = sim_validation(steps, SHAPE)
    assert set(sv["calibration"]["engine_scale_per_setting"]) == set(SPEED)
    assert set(cal.per_setting) == set(SPEED)
    assert sv["max_rel_error"] < pooled_sv["max_rel_error"]
    assert sv["max_rel_error"] < 0.05, sv["rows"]
    # the holdout predicts each setting from a calibration on the other only: no speed of its own, as before
    assert sv["holdout_max_rel_error"] == pytest.approx(pooled_sv["holdout_max_rel_error"])
    # one setting alone: its engine is already its own fit, nothing to scale
    one = [s for s in steps if s["setting"] == "longtail-slow"]
    sv1, cal1 = sim_validation(one, SHAPE)
    assert cal1.per_setting == {} and "engine_scale_per_setting" not in sv1["calibration"]
    # ... unless the engine is a donor's (a capped KV pool borrows an uncapped stack's): then it runs at its own speed
    donor = calibrate([s for s in steps if s["setting"] == "longtail-fast"], SHAPE)
    sv2, cal2 = sim_validation(one, SHAPE, engine_donor=donor)
    assert set(cal2.per_setting) == {"longtail-slow"}
    assert cal2.per_setting["longtail-slow"]["alone"].scale == pytest.approx(1.4, rel=0.05)
    assert sv2["max_rel_error"] < 0.05, sv2["rows"]
