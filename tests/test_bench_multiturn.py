"""The multi-turn bench setting (lab/verl_pipe_lab/bench/conf/multiturn.yaml, lab/verl_pipe_lab/bench/multiturn.py, multiturn_sim.py): it
composes on the multi-turn recipe (ours and the peer's) and passes our and verl's config checks; bad settings are
refused naming the key; the analysis (FGD's effect, CGP+FGD vs the peer, the simulator's error per metric) on
synthetic steps, and the calibration recovering a known engine from simulated steps. No Ray, no model."""

import pytest
import yaml
from omegaconf import OmegaConf, open_dict

from verl_pipe_lab.bench import multiturn as mtb
from verl_pipe_lab.bench import multiturn_sim as mts
from verl_pipe.config import validate


@pytest.fixture(scope="module")
def cfg():
    return mtb.load()


def test_setting_composes_and_validates(cfg):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from verl_pipe.assets.multiturn_env import EnvConfig
    from verl_pipe.rollout.multiturn import env_config

    c = mtb.compose_config(cfg)
    validate(c.copy(), check_paths=False)
    with open_dict(c):  # what the launcher derives (launch/prepare.py)
        c.rollout = {"nnodes": c.actor_rollout_ref.rollout.nnodes,
                     "n_gpus_per_node": c.actor_rollout_ref.rollout.n_gpus_per_node}
    OmegaConf.resolve(c)
    validate_config(config=c, use_reference_policy=need_reference_policy(c), use_critic=need_critic(c))
    env = env_config(c)
    assert env == EnvConfig.from_dict(cfg["multiturn"]) and env.turn_tokens is not None
    assert c.actor_rollout_ref.rollout.agent.default_agent_loop == "verl_pipe_multiturn"
    assert c.rolloutpipe.workload is None and c.rolloutpipe.fgd.enable
    assert c.actor_rollout_ref.rollout.max_model_len >= c.data.max_prompt_length + c.data.max_response_length
    # a whole episode fits the response: every turn at its cap plus a tool message of ~30 tokens between two turns
    assert env.turns.cap * env.turn_max_tokens + (env.turns.cap - 1) * 30 <= c.data.max_response_length
    assert cfg["modes"] == ["sync", "cgp", "cgp_fgd"] and cfg["peers"] == ["onpolicy"]


@pytest.mark.parametrize("change, match", [
    ({"modes": ["cgp", "cgp_fgd"]}, "must include sync"),
    ({"modes": ["sync", "cgp_group_fgd"]}, "subset"),
    ({"peers": ["default"]}, "only onpolicy"),
    ({"calibration_steps": -1}, "calibration_steps"),
    ({"cache_block": 0}, "cache_block"),
    ({"multiturn": {"turns": {"median": 2}}}, "turn_tokens must be set"),
    ({"rounds": 2}, "unknown keys"),
    ({"repeats": -1}, "repeats"),
])
def test_bad_settings_are_refused(cfg, tmp_path, change, match):
    path = tmp_path / "mt.yaml"
    path.write_text(yaml.safe_dump({**cfg, **change}))
    with pytest.raises(ValueError, match=match):
        mtb.load(path)


def test_the_peer_runs_the_rounds_batches_on_the_recipe_with_the_multiturn_node(cfg):
    from verl_pipe_lab.bench.peer.runner import compose_spec, workload_seed

    spec = mtb.peer_spec(cfg, "onpolicy", repeats=3)
    warm = cfg["warmup_steps"] + cfg["calibration_steps"]
    assert spec["warmup_steps"] == warm and spec["steps"] == 3 + warm  # our warm-up and calibration batches first
    assert [workload_seed(k, spec["seed"], warm) for k in range(warm, warm + 3)] == [cfg["seed"] + r for r in range(3)]
    c = compose_spec(spec)
    assert c.actor_rollout_ref.rollout.agent.default_agent_loop == "verl_pipe_multiturn"
    assert OmegaConf.to_container(c.rolloutpipe.multiturn) == cfg["multiturn"]
    assert c.trainer.v1.trainer_mode == "separate_async" and c.trainer.v1.separate_async.num_warmup_batches == 0
    assert c.data.train_batch_size == 8 and c.actor_rollout_ref.rollout.n == 8
    validate(c.copy(), check_paths=False)


def test_calibration_steps_are_single_turn_with_the_settings_turn_lengths(cfg):
    from verl_pipe.assets.multiturn_env import EnvConfig, plan_episode

    env = EnvConfig.from_dict(mtb.calibration_env(cfg, 1))
    assert env.seed == mtb.CALIBRATION_SEED + 1 and env.turn_tokens == EnvConfig.from_dict(cfg["multiturn"]).turn_tokens
    assert {plan_episode(env, f"train/{g}", i).turns for g in range(8) for i in range(8)} == {1}


def test_the_steps_file_sits_beside_the_json():
    assert mtb.steps_path("docs/bench/multiturn_2026-12-02b.json").name == "multiturn_steps_2026-12-02b.json.gz"


def _steps():
    # two rounds; FGD makes the first unit 20% earlier and rollout->train end 10% shorter than cgp
    base = {"sync": (10.0, 6.0), "cgp": (8.0, 2.0), "cgp_fgd": (7.2, 1.6)}
    steps = []
    for r in (0, 1):
        for mode, (end, first) in base.items():
            tl = {k: 1.0 for k in mtb.FIGURES}
            tl.update(rollout_to_train_end_s=end * (1 + r), first_unit_ready_s=first * (1 + r), rollout_end_s=5.0)
            steps.append({"round": r, "mode": mode, "timeline": tl})
    return steps


def test_summary_reports_fgds_effect_and_the_change_vs_sync():
    s = mts.summarize(_steps(), mtb.FIGURES)
    assert s["fgd_vs_cgp"]["first_unit_ready_s"] == pytest.approx(-0.2)
    assert s["fgd_vs_cgp"]["rollout_to_train_end_s"] == pytest.approx(-0.1)
    assert s["vs_sync"]["cgp"]["rollout_to_train_end_s"] == pytest.approx(-0.2)
    assert s["modes"]["sync"]["rollout_to_train_end_s"] == pytest.approx(15.0)


def test_simulated_steps_give_a_relative_error_per_step(cfg):
    live = {"shape": {"n": 4, "prompts": 4, "groups_per_unit": 2, "max_num_seqs": 16, "max_response_length": 256,
                      "replicas": 1, "fgd_window": "adaptive", "baseline_window": None,
                      "baseline_order": "group_major"},
            "rounds": [{"round": 0, "seed": 0, "tasks": [f"train/{g}" for g in range(4)]}],
            "steps": []}
    for mode in ("sync", "cgp_fgd"):
        tl = {k: 1.0 for k in mtb.FIGURES}
        live["steps"].append({"round": 0, "mode": mode, "timeline": tl, "prompt_len": 30.0, "tool_tokens": 28.0})
    sims = mts.simulate_steps(cfg, live)
    assert [s["mode"] for s in sims] == ["sync", "cgp_fgd"]
    for s in sims:
        assert s["sim"]["rollout_end_s"] > 0
        assert s["rel_error"]["rollout_end_s"] == pytest.approx(s["sim"]["rollout_end_s"] - 1.0)
    summary = mts.summarize(live["steps"], mtb.FIGURES, sims)
    assert set(summary["sim_abs_rel_error"]) == {"sync", "cgp_fgd"}


def test_summary_compares_cgp_fgd_with_the_peer():
    steps = _steps() + [{"round": r, "mode": mts.PEER_MODE,
                         "timeline": {k: 1.0 for k in mtb.FIGURES} | {"rollout_to_train_end_s": 9.0 * (1 + r),
                                                                      "first_unit_ready_s": 4.0 * (1 + r)}}
                        for r in (0, 1)]
    s = mts.summarize(steps, mtb.FIGURES)
    assert s["cgp_fgd_vs_peer"]["rollout_to_train_end_s"] == pytest.approx(7.2 / 9.0 - 1)
    assert s["cgp_fgd_vs_peer"]["first_unit_ready_s"] == pytest.approx(-0.6)
    assert s["vs_sync"][mts.PEER_MODE]["rollout_to_train_end_s"] == pytest.approx(-0.1)


TRUE_ENGINE = dict(t0_s=2e-3, per_seq_s=2.5e-4, prefill_flops_per_token=1.0, prefill_flops_per_s=2.0e4)


def _recorded_run(cfg, engine, trainer):
    """A bench run recorded from the simulator with a known engine and trainer: calibration steps, then rounds of
    every mode, each with its timeline events and metrics as the live bench keeps them."""
    from verl_pipe.assets.multiturn_env import EnvConfig
    from verl_pipe.sim.simulate import rollout_for_mode, timeline_for
    from verl_pipe.sim.turns import from_env

    shape = {"n": 8, "prompts": 8, "groups_per_unit": 2, "micro_rows": 8, "max_num_seqs": 16,
             "max_response_length": 256, "replicas": 1, "cache_block": 128, "fgd_window": "adaptive",
             "baseline_window": None, "baseline_order": "group_major"}
    tasks = [f"train/{g}" for g in range(8)]

    def record(node, mode, window):
        eps = from_env(EnvConfig.from_dict(node), 8, 8, response_length=256, tool_tokens=30,
                       task=lambda g: tasks[g], cache_block=128)
        wl = eps.workload(prompt_len=35)
        res = rollout_for_mode(mode, wl, engine.with_(max_num_seqs=16), 1, 2, window, episodes=eps)
        tl = timeline_for(res, wl, trainer, mode, 2, weight_sync_s=0.0)
        return {"events": tl.to_dict(), "timeline": tl.metrics(), "prompt_len": 35.0, "tool_tokens": 30.0}

    calibration = [record(mtb.calibration_env(cfg, k), "sync", None) for k in range(2)]
    rounds, steps = [], []
    for r in range(2):
        rounds.append({"round": r, "seed": r, "tasks": tasks})
        for mode in ("sync", "cgp", "cgp_fgd"):
            st = record({**cfg["multiturn"], "seed": r}, mode, "adaptive" if mode == "cgp_fgd" else None)
            steps.append({"round": r, "mode": mode, **st})
    return {"shape": shape, "rounds": rounds, "calibration": calibration, "steps": steps}


def test_the_calibration_recovers_the_engine_and_the_analysis_its_steps(cfg, tmp_path):
    import gzip
    import json

    from verl_pipe.sim.engine import CPU_TINY
    from verl_pipe.sim.trainer import TrainerParams

    engine = CPU_TINY.with_(**TRUE_ENGINE)
    trainer = TrainerParams(num_gpus=1, flops_per_s_per_gpu=2e5, efficiency=1.0, linear_flops_per_token=1.0,
                            attn_flops_coef=0.0, microbatch_overhead_s=0.0, call_overhead_s=0.02, use_ref=False,
                            optimizer_step_s=0.05, logprob_ratio=0.4, swap_save_s=0.0, swap_restore_s=0.0)
    live = _recorded_run(cfg, engine, trainer)
    fit = mts.fit_engine_on(live["calibration"], live["shape"])
    # a full batch's decode step (t0 and per_seq are only jointly identified near it) and the prefill per token
    assert fit.params.step_time(16, 0) == pytest.approx(engine.step_time(16, 0), rel=0.1)
    assert fit.prefill_s_per_token == pytest.approx(1 / TRUE_ENGINE["prefill_flops_per_s"], rel=0.2)
    sim = mts.analyze(cfg, live)
    assert set(sim["abs_rel_error"]) == {"sync", "cgp", "cgp_fgd"}
    for per_metric in sim["abs_rel_error"].values():
        assert set(per_metric) == set(mts.METRICS)
    # calibrated on single-turn steps, the simulator predicts the multi-turn steps it was not fitted on
    assert sim["max_abs_rel_error"] < 0.10 and sim["within_target"]
    # the preset engine (a slower prefill) does not: its first unit comes late
    preset = sim["preset"]["abs_rel_error"]
    assert max(v["first_unit_ready_s"]["max"] for v in preset.values()) > 0.3
    # the steps file alone rebuilds the analysis
    path = tmp_path / "mt_steps_x.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"config": cfg, **live}, f)
    again = mtb.reanalyze(path)
    assert again["sim"]["abs_rel_error"] == sim["abs_rel_error"]
    assert "events" not in again["steps"][0] and again["summary"]["fgd_vs_cgp"]


def test_the_peers_measured_steps_become_rounds_and_a_failure_is_reported(cfg, monkeypatch):
    import verl_pipe_lab.bench.peer as peer

    rounds = [{"round": r, "seed": r, "tasks": [f"train/{r}{g}" for g in range(2)]} for r in range(2)]
    metrics = {k: 1.0 for k in mtb.FIGURES}
    recs = [{"warmup": True, "metrics": metrics, "weight_versions": {}, "tasks": ["x"]}] * 3 + [
        {"warmup": False, "metrics": dict(metrics, first_unit_ready_s=2.0 + r), "weight_versions": {"on_policy": True},
         "tasks": rounds[r]["tasks"] if r == 0 else ["train/other"]} for r in range(2)]
    seen = []
    monkeypatch.setattr(peer, "run_peer", lambda spec, **kw: seen.append(spec) or {"steps": recs})
    entries, steps = mtb.run_peers(cfg, 2, rounds, log=lambda *a: None)
    assert seen[0]["warmup_steps"] == 3 and seen[0]["multiturn"] == cfg["multiturn"]
    assert [(s["round"], s["mode"], s["timeline"]["first_unit_ready_s"]) for s in steps] == [
        (0, mts.PEER_MODE, 2.0), (1, mts.PEER_MODE, 3.0)]
    assert [s["same_tasks"] for s in steps] == [True, False]

    def fail(spec, **kw):
        raise RuntimeError("verl separate_async peer (onpolicy) failed with exit code 1")

    monkeypatch.setattr(peer, "run_peer", fail)
    entries, steps = mtb.run_peers(cfg, 2, rounds, log=lambda *a: None)
    assert steps == [] and "exit code 1" in entries[0]["error"]


def test_the_calibration_check_re_simulates_the_calibration_steps(cfg):
    from verl_pipe.sim.engine import CPU_TINY
    from verl_pipe.sim.trainer import TrainerParams

    engine = CPU_TINY.with_(**TRUE_ENGINE)
    live = _recorded_run(cfg, engine, TrainerParams(use_ref=False))
    check = mts.calibration_check(live["calibration"], live["shape"], engine)
    assert len(check) == 2
    for c in check:  # the engine that recorded them reproduces them
        assert c["rel_error"]["first_unit_ready_s"] == pytest.approx(0.0, abs=1e-9)
        assert c["rel_error"]["rollout_end_s"] == pytest.approx(0.0, abs=1e-9)
    slow = mts.calibration_check(live["calibration"], live["shape"], engine.with_(t0_s=4e-3))
    assert all(c["rel_error"]["rollout_end_s"] > 0.05 for c in slow)
