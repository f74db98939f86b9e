"""The uncontended bound (lab/verl_pipe_lab/bench/uncontended.py) on hand-built timelines whose answer is known, and in the
bench's results."""

import math

import pytest

from verl_pipe_lab.bench import run as bench
from verl_pipe_lab.bench.uncontended import (first_work_s, mode_uncontended, step_tokens, step_uncontended,
                                         sync_after_rates, uncontended_bound_s)
from tests.test_bench import SHAPE, TRUE_TRAINER, simulated_steps

# Two groups of 2 rows of 4 tokens, prompt 10, micro-batches of 2 rows: each group pads to 2 x (10 + 4) = 28 tokens.
LENGTHS = [[4, 4], [4, 4]]


def resp(rid, g, t):
    return {"t": t, "request_id": rid, "group": g, "num_tokens": 4}


def span(kind, a, b, unit, group=None, groups=None):
    return {"kind": kind, "start": a, "end": b, "unit": unit, "group": group, **({"groups": groups} if groups else {})}


def step(responses, spans, metrics, groups=()):
    tl = {"requests": [{"t": 0.0, "request_id": "a", "group": 0}], "aborts": [], "groups": list(groups),
          "units_ready": [{"t": 4.0, "unit": 0, "groups": [0]}, {"t": 6.0, "unit": 1, "groups": [1]}],
          "responses": responses, "train_spans": spans}
    return {"timeline": tl, "lengths": LENGTHS, "prompt_len": 10, "metrics": metrics}


# sync: the rollout ends at 10; the whole batch's log-probs (56 tokens) take 1.12 s (20 s per 1k tokens), each
# unit's update (28 tokens) 1.4 s (50 s per 1k)
SYNC = step([resp("a", 0, 3.0), resp("b", 0, 4.0), resp("c", 1, 9.0), resp("d", 1, 10.0)],
            [span("old_log_prob", 10.0, 11.12, None), span("update", 11.12, 12.52, 0), span("update", 12.52, 13.92, 1)],
            {"rollout_end_s": 10.0, "first_unit_ready_s": 4.0, "rollout_to_train_end_s": 13.92})
# cgp, trainer-bound: unit 0's work overlaps the rollout (ends at 6) at twice sync's rates; the pipelined step sits
# at its own bound (first ready 4 + busy 5.88 = 9.88) but sync's rates would have allowed 7.96
CGP = step([resp("a", 0, 3.0), resp("b", 0, 4.0), resp("c", 1, 5.0), resp("d", 1, 6.0)],
           [span("old_log_prob", 4.0, 5.12, 0, groups=[0]), span("update", 5.12, 7.92, 0),
            span("old_log_prob", 7.92, 8.48, 1, groups=[1]), span("update", 8.48, 9.88, 1)],
           {"rollout_end_s": 6.0, "first_unit_ready_s": 4.0, "rollout_to_train_end_s": 9.88})


def test_bound_is_the_larger_of_the_two_paths():
    rates = {"update": 50.0, "old_log_prob": 20.0}
    # the last unit's work after the rollout: 6 + 28 x 0.07
    assert uncontended_bound_s(6.0, 4.0, {"update": 28, "old_log_prob": 28}, {"update": 56, "old_log_prob": 56},
                               rates) == pytest.approx(7.96)
    # all the work from the first unit: 1 + 56 x 0.07
    assert uncontended_bound_s(2.0, 1.0, {"update": 28}, {"update": 56, "old_log_prob": 56},
                               rates) == pytest.approx(1.0 + 3.92)
    # work sync has no rate for cannot be charged: no bound rather than a low one
    assert math.isnan(uncontended_bound_s(6.0, 1.0, {}, {"forward_backward": 10}, rates))


def test_sync_rates_are_its_after_rollout_costs():
    assert sync_after_rates([SYNC], micro_rows=2) == pytest.approx({"old_log_prob": 20.0, "update": 50.0})


def test_contended_mode_falls_below_its_own_efficiency():
    rates = sync_after_rates([SYNC], micro_rows=2)
    last, total = step_tokens(CGP, micro_rows=2)
    assert last == pytest.approx({"old_log_prob": 28, "update": 28})
    assert total == pytest.approx({"old_log_prob": 56, "update": 56})
    u = step_uncontended(CGP, rates, micro_rows=2)
    assert u["uncontended_lower_bound_s"] == pytest.approx(7.96)
    assert u["uncontended_efficiency"] == pytest.approx(7.96 / 9.88)
    # sync against its own rates: the bound is its ideal one (rollout end + the last update)
    assert step_uncontended(SYNC, rates, 2)["uncontended_lower_bound_s"] == pytest.approx(11.4)
    m = mode_uncontended([CGP, CGP], [SYNC], micro_rows=2)
    assert m["uncontended_efficiency"] == pytest.approx(7.96 / 9.88)
    assert m["uncontended_s_per_1k_padded_tokens"] == pytest.approx(rates)
    # no sync span after the rollout: no rate, no figure
    early = step(SYNC["timeline"]["responses"], [span("update", 1.0, 2.0, 0)], SYNC["metrics"])
    assert mode_uncontended([CGP], [early], 2) == {}


def test_group_granularity_last_burst_and_first_group():
    # group granularity: unit 1's work is a burst per group, then its optimizer step; only the last burst and the
    # group-less optimizer step are the last unit's tail, and the trainer can start at the first trainable group
    spans = [span("old_log_prob", 3.0, 3.5, 0, group=0), span("forward_backward", 3.5, 4.0, 0, group=0),
             span("optimizer_step", 4.0, 4.1, 0), span("forward_backward", 5.0, 5.5, 1, group=0),
             span("forward_backward", 6.0, 6.5, 1, group=1), span("optimizer_step", 6.5, 6.6, 1)]
    st = step([resp("a", 0, 2.0), resp("c", 1, 6.0)], spans, {"rollout_end_s": 6.0, "first_unit_ready_s": 4.0,
                                                                "rollout_to_train_end_s": 6.6},
              groups=[{"t": 2.5, "group": 0, "trainable": True}, {"t": 6.0, "group": 1, "trainable": True}])
    st["timeline"]["units_ready"] = [{"t": 2.5, "unit": 0, "groups": [0]}, {"t": 6.0, "unit": 1, "groups": [0, 1]}]
    last, _ = step_tokens(st, micro_rows=2)
    assert last == pytest.approx({"update": 28})  # group 1's burst only; the optimizer step has no tokens
    assert first_work_s(st) == pytest.approx(2.5)
    st["timeline"]["train_spans"] = [dict(s, group=None) for s in spans]
    assert first_work_s(st) == pytest.approx(4.0)  # per-unit work waits for the unit


def test_build_result_reports_it_beside_pipeline_efficiency():
    # a trainer that costs by the token only (no per-call, optimizer-step or θ_k snapshot cost) and the same with
    # or without the rollout beside it: sync's rates price every mode's work exactly, so the bound is each mode's own
    steps = simulated_steps(trainer=TRUE_TRAINER.with_(microbatch_overhead_s=0.0, optimizer_step_s=0.0, swap_save_s=0.0,
                                                       swap_restore_s=0.0))
    settings = [{"name": "longtail-a", "workload": {"kind": "lognormal"}, "role": "balanced"},
                {"name": "notail-b", "workload": {"kind": "equal"}}]
    res = bench.build_result({}, settings, steps, {}, {}, {"bench": SHAPE}, {"cpu": "x"}, None, None)
    for s in res["settings"]:
        for mode in ("sync", "cgp", "cgp_fgd"):
            e = s["modes"][mode]
            assert e["uncontended_efficiency"] == pytest.approx(e["pipeline_efficiency"], rel=1e-6)
            assert e["uncontended_lower_bound_s"] == pytest.approx(e["ideal_lower_bound_s"], rel=1e-6)
    from verl_pipe_lab.bench.report import format_setting

    assert "unc eff" in format_setting(res["settings"][0])
