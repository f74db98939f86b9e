"""The engine model's KV pool in blocks and its preemption, as vLLM V1's scheduler does them (vLLM 0.29,
``v1/core/sched/scheduler.py``): a request holds whole blocks, needs a new one at each block boundary, and when the
next step does not fit the victim is ``running.pop()`` (fcfs) or ``max(running, key=(priority, arrival))``
(priority); it loses its computed tokens and goes back to the front of waiting; nothing is admitted in that step."""

from __future__ import annotations

import pytest

from verl_pipe.core import workload as W
from verl_pipe.sim.engine import EngineParams, Replica, Seq
from verl_pipe.core.frontier import FCFSPolicy, FrontierPolicy
from verl_pipe.sim.simulate import simulate_rollout, step_admission

# one decode step = 1 s, no prefill cost
STEP = EngineParams(max_num_seqs=256, max_num_batched_tokens=10**6, kv_bytes_per_token=0.0, weight_bytes=0.0,
                    t0_s=1.0, per_seq_s=0.0, bw_eff_Bps=1.0, prefill_flops_per_token=0.0)


def make_policy(cls, wl, replicas, gpu, window, target=None, order="group_major"):
    """``cls`` (FrontierPolicy: ``window`` is FGD's; FCFSPolicy: the stock dispatch's) built as a step builds it."""
    fgd = issubclass(cls, FrontierPolicy)
    return cls.for_step(step_admission(wl, replicas, gpu, window if fgd else None, target, order,
                                       baseline_window=None if fgd else window))


def _seqs(n, prompt, length, priorities=None):
    return [Seq(i, i, 0, length, prompt, (priorities or [0] * n)[i], float(i), i) for i in range(n)]


def test_a_pool_in_blocks_runs_one_request_per_block_however_short():
    # 4 blocks of 128 tokens: 8 requests of 10 + 20 tokens fit in 512 tokens, but each holds a whole block
    rep = Replica(0, STEP.with_(kv_capacity_tokens=4 * 128, kv_block_tokens=128))
    for s in _seqs(8, 10, 20):
        rep.submit(s)
    rep.plan(0.0)
    assert len(rep.running) == 4 and len(rep.waiting) == 4
    tokens = Replica(0, STEP.with_(kv_capacity_tokens=4 * 128))  # the same pool counted in tokens
    for s in _seqs(8, 10, 20):
        tokens.submit(s)
    tokens.plan(0.0)
    assert len(tokens.running) == 8


def _run_to_first_preemption(policy):
    # 3 blocks of 4 tokens, prompts of 3. A (rank 1) is admitted first and runs a step alone (4 tokens: its next
    # token takes a second block); B (rank 0) arrives and gets the third block; one step later both cross a block
    # boundary and the pool cannot give both
    rep = Replica(0, STEP.with_(kv_capacity_tokens=12, kv_block_tokens=4, scheduling_policy=policy))
    a, b = Seq(0, 0, 0, 6, 3, 1, 0.0, 0), Seq(1, 1, 0, 6, 3, 0, 1.0, 1)
    rep.submit(a)
    rep.plan(0.0)
    assert rep.interrupt(0.5) == pytest.approx(1.0)
    rep.finish_segment()
    rep.submit(b)
    assert rep.plan(1.0) == pytest.approx(2.0) and list(rep.running) == [a.rid, b.rid]
    rep.finish_segment()
    rep.plan(2.0)
    return rep, a, b


def test_fcfs_preempts_the_latest_admitted_and_admits_nothing_in_that_step():
    rep, a, b = _run_to_first_preemption("fcfs")
    assert rep.num_preemptions == 1 and b.preemptions == 1 and a.preemptions == 0
    assert list(rep.running) == [a.rid]
    assert rep.waiting[0][2] is b and b.base == 1  # keeps its token, recomputes prompt + output


def test_priority_preempts_the_largest_priority_then_arrival_even_if_admitted_first():
    rep, a, b = _run_to_first_preemption("priority")
    assert a.preemptions == 1 and b.preemptions == 0 and a.base == 2
    assert list(rep.running) == [b.rid]


def test_a_block_bound_rollout_completes_every_request_within_the_pool():
    wl = W.from_spec({"kind": "lognormal", "median": 40, "sigma": 1.0, "rho": 0.7, "cap": 300}, 8, 4, 16, seed=1)
    eng = STEP.with_(kv_capacity_tokens=8 * 64, kv_block_tokens=64, scheduling_policy="priority")
    res = simulate_rollout(wl, eng, make_policy(FrontierPolicy, wl, 1, 2, None), 1)
    assert len([m for m, _ in res.log if m == "response_done"]) == 32
    assert res.stats["preemptions"] > 0
    assert max(res.stats["peak_kv_tokens"]) <= 8 * 64


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("seed", range(4))
def test_the_pool_never_holds_more_blocks_than_it_has(monkeypatch, policy, seed):
    """After every stretch of steps the engine ran in closed form, the running requests' blocks fit the pool."""
    B, blocks = 16, 12
    seen = []
    finish = Replica.finish_segment

    def checked(self):
        done = finish(self)
        held = sum(-(-(s.prompt + self.generated(s)) // B) for s in self.running.values())
        held += sum(-(-(s.prompt + s.length) // B) for s in done)  # a finished request held its last token's block
        seen.append(held)
        assert held <= blocks
        return done

    monkeypatch.setattr(Replica, "finish_segment", checked)
    wl = W.from_spec({"kind": "lognormal", "median": 20, "sigma": 1.0, "rho": 0.5, "cap": 100}, 6, 4, 8, seed=seed)
    eng = STEP.with_(kv_capacity_tokens=blocks * B, kv_block_tokens=B, scheduling_policy=policy)
    res = simulate_rollout(wl, eng, make_policy(FrontierPolicy if policy == "priority" else FCFSPolicy, wl, 1, 2, None), 1)
    assert len([m for m, _ in res.log if m == "response_done"]) == 24 and max(seen) > blocks // 2
