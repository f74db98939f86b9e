"""The verl separate_async benchmark peer's pure parts (lab/verl_pipe_lab/bench/peer): configurations -> overrides,
bench sizing -> runner spec, and recorded events / verl tags -> our StepTimeline metrics. No Ray."""

import math

import pytest

from verl_pipe_lab.bench.peer import bench_spec
from verl_pipe_lab.bench.peer.configs import MODE_NAMES, peer_overrides
from verl_pipe_lab.bench.peer.metrics import UNAVAILABLE, step_record, step_timeline, weight_versions

QUICK = ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]


def _value(overrides, key):
    return [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key][-1]


def test_onpolicy_config_generates_nothing_ahead_and_drops_anything_stale():
    o = peer_overrides("onpolicy", QUICK, steps=3)
    assert o[:len(QUICK)] == QUICK  # the bench's own sizing first, unchanged
    assert _value(o, "trainer.v1.trainer_mode") == "separate_async"
    assert _value(o, "trainer.v1.separate_async.parameter_sync_step") == "4"  # 8 groups / mini-batch 2
    assert _value(o, "trainer.v1.separate_async.num_warmup_batches") == "0"
    assert _value(o, "trainer.v1.sampler.max_off_policy_threshold") == "1"
    assert _value(o, "trainer.total_training_steps") == "3"
    assert _value(o, "transfer_queue.enable") == "true"


def test_default_config_is_verls_one_batch_ahead():
    o = peer_overrides("default", QUICK, steps=2)
    assert _value(o, "trainer.v1.separate_async.num_warmup_batches") == "1"
    assert _value(o, "trainer.v1.sampler.max_off_policy_threshold") == "8"
    assert MODE_NAMES == {"onpolicy": "verl_separate_async", "default": "verl_separate_async_1off",
                          "tuned": "verl_separate_async_tuned", "separate_sync": "verl_separate_sync",
                          "colocated": "verl_colocated"}


def test_tuned_and_sync_configs_run_verls_other_trainers_with_their_knobs():
    from verl_pipe_lab.bench.peer.configs import TUNED, VERL_STORAGE_UNITS, knobs_of

    t = peer_overrides("tuned", QUICK, steps=2)
    assert _value(t, "trainer.v1.trainer_mode") == "separate_async"
    assert _value(t, "trainer.v1.separate_async.num_warmup_batches") == "0"  # still exactly on-policy
    assert _value(t, "transfer_queue.backend.SimpleStorage.num_data_storage_units") == str(TUNED["storage_units"])
    assert _value(t, "actor_rollout_ref.rollout.agent.num_workers") == str(TUNED["agent_workers"])
    c = peer_overrides("colocated", QUICK, steps=2)
    from verl_pipe_lab.bench.peer.configs import AFTER_VALIDATION

    assert _value(c, "trainer.v1.trainer_mode") == "sync"
    assert AFTER_VALIDATION["sync_colocated"] == {"actor_rollout_ref.hybrid_engine": True}  # after our validation
    s = peer_overrides("separate_sync", QUICK, steps=2)
    assert _value(s, "trainer.use_v1") == "false" and _value(s, "actor_rollout_ref.hybrid_engine") == "false"
    assert _value(s, "+actor_rollout_ref.rollout.agent.agent_loop_manager_class").endswith("PeerLegacyAgentLoopManager")
    # a tuning A/B's knobs win over the configuration's; verl's storage default when a configuration sets none
    o = peer_overrides("onpolicy", QUICK, steps=1, knobs={"storage_units": 8, "agent_workers": 2})
    assert _value(o, "transfer_queue.backend.SimpleStorage.num_data_storage_units") == "8"
    assert _value(o, "actor_rollout_ref.rollout.agent.num_workers") == "2"
    assert knobs_of("onpolicy")["poll_interval_s"] is None and VERL_STORAGE_UNITS == 8
    with pytest.raises(ValueError, match="poll_interval_s=0"):
        knobs_of("tuned", {"poll_interval_s": 0})
    with pytest.raises(ValueError, match="nope"):
        knobs_of("tuned", {"nope": 1})


def test_bad_settings_name_the_setting():
    with pytest.raises(ValueError, match="ppo_mini_batch_size=3"):
        peer_overrides("onpolicy", ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=3"], 1)
    with pytest.raises(ValueError, match="'sometimes'"):
        peer_overrides("sometimes", QUICK, 1)
    with pytest.raises(ValueError, match="steps=0"):
        peer_overrides("onpolicy", QUICK, 0)
    with pytest.raises(ValueError, match="data.train_batch_size='eight'"):
        peer_overrides("onpolicy", ["data.train_batch_size=eight"], 1)


def test_bench_spec_takes_the_bench_sizing_and_the_longtail_workload():
    cfg = {"model_size": "bench", "overrides": QUICK, "seed": 0, "warmup_steps": 1,
           "settings": [{"name": "notail-equal-L32", "workload": {"kind": "equal", "length": 32}},
                        {"name": "longtail-x", "workload": {"kind": "lognormal", "median": 32, "sigma": 0.8,
                                                            "rho": 0.7, "cap": 128}}]}
    spec = bench_spec("default", 3, cfg)
    assert spec["setting"] == "longtail-x" and spec["workload"]["kind"] == "lognormal"
    assert spec["steps"] == 4 and spec["warmup_steps"] == 1  # the warm-up step comes on top
    assert spec["overrides"][-2:] == ["rolloutpipe.tiny_assets.size=bench", "rolloutpipe.tiny_assets.warm_start.steps=0"]
    assert bench_spec("onpolicy", 2, cfg, "notail-equal-L32", warmup_steps=0)["steps"] == 2
    with pytest.raises(ValueError, match="--setting 'nope'"):
        bench_spec("onpolicy", 2, cfg, "nope")


def _events(t_submit=100.0):
    """Two groups of two requests, mini-batches of one group; group 1 is the long one."""
    groups = {
        "a": {"group": 0, "done": t_submit + 2.0,
              "requests": {0: {"start": t_submit, "end": t_submit + 1.5, "tokens": 10},
                           1: {"start": t_submit + 0.1, "end": t_submit + 2.0, "tokens": 12}}},
        "b": {"group": 1, "done": t_submit + 6.0,
              "requests": {0: {"start": t_submit, "end": t_submit + 6.0, "tokens": 40},
                           1: {"start": t_submit + 0.1, "end": t_submit + 3.0, "tokens": 20}}},
    }
    spans = [{"kind": "old_log_prob", "start": t_submit + 3.0, "end": t_submit + 4.0, "unit": 0},
             {"kind": "update", "start": t_submit + 4.0, "end": t_submit + 5.0, "unit": 0},
             {"kind": "old_log_prob", "start": t_submit + 7.0, "end": t_submit + 8.0, "unit": 1},
             {"kind": "update", "start": t_submit + 8.0, "end": t_submit + 10.0, "unit": 1}]
    return groups, spans


def _tags(lo, hi, prompt_step, count=4):
    return [{"min_global_steps": lo, "max_global_steps": hi, "global_steps": prompt_step} for _ in range(count)]


def test_events_map_onto_our_metrics():
    groups, spans = _events()
    rec = step_record(3, 1, groups, spans, (110.0, 111.5), step_start=99.9, step_end=111.5,
                      timing_raw={"gen": 4.0, "update_weights": 1.5, "step": 11.6}, tags=_tags(2, 2, 3))
    m = rec["metrics"]
    assert m["rollout_end_s"] == pytest.approx(6.0)
    assert m["rollout_to_train_end_s"] == pytest.approx(10.0)
    assert m["trainer_busy_s"] == pytest.approx(5.0)
    assert m["trainer_wait_ratio"] == pytest.approx(0.5)
    assert m["first_unit_ready_s"] == pytest.approx(2.0)  # group "a" done: the first unit of one group
    assert m["first_unit_start_s"] == pytest.approx(3.0)
    assert m["weight_sync_s"] == pytest.approx(1.5)
    assert m["step_time_s"] == pytest.approx(11.5)
    assert m["last_unit_cost_s"] == pytest.approx(3.0)
    assert m["response_tokens"] == 82 and m["num_requests"] == 4 and m["num_groups"] == 2
    assert m["step_wall_s"] == pytest.approx(11.6) and m["step_start_to_t0_s"] == pytest.approx(0.1)
    assert m["data_latency_s"] == m["rollout_to_train_end_s"] and m["data_rollout_end_s"] == m["rollout_end_s"]
    assert m["verl_gen_wait_s"] == 4.0 and m["verl_update_weights_s"] == 1.5
    assert "num_aborted" not in m and rec["unavailable"] == UNAVAILABLE
    assert all(isinstance(v, float) and not math.isnan(v) for v in m.values())
    assert rec["weight_versions"]["on_policy"] is True
    assert rec["lengths"] == [[10, 12], [40, 20]]  # per trained group, per response (tokens)


def test_weight_versions_say_on_policy_only_when_every_trajectory_used_the_previous_steps_weights():
    on = weight_versions(_tags(2, 2, 3), step=3)
    assert on == {"trajectories": 4, "with_version": 4, "policy_version": 2, "min_global_steps": 2,
                  "max_global_steps": 2, "spanning": 0, "max_staleness": 0, "on_policy": True,
                  "prompt_global_steps_min": 3, "prompt_global_steps_max": 3}
    stale = weight_versions(_tags(1, 1, 2) + _tags(1, 2, 2, count=2), step=3)  # one batch ahead, partial rollout
    assert stale["on_policy"] is False and stale["max_staleness"] == 1 and stale["spanning"] == 2
    assert stale["min_global_steps"] == 1 and stale["max_global_steps"] == 2
    unknown = weight_versions([{"global_steps": 3}], step=3)
    assert unknown["on_policy"] is None and unknown["with_version"] == 0


def test_a_step_without_rollout_events_is_an_error():
    with pytest.raises(ValueError, match="no rollout events"):
        step_record(1, 1, {}, [], None, 0.0, 1.0, {}, [])


def test_timeline_keeps_group_ids_and_requests_per_session():
    groups, spans = _events()
    tl = step_timeline(1, 2, groups, spans, None)
    assert tl.t0 == 100.0
    units = tl.unit_table()
    assert [u["unit"] for u in units] == [0, 1]


def test_data_generated_ahead_is_measured_over_the_steps_window():
    """One batch ahead: the trained groups were submitted at 100 (the previous step); this step submitted its
    own batch at 104, so its metrics start there; the data's latency is kept apart."""
    groups, spans = _events()
    for g in groups.values():
        g["submitted"] = 100.0
    rec = step_record(2, 1, groups, spans, (110.0, 111.5), step_start=103.9, step_end=111.5, timing_raw={},
                      tags=_tags(0, 0, 1), step_t0=104.0)
    m = rec["metrics"]
    assert m["rollout_end_s"] == pytest.approx(2.0)  # group b's last response at 106
    assert m["first_unit_ready_s"] == pytest.approx(0.0)  # group a was complete before the step began
    assert m["rollout_to_train_end_s"] == pytest.approx(6.0)
    assert m["trainer_busy_s"] == pytest.approx(4.0)  # spans clipped to the step's window (103-104 is outside)
    assert m["step_time_s"] == pytest.approx(7.5)
    assert m["data_rollout_end_s"] == pytest.approx(6.0) and m["data_latency_s"] == pytest.approx(10.0)
    assert m["step_start_to_t0_s"] == pytest.approx(0.1)
    wv = rec["weight_versions"]
    assert wv["on_policy"] is False and wv["max_staleness"] == 1


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_stop_runner_terminates_then_kills_the_session(ignores_sigterm):
    import subprocess
    import sys

    from verl_pipe_lab.bench.peer import stop_runner

    code = ("import signal, sys, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignores_sigterm else "")
            + "print('up', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    stop_runner(proc, grace_s=1)
    assert proc.returncode == (-9 if ignores_sigterm else -15)


def test_workload_seeds_follow_the_bench():
    from verl_pipe_lab.bench.peer.runner import workload_seed

    assert [workload_seed(i, 0, 1) for i in range(4)] == [10_000, 0, 1, 2]  # warm-up, then rounds 0, 1, 2
    assert [workload_seed(i, 5, 0) for i in range(2)] == [5, 6]


def test_bench_spec_runs_the_peer_on_the_settings_own_stack():
    """A setting on a named stack (the paper regime) gives the peer that stack's overrides, as our modes get."""
    from verl_pipe_lab.bench.settings import CONF_DIR, load_config, stack_overrides

    cfg = load_config(CONF_DIR / "default.yaml")
    name = next(s["name"] for s in cfg["settings"] if s.get("stack") == "paper")
    spec = bench_spec("onpolicy", 1, cfg, name)
    assert spec["overrides"] == stack_overrides(cfg, "paper") and spec["model_size"] == "paper"
    assert "actor_rollout_ref.rollout.max_num_seqs=256" in spec["overrides"]
