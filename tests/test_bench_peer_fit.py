"""verl's peer's own terms in the simulator (verl_pipe/sim/peer_fit.py), on steps the simulator made with known
values: its rollout's speed from its rollout figures, its mini-step gap from its spans."""

import pytest

from verl_pipe.sim.calib import PaddedWorkload, simulate_like
from verl_pipe.sim.peer_fit import fit_engine_scale, fit_peer, ministep_gap, scaled
from verl_pipe.core.workload import from_spec
from verl_pipe.sim.engine import CPU_TINY
from verl_pipe.sim.simulate import simulate_step
from verl_pipe.sim.trainer import TrainerParams

SHAPE_KW = dict(n=8, groups_per_unit=2, micro_rows=8, max_num_seqs=16, max_num_batched_tokens=2048,
                kv_capacity_tokens=1 << 20)
ENGINE = CPU_TINY.with_(max_num_seqs=16, t0_s=3e-3, per_seq_s=4e-4, prefill_flops_per_token=1.0,
                        prefill_flops_per_s=1e4, kv_capacity_tokens=1 << 20)
TRAINER = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1 / 2e-4, linear_flops_per_token=1.0, attn_flops_coef=0.0,
                        microbatch_overhead_s=0.05, max_tokens_per_microbatch=1 << 40, logprob_ratio=0.4,
                        use_ref=False, optimizer_step_s=0.02, swap_cycle_s=0.0, swap_save_s=0.0, swap_restore_s=0.0)


def peer_steps(engine, trainer):
    from verl_pipe.sim.calib import StepShape

    shape = StepShape(**SHAPE_KW)
    out = []
    for seed in range(3):
        wl0 = from_spec({"kind": "lognormal", "median": 40, "sigma": 1.0, "rho": 0.7, "cap": 256}, 8, 8, 0, seed=seed)
        tl = simulate_step(PaddedWorkload(8, 8, wl0.lengths, 30), engine, trainer, "verl_separate_async", 1,
                           groups_per_unit=2)
        d = tl.to_dict()
        out.append({"mode": "verl_separate_async", "setting": "s", "lengths": wl0.lengths, "prompt_len": 30.0,
                    "weight_sync_s": 0.0, "metrics": tl.metrics(), "train_spans": d["train_spans"]})
    return shape, out


def test_the_engine_scale_of_a_slower_rollout_is_recovered():
    shape, steps = peer_steps(scaled(ENGINE, 1.5), TRAINER)
    simulate = lambda st, eng: simulate_like(st, st["mode"], "minibatch", eng, TRAINER, shape)  # noqa: E731
    assert fit_engine_scale(steps, simulate, ENGINE) == pytest.approx(1.5, rel=0.03)
    assert fit_engine_scale(steps, simulate, scaled(ENGINE, 1.5)) == pytest.approx(1.0, rel=0.03)


def test_the_ministep_gap_is_measured_between_a_units_log_prob_and_its_update():
    shape, steps = peer_steps(ENGINE, TRAINER.with_(verl_ministep_gap_s=0.25))
    assert ministep_gap(steps) == pytest.approx(0.25)
    assert ministep_gap(peer_steps(ENGINE, TRAINER)[1]) == 0.0
    fit = fit_peer(steps, lambda st, eng: simulate_like(st, st["mode"], "minibatch", eng, TRAINER, shape), ENGINE)
    assert fit.ministep_gap_s == pytest.approx(0.25) and fit.steps == 3
    assert fit_peer([], None, ENGINE) is None


def test_a_scale_must_be_positive():
    with pytest.raises(ValueError, match="scale"):
        scaled(ENGINE, 0.0)
