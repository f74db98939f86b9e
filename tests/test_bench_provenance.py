"""What a bench result records about its stacks and host (lab/verl_pipe_lab/bench/provenance.py), on a fake composed config:
no Hydra, Ray or vLLM."""

import json

from omegaconf import OmegaConf

from verl_pipe_lab.bench import run as bench
from verl_pipe_lab.bench.provenance import machine, stack_record
from tests.test_bench import SHAPE, simulated_steps


def fake_config(coalesce=True):
    return OmegaConf.create({
        "data": {"train_batch_size": 8, "max_response_length": 256},
        "algorithm": {"adv_estimator": "grpo"},
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 8, "ppo_epochs": 1},
                              "rollout": {"n": 8, "max_num_seqs": 16}},
        "rolloutpipe": {"mode": "sync", "cgp": {"granularity": "minibatch", "coalesce_log_probs": coalesce},
                        "fgd": {"window": "adaptive"}, "theta_k": {"store": "auto"},
                        "cpu": {"kv_cache_gib": 2, "system_cores": "all"},
                        # an interpolation resolves to its value: the JSON says what ran
                        "trace_dir": None, "alias": "${rolloutpipe.fgd.window}"}})


def test_stack_record_keeps_every_rolloutpipe_value_and_the_overrides():
    rec = stack_record(fake_config(), ["a=1", "rolloutpipe.mode=cgp"])
    assert rec["overrides"] == ["a=1", "rolloutpipe.mode=cgp"]
    assert rec["rolloutpipe"]["cpu"] == {"kv_cache_gib": 2, "system_cores": "all"}
    assert rec["rolloutpipe"]["theta_k"] == {"store": "auto"}
    assert rec["rolloutpipe"]["alias"] == "adaptive"
    assert rec["coalesce_log_probs"] is True
    assert stack_record(fake_config(coalesce=False), [])["coalesce_log_probs"] is False
    assert rec["verl"]["actor_rollout_ref.rollout.max_num_seqs"] == 16
    json.dumps(rec)


def test_machine_names_the_host():
    m = machine()
    assert m["arch"] and m["os"] and m["usable_cores"] >= 1


def test_build_result_keeps_stacks_bench_config_and_existing_keys():
    cfg = {"overrides": ["x=1"], "modes": ["sync", "cgp", "cgp_fgd"], "settings": [{"name": "longtail-a"}]}
    stacks = {"bench": stack_record(fake_config(), ["x=1"])}
    settings = [{"name": "longtail-a", "workload": {"kind": "lognormal"}, "role": "balanced"}]
    steps = [s for s in simulated_steps() if s["setting"] == "longtail-a"]
    res = bench.build_result(cfg, settings, steps, {}, {}, {"bench": SHAPE}, {"cpu": "x"}, None, None, None, stacks)
    c = res["config"]
    assert {"overrides", "modes", "warmup_steps", "interleaved", "shapes"} <= set(c)  # kept as before
    assert c["stacks"]["bench"]["rolloutpipe"]["fgd"] == {"window": "adaptive"}
    assert c["coalesce_log_probs"] == {"bench": True}
    assert c["bench_config"] == cfg
    assert c["mode_args"]["cgp_group"] == {"mode": "cgp", "granularity": "group", "fgd": False}
    json.dumps(res)


def test_steps_file_carries_the_stacks_to_reanalyze(tmp_path):
    runner = bench.BenchRunner({}, 1, log=lambda *_: None)
    runner.stacks = {"bench": stack_record(fake_config(), ["x=1"])}
    path = tmp_path / "r_steps.json"
    path.write_text(json.dumps(runner.dump()))
    again = bench.BenchRunner({}, 1, log=lambda *_: None)
    again.load(path)
    assert again.stacks == runner.stacks
