"""bench.sim_windows rebuilds the calibrated simulator from a results JSON's summary: the rebuilt engine and trainer
must predict what the fitted ones predict."""

import pytest

from verl_pipe.sim.calib import calibrate, calibration_summary, simulate_like
from verl_pipe_lab.bench.sim_windows import format_rows, simulate_setting
from verl_pipe.sim.records import engine_from_summary, trainer_from_summary
from tests.test_bench import SHAPE, simulated_steps


def test_rebuilt_calibration_predicts_like_the_fit():
    steps = simulated_steps()
    cal = calibrate(steps, SHAPE)
    summary = calibration_summary(cal)
    trainer = trainer_from_summary(summary["trainer"])
    for mode, key in (("sync", "engine_alone"), ("cgp", "engine_overlapped"), ("cgp_fgd", "engine_overlapped")):
        engine = engine_from_summary(summary[key], SHAPE)
        for step in steps[:4]:
            want = simulate_like(step, mode, "minibatch", cal.engine_for(mode), cal.trainer.params, SHAPE)
            got = simulate_like(step, mode, "minibatch", engine, trainer, SHAPE)
            assert got["rollout_to_train_end_s"] == pytest.approx(want["rollout_to_train_end_s"], rel=1e-6)
            assert got["rollout_end_s"] == pytest.approx(want["rollout_end_s"], rel=1e-6)


def test_simulate_setting_compares_every_window_with_cgp():
    summary = calibration_summary(calibrate(simulated_steps(), SHAPE))
    setting = {"name": "notail-x", "workload": {"kind": "equal", "length": 24}}
    modes = simulate_setting(setting, SHAPE, 8, summary, ["adaptive", "null", "2"], rounds=2, seed=0, prompt_len=30)
    assert set(modes) == {"sync", "cgp", "cgp_fgd[adaptive]", "cgp_fgd[null]", "cgp_fgd[2]"}
    assert modes["cgp"]["vs_cgp_pct"] == 0.0
    # 32 requests on 8 slots, group-major: FGD's rank order is the stock order, the adaptive window never holds a
    # request back, so nothing changes; a window of 2 runs a quarter of the batch
    assert modes["cgp_fgd[adaptive]"]["rollout_end_s"] == pytest.approx(modes["cgp"]["rollout_end_s"])
    assert modes["cgp_fgd[2]"]["rollout_end_s"] > 1.2 * modes["cgp"]["rollout_end_s"]
    row = {"setting": "notail-x", "stack": "bench", "requests": 32, "max_num_seqs": 8, "kv_capacity_tokens": 1,
           "baseline_order": "group_major", "client_s_per_request": 0.0, "modes": modes}
    assert "cgp_fgd[adaptive]" in format_rows([row])


def test_sim_tail_models_group_granularity_and_every_knowledge():
    """sim_tail at group granularity: the same settings and knowledge, with both arms at that granularity (the cgp
    variant's is fixed at mini-batch, so the baseline is cgp_group there): the baseline's timeline changes with it."""
    from verl_pipe_lab.bench.sim_tail import simulate_setting as tail_setting
    from verl_pipe.sim.tail import Knowledge

    summary = calibration_summary(calibrate(simulated_steps(), SHAPE))
    setting = {"name": "longtail-x", "workload": {"kind": "lognormal", "median": 24, "sigma": 1.0, "rho": 0.7,
                                                  "cap": 96, "prompts": 8, "cross_epoch": 0.6}}
    knowledge = [Knowledge.parse(k) for k in ("off", "perfect", "predicted")]
    step_s = {}
    for gran in ("minibatch", "group"):
        res = tail_setting(setting, SHAPE, 8, summary, knowledge, rounds=3, seed=0, prompt_len=30,
                           unit_fill="completion", granularity=gran)
        assert set(res["modes"]) == {"cgp", "cgp_fgd[off]", "cgp_fgd[perfect]", "cgp_fgd[predicted]"}
        assert res["modes"]["cgp"]["vs_cgp_pct"] == 0.0
        step_s[gran] = res["modes"]["cgp"]["rollout_to_train_end_s"]
    assert step_s["group"] != pytest.approx(step_s["minibatch"], rel=1e-6)


def test_sim_tail_refuses_an_unknown_granularity(capsys):
    from verl_pipe_lab.bench.sim_tail import main

    with pytest.raises(SystemExit):
        main(["--config", "lab/verl_pipe_lab/bench/conf/fgd_tail.yaml", "--calibration", "x.json", "--granularity", "unit"])
    assert "--granularity" in capsys.readouterr().err
