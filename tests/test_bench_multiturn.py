"""The multi-turn bench setting (conf/bench/multiturn.yaml, verl_pipe/bench/multiturn.py): it composes on the
multi-turn recipe and passes our and verl's config checks; bad settings are refused naming the key; the analysis
(FGD's effect, the simulator's error) on synthetic steps. No Ray, no model."""

import pytest
import yaml
from omegaconf import OmegaConf, open_dict

from verl_pipe.bench import multiturn as mtb
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
    with open_dict(c):  # what main_grpo.prepare_config derives
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
    assert cfg["modes"] == ["sync", "cgp", "cgp_fgd"] and not cfg["peers"]


@pytest.mark.parametrize("change, match", [
    ({"modes": ["cgp", "cgp_fgd"]}, "must include sync"),
    ({"modes": ["sync", "cgp_group_fgd"]}, "subset"),
    ({"peers": ["onpolicy"]}, "sample index"),
    ({"multiturn": {"turns": {"median": 2}}}, "turn_tokens must be set"),
    ({"rounds": 2}, "unknown keys"),
    ({"repeats": -1}, "repeats"),
])
def test_bad_settings_are_refused(cfg, tmp_path, change, match):
    path = tmp_path / "mt.yaml"
    path.write_text(yaml.safe_dump({**cfg, **change}))
    with pytest.raises(ValueError, match=match):
        mtb.load(path)


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
    s = mtb.summarize(_steps())
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
    sims = mtb.simulate_steps(cfg, live)
    assert [s["mode"] for s in sims] == ["sync", "cgp_fgd"]
    for s in sims:
        assert s["sim"]["rollout_end_s"] > 0
        assert s["rel_error"]["rollout_end_s"] == pytest.approx(s["sim"]["rollout_end_s"] - 1.0)
    summary = mtb.summarize(live["steps"], sims)
    assert set(summary["sim_abs_rel_error"]) == {"sync", "cgp_fgd"}
