"""The simulator: exact hand-computed schedules, invariants on random small steps, and the effects it must show."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_pipe.core import workload as W
from verl_pipe.core.frontier import AdaptiveWindow, FCFSPolicy, FrontierPolicy, resolve_window
from verl_pipe.sim.engine import EngineParams, Replica, Seq, fit_engine_params
from verl_pipe.sim.grid import format_setting, run_grid
from verl_pipe.sim.simulate import rollout_for_mode, simulate_rollout, simulate_step, step_admission, timeline_for
from verl_pipe.sim.trainer import MODES, TrainerParams, placement_costs, schedule

# One decode step = exactly 1 s, no prefill cost, KV never binds: schedules can be worked out by hand.
UNIT_STEP = EngineParams(max_num_seqs=2, kv_capacity_tokens=10**9, kv_bytes_per_token=0.0, weight_bytes=0.0,
                         t0_s=1.0, per_seq_s=0.0, bw_eff_Bps=1.0, prefill_flops_per_token=0.0)
# Every unit costs exactly 2 s (one micro-batch overhead, free FLOPs), no log-prob/ref/optimizer cost.
FIXED_2S = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1e30, microbatch_overhead_s=2.0,
                         max_tokens_per_microbatch=10**9, logprob_ratio=0.0, use_ref=False, optimizer_step_s=0.0,
                         poll_interval_s=2.0, swap_save_s=0.5, swap_restore_s=0.5)
HAND = W.Workload(2, 2, [[2, 3], [1, 4]], prompt_len=1)


def make_policy(cls, wl, replicas, gpu, window, target=None, order="group_major"):
    """``cls`` (FrontierPolicy: ``window`` is FGD's; FCFSPolicy: the stock dispatch's) built as a step builds it."""
    fgd = issubclass(cls, FrontierPolicy)
    return cls.for_step(step_admission(wl, replicas, gpu, window if fgd else None, target, order,
                                       baseline_window=None if fgd else window))


def _events(tl, kind):
    return tl.to_dict()[kind]


# ---- hand-computed ------------------------------------------------------------------------------------------
def test_hand_computed_rollout():
    # slots 2: g0.0 (2) and g0.1 (3) run from 0; g0.0 ends at 2 and g1.0 (1) takes its slot for step 3;
    # g0.1 and g1.0 end at 3 (group 0 done); g1.1 (4) runs 3..7 (group 1 done).
    tl = simulate_step(HAND, UNIT_STEP, FIXED_2S, "cgp", num_replicas=1, groups_per_unit=1)
    done = {e["request_id"]: e["t"] for e in _events(tl, "responses")}
    assert done == {"0-0": 2.0, "0-1": 3.0, "1-0": 3.0, "1-1": 7.0}
    assert {g["group"]: g["t"] for g in _events(tl, "groups")} == {0: 3.0, 1: 7.0}


@pytest.mark.parametrize("mode,swap,end,spans", [
    ("sync", 0.5, 11.0, [(7, 9), (9, 11)]),  # the whole rollout (7 s), then two 2 s units; sync never swaps
    ("cgp", 0.0, 9.0, [(3, 5), (7, 9)]),  # unit 0 trains while group 1 still generates
    ("cgp_group", 0.0, 9.0, [(3, 5), (7, 9)]),
    # with CPU copies of 0.5 s: unit 0 (old_log_prob free) snapshots theta_k after its log-probs (3-3.5), then
    # updates (3.5-5.5); unit 1's old_log_prob swaps theta_k in and out: save + 2 restores = 1.5 s (7-8.5)
    ("cgp", 0.5, 10.5, [(3, 3.5), (3.5, 5.5), (7, 8.5), (8.5, 10.5)]),
    # group granularity: the snapshot comes after unit 0's groups, before its optimizer step (free here)
    ("cgp_group", 0.5, 10.5, [(3, 5), (5, 5.5), (7, 8.5), (8.5, 10.5)]),
    # polls at 0, 2, 4 -> unit 0 found at 4: save 0.5, update 2; unit 1: free at 6.5, polls 6.5, 8.5 ->
    # save+restore 1.0, old_log_prob (free), restore 0.5, update 2 -> 12.
    ("verl_separate_async", 0.5, 12.0, [(4, 4.5), (4.5, 6.5), (8.5, 9.5), (9.5, 10), (10, 12)]),
])
def test_hand_computed_trainer(mode, swap, end, spans):
    trainer = FIXED_2S.with_(swap_save_s=swap, swap_restore_s=swap)
    tl = simulate_step(HAND, UNIT_STEP, trainer, mode, num_replicas=1, groups_per_unit=1, weight_sync_s=0.5)
    m = tl.metrics()
    assert m["rollout_end_s"] == 7.0
    assert m["rollout_to_train_end_s"] == pytest.approx(end)
    assert [(s["start"], s["end"]) for s in _events(tl, "train_spans")] == [pytest.approx(x) for x in spans]
    assert m["step_time_s"] == pytest.approx(end + 0.5)  # weight sync after the last optimizer step
    if mode == "sync":
        assert m["trainer_wait_ratio"] == pytest.approx(7 / 11)


def test_hand_computed_group_bursts():
    # verl_pipe/core/schedule.py group_schedule: the trainer takes every group that has arrived (up
    # to the unit's remainder) in one call. A call costs 1 s + 1 s per group (10 tokens at 10 tokens/s);
    # old_log_prob half of that; optimizer step 0.5 s; CPU copies 0.1 s. Units of 3 groups, groups done at
    # 1, 2, 3 | 4, 5, 9.
    p = TrainerParams(num_gpus=1, flops_per_s_per_gpu=10.0, linear_flops_per_token=1.0, attn_flops_coef=0.0,
                      call_overhead_s=1.0, microbatch_overhead_s=0.0, max_tokens_per_microbatch=10**9,
                      logprob_ratio=0.5, use_ref=False, optimizer_step_s=0.5, swap_save_s=0.1, swap_restore_s=0.1)
    completions = [(1.0, 0), (2.0, 1), (3.0, 2), (4.0, 3), (5.0, 4), (9.0, 5)]
    plan = schedule("cgp_group", completions, lambda g: [10], p, groups_per_unit=3, rollout_end=9.0)
    assert [(k, pytest.approx(a), pytest.approx(b), u, g) for k, a, b, u, g, _ in plan.spans] == [
        # unit 0: at 1 only group 0 is in -> old_log_prob 0.5*(1+1), forward_backward 1+1
        ("old_log_prob", 1.0, 2.0, 0, 0), ("forward_backward", 2.0, 4.0, 0, 0),
        # free at 4: groups 1 and 2 (done at 2, 3) are one burst -> 0.5*(1+2), 1+2
        ("old_log_prob", 4.0, 5.5, 0, 2), ("forward_backward", 5.5, 8.5, 0, 2),
        ("snapshot_theta_k", 8.5, 8.6, 0, None), ("optimizer_step", 8.6, 9.1, 0, None),
        # unit 1: free at 9.1, all three groups are in (the last at 9) -> one burst; its old_log_prob swaps
        # theta_k in and out: 0.5*(1+3) + 0.1 + 2*0.1
        ("old_log_prob", 9.1, 11.4, 1, 5), ("forward_backward", 11.4, 15.4, 1, 5),
        ("optimizer_step", 15.4, 15.9, 1, None)]
    assert plan.end == pytest.approx(15.9)
    # one group per call (the old model) would pay the call overhead six times: 1 s + 1.5 s more per extra call
    per_group = sum(p.logprob_s([10]) + p.update_s([10]) for _ in range(6))
    assert per_group - sum(p.logprob_s([10] * k) + p.update_s([10] * k) for k in (1, 2, 3)) == pytest.approx(4.5)
    # a trainer that keeps up takes one group per call
    fast = p.with_(time_scale=0.01, swap_save_s=0.0, swap_restore_s=0.0)
    quick = schedule("cgp_group", completions, lambda g: [10], fast, groups_per_unit=3, rollout_end=9.0)
    assert [g for k, _, _, _, g, _ in quick.spans if k == "forward_backward"] == [0, 1, 2, 3, 4, 5]
    # simultaneous completions: an idle trainer wakes on the first and takes it alone (the real FIFO receives
    # them one at a time); the rest arrived while it worked, so they form the next burst
    tied = schedule("cgp_group", [(1.0, 0), (1.0, 1), (1.0, 2)], lambda g: [10], p, groups_per_unit=3,
                    rollout_end=1.0)
    assert [(k, pytest.approx(a), pytest.approx(b), g) for k, a, b, _, g, _ in tied.spans] == [
        ("old_log_prob", 1.0, 2.0, 0), ("forward_backward", 2.0, 4.0, 0),
        ("old_log_prob", 4.0, 5.5, 2), ("forward_backward", 5.5, 8.5, 2), ("optimizer_step", 8.5, 9.0, None)]


def test_decode_cost_grows_with_context_and_interrupt_joins_at_step_boundary():
    # step time = ctx (1 B/token at 1 B/s), prefill 10 tokens at 10 tokens/s = 1 s on the first step
    p = EngineParams(max_num_seqs=4, kv_capacity_tokens=10**6, kv_bytes_per_token=1.0, weight_bytes=0.0, t0_s=0.0,
                     bw_eff_Bps=1.0, prefill_flops_per_token=1.0, prefill_flops_per_s=10.0)
    r = Replica(0, p)
    r.submit(Seq(0, 0, 0, length=3, prompt=10, priority=0, arrival=0.0, order=0))
    assert r.plan(0.0) == pytest.approx(1 + 10 + 11 + 12)  # steps read 10, 11, 12 tokens of KV
    r.submit(Seq(1, 0, 1, length=1, prompt=10, priority=0, arrival=15.0, order=1))
    assert r.interrupt(15.0) == pytest.approx(22.0)  # the step in progress (11..22) finishes first
    assert r.finish_segment() == []
    end = r.plan(22.0)  # both run: ctx 12 + 10, plus 1 s to prefill the newcomer
    assert end == pytest.approx(22 + 1 + 22)
    assert sorted(s.rid for s in r.finish_segment()) == [0, 1]


def test_fit_engine_params_recovers_a_line():
    pts = [(b, 0.004 + 0.0003 * b) for b in (1, 2, 4, 8, 16)]
    p = fit_engine_params(pts)
    assert p.t0_s == pytest.approx(0.004) and p.per_seq_s == pytest.approx(0.0003)
    assert p.step_time(10, 0) == pytest.approx(0.007)
    q = fit_engine_params([(b, c, 0.001 + 0.0002 * b + 1e-6 * c) for b, c in [(1, 10), (2, 50), (4, 30), (8, 90)]])
    assert q.step_time(3, 40) == pytest.approx(0.001 + 0.0006 + 4e-5)


# ---- workload -----------------------------------------------------------------------------------------------
def test_lognormal_workload_moments_and_group_correlation():
    wl = W.lognormal(2000, 16, sigma=0.8, rho=0.72, cap=10**7, prompt_len=300, seed=1, mean=1000)
    x = np.log(np.array(wl.lengths, dtype=float))
    assert np.exp(np.median(x)) == pytest.approx(1000 * math.exp(-0.32), rel=0.03)  # median 726
    # share of variance from the group latent = rho
    between = np.var(x.mean(axis=1)) - np.var(x, axis=1, ddof=1).mean() / 16
    assert between / np.var(x) == pytest.approx(0.72, abs=0.04)
    capped = W.named("D4", seed=0)
    assert max(max(g) for g in capped.lengths) == 8192
    assert capped.truncated_fraction(8192) == pytest.approx(0.39, abs=0.05)  # docs/sim_sources.md §7 (D4): 39%
    assert W.named("D1", seed=3).lengths == W.named("D1", seed=3).lengths  # seeded


# ---- invariants on random small steps -----------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(groups=st.integers(2, 6), n=st.integers(1, 4), replicas=st.integers(1, 3), slots=st.integers(1, 6),
       kv=st.sampled_from([60, 150, 10**6]), fgd=st.booleans(), window=st.sampled_from([None, 1, 3, "adaptive"]),
       gpu=st.integers(1, 3), mode=st.sampled_from(MODES), seed=st.integers(0, 1000), oversample=st.booleans(),
       client=st.sampled_from([0.0, 0.003]))
def test_invariants(groups, n, replicas, slots, kv, fgd, window, gpu, mode, seed, oversample, client):
    wl = W.lognormal(groups, n, sigma=0.8, rho=0.5, cap=40, prompt_len=5, seed=seed, median=10)
    eng = EngineParams(max_num_seqs=slots, kv_capacity_tokens=kv, max_num_batched_tokens=16,
                       scheduling_policy="priority" if fgd else "fcfs")
    gpu = min(gpu, groups - 1 if oversample else groups)
    target = groups - 1 if oversample else groups
    if window == "adaptive":
        window = resolve_window(window, gpu, n, slots)
    policy = make_policy(FrontierPolicy if fgd else FCFSPolicy, wl, replicas, gpu, window, target, "interleave:2")
    ro = simulate_rollout(wl, eng, policy, replicas, client_s_per_request=client)
    tl = timeline_for(ro, wl, TrainerParams(), mode if mode != "cgp_fgd" else "cgp", gpu, 0.5)
    ev = tl.to_dict()
    done = [e["request_id"] for e in ev["responses"]]
    aborted = [e["request_id"] for e in ev["aborts"]]
    submitted = {e["request_id"] for e in ev["requests"]}
    assert len(done) == len(set(done)) and not set(done) & set(aborted)  # each finishes at most once...
    assert len(aborted) == len(set(aborted)) and set(done) | set(aborted) <= submitted
    if not oversample:  # ...and exactly once when nothing is cut
        assert len(done) == groups * n == len(submitted)
    length = {f"{g}-{i}": wl.lengths[g][i] for g in range(groups) for i in range(n)}
    assert all(e["num_tokens"] == length[e["request_id"]] for e in ev["responses"])
    group_t = {g["group"]: g["t"] for g in ev["groups"]}
    for g, t in group_t.items():  # a group is done when its last response is
        assert t == max(e["t"] for e in ev["responses"] if e["group"] == g)
    trained = {g for _, g in ro.completions}
    assert len(trained) == target
    # the trainer never touches a unit before all its groups are complete (group granularity: its first)
    ready = {u["unit"]: u for u in ev["units_ready"]}
    for s in ev["train_spans"]:
        if s["unit"] is None:
            assert s["start"] >= max(group_t[g] for g in trained)
            continue
        gs = ready[s["unit"]]["groups"]
        need = min if (mode == "cgp_group" and s["kind"] != "optimizer_step") else max
        assert s["start"] >= need(group_t[g] for g in gs) - 1e-9
    spans = sorted((s["start"], s["end"]) for s in ev["train_spans"])  # one trainer: no overlap
    assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))
    m = tl.metrics()
    if mode == "sync":  # wait ratio = R / (R + T)
        R, T = m["rollout_end_s"], m["trainer_busy_s"]
        assert m["trainer_wait_ratio"] == pytest.approx(R / (R + T))
    if client:  # one driver thread: its submissions and responses never overlap
        times = sorted([e["t"] for e in ev["requests"]] + [e["t"] for e in ev["responses"]])
        assert all(b - a >= client - 1e-9 for a, b in zip(times, times[1:]))


def test_kv_preemption_when_capacity_binds_and_everything_completes():
    wl = W.equal_lengths(4, 4, length=60, prompt_len=20)
    eng = EngineParams(max_num_seqs=16, kv_capacity_tokens=600)  # 16 x 80 tokens would need 1280
    ro = simulate_rollout(wl, eng, make_policy(FCFSPolicy, wl, 1, 2, None), 1)
    assert ro.stats["preemptions"] > 0
    assert max(ro.stats["peak_kv_tokens"]) <= 600
    assert sum(1 for m, _ in ro.log if m == "response_done") == 16
    roomy = simulate_rollout(wl, eng.with_(kv_capacity_tokens=10**6), make_policy(FCFSPolicy, wl, 1, 2, None), 1)
    assert roomy.stats["preemptions"] == 0 and roomy.rollout_end < ro.rollout_end


# ---- the effects --------------------------------------------------------------------------------------------
def test_fgd_first_unit_ready_not_later_than_fcfs_interleave_on_long_tail():
    # The window binds (32 slots for 256 requests) and the stock order interleaves the groups (one chunk per
    # group: verl's agent-loop workers each submit their chunk at once), so FCFS holds a few requests of every
    # group and no group completes early; FGD admits whole groups in rank order.
    # NB: against a coarse interleave (e.g. 8 chunks of 4 groups, verl's default 8 workers) FGD is only about
    # as good as FCFS: both are then near group-major, and FCFS's unit is the fastest 4 of the ~8 groups it
    # has in flight while FGD's waits for the slowest of its 4 frontier groups (see the FGD sweep in grid.py).
    eng = EngineParams(max_num_seqs=64)
    for seed in range(4):
        wl = W.lognormal(32, 8, sigma=0.9, rho=0.6, cap=4000, prompt_len=100, seed=seed, median=300)
        kw = dict(num_replicas=2, groups_per_unit=4, window=16)
        fcfs = simulate_step(wl, eng, TrainerParams(), "cgp", order="interleave:32", **kw).metrics()
        fgd = simulate_step(wl, eng, TrainerParams(), "cgp_fgd", **kw).metrics()
        assert fgd["first_unit_ready_s"] < 0.5 * fcfs["first_unit_ready_s"]


def test_equal_lengths_cgp_is_sync_plus_a_little():
    # one wave (slots >= requests), no tail: every group completes at once, nothing to overlap
    # (cgp pays the CPU copies that keep its old log-probs at theta_k: a snapshot in unit 0, and one swap when
    # unit 1 takes the 12 groups queued by then in one coalesced log-prob call; units 2 and 3 make no call;
    # and a second log-prob call's micro-batch overheads)
    wl = W.equal_lengths(16, 8, length=1000, prompt_len=300)
    eng = EngineParams(max_num_seqs=128)
    kw = dict(num_replicas=1, groups_per_unit=4)
    p = TrainerParams()
    sync = simulate_step(wl, eng, p, "sync", **kw).metrics()["rollout_to_train_end_s"]
    cgp = simulate_step(wl, eng, p, "cgp", **kw).metrics()["rollout_to_train_end_s"]
    copies = p.swap_save_s + p.theta_k_swap_s  # 4 units, 2 log-prob calls
    assert abs(cgp - copies - sync) <= 0.05 * sync
    free_copies = p.with_(swap_save_s=0.0, swap_restore_s=0.0)
    assert simulate_step(wl, eng, free_copies, "cgp", **kw).metrics()["rollout_to_train_end_s"] == pytest.approx(
        cgp - copies)


def test_cgp_beats_sync_on_long_tail():
    wl = W.named("D1", num_groups=32, n=8, seed=0)
    kw = dict(num_replicas=2, groups_per_unit=8, order="interleave:8")
    sync = simulate_step(wl, EngineParams(max_num_seqs=32), TrainerParams(), "sync", **kw).metrics()
    for mode in ("cgp", "cgp_group", "verl_separate_async"):
        m = simulate_step(wl, EngineParams(max_num_seqs=32), TrainerParams(), mode, **kw).metrics()
        assert m["rollout_to_train_end_s"] < sync["rollout_to_train_end_s"]
        assert m["trainer_wait_ratio"] < sync["trainer_wait_ratio"]


def test_hand_computed_driver_cost():
    # one slot, two 1-token requests, the driver takes 0.5 s per request. All at once (FCFS, no window): submitted
    # at 0.5 and 1.0; 0.0 runs 0.5-1.5 and 1 waits inside the engine, runs 1.5-2.5; the driver takes the responses
    # at 2.0 and 3.0. A window of exactly the slot: 1 is submitted only once 0's response is in (2.0 -> 2.5),
    # runs 2.5-3.5, is taken at 4.0. The adaptive window (slot + a margin of 1) keeps 1 waiting in the engine.
    wl = W.Workload(1, 2, [[1, 1]], prompt_len=0)
    eng = UNIT_STEP.with_(max_num_seqs=1)

    def run(kind, window):
        cls = {"fcfs": FCFSPolicy, "fgd": FrontierPolicy}[kind]
        ro = simulate_rollout(wl, eng, make_policy(cls, wl, 1, 1, window), 1, client_s_per_request=0.5)
        return [kw["t"] for m, kw in ro.log if m == "request_submitted"], \
            [kw["t"] for m, kw in ro.log if m == "response_done"]

    assert run("fcfs", None) == ([0.5, 1.0], [2.0, 3.0])
    assert run("fgd", 1) == ([0.5, 2.5], [2.0, 4.0])
    assert run("fgd", AdaptiveWindow(capacity=1, floor=1)) == ([0.5, 1.0], [2.0, 3.0])
    with pytest.raises(ValueError, match="client_s_per_request"):
        simulate_rollout(wl, eng, make_policy(FCFSPolicy, wl, 1, 1, None), 1, client_s_per_request=-1)


def test_adaptive_window_never_costs_where_a_window_of_the_slots_does():
    # Equal lengths free the whole batch at once; with a driver that takes time per request, a window of exactly
    # max_num_seqs idles the slots until the driver refills them, the baseline (everything in the engine) and
    # the adaptive window refill from vLLM's own queue. Where the slots cover the step, fgd.window=auto runs a
    # smaller batch than everything and the step's rollout is longer.
    wl = W.equal_lengths(8, 8, length=32, prompt_len=8)
    eng = EngineParams(max_num_seqs=16, kv_capacity_tokens=10**6, t0_s=5e-3, per_seq_s=1e-4)
    kw = dict(num_replicas=1, groups_per_unit=2, client_s_per_request=5e-3)
    cgp = rollout_for_mode("cgp", wl, eng, window=None, **kw).rollout_end
    adaptive = rollout_for_mode("cgp_fgd", wl, eng, window="adaptive", **kw).rollout_end
    slots = rollout_for_mode("cgp_fgd", wl, eng, window=16, **kw).rollout_end  # fgd.window=null
    assert adaptive <= 1.01 * cgp and slots > 1.1 * adaptive
    wide = eng.with_(max_num_seqs=64)  # covers the step's 64 requests
    cgp = rollout_for_mode("cgp", wl, wide, window=None, **kw).rollout_end
    adaptive = rollout_for_mode("cgp_fgd", wl, wide, window="adaptive", **kw).rollout_end
    auto = rollout_for_mode("cgp_fgd", wl, wide, window="auto", **kw).rollout_end
    assert adaptive <= 1.01 * cgp and auto > 1.1 * adaptive


def test_policies_are_the_shared_ones():
    wl = W.equal_lengths(2, 2, 5, 1)
    assert isinstance(make_policy(FCFSPolicy, wl, 1, 1, None), FCFSPolicy)
    assert isinstance(make_policy(FrontierPolicy, wl, 1, 1, 4), FrontierPolicy)


def test_grid_smoke(tmp_path, capsys):
    cfg = tmp_path / "g.yaml"
    cfg.write_text("""
seeds: {v: [0], src: t}
batch: {num_groups: {v: 8, src: t}, n: {v: 4, src: t}, groups_per_unit: {v: 2, src: t}, prompt_len: {v: 20, src: t}}
engine: {max_num_seqs: {v: 8, src: t}, weight_bytes: {v: 4.06e9, src: "PyYAML reads this as a string"}}
trainer: {optimizer_step_s: {v: 0.015, src: t}}
theta_k: {placement: pinned, param_bytes: 6.9e9, opt_bytes: 13.8e9, checkpoint_on_failure: true,
          pageable_save_Bps: 1.23e9, pageable_restore_Bps: 6.7e9, pageable_opt_save_Bps: 1.27e9, pinned_Bps: 55.0e9,
          measured_param_bytes: 6.9e9, device_snapshot_s: 0.004, device_swap_s: 0.012}
weight_sync_s: {v: 0.5, src: t}
dispatch: {baseline_order: interleave:2, baseline_window: 8, fgd_window: 4, fgd_frontier_groups: auto,
           fgd_slack: 0, fgd_affinity: true}
modes: {v: [sync, cgp, cgp_group, cgp_fgd, verl_separate_async], src: t}
tr_sweep: {v: [0.5, 2.0], src: t}
fgd_sweep: {v: [{window: 2, affinity: false}], src: t}
distributions: {D1: {name: x, kind: lognormal, mean: 200, sigma: 0.8, rho: 0.7, cap: 2000}}
splits: {S1: {rollout_gpus: 2, train_gpus: 1}}
controls: [{name: notail-eq, distribution: {kind: equal, length: 100}, split: S1}]
""")
    res = run_grid(cfg)
    assert {r["theta_k_placement"] for r in res} == {"pinned"}
    assert [r["name"] for r in res] == ["longtail-D1-x-2R1T", "notail-eq-2R1T"]
    r = res[0]
    assert set(MODES) <= set(r["modes"]) and r["modes"]["sync"]["reduction_vs_sync_pct"] == 0
    assert r["modes"]["cgp_fgd"]["granularity"] in ("minibatch", "group")
    for p, target in zip(r["tr_sweep"], (0.5, 2.0)):
        assert p["sync_train_to_rollout_ratio"] == pytest.approx(target, rel=1e-6)
    assert len(r["fgd_sweep"]) == 1
    json.dumps(res)
    assert "verl_separate_async" in format_setting(r)


def test_placement_costs_from_the_measured_figures():
    f = dict(param_bytes=6.9e9, opt_bytes=13.8e9, pageable_save_Bps=6.9e9 / 5.61, pageable_restore_Bps=6.9e9 / 1.03,
             pageable_opt_save_Bps=13.8e9 / 10.9, pinned_Bps=55e9, measured_param_bytes=6.9e9,
             device_snapshot_s=0.004, device_swap_s=0.012)
    page = TrainerParams(**placement_costs("pageable", 1, f))
    assert page.swap_save_s == pytest.approx(5.61) and page.swap_restore_s == pytest.approx(1.03)
    assert page.theta_k_swap_s == pytest.approx(5.61 + 2 * 1.03) and page.snapshot_s == pytest.approx(5.61 + 10.9)
    pinned = TrainerParams(**placement_costs("pinned", 2, f))  # each GPU copies its half
    assert pinned.swap_save_s == pytest.approx(6.9e9 / 2 / 55e9) and pinned.opt_snapshot_s == pytest.approx(13.8e9 / 2 / 55e9)
    dev = TrainerParams(**placement_costs("device", 4, f))
    assert dev.theta_k_swap_s == pytest.approx(0.003) and dev.snapshot_s == pytest.approx(0.001 + 0.002)
    assert placement_costs("pinned", 1, dict(f, checkpoint_on_failure=False))["opt_snapshot_s"] == 0
    with pytest.raises(ValueError, match="pageable, pinned, device"):
        placement_costs("nvme", 1, f)
    # CGP pays the snapshot at unit 0 and the swap on later units; sync pays neither
    wl = W.equal_lengths(4, 2, 50, 10)
    eng = EngineParams(max_num_seqs=8)
    kw = dict(num_replicas=1, groups_per_unit=1, weight_sync_s=0.0)
    ends = {pl: simulate_step(wl, eng, TrainerParams(**placement_costs(pl, 1, f)), "cgp", **kw).metrics()[
        "rollout_to_train_end_s"] for pl in ("pageable", "pinned", "device")}
    assert ends["device"] < ends["pinned"] < ends["pageable"]
    syncs = {simulate_step(wl, eng, TrainerParams(**placement_costs(pl, 1, f)), "sync", **kw).metrics()[
        "rollout_to_train_end_s"] for pl in ("pageable", "pinned", "device")}
    assert len(syncs) == 1
