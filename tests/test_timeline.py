"""StepTimeline: hand-computed schedules, trace structure, round trip, threads, and metric properties."""

import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_pipe.core.timeline import StepTimeline, summarize, write_chrome_trace

T0 = 1000.0  # absolute clock value of the first submit; every reported time must be relative to it


def rollout(tl, done_times, trainable=None, base=T0, per_group=2, replicas=2):
    """Group g's `per_group` requests are submitted at base and all finish at base + done_times[g]."""
    trainable = trainable or [True] * len(done_times)
    for g, (d, ok) in enumerate(zip(done_times, trainable)):
        for i in range(per_group):
            rid = f"s{tl.step}-g{g}-r{i}"
            tl.request_submitted(rid, g, replica=(g * per_group + i) % replicas, t=base)
            tl.response_done(rid, g, num_tokens=10, t=base + d)
        tl.group_done(g, ok, t=base + d)


def sync_schedule():
    tl = StepTimeline(step=0, groups_per_unit=2)
    rollout(tl, [4, 6, 8, 10])
    tl.train_span("update", T0 + 10, T0 + 12, unit=0)
    tl.train_span("update", T0 + 12, T0 + 14, unit=1)
    tl.weight_sync(T0 + 14, T0 + 15)
    return tl


def test_sync_like_schedule():
    m = sync_schedule().metrics()
    assert m["rollout_end_s"] == 10
    assert m["rollout_to_train_end_s"] == m["train_end_s"] == 14
    assert m["trainer_busy_s"] == 4
    assert m["trainer_wait_ratio"] == pytest.approx(10 / 14)
    assert m["first_unit_ready_s"] == 6  # 2nd trainable group done
    assert m["first_unit_start_s"] == 10
    assert m["ideal_lower_bound_s"] == 12  # max(10 + 2, 6 + 4)
    assert m["pipeline_efficiency"] == pytest.approx(12 / 14)
    assert m["weight_sync_s"] == 1
    assert m["step_time_s"] == 15
    assert (m["num_requests"], m["num_responses"], m["num_groups"]) == (8, 8, 4)
    assert (m["num_trainable_groups"], m["num_units"], m["response_tokens"]) == (4, 2, 80)
    assert m["group_done_p50_s"] == 7 and m["group_done_p90_s"] == pytest.approx(9.4)
    assert all(isinstance(v, float) for v in m.values())


def test_pipelined_overlapping_spans_not_double_counted():
    tl = StepTimeline(step=3, groups_per_unit=1)
    rollout(tl, [2, 4, 6])
    tl.train_span("old_log_prob", T0 + 2, T0 + 3, unit=0)
    tl.train_span("update", T0 + 2.5, T0 + 4, unit=0)  # overlaps the previous span
    tl.train_span("update", T0 + 4, T0 + 5.5, unit=1)
    tl.train_span("update", T0 + 6, T0 + 7, unit=2)
    tl.train_span("ref_log_prob", T0 + 6.5, T0 + 6.8)  # unattributed, inside unit 2's span
    m = tl.metrics()
    assert m["trainer_busy_s"] == pytest.approx(4.5)  # [2,5.5] + [6,7]
    assert m["trainer_wait_ratio"] == pytest.approx(2.5 / 7)
    assert m["first_unit_ready_s"] == 2
    assert m["ideal_lower_bound_s"] == pytest.approx(7)  # max(6 + 1, 2 + 4.5)
    assert m["pipeline_efficiency"] == pytest.approx(1)
    assert m["weight_sync_s"] == 0 and m["step_time_s"] == 7
    rows = tl.unit_table()
    assert [r["unit"] for r in rows] == [0, 1, 2]
    assert rows[0] == {"unit": 0, "ready_s": 2, "derived_ready_s": 2, "start_s": 2, "end_s": 4, "busy_s": 2}


def test_spans_before_t0_are_clipped():
    tl = StepTimeline(step=0, groups_per_unit=1)
    rollout(tl, [1])
    tl.train_span("warmup", T0 - 5, T0 + 1)
    tl.train_span("update", T0 + 1, T0 + 2, unit=0)
    m = tl.metrics()
    assert m["trainer_busy_s"] == 2 and m["trainer_wait_ratio"] == 0


def test_first_unit_ready_skips_untrainable_groups():
    tl = StepTimeline(step=0, groups_per_unit=2)
    rollout(tl, [1, 2, 3, 4, 5, 6, 7], trainable=[True, False, True, False, True, True, False])
    tl.train_span("update", T0 + 3, T0 + 4, unit=0)
    tl.train_span("update", T0 + 6, T0 + 8, unit=1)
    tl.unit_ready(0, [0, 2], t=T0 + 3.5)  # the trainer's own observation wins in the table
    m = tl.metrics()
    assert m["first_unit_ready_s"] == 3
    assert m["num_groups"] == 7 and m["num_trainable_groups"] == 4
    rows = {r["unit"]: r for r in tl.unit_table()}
    assert rows[0]["ready_s"] == 3.5 and rows[0]["derived_ready_s"] == 3
    assert rows[1]["ready_s"] == 6  # 4th trainable completion
    cdf = tl.group_completion_cdf()
    assert cdf[0] == (1, pytest.approx(1 / 7)) and cdf[-1] == (7, 1.0)
    assert [t for t, _ in cdf] == sorted(t for t, _ in cdf)


def test_partial_unit_and_zero_trainable_fall_back_to_rollout_end():
    tl = StepTimeline(step=0, groups_per_unit=4)
    rollout(tl, [1, 2, 3], trainable=[False, False, False])
    tl.request_submitted("late", 9, t=T0 + 1)
    tl.request_aborted("late", 9, t=T0 + 5)  # aborts count towards the rollout end
    tl.train_span("noop", T0 + 5, T0 + 5.5)
    m = tl.metrics()
    assert m["num_trainable_groups"] == 0 and m["num_units"] == 0
    assert m["rollout_end_s"] == 5 and m["first_unit_ready_s"] == 5
    assert m["ideal_lower_bound_s"] == pytest.approx(5.5)  # no unit -> last unit cost 0
    assert m["num_aborted"] == 1 and m["num_requests"] == 7


def test_trainer_can_finish_before_rollout_end():
    """Why the ideal bound is no bound here: the last unit's groups finish early, late groups are untrainable."""
    tl = StepTimeline(step=0, groups_per_unit=1)
    rollout(tl, [1, 2, 10], trainable=[True, True, False])
    tl.train_span("update", T0 + 1, T0 + 2, unit=0)
    tl.train_span("update", T0 + 2, T0 + 3, unit=1)  # both start after their derived ready time
    m = tl.metrics()
    assert m["rollout_to_train_end_s"] == 3
    assert m["ideal_lower_bound_s"] == 11 and m["pipeline_efficiency"] > 1  # reported, not clipped
    assert m["step_time_s"] == 10  # the step still ends with its rollout


def test_missing_data_errors():
    tl = StepTimeline(step=7, groups_per_unit=1)
    with pytest.raises(ValueError, match="request_submitted"):
        tl.metrics()
    tl.request_submitted("a", 0, t=0.0)
    tl.response_done("a", 0, 5, t=1.0)
    with pytest.raises(ValueError, match="train_span"):
        tl.metrics()
    tl2 = StepTimeline(step=7, groups_per_unit=1)
    tl2.request_submitted("a", 0, t=0.0)
    tl2.train_span("update", 0.0, 1.0)
    with pytest.raises(ValueError, match="response_done"):
        tl2.metrics()
    with pytest.raises(ValueError):
        StepTimeline(step=0, groups_per_unit=0)


def test_fake_clock_and_span_context_manager():
    now = [5.0]
    tl = StepTimeline(step=0, groups_per_unit=1, clock=lambda: now[0])
    tl.request_submitted("a", 0)
    now[0] = 7.0
    tl.response_done("a", 0, 3)
    tl.group_done(0, True)
    assert tl.t0 == 5.0
    with pytest.raises(RuntimeError):
        with tl.span("update", unit=0):
            now[0] = 9.0
            raise RuntimeError("boom")  # the span is still recorded
    m = tl.metrics()
    assert m["first_unit_start_s"] == 2 and m["train_end_s"] == 4 and m["trainer_busy_s"] == 2


def non_overlapping(events):
    by_tid = {}
    for e in events:
        by_tid.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_chrome_trace_structure():
    tl = StepTimeline(step=0, groups_per_unit=1)
    # Replica 1 runs 3 requests at once, then one more after the first ends; replica None maps to 0.
    for i, (s, e) in enumerate([(0, 5), (0, 3), (1, 4), (3, 6)]):
        tl.request_submitted(f"r{i}", i, replica=1, t=T0 + s)
        tl.response_done(f"r{i}", i, 7, t=T0 + e)
    tl.request_submitted("x", 9, t=T0 + 2)
    tl.request_aborted("x", 9, t=T0 + 2.5)
    tl.request_submitted("y", 9, t=T0 + 2)  # never finished: drawn up to the last event
    tl.group_done(0, True, t=T0 + 5)
    tl.unit_ready(0, [0], t=T0 + 5)
    tl.train_span("old_log_prob", T0 + 5, T0 + 6, unit=0)
    tl.train_span("ref_log_prob", T0 + 5.5, T0 + 6.5, unit=0)
    tl.weight_sync(T0 + 6.5, T0 + 7)
    trace = tl.to_chrome_trace()
    json.dumps(trace)
    assert trace["displayTimeUnit"] == "ms"
    ev = trace["traceEvents"]
    assert all(e["ts"] >= 0 for e in ev if "ts" in e)
    xs = [e for e in ev if e["ph"] == "X"]
    non_overlapping(xs)
    reqs = {e["name"]: e for e in xs if e["pid"] == 1}
    assert {reqs[f"r{i}"]["tid"] for i in range(4)} == {1000, 1001, 1002}
    assert reqs["r3"]["tid"] == reqs["r1"]["tid"]  # reuses the lane r1 freed at t=3
    assert reqs["x"]["tid"] == 0 and reqs["x"]["args"]["aborted"]
    assert reqs["y"]["args"]["unfinished"] and reqs["y"]["dur"] == pytest.approx(5e6)
    assert reqs["r0"]["ts"] == 0 and reqs["r0"]["dur"] == pytest.approx(5e6)
    assert reqs["r0"]["args"]["group"] == 0 and reqs["r0"]["args"]["tokens"] == 7
    train = [e for e in xs if e["pid"] == 2]
    assert sorted(e["name"] for e in train) == ["old_log_prob", "ref_log_prob"]
    assert len({e["tid"] for e in train}) == 2  # overlapping spans go to separate lanes
    assert [e["pid"] for e in xs if e["name"] == "weight_sync"] == [3]
    inst = [e for e in ev if e["ph"] == "i"]
    assert {(e["pid"], e["args"].get("trainable")) for e in inst} == {(1, True), (2, None)}
    meta = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert meta == {(1, "rollout"), (2, "trainer"), (3, "weight_sync")}
    named = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in ev if e["ph"] != "M"} <= named


def test_write_chrome_trace_lays_steps_out_in_time(tmp_path):
    a, b = StepTimeline(0, 2), StepTimeline(1, 2)
    rollout(a, [4, 6, 8, 10])
    rollout(b, [1, 2], base=T0 + 20)
    path = tmp_path / "trace.json"
    write_chrome_trace([a, b], path)
    ev = json.loads(path.read_text())["traceEvents"]
    starts = {e["name"]: e["ts"] for e in ev if e["ph"] == "X"}
    assert starts["s0-g0-r0"] == 0 and starts["s1-g0-r0"] == pytest.approx(20e6)
    meta = [json.dumps(e, sort_keys=True) for e in ev if e["ph"] == "M"]
    assert len(meta) == len(set(meta))


def test_to_dict_from_dict_round_trip():
    tl = sync_schedule()
    tl.unit_ready(0, [0, 1], t=T0 + 6)
    tl.request_aborted("s0-g9-r0", 9, t=T0 + 3)
    d = json.loads(json.dumps(tl.to_dict()))
    back = StepTimeline.from_dict(d)
    assert back.to_dict() == tl.to_dict()
    assert back.metrics() == tl.metrics()
    assert back.unit_table() == tl.unit_table()
    assert back.to_chrome_trace() == tl.to_chrome_trace()
    assert (back.step, back.groups_per_unit) == (0, 2)


def test_thread_safety_smoke():
    tl = StepTimeline(step=0, groups_per_unit=4)
    n_threads, per_thread = 8, 300

    def worker(k):
        for i in range(per_thread):
            rid, g, t = f"{k}-{i}", k * per_thread + i, T0 + i * 1e-3
            tl.request_submitted(rid, g, replica=k, t=t)
            tl.response_done(rid, g, 1, t=t + 1)
            tl.group_done(g, i % 2 == 0, t=t + 1)
            if i % 50 == 0:
                tl.train_span("update", t + 1, t + 1.5, unit=g)
                tl.metrics()  # reading while others write must not break

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    m = tl.metrics()
    total = n_threads * per_thread
    assert m["num_requests"] == m["num_responses"] == m["num_groups"] == m["response_tokens"] == total
    assert m["num_trainable_groups"] == total // 2


def test_summarize():
    s = summarize([{"a": 1.0, "b": 2.0, "name": "x"}, {"a": 3.0, "b": 2.0, "name": "y"}])
    assert s == {"a": 2.0, "b": 2.0, "runs": 2, "spread": {"a": 2.0, "b": 0.0}}
    with pytest.raises(ValueError):
        summarize([])


# ---- properties ------------------------------------------------------------------------------------

groups_st = st.lists(st.tuples(st.floats(0.01, 50), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(groups=groups_st, gpu=st.integers(1, 3),
       spans=st.lists(st.tuples(st.floats(-10, 100), st.floats(0, 30), st.none() | st.integers(0, 4)),
                      min_size=1, max_size=10))
def test_wait_ratio_and_busy_bounded_for_any_schedule(groups, gpu, spans):
    tl = StepTimeline(0, gpu)
    rollout(tl, [d for d, _ in groups], [ok for _, ok in groups])
    for start, dur, unit in spans:
        tl.train_span("update", T0 + start, T0 + start + dur, unit=unit)
    try:
        m = tl.metrics()
    except ValueError:  # all trainer work ended before the first request: no window to measure
        assert max(T0 + s + d for s, d, _ in spans) <= T0
        return
    assert 0 <= m["trainer_wait_ratio"] <= 1
    assert m["trainer_busy_s"] <= m["rollout_to_train_end_s"] + 1e-9
    assert m["step_time_s"] >= max(m["rollout_to_train_end_s"], m["rollout_end_s"])


@settings(max_examples=150, deadline=None)
@given(groups=groups_st, gpu=st.integers(1, 3), data=st.data())
def test_ideal_lower_bound_holds_for_causal_schedules(groups, gpu, data):
    """The bound is a real lower bound only when the trainer is causal: every span starts after its unit's
    derived ready time (unattributed work after the first unit is ready) AND the last unit starts after the
    rollout ends. Without the last condition it fails (test_trainer_can_finish_before_rollout_end); with only
    the first, the `first_unit_ready + busy` half still holds, which is also asserted."""
    tl = StepTimeline(0, gpu)
    rollout(tl, [d for d, _ in groups], [ok for _, ok in groups])
    rollout_end = max(d for d, _ in groups)
    trainable = sorted(d for d, ok in groups if ok)

    def ready(u):
        k = (u + 1) * gpu - 1
        return trainable[k] if k < len(trainable) else rollout_end

    n_units = data.draw(st.integers(0, 5))
    starts_last_after_end = data.draw(st.booleans())
    gap, dur = st.floats(0, 5), st.floats(0, 5)
    for u in range(n_units):
        earliest = ready(u)
        if u == n_units - 1 and starts_last_after_end:
            earliest = max(earliest, rollout_end)
        for _ in range(data.draw(st.integers(1, 3))):  # spans of one unit may overlap each other
            s = earliest + data.draw(gap)
            tl.train_span("update", T0 + s, T0 + s + data.draw(dur), unit=u)
    for _ in range(data.draw(st.integers(0 if n_units else 1, 2))):
        # with no unit at all, unattributed work plays the last unit's role
        s = (rollout_end if n_units == 0 and starts_last_after_end else ready(0)) + data.draw(gap)
        tl.train_span("old_log_prob", T0 + s, T0 + s + data.draw(st.floats(0.01, 5)))
    m = tl.metrics()
    window = m["rollout_to_train_end_s"]
    assert m["first_unit_ready_s"] + m["trainer_busy_s"] <= window + 1e-6
    if starts_last_after_end:
        assert m["ideal_lower_bound_s"] <= window + 1e-6
        assert m["pipeline_efficiency"] <= 1 + 1e-6


def test_chrome_trace_many_concurrent_requests_keep_replicas_apart():
    tl = StepTimeline(step=0, groups_per_unit=1)
    for i in range(1500):  # a sync rollout queueing everything on replica 0
        tl.request_submitted(f"a{i}", i, replica=0, t=T0 + i * 1e-4)
        tl.response_done(f"a{i}", i, 1, t=T0 + 10 + (i % 7))
    tl.request_submitted("b", 0, replica=1, t=T0)
    tl.response_done("b", 0, 1, t=T0 + 1)
    tl.group_done(0, True, t=T0 + 1)
    ev = tl.to_chrome_trace()["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    non_overlapping(xs)
    tid_b = next(e["tid"] for e in xs if e["name"] == "b")
    assert tid_b not in {e["tid"] for e in xs if e["name"] != "b"}
    group_tid = next(e["tid"] for e in ev if e["ph"] == "i")
    assert group_tid not in {e["tid"] for e in xs}


def test_group_granularity_ideal_bound_uses_first_group_and_last_group_tail():
    from verl_pipe.core.timeline import StepTimeline

    tl = StepTimeline(step=1, groups_per_unit=2)
    for g, done in enumerate([1.0, 2.0, 3.0, 4.0]):
        tl.request_submitted(f"r{g}", g, t=0.0)
        tl.response_done(f"r{g}", g, 10, t=done)
        tl.group_done(g, True, t=done)
    # per-group forward/backward right after each group, optimizer step per unit
    for g, (s, e) in enumerate([(1.0, 1.5), (2.0, 2.5), (3.0, 3.5), (4.0, 4.5)]):
        tl.train_span("forward_backward", s, e, unit=g // 2, group=g)
    tl.train_span("optimizer_step", 2.5, 2.7, unit=0)
    tl.train_span("optimizer_step", 4.5, 4.7, unit=1)
    m = tl.metrics()
    assert m["last_unit_cost_s"] == pytest.approx(0.5 + 0.2)  # last group's fwd/bwd + the step
    assert m["ideal_lower_bound_s"] == pytest.approx(max(4.0 + 0.7, 1.0 + 2.4))
    assert m["pipeline_efficiency"] <= 1.0 + 1e-9


def test_trainer_busy_in_rollout_is_the_work_before_the_rollout_ends():
    tl = StepTimeline(step=0, groups_per_unit=1)
    for g, d in enumerate([2.0, 6.0]):
        tl.request_submitted(f"g{g}", g, replica=0, t=0.0)
        tl.response_done(f"g{g}", g, num_tokens=5, t=d)
        tl.group_done(g, True, t=d)
    tl.train_span("update", 2.5, 4.0, unit=0)
    tl.train_span("old_log_prob", 5.0, 7.0, unit=1)  # straddles the rollout's end (6): 1 s before it
    tl.train_span("update", 7.0, 8.0, unit=1)
    assert tl.trainer_busy_in_rollout_s() == pytest.approx(2.5) and tl.metrics()["trainer_busy_s"] == pytest.approx(4.5)
    assert "trainer_busy_in_rollout_s" not in tl.metrics()  # the bench JSONs' metric set stays as it was
