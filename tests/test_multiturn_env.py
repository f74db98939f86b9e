"""verl_pipe/assets/multiturn_env.py: the scripted calculator environment of multi-turn rollouts (pure Python)."""

import math
import statistics
import subprocess
import sys

import pytest

from verl_pipe.assets.multiturn_env import (EnvConfig, TailSpec, calculator, group_latent, observation, plan_episode,
                                            reward)

CFG = EnvConfig(seed=3, turns=TailSpec(median=2, sigma=0.8, rho=0.7, cap=8),
                latency_s=TailSpec(median=0.05, sigma=1.0, rho=0.7, cap=5.0), tool_failure_p=0.1)


def test_same_episode_for_the_same_task_and_sample():
    assert plan_episode(CFG, 17, 3) == plan_episode(CFG, 17, 3)
    assert plan_episode(CFG, 17, 3) != plan_episode(EnvConfig(seed=4, turns=CFG.turns, latency_s=CFG.latency_s,
                                                              tool_failure_p=0.1), 17, 3)
    plans = {plan_episode(CFG, 17, i) for i in range(8)}
    assert len(plans) > 1  # the samples of a group differ


def test_same_episode_in_another_process():
    """String-seeded draws do not depend on PYTHONHASHSEED: a restarted or remote worker replays the episode."""
    code = ("from verl_pipe.assets.multiturn_env import *; "
            "c = EnvConfig(seed=3, tool_failure_p=0.1); print(repr(plan_episode(c, 17, 3)))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert outs == {repr(plan_episode(EnvConfig(seed=3, tool_failure_p=0.1), 17, 3)) + "\n"}


def test_turns_and_latencies_stay_in_bounds():
    for task in range(200):
        for sample in range(4):
            p = plan_episode(CFG, task, sample)
            assert 1 <= p.turns <= 8
            assert len(p.latencies_s) == len(p.failures) == p.turns - 1
            assert all(0 < x <= 5.0 for x in p.latencies_s)


def _corr(xs, ys):
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def test_turns_are_heavy_tailed_and_correlated_within_a_group():
    cfg = EnvConfig(turns=TailSpec(median=3, sigma=0.8, rho=0.7, cap=64))
    groups = [[plan_episode(cfg, task, s).turns for s in range(8)] for task in range(400)]
    flat = sorted(t for g in groups for t in g)
    assert statistics.median(flat) == 3
    assert flat[int(0.99 * len(flat))] >= 4 * statistics.median(flat)  # a long tail
    # within-group correlation: pairs of samples of the same group vs of different groups
    same = _corr([math.log(g[0]) for g in groups], [math.log(g[1]) for g in groups])
    other = _corr([math.log(g[0]) for g in groups], [math.log(groups[(i + 1) % len(groups)][1])
                                                     for i, g in enumerate(groups)])
    assert same > 0.45 and abs(other) < 0.15
    # rho = 0: no group effect
    cfg0 = EnvConfig(turns=TailSpec(median=3, sigma=0.8, rho=0.0, cap=64))
    g0 = [[plan_episode(cfg0, task, s).turns for s in range(2)] for task in range(400)]
    assert abs(_corr([math.log(g[0]) for g in g0], [math.log(g[1]) for g in g0])) < 0.15


def test_one_group_latent_drives_turns_and_latency():
    """A task that needs many tool calls also gets slow ones: groups' mean latency follows their mean turns."""
    cfg = EnvConfig(turns=TailSpec(median=4, sigma=0.8, rho=0.8, cap=64),
                    latency_s=TailSpec(median=0.1, sigma=0.8, rho=0.8, cap=100.0))
    zs, lat = [], []
    for task in range(300):
        plans = [plan_episode(cfg, task, s) for s in range(4)]
        calls = [x for p in plans for x in p.latencies_s]
        if calls:
            zs.append(group_latent(cfg.seed, task))
            lat.append(statistics.fmean(math.log(x) for x in calls))
    assert _corr(zs, lat) > 0.8


def test_tool_failures_follow_their_probability():
    cfg = EnvConfig(turns=TailSpec(median=6, sigma=0.0, rho=0.0, cap=6), tool_failure_p=0.2)
    fails = [f for task in range(300) for f in plan_episode(cfg, task, 0).failures]
    assert len(fails) == 300 * 5
    assert 0.15 < sum(fails) / len(fails) < 0.25
    assert not any(any(plan_episode(EnvConfig(), t, 0).failures) for t in range(100))


def test_calculator_and_observation():
    assert calculator("7 + 8 = ?") == "7 + 8 = 15"
    assert calculator("so 4*9 then 3 + 1") == "4 * 9 = 36"
    assert calculator("17 % 10") == "17 % 10 = 7"
    assert calculator("5 % 0") == "5 % 0 is undefined"
    assert calculator("no numbers") == "no expression found"
    assert calculator(None) == "no expression found"
    assert observation("2 + 2", 3) == "calculator: 2 + 2 = 4. 3 turns left."
    assert observation("x", 1).endswith("Last turn: put the final answer after 'Answer:'")


def test_reward_checks_the_final_answer():
    assert reward("3 + 4 = 7. Answer: 7", "7") == 1.0
    assert reward("Answer: 6", "7") == 0.0
    assert reward("Answer: 7", "7", tool_failed=True) == 0.0
    assert reward("", "7") == 0.0
    with pytest.raises(ValueError):
        reward("Answer: 7", None)  # a record without a ground truth is a data bug


def test_config_from_a_mapping_names_unknown_keys():
    cfg = EnvConfig.from_dict({"seed": 1, "turns": {"median": 3}, "tool_failure_p": 0,
                               "on_tool_failure": "fail_request"})
    assert cfg.turns == TailSpec(median=3, sigma=0.8, rho=0.7, cap=6) and cfg.tool_failure_p == 0.0
    assert EnvConfig.from_dict(None) == EnvConfig()
    for bad, word in [({"turn": 3}, "turn"), ({"turns": {"mean": 3}}, "mean"), ({"on_tool_failure": "retry"}, "retry"),
                      ({"turns": {"median": 0.5}}, "turns.median"), ({"latency_s": {"rho": 2}}, "rho"),
                      ({"turn_max_tokens": 0}, "turn_max_tokens"), ({"tool_failure_p": 1.5}, "tool_failure_p"),
                      ({"turns": {"median": 9, "cap": 6}}, "cap")]:
        with pytest.raises(ValueError, match=word):
            EnvConfig.from_dict(bad)


def test_forced_turn_lengths_are_deterministic_group_correlated_and_leave_the_rest_unchanged():
    spec = {"seed": 3, "turns": {"median": 3, "sigma": 0.8, "rho": 0.7, "cap": 8}, "turn_max_tokens": 64,
            "tool_failure_p": 0.1}
    plain = EnvConfig.from_dict(spec)
    forced = EnvConfig.from_dict({**spec, "turn_tokens": {"median": 16, "sigma": 0.8, "rho": 0.9, "cap": 48}})
    assert EnvConfig.from_dict({**spec, "turn_tokens": None}).turn_tokens is None
    for task in range(50):
        for s in range(4):
            a, b = plan_episode(plain, task, s), plan_episode(forced, task, s)
            assert a.turn_tokens == () and len(b.turn_tokens) == b.turns
            assert (a.turns, a.latencies_s, a.failures) == (b.turns, b.latencies_s, b.failures)
            assert all(1 <= t <= 48 for t in b.turn_tokens)
            assert b == plan_episode(forced, task, s)
    # the group latent drives lengths too: groups' mean turn length varies far more than within-group noise allows
    means = [sum(sum(plan_episode(forced, task, s).turn_tokens) / plan_episode(forced, task, s).turns
                 for s in range(4)) / 4 for task in range(200)]
    assert max(means) > 2.5 * min(means)
    capped = EnvConfig.from_dict({**spec, "turn_max_tokens": 8,
                                  "turn_tokens": {"median": 16, "sigma": 0.0, "rho": 0.0, "cap": 48}})
    assert set(plan_episode(capped, 1, 0).turn_tokens) == {8}
    for bad, word in [({"median": 16}, "missing"), ({"median": 0.5, "sigma": 0, "rho": 0, "cap": 4}, "turn_tokens")]:
        with pytest.raises(ValueError, match=word):
            EnvConfig.from_dict({**spec, "turn_tokens": bad})
