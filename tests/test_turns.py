"""Turn-aware admission (verl_pipe.core.frontier, verl_pipe.core.rollout_core): a trajectory waiting on its tool holds
no window slot; its next turn goes to the same replica with the same priority, in group-rank order ahead of later
groups' first turns. Pure logic: a random driver checks the invariants over many event orders."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_pipe.core.frontier import AdaptiveWindow, FCFSPolicy, FrontierPolicy, Request
from verl_pipe.core.rollout_core import HandOver, NextTurn, RolloutCore, Submit


def test_tool_wait_frees_the_slot_and_next_turn_is_sticky():
    p = FrontierPolicy(num_groups=3, n=2, groups_per_unit=1, target_groups=3, replicas=[0, 1], window=2)
    first = p.admit()
    assert [(a.request, a.replica, a.turn) for a in first] == [
        (Request(0, 0), 0, 0), (Request(0, 1), 0, 0), (Request(1, 0), 1, 0), (Request(1, 1), 1, 0)]
    assert p.on_turn_done(Request(0, 0), 0)
    assert p.inflight_count(0) == 1 and p.trajectory_count(0) == 2 and p.tool_wait_count() == 1
    # the freed slot goes to the next group's first turn while (0, 0) waits on its tool
    assert [(a.request, a.replica) for a in p.admit()] == [(Request(2, 0), 0)]
    assert p.on_turn_done(Request(1, 1), 1) and p.on_tool_done(Request(1, 1), 1)
    assert p.on_tool_done(Request(0, 0), 0)
    assert p.admit()[0] == type(first[0])(Request(1, 1), 1, 1, 1)  # same replica, same priority, turn 1
    assert p.ready_turn_count() == 1  # (0, 0)'s replica is full: it waits for a slot there, not elsewhere
    p.on_response_done(Request(2, 0), 0)
    assert [(a.request, a.replica, a.priority, a.turn) for a in p.admit()] == [(Request(0, 0), 0, 0, 1)]


def test_next_turn_goes_before_a_later_groups_first_turn_and_after_an_earlier_one():
    p = FrontierPolicy(num_groups=4, n=2, groups_per_unit=1, target_groups=4, replicas=[0], window=2)
    assert [a.request for a in p.admit()] == [Request(0, 0), Request(0, 1)]
    p.on_turn_done(Request(0, 1), 0)
    assert [a.request for a in p.admit()] == [Request(1, 0)]
    p.on_response_done(Request(0, 0), 0)
    p.on_tool_done(Request(0, 1), 0)
    # one slot: group 0's next turn beats group 1's pending first turn
    assert [(a.request, a.turn) for a in p.admit()] == [(Request(0, 1), 1)]
    p.on_turn_done(Request(1, 0), 0)
    p.on_tool_done(Request(1, 0), 0)
    p.on_response_done(Request(0, 1), 0)
    p.on_group_done(0, True)
    # two slots, group 1 has a next turn and a pending first turn: the next turn (same rank) first
    assert [(a.request, a.turn) for a in p.admit()] == [(Request(1, 0), 1), (Request(1, 1), 0)]


def test_fcfs_next_turns_go_first_in_the_order_their_tools_returned():
    p = FCFSPolicy(num_groups=3, n=2, groups_per_unit=1, target_groups=3, replicas=[0], window=2)
    p.admit()
    for i in (1, 0):
        p.on_turn_done(Request(0, i), 0)
    for i in (1, 0):
        p.on_tool_done(Request(0, i), 0)
    assert [(a.request, a.turn) for a in p.admit()] == [(Request(0, 1), 1), (Request(0, 0), 1)]


def test_dead_replica_restarts_waiting_and_ready_trajectories_from_their_first_turn():
    p = FrontierPolicy(num_groups=2, n=2, groups_per_unit=1, target_groups=2, replicas=[0, 1], window=4)
    p.admit()
    p.on_turn_done(Request(0, 0), 0)
    p.on_turn_done(Request(0, 1), 0)
    p.on_tool_done(Request(0, 1), 0)
    lost = p.remove_replica(0)
    assert lost == [Request(0, 0), Request(0, 1)]
    assert p.tool_wait_count() == 0 and p.ready_turn_count() == 0
    assert not p.on_tool_done(Request(0, 0), 0), "a report about the dead replica is stale"
    assert [(a.request, a.replica, a.turn) for a in p.admit()] == [(Request(0, 0), 1, 0), (Request(0, 1), 1, 0)]


def test_a_turn_report_in_the_wrong_state_is_a_bug():
    p = FrontierPolicy(num_groups=1, n=1, groups_per_unit=1, target_groups=1, replicas=[0], window=1)
    p.admit()
    with pytest.raises(RuntimeError, match="not waiting on its tool"):
        p.on_tool_done(Request(0, 0), 0)
    p.on_turn_done(Request(0, 0), 0)
    with pytest.raises(RuntimeError, match="not in a model turn"):
        p.on_turn_done(Request(0, 0), 0)


def test_core_releases_next_turns_as_next_turn_actions():
    core = RolloutCore(FrontierPolicy(num_groups=1, n=1, groups_per_unit=1, target_groups=1, replicas=[0, 1],
                                      window=1))
    (sub,) = core.admit()
    assert isinstance(sub, Submit) and sub.admission.turn == 0
    r = sub.admission.replica
    assert core.turn_done(Request(0, 0), r) == [] and core.tool_done(Request(0, 0), r) == []
    (nxt,) = core.admit()
    assert isinstance(nxt, NextTurn) and nxt.admission.replica == r and nxt.admission.turn == 1
    assert core.inflight_count() == 1  # the trajectory, not its turns
    assert core.turn_done(Request(0, 0), 1 - r) == [], "stale: another replica"
    acts = core.response_done(Request(0, 0), r)
    assert isinstance(acts[-1], HandOver)


# --- a random driver ----------------------------------------------------------------------------------------------

class _Model:
    """What the random driver knows of each started trajectory: its state ("turn" | "tool" | "ready"), replica,
    first turn's priority and model turns left."""

    def __init__(self, policy, turns: dict, window):
        self.policy, self.turns, self.window = policy, turns, window
        self.fgd = isinstance(policy, FrontierPolicy)
        self.state, self.replica, self.prio, self.left = {}, {}, {}, {}
        self.done_in = [0] * policy.num_groups

    def admitted(self, adms) -> None:
        """Checks one admit() call's admissions and the policy's counts after it."""
        first_to = {}
        for a in adms:
            q = a.request
            if a.turn == 0:
                assert q not in self.state
                self.state[q], self.replica[q] = "turn", a.replica
                self.prio[q], self.left[q] = a.priority, self.turns[q]
                first_to.setdefault(a.replica, []).append(q.group)
                continue
            assert self.state.get(q) == "ready", "only a ready trajectory gets its next turn"
            assert a.replica == self.replica[q], "a next turn goes to the trajectory's replica"
            assert a.priority == self.prio[q], "the priority is sticky across turns"
            if self.fgd:
                assert all(g <= q.group for g in first_to.get(a.replica, [])), \
                    "a next turn was admitted behind a later group's first turn"
            self.state[q] = "turn"
        if self.fgd:  # a next turn left waiting: no later group's first turn took a slot of its replica in this call
            for q, s in self.state.items():
                if s == "ready":
                    assert all(g <= q.group for g in first_to.get(self.replica[q], [])), (q, first_to)
        for r in self.policy.replicas:
            in_turn = sum(1 for q, s in self.state.items() if s == "turn" and self.replica[q] == r)
            assert self.policy.inflight_count(r) == in_turn, "a trajectory off its model turn counted in flight"
            if self.window is not None and not isinstance(self.window, AdaptiveWindow):
                assert in_turn <= self.window
        assert self.policy.tool_wait_count() == sum(s == "tool" for s in self.state.values())

    def kill_replica(self, dead: int) -> None:
        lost = self.policy.remove_replica(dead)
        assert set(lost) == {q for q in self.state if self.replica[q] == dead}
        for q in lost:
            del self.state[q]
        self.policy.add_replica(dead)

    def advance(self, q) -> None:
        """The next event of trajectory ``q``: its turn ends (to its tool, or its end) or its tool returns."""
        p, s = self.policy, self.state[q]
        if s == "turn":
            self.left[q] -= 1
            if self.left[q]:
                assert p.on_turn_done(q, self.replica[q])
                self.state[q] = "tool"
                return
            assert p.on_response_done(q, self.replica[q])
            del self.state[q]
            self.done_in[q.group] += 1
            if self.done_in[q.group] == p.n:
                p.on_group_done(q.group, True)
        elif s == "tool":
            assert p.on_tool_done(q, self.replica[q])
            self.state[q] = "ready"


def _drive(policy, turns: dict, rng: random.Random, window, deaths: int = 0):
    """Runs ``policy`` to its end over random event orders; ``turns[req]``: its planned model turns. Checks the
    turn-aware invariants after every admit() and returns the number of admissions checked."""
    model, checked = _Model(policy, turns, window), 0
    while not policy.all_done:
        adms = policy.admit()
        model.admitted(adms)
        checked += len(adms)
        moves = list(model.state)
        if not moves:
            break
        if deaths and rng.random() < 0.05 and len(policy.replicas) > 1:
            deaths -= 1
            model.kill_replica(rng.choice(policy.replicas))
            continue
        for q in rng.sample(moves, k=max(1, len(moves) // 3)):
            model.advance(q)
        if policy.batch_full:
            for q in policy.to_abort():
                model.state.pop(q, None)
    return checked


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["fgd", "fcfs"]),
       window=st.sampled_from([1, 2, 3, 5, None, "adaptive"]), replicas=st.integers(1, 3), deaths=st.integers(0, 2))
def test_turn_invariants_over_random_event_orders(seed, kind, window, replicas, deaths):
    rng = random.Random(seed)
    num_groups, n = rng.randint(1, 6), rng.randint(1, 4)
    if window == "adaptive":
        window = AdaptiveWindow(capacity=3, floor=1)
    cls = FrontierPolicy if kind == "fgd" else FCFSPolicy
    policy = cls(num_groups=num_groups, n=n, groups_per_unit=1, target_groups=num_groups,
                 replicas=list(range(replicas)), window=window)
    turns = {Request(g, i): rng.randint(1, 4) for g in range(num_groups) for i in range(n)}
    assert _drive(policy, turns, rng, window, deaths) >= num_groups * n
    assert policy.all_done and policy.inflight_count() == 0 and policy.trajectory_count() == 0


# --- the real driver (StreamingRollout's step loop) over a fake multi-turn agent loop -------------------------------

def _turn_driver_class():
    from verl_pipe.rollout.stream import StreamingRollout

    return type("TurnDriver", (_TurnDriver, StreamingRollout), {})


class _TurnDriver:
    """Mixed into StreamingRollout (``_turn_driver_class``, so that importing this module needs no verl): its real
    ``_StepRun`` with the agent loop replaced: ``plan[(g, i)]`` is a list of (turn seconds,
    tool seconds) per model turn; the fake calls the same turn hooks as verl_pipe.rollout.multiturn."""

    def __init__(self, plan):
        from types import SimpleNamespace

        self.plan, self.log = plan, []
        self.supervisor, self._tasks, self.sampling_params, self.default_agent = None, {}, {}, "x"
        from tests.fakes import stand_in
        from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker

        self.worker = stand_in(PipeAgentLoopWorker, _run_agent_loop=self._agent_loop,
                               _postprocess=lambda outputs, validate: outputs, score_by_group=False)
        self.client = SimpleNamespace(_servers=[None])

    async def _agent_loop(self, sampling_params, trajectory, trace=False, **kwargs):
        import asyncio
        from types import SimpleNamespace

        import torch

        from verl_pipe.rollout import turns
        from verl_pipe.rollout.client import CURRENT_ADMISSION

        adm = CURRENT_ADMISSION.get()
        key = (adm.request.group, adm.request.index)
        loop = asyncio.get_running_loop()
        segments = self.plan[key]
        for k, (gen_s, tool_s) in enumerate(segments):
            if k:
                await turns.next_turn()
            self.log.append((loop.time(), "turn", key, k, adm.replica, adm.priority))
            await asyncio.sleep(gen_s)
            if k == len(segments) - 1:
                break
            turns.turn_done()
            self.log.append((loop.time(), "tool", key, k, adm.replica, adm.priority))
            await asyncio.sleep(tool_s)
        return SimpleNamespace(response_mask=torch.ones(3), reward_score=None, extra_fields={})


def _run_turn_driver(plan, groups, window):
    import asyncio
    from types import SimpleNamespace

    import numpy as np

    from verl_pipe.core.timeline import StepTimeline
    from verl_pipe.rollout.stream import StepRequest

    drv = _turn_driver_class()(plan)
    gen_batch = SimpleNamespace(non_tensor_batch={"raw_prompt": np.array([f"p{g}" for g in range(groups)])})
    policy = FrontierPolicy(groups, 1, 1, groups, [0], window=window)
    req = StepRequest(step=1, gen_batch=gen_batch, n=1, policy=policy, timeline=StepTimeline(1, 1),
                      on_group=lambda g, outs: True)
    result = asyncio.run(drv._run_step(req))
    return drv.log, result, policy


def test_real_driver_frees_the_slot_during_a_tool_wait_and_gates_the_next_turn():
    # window 1: group 0 has two turns with a 0.3 s tool between; group 1 one turn of 0.5 s
    plan = {(0, 0): [(0.05, 0.3), (0.05, 0.0)], (1, 0): [(0.5, 0.0)]}
    log, result, policy = _run_turn_driver(plan, groups=2, window=1)
    t = {(kind, key, k): when for when, kind, key, k, _, _ in log}
    assert result.groups_done == 2
    # group 1's first turn took the slot while group 0 waited on its tool ...
    assert t[("tool", (0, 0), 0)] <= t[("turn", (1, 0), 0)] < t[("tool", (0, 0), 0)] + 0.3
    # ... so group 0's next turn (tool back at +0.3 s) waited for that slot: after group 1's 0.5 s turn
    assert t[("turn", (0, 0), 1)] >= t[("turn", (1, 0), 0)] + 0.5 - 0.01
    assert {(key, k): (r, prio) for _, kind, key, k, r, prio in log if kind == "turn"}[((0, 0), 1)] == (0, 0)
    assert policy.stats()["turns_admitted"] == 1 and policy.stats()["tool_waits"] == 1


def test_real_driver_without_tool_waits_keeps_single_turn_behaviour():
    plan = {(g, 0): [(0.01, 0.0)] for g in range(3)}
    log, result, policy = _run_turn_driver(plan, groups=3, window=1)
    assert result.groups_done == 3 and policy.stats()["tool_waits"] == 0
    assert [key for _, _, key, *_ in log] == [(0, 0), (1, 0), (2, 0)]
