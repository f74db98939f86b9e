"""Length prediction (verl_pipe/core/lengths.py), the length-aware FGD order (frontier.FrontierPolicy with lengths),
the policy plug-in (verl_pipe/core/admission.py), repeated prompts in the forced-length workload
(core/workload.py) and the predictor in the simulator (sim/tail.py): pure, no Ray."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_pipe.core import workload as W
from verl_pipe.core.admission import (DEFAULT_FGD_POLICY, PolicyPathError, StepAdmission, TrainerRatio, load_policy,
                                      rest_order)
from verl_pipe.core.frontier import FCFSPolicy, FrontierPolicy, Request
from verl_pipe.core.lengths import (LengthHistory, Prediction, StepLengths, prediction_quality, rank_correlation)


# --- the history ---------------------------------------------------------------------------------------------------

def test_history_predicts_only_from_earlier_epochs():
    h = LengthHistory()
    assert h.predict("a", 0) == Prediction(None, "prior", 0.25)  # nothing seen at all
    assert h.record("a", 0, [10, 10])
    assert not h.record("a", 0, [99, 99])  # the same epoch again (another mode of a bench round): ignored
    assert not h.record(None, 0, [5])  # a prompt without identity
    assert h.predict("a", 0).source == "prior"  # its own epoch is never a prediction of itself
    p = h.predict("a", 1)
    assert p.source == "history" and math.isclose(p.log_tokens, math.log(10))
    assert h.predict("b", 1).source == "prior" and math.isclose(h.predict("b", 1).log_tokens, math.log(10))


def test_history_keeps_the_latest_epochs_and_predicts_from_the_latest_earlier_one():
    h = LengthHistory()
    for e, x in enumerate([4, 8, 16, 32]):
        h.record("a", e, [x])
    assert math.isclose(h.predict("a", 3).log_tokens, h.mean + (math.log(16) - h.mean))  # slope 1: < MIN_PAIRS
    assert h.predict("a", 1).source == "prior"  # epoch 0 was dropped (EPOCHS_KEPT): nothing earlier is kept


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 0.9), st.integers(0, 10_000))
def test_the_slope_estimates_the_cross_epoch_carry_over(x, seed):
    """Prompts whose mean log-length follows an AR(1) over epochs with coefficient x: the slope comes out near x,
    and the history's predictions rank the next epoch better than chance exactly when x > 0."""
    rng = np.random.default_rng(seed)
    h = LengthHistory()
    z = rng.standard_normal(400)
    for e in range(2):
        for k in range(400):
            h.record(k, e, [max(1, int(round(math.exp(4 + z[k]))))])
        z = x * z + math.sqrt(1 - x * x) * rng.standard_normal(400)
    assert abs(h.slope - x) < 0.2
    pred = [h.predict(k, 2).log_tokens for k in range(400)]
    rho = rank_correlation(pred, list(z)) or 0.0  # None: a slope of 0 predicts the mean for every prompt
    assert rho > x - 0.25 and (x < 0.3 or rho > 0.1)


# --- a step's predictions ------------------------------------------------------------------------------------------

def test_siblings_refine_the_start_of_step_prediction():
    s = StepLengths([Prediction(math.log(100), "history", 1.0), Prediction(None, "prior", 0.25)], n=3)
    assert s.tokens(1) is None and s.source(1) == "prior"  # a run's first step: nothing known
    s.observe(0, 25)  # history 100 weighted as one sibling against one sibling of 25: their geometric mean
    assert math.isclose(s.tokens(0), 50.0) and s.source(0) == "siblings"
    assert math.isclose(s.tokens(1), 25.0)  # the prior is now this step's finished responses
    s.observe(1, 400)  # the prior (this step's responses: 25 and 400) is worth a quarter of a sibling
    prior = (math.log(25) + math.log(400)) / 2
    assert math.isclose(s.log_mean(1), (0.25 * prior + math.log(400)) / 1.25)
    s.observe(0, 25)
    s.observe(0, 100)
    with pytest.raises(RuntimeError, match="more than n"):
        s.observe(0, 1)
    rec = s.record()
    assert rec[0]["actual_mean_tokens"] == 50 and rec[0]["actual_max_tokens"] == 100
    assert rec[0]["predicted_tokens"] == pytest.approx(100) and rec[0]["first_tokens"] == 25
    assert rec[0]["first_sibling_tokens"] == pytest.approx(50)
    assert rec[1]["actual_mean_tokens"] is None and rec[1]["predicted_tokens"] is None  # not all of it finished
    assert s.lengths(0) == [25, 25, 100] and s.lengths(1) is None


def test_rank_correlation_and_prediction_quality():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # scipy's, with ties
    assert rank_correlation([1, 1, 1], [1, 2, 3]) is None and rank_correlation([1, 2], [1, 2]) is None
    recs = [{"source": "history", "n": 2, "predicted_tokens": p, "actual_mean_tokens": a, "first_tokens": a,
             "first_sibling_tokens": a} for p, a in [(1, 10), (2, 20), (3, 30)]]
    q = prediction_quality(recs + [{"source": "prior", "n": 2, "predicted_tokens": None, "actual_mean_tokens": 5,
                                    "first_tokens": None, "first_sibling_tokens": None}])
    assert q["history"] == {"groups": 3, "rank_correlation": pytest.approx(1.0)}
    assert q["siblings"]["groups"] == 3 and q["prior"] == {"groups": 1, "rank_correlation": None}


# --- the length-aware order ----------------------------------------------------------------------------------------

def _lengths(tokens, n):
    return StepLengths([Prediction(math.log(t), "history", 1.0) if t else Prediction(None, "prior", 0.25)
                        for t in tokens], n)


def test_completion_fill_frontier_is_the_groups_predicted_shortest_longest_first():
    # one replica of 4 slots (window 4), units of 2 groups of n=2: the frontier is the two shortest groups
    p = FrontierPolicy(6, 2, 2, 6, [0], window=4, unit_fill="completion", lengths=_lengths([50, 10, 40, 5, 60, 30], 2),
                       rest_order="rank")
    assert p.frontier() == [3, 1]
    adms = p.admit()
    assert [a.request.group for a in adms] == [1, 1, 3, 3]  # within the frontier: longest predicted first
    assert all(a.priority < 6 for a in adms)
    p.on_response_done(Request(1, 0))
    p.observe_length(Request(1, 0), 200)  # group 1 turns out long: the frontier moves on to the next shortest
    assert p.frontier() == [3, 5]
    assert [(a.request.group, a.priority) for a in p.admit()] == [(5, 0)]


@pytest.mark.parametrize("order, first", [("rank", 1), ("shortest", 3), ("longest", 4)])
def test_the_order_beyond_the_frontier(order, first):
    p = FrontierPolicy(6, 1, 1, 6, [0], window=2, unit_fill="dispatch", lengths=_lengths([50, 10, 40, 5, 60, 30], 1),
                       rest_order=order)
    assert p.frontier() == [0]  # dispatch fill: the next unit is sync's mini-batch, whatever the lengths
    adms = p.admit()
    assert [a.request.group for a in adms] == [0, first]
    assert adms[0].priority == 0 and adms[1].priority == 6  # beyond the frontier: num_groups + its place


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 3), st.sampled_from(["completion", "dispatch"]),
       st.sampled_from(["rank", "shortest", "longest"]), st.integers(0, 10_000))
def test_equal_predictions_admit_exactly_as_rank_order(groups, n, replicas, fill, order, seed):
    """With every prediction equal (a run's first step, equal lengths), the length-aware order is FGD's rank order:
    the same admissions, replicas and order, under the same random completions."""
    rng = random.Random(seed)
    gpu = rng.randint(1, groups)
    a = FrontierPolicy(groups, n, gpu, groups, list(range(replicas)), window=rng.randint(1, 6))
    b = FrontierPolicy(groups, n, gpu, groups, list(range(replicas)), window=a.window, unit_fill=fill,
                       lengths=_lengths([7] * groups, n), rest_order=order)
    inflight = []
    while True:
        xa, xb = a.admit(), b.admit()
        assert [(x.request, x.replica) for x in xa] == [(x.request, x.replica) for x in xb]
        inflight += [x.request for x in xa]
        if not inflight:
            break
        req = inflight.pop(rng.randrange(len(inflight)))
        for p in (a, b):
            p.on_response_done(req)
            p.observe_length(req, 7)
            if all(Request(req.group, i) not in inflight for i in range(n)) and p._done_in_group[req.group] == n:
                p.on_group_done(req.group, True)
    assert a.all_done and b.all_done


def test_by_length_off_keeps_rank_order_and_still_records():
    lengths = _lengths([50, 10, 40], 1)
    p = FrontierPolicy(3, 1, 1, 3, [0], window=1, lengths=lengths, by_length=False)
    assert [a.request.group for a in p.admit()] == [0]
    p.on_response_done(Request(0, 0))
    p.observe_length(Request(0, 0), 33)
    assert lengths.seen(0) == 1 and p.stats()["by_length"] is False


# --- the plug-in ---------------------------------------------------------------------------------------------------

def test_load_policy_names_the_key_and_the_problem():
    assert load_policy(DEFAULT_FGD_POLICY) is FrontierPolicy
    assert load_policy("verl_pipe.core.frontier:FCFSPolicy") is FCFSPolicy
    for path, why in [("FrontierPolicy", "a class path"), ("no_such_pkg_x.y:P", "not importable"),
                      ("verl_pipe.core.frontier:Nope", "has no 'Nope'"), ("verl_pipe.core.frontier:Request",
                                                                            "not an admission policy")]:
        with pytest.raises(PolicyPathError, match=f"^my.key: .*{why}"):
            load_policy(path, "my.key")


class _CustomPolicy(FrontierPolicy):
    """A plug-in that takes an extra argument and reads the predictions."""

    def __init__(self, *args, tag: str = "", **kwargs):
        self.tag = tag
        super().__init__(*args, **kwargs)


def test_for_step_builds_each_policy_from_what_the_step_tells_it():
    lengths = _lengths([3, 2], 2)
    step = StepAdmission(2, 2, 1, 2, [0, 1], fgd_window=4, frontier_groups=2, baseline_window=3,
                         baseline_order="interleave:2", unit_fill="dispatch", lengths=lengths, rest_order="longest")
    f = FrontierPolicy.for_step(step)
    assert (f.window, f.frontier_groups, f.unit_fill, f.lengths, f.rest_order) == (4, 2, "dispatch", lengths,
                                                                                    "longest")
    c = FCFSPolicy.for_step(step)
    assert (c.window, c.order, c.lengths) == (3, "interleave:2", lengths)
    custom = _CustomPolicy.for_step(StepAdmission(2, 2, 1, 2, [0], extra={"tag": "x"}))
    assert custom.tag == "x" and custom.lengths is None


def test_rest_order_follows_the_bottleneck():
    assert rest_order("completion", None) == "rank"  # nothing measured yet
    assert rest_order("completion", 2.0) == "shortest"  # the trainer is the bottleneck
    assert rest_order("completion", 0.3) == "longest"  # the rollout is
    assert rest_order("completion", 1.0) == "rank"
    assert rest_order("dispatch", 2.0) == "rank"
    # per granularity (both at 1.5 until a real run supports the simulator's 1.0 at group granularity)
    assert rest_order("completion", 1.5, "group") == "shortest" and rest_order("completion", 1.0, "group") == "rank"
    assert rest_order("completion", 0.3, "group") == "longest" and rest_order("dispatch", 2.0, "group") == "rank"
    with pytest.raises(ValueError, match="granularity"):
        rest_order("completion", 1.0, "token")
    r = TrainerRatio()
    assert r.update(None, 3.0) is None and r.update(2.0, 1.0) == 2.0 and r.update(1.0, 1.0) == 1.5


def test_a_configured_rest_order_wins_over_the_ratio_and_a_bad_one_names_the_key():
    # rolloutpipe.fgd.rest_order: auto is the rule above; rank/shortest/longest fix the order whatever the ratio
    assert rest_order("completion", 2.0, configured="auto") == "shortest"
    assert rest_order("completion", 2.0, configured="longest") == "longest"
    assert rest_order("completion", None, "group", configured="shortest") == "shortest"
    assert rest_order("dispatch", 0.3, configured="longest") == "longest"
    with pytest.raises(ValueError, match="rolloutpipe.fgd.rest_order"):
        rest_order("completion", 1.0, configured="lpt")
    from verl_pipe.trainer.knobs import StepKnobs

    assert StepKnobs().fgd_rest_order == "auto"
    assert StepKnobs(fgd_rest_order="longest").record()["fgd_rest_order"] == "longest"
    with pytest.raises(ValueError, match="fgd_rest_order"):
        StepKnobs(fgd_rest_order="lpt")
    # the bench's forced-length steps carry the configured order; a setting's knobs override it
    from verl_pipe_lab.bench.run import setting_knobs

    wl = W.from_spec({"kind": "lognormal", "median": 40, "sigma": 1.0, "rho": 0.7, "cap": 512}, 4, 2, 0, seed=1)
    configured = StepKnobs(fgd_rest_order="longest")
    assert setting_knobs(configured, wl, None)["fgd_rest_order"] == "longest"
    assert setting_knobs(configured, wl, {"name": "x", "knobs": {"fgd_rest_order": "rank"}})["fgd_rest_order"] == "rank"


# --- repeated prompts in the forced-length workload ----------------------------------------------------------------

def test_repeated_prompts_cover_the_pool_once_per_epoch_in_a_new_order():
    spec = {"kind": "lognormal", "median": 40, "sigma": 1.0, "rho": 0.7, "cap": 512, "prompts": 8}
    steps = [W.from_spec(spec, 4, 2, 0, seed=3, step=s) for s in range(4)]
    assert sorted(steps[0].prompt_keys + steps[1].prompt_keys) == list(range(8))  # epoch 0
    assert sorted(steps[2].prompt_keys + steps[3].prompt_keys) == list(range(8))  # epoch 1
    assert [w.epoch for w in steps] == [0, 0, 1, 1]
    assert steps[0].prompt_keys + steps[1].prompt_keys != steps[2].prompt_keys + steps[3].prompt_keys
    assert W.from_spec(spec, 4, 2, 0, seed=3, step=2).lengths == steps[2].lengths  # seeded
    assert W.length_keys(steps[2]) == tuple((k, 1) for k in steps[2].prompt_keys)
    assert W.length_keys(W.from_spec(dict(spec, prompts=None), 4, 2, 0, seed=3)) is None
    with pytest.raises(ValueError, match="multiple"):
        W.from_spec(dict(spec, prompts=6), 4, 2, 0, seed=3)


def test_cross_epoch_correlation_is_the_knob_and_within_step_rho_is_unchanged():
    """2,000 prompts over two epochs: the group latent's correlation across epochs is cross_epoch (estimated from the
    group means), the within-group correlation of log-lengths rho, the marginal median unchanged."""
    G, n, x, rho = 2000, 8, 0.6, 0.7
    spec = {"kind": "lognormal", "median": 100, "sigma": 1.0, "rho": rho, "cap": 10**6, "prompts": G,
            "cross_epoch": x}
    e0, e1 = (W.from_spec(spec, G, n, 0, seed=1, step=s) for s in (0, 1))
    m0 = {k: np.log(g).mean() for k, g in zip(e0.prompt_keys, e0.lengths)}
    m1 = {k: np.log(g).mean() for k, g in zip(e1.prompt_keys, e1.lengths)}
    keys = sorted(m0)
    c = np.corrcoef([m0[k] for k in keys], [m1[k] for k in keys])[0, 1]
    # group means carry the latent (variance rho) plus within-group noise ((1 - rho) / n): x * rho / (rho + ...)
    assert abs(c - x * rho / (rho + (1 - rho) / n)) < 0.05
    logs = np.log(np.array(e1.lengths, dtype=float))
    within = np.corrcoef(logs[:, 0], logs[:, 1])[0, 1]
    assert abs(within - rho) < 0.05 and abs(np.median(logs) - math.log(100)) < 0.05
    zero = W.from_spec(dict(spec, cross_epoch=0.0), G, n, 0, seed=1, step=1)
    m1 = {k: np.log(g).mean() for k, g in zip(zero.prompt_keys, zero.lengths)}
    assert abs(np.corrcoef([m0[k] for k in keys], [m1[k] for k in keys])[0, 1]) < 0.07


# --- the simulator's predictor -------------------------------------------------------------------------------------

def test_run_predictor_learns_only_earlier_epochs_and_knows_nothing_for_new_prompts():
    from verl_pipe.sim.tail import Knowledge, RunPredictor, oracle_lengths

    spec = {"kind": "lognormal", "median": 40, "sigma": 1.0, "rho": 0.7, "cap": 512, "prompts": 4}
    wl = [W.from_spec(spec, 4, 2, 0, seed=0, step=s) for s in range(3)]
    hist = RunPredictor("predicted")
    assert all(p.source == "prior" for p in hist.lengths(wl[0], 0).initial)
    hist.learn(wl[0], 0)
    assert all(p.source == "history" for p in hist.lengths(wl[1], 1).initial)
    sib = RunPredictor("siblings")
    sib.learn(wl[0], 0)
    assert all(p.source == "prior" for p in sib.lengths(wl[1], 1).initial)
    assert RunPredictor("off").lengths(wl[0], 0) is None
    perfect = oracle_lengths(wl[0])
    assert [round(perfect.tokens(g)) for g in range(4)] == [round(math.exp(np.log(g).mean())) for g in wl[0].lengths]
    assert Knowledge.parse("perfect~0.5@longest") == Knowledge("perfect", 0.5, "longest")
    with pytest.raises(ValueError):
        Knowledge.parse("psychic")


def test_perfect_knowledge_gets_the_first_unit_out_sooner_in_the_simulator():
    """One slot-bound engine, units of one group, one long group first in rank order: rank-order FGD starts it first
    and the first unit waits for it; with its length known, the short group is the frontier and is ready first."""
    from verl_pipe.sim.engine import EngineParams
    from verl_pipe.sim.simulate import rollout_for_mode
    from verl_pipe.sim.tail import oracle_lengths

    wl = W.Workload(2, 2, [[40, 40], [4, 4]], prompt_len=1)
    eng = EngineParams(max_num_seqs=2, kv_capacity_tokens=10**9, kv_bytes_per_token=0.0, weight_bytes=0.0, t0_s=1.0,
                       per_seq_s=0.0, bw_eff_Bps=1.0, prefill_flops_per_token=0.0)
    rank = rollout_for_mode("cgp_fgd", wl, eng, 1, 1, window=2)
    known = rollout_for_mode("cgp_fgd", wl, eng, 1, 1, window=2, lengths=oracle_lengths(wl))
    assert rank.completions[0] == (pytest.approx(40.0), 0) and known.completions[0][1] == 1
    assert known.completions[0][0] < 10.0


def test_the_plug_in_example_of_extending_md_runs_as_documented():
    """docs/extending.md's LateLongPolicy, executed from the page: loaded by its class path machinery's check, built by
    for_step with predictions, it admits the group predicted long only once nothing else waits."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "extending.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "class LateLongPolicy" in b)
    ns: dict = {}
    exec(code, ns)  # noqa: S102 -- the documentation's own example
    cls = ns["LateLongPolicy"]
    p = cls.for_step(StepAdmission(4, 1, 1, 4, [0], fgd_window=1, unit_fill="dispatch",
                                   lengths=_lengths([900, 10, 20, 30], 1)))
    order = []
    while not p.all_done:
        (a,) = p.admit()
        order.append(a.request.group)
        p.on_response_done(a.request)
        p.on_group_done(a.request.group, True)
    assert order == [1, 2, 3, 0]


def test_paired_rounds_reports_the_length_predictions_rank_correlation():
    from verl_pipe_lab.bench.tools import paired_rounds as tool
    rec = lambda p, a: {"source": "history", "n": 2, "predicted_tokens": p, "actual_mean_tokens": a,  # noqa: E731
                        "first_tokens": a, "first_sibling_tokens": a}
    steps = [{"setting": "s", "length_predictions": [rec(1, 10), rec(2, 30)]},
             {"setting": "s", "length_predictions": [rec(3, 20)]}, {"setting": "t"}]
    q = tool.length_quality(steps)
    assert list(q) == ["s"] and q["s"]["history"]["groups"] == 3
    assert q["s"]["history"]["rank_correlation"] == pytest.approx(0.5)


def test_paired_rounds_across_settings_pairs_each_mode_round_by_round():
    from verl_pipe_lab.bench.tools import paired_rounds as tool
    st = lambda s, r, m, x: {"setting": s, "round": r, "mode": m, "metrics": {"rollout_to_train_end_s": x}}  # noqa
    steps = [st("off", 0, "cgp_fgd", 10.0), st("on", 0, "cgp_fgd", 9.0), st("off", 1, "cgp_fgd", 12.0),
             st("on", 1, "cgp_fgd", 10.0), st("off", 0, "cgp", 11.0), st("on", 0, "cgp", 11.5),
             st("other", 0, "cgp_fgd", 1.0), st("on", 2, "cgp_fgd", 1.0)]  # no pair: left out
    got = tool.across(steps, "off", "on")
    assert sorted(got) == ["cgp", "cgp_fgd"]
    assert got["cgp_fgd"]["rounds"] == [0, 1] and got["cgp_fgd"]["diffs"] == [-1.0, -2.0]
    assert got["cgp_fgd"]["mean"] == -1.5 and got["cgp_fgd"]["rel_pct"] == pytest.approx(-100 * 1.5 / 11)
    assert got["cgp"]["diffs"] == [0.5]


def test_the_simulator_replays_a_measured_fgd_step_with_its_predictions_and_plug_in():
    """A bench step of cgp_fgd keeps its groups' predictions and its policy; simulate_like replays them: the A/A (the
    stock FCFS policy as FGD's plug-in) simulates exactly as cgp, and the recorded predictions change the order."""
    from verl_pipe.sim.calib import StepShape, simulate_like
    from verl_pipe.sim.engine import EngineParams
    from verl_pipe.sim.trainer import TrainerParams

    shape = StepShape(n=2, groups_per_unit=1, micro_rows=2, max_num_seqs=2, max_num_batched_tokens=64,
                      kv_capacity_tokens=10**6, num_replicas=1, baseline_order="group_major", baseline_window=None,
                      fgd_window=2)
    eng = EngineParams(max_num_seqs=2, kv_capacity_tokens=10**6, t0_s=0.01, per_seq_s=0.0)
    tr = TrainerParams()
    lengths = [[40, 40], [4, 4], [30, 30]]
    recs = [{"predicted_tokens": t} for t in (40, 4, 30)]
    step = {"lengths": lengths, "prompt_len": 1, "mode": "cgp_fgd", "fgd_lengths": "predicted",
            "length_predictions": recs, "admission": {"policy": "verl_pipe.core.frontier:FCFSPolicy",
                                                      "rest_order": "rank"}}
    aa = simulate_like(step, "cgp_fgd", "minibatch", eng, tr, shape)
    cgp = simulate_like(dict(step, mode="cgp"), "cgp", "minibatch", eng, tr, shape)
    assert aa == cgp
    fgd = dict(step, admission={"policy": DEFAULT_FGD_POLICY, "rest_order": "rank"})
    known = simulate_like(fgd, "cgp_fgd", "minibatch", eng, tr, shape)
    rank = simulate_like(dict(fgd, fgd_lengths="off"), "cgp_fgd", "minibatch", eng, tr, shape)
    assert known["first_unit_ready_s"] < rank["first_unit_ready_s"]
