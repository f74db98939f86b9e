"""rolloutpipe.cgp.unit_fill: the dispatch-order release (verl_pipe/core/release.py), pure."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_pipe.core.release import DispatchOrderRelease, check_fill, dispatch_release_times


def test_a_group_waits_for_every_group_dispatched_before_it():
    out = []
    r = DispatchOrderRelease(out.append, 4)
    r.hold(2, "g2")
    r.ended(2)
    assert out == [] and r.waiting == [2]
    r.hold(0, "g0")
    r.ended(0)
    assert out == ["g0"]
    r.ended(1)  # untrainable (or dropped): nothing to put, but it no longer holds group 2 back
    assert out == ["g0", "g2"] and r.waiting == []
    r.hold(3, "g3")
    r.ended(3)
    assert out == ["g0", "g2", "g3"] and r.released == [0, 2, 3]


def test_flush_releases_what_is_held_in_dispatch_order():
    out = []
    r = DispatchOrderRelease(out.append, 5)
    for g in (4, 1, 3):
        r.hold(g, g)
        r.ended(g)
    assert out == []  # group 0 never ended (aborted once the batch was full: no report)
    r.flush()
    assert out == [1, 3, 4]


def test_bad_input_is_refused():
    r = DispatchOrderRelease([].append, 2)
    with pytest.raises(ValueError, match="out of range"):
        r.hold(2, "x")
    r.hold(0, "x")
    with pytest.raises(RuntimeError, match="held twice"):
        r.hold(0, "x")
    with pytest.raises(ValueError, match="unit_fill"):
        check_fill("arrival")
    with pytest.raises(ValueError, match="num_groups"):
        DispatchOrderRelease([].append, 0)


@settings(max_examples=300, deadline=None)
@given(st.permutations(list(range(8))), st.lists(st.booleans(), min_size=8, max_size=8), st.integers(0, 8))
def test_any_completion_order_releases_the_trained_groups_sorted(order, trainable, ended_before_flush):
    out = []
    r = DispatchOrderRelease(out.append, 8)
    for g in order[:ended_before_flush]:
        if trainable[g]:
            r.hold(g, g)
        r.ended(g)
        # released so far: exactly the trained groups below the first group not yet ended
        settled = set(order[:order.index(g) + 1])
        first_open = min(set(range(8)) - settled, default=8)
        assert out == [x for x in range(first_open) if trainable[x]]
    r.flush()
    done = order[:ended_before_flush]
    assert out == sorted(x for x in done if trainable[x])


def test_simulated_release_times():
    # trained groups 0, 2, 3 complete at 2, 1, 5; group 1 (untrainable) ends at 3
    got = dispatch_release_times([(1.0, 2), (2.0, 0), (5.0, 3)], {1: 3.0}, rollout_end=6.0)
    assert got == [(2.0, 0), (3.0, 2), (5.0, 3)]
    # a group that never ended (aborted) holds the later ones until the rollout's end
    assert dispatch_release_times([(1.0, 2)], {}, rollout_end=6.0) == [(6.0, 2)]
    assert dispatch_release_times([], {}, 1.0) == []


def test_simulator_fills_units_in_dispatch_order():
    """Group 1 completes first (lengths 1), group 0 last: completion fill trains group 1 first, dispatch fill
    waits for group 0 and trains the units in dispatch order, as sync does."""
    from verl_pipe.core import workload as W
    from verl_pipe.sim.engine import EngineParams
    from verl_pipe.sim.simulate import simulate_step
    from verl_pipe.sim.trainer import TrainerParams

    engine = EngineParams(max_num_seqs=4, kv_capacity_tokens=10**9, kv_bytes_per_token=0.0, weight_bytes=0.0,
                          t0_s=1.0, per_seq_s=0.0, bw_eff_Bps=1.0, prefill_flops_per_token=0.0)
    trainer = TrainerParams(num_gpus=1, flops_per_s_per_gpu=1e30, microbatch_overhead_s=2.0,
                            max_tokens_per_microbatch=10**9, logprob_ratio=0.0, use_ref=False, optimizer_step_s=0.0)
    wl = W.Workload(2, 2, [[5, 5], [1, 1]], prompt_len=1)
    units = {}
    for fill in ("completion", "dispatch"):
        tl = simulate_step(wl, engine, trainer, "cgp", num_replicas=1, groups_per_unit=1, unit_fill=fill)
        units[fill] = [(u["groups"], u["t"]) for u in tl.to_dict()["units_ready"]]
    assert units["completion"] == [([1], 1.0), ([0], 5.0)]
    assert units["dispatch"] == [([0], 5.0), ([1], 5.0)]
