"""The rollout driver's fault handling as pure logic: StreamingRollout's real step loop, admission policy and
timeline, with the agent loop replaced by a coroutine that sleeps, times out or fails as each test says (the
end-to-end versions with vLLM are in tests/e2e/test_faults.py and test_replicas.py)."""

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl_pipe.core.frontier import FCFSPolicy
from verl_pipe.core.timeline import StepTimeline
from tests.fakes import fake_of, stand_in
from verl.experimental.agent_loop.agent_loop import _InternalAgentLoopOutput
from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker
from verl_pipe.rollout.group_scores import REWARD_ERROR, RewardTimeout
from verl_pipe.rollout.replicas import ReplicaSupervisor
from verl_pipe.rollout.stream import ReplicaLostError, RewardFailedError, StepRequest, StreamingRollout


class EngineDeadError(Exception):
    """Named like vLLM's: the engine behind a replica is gone."""


class Driver(StreamingRollout):
    """StreamingRollout without Ray or vLLM: ``behave(group, index, attempt, replica)`` returns a delay in
    seconds or raises."""

    def __init__(self, behave, supervisor=None):  # noqa: D107 - no super(): nothing to connect to
        self.behave = behave
        self.supervisor = supervisor
        self._tasks, self._scoring = {}, {}
        self.sampling_params = {}
        self.default_agent = "single_turn_agent"
        self.calls = []
        self.worker = stand_in(PipeAgentLoopWorker, _run_agent_loop=self._fake_agent_loop,
                               _postprocess=lambda outputs, validate: outputs, score_by_group=False)
        self.client = SimpleNamespace(_servers=[None, None])
        self.reward_keys = None
        self.reward_error = {}  # (group, index) -> the error its own reward call left on it (verl's path)

    async def _fake_agent_loop(self, sampling_params, trajectory, trace=False, **kwargs):
        from verl_pipe.rollout.client import CURRENT_ADMISSION

        adm = CURRENT_ADMISSION.get()
        key = (adm.request.group, adm.request.index)
        attempt = sum(1 for c in self.calls if c[:2] == key)
        self.calls.append((*key, adm.replica))
        delay = self.behave(*key, attempt, adm.replica)
        await asyncio.sleep(delay)
        # verl's per-response reward: scored (1.0), or the error its call left; score_by_group: not scored yet
        error, deferred = self.reward_error.get(key), self.worker.score_by_group
        extra = {} if deferred else {"reward_extra_info": {"acc": 1.0}} if error is None else {REWARD_ERROR: error}
        return stand_in(_InternalAgentLoopOutput, response_mask=torch.ones(3),
                        reward_score=None if error or deferred else 1.0, extra_fields=extra,
                        extra={"group": key[0], "index": key[1], "replica": adm.replica})

    def run(self, req: StepRequest):
        return asyncio.run(self._run_step(req))


def _request(groups=4, target=4, replicas=(0,), window=None, **kw):
    trained = []
    gen_batch = SimpleNamespace(non_tensor_batch={"raw_prompt": np.array([f"p{g}" for g in range(groups)]),
                                                  "index": np.array([100 + g for g in range(groups)]),
                                                  "data_source": np.array(["digit_math"] * groups)})
    req = StepRequest(step=1, gen_batch=gen_batch, n=2,
                      policy=FCFSPolicy(groups, 2, 1, target, replicas, window=window), timeline=StepTimeline(1, 1),
                      on_group=lambda g, outs: trained.append((g, [o.replica for o in outs])) or True, **kw)
    return req, trained


def test_a_timed_out_request_is_retried_then_succeeds():
    drv = Driver(lambda g, i, attempt, r: 1.0 if (g, i, attempt) == (1, 0, 0) else 0.0)
    req, trained = _request(request_timeout_s=0.2, max_retries=2)
    result = drv.run(req)
    assert sorted(g for g, _ in trained) == [0, 1, 2, 3]
    assert result.failed_attempts == 1 and result.dropped_groups == 0
    assert drv.calls.count((1, 0, 0)) == 2  # the original and one retry


def test_a_request_timing_out_past_its_retries_drops_its_group_and_the_next_group_replaces_it():
    # group 1 never answers in time; a window of one group makes the step wait on it (group-major order)
    drv = Driver(lambda g, i, attempt, r: 5.0 if g == 1 else 0.0)
    req, trained = _request(groups=5, target=4, window=2, request_timeout_s=0.1, max_retries=1,
                            on_request_failure="drop_group")
    result = drv.run(req)
    assert sorted(g for g, _ in trained) == [0, 2, 3, 4], "group 4 (oversampled) took group 1's place"
    assert result.dropped_groups == 1
    assert result.failed_attempts >= 2
    assert req.policy.stats()["dropped_groups"] == 1


def test_a_request_failing_past_its_retries_fails_the_step_naming_the_settings():
    def behave(g, i, attempt, r):
        if g == 2:
            raise ValueError("bad sampling parameter")
        return 0.0

    req, _ = _request(max_retries=1)
    with pytest.raises(RuntimeError, match=r"max_request_retries=1.*on_request_failure=fail"):
        Driver(behave).run(req)


@fake_of(ReplicaSupervisor, extra=("restart_s", "fail", "restarted", "retired"))
class FakeSupervisor:
    def __init__(self, restart=True, restart_s=0.2, fail=False):
        self.restart_enabled, self.restart_s, self.fail = restart, restart_s, fail
        self.restarted, self.retired = [], []

    def restart(self, index, version):
        import time

        time.sleep(self.restart_s)
        if self.fail:
            raise RuntimeError("no devices")
        self.restarted.append((index, version))

    def retire(self, index):
        self.retired.append(index)

    def live(self):
        return [0, 1]


def _dies_once(replica=0, after=0.05):
    """The replica's engine dies: every request on it from then on fails, until it is restarted."""
    state = {"dead": False, "restarted": False}

    def behave(g, i, attempt, r):
        if r == replica and not state["restarted"] and (state["dead"] or g >= 1):
            state["dead"] = True
            raise EngineDeadError("engine core died")
        return after

    return behave, state


def test_the_only_replica_dies_and_comes_back_with_the_step_weights():
    behave, state = _dies_once()
    sup = FakeSupervisor()
    drv = Driver(behave, sup)
    orig = sup.restart
    sup.restart = lambda index, version: (orig(index, version), state.update(restarted=True))
    req, trained = _request(weight_version=7)
    result = drv.run(req)
    assert sup.restarted == [(0, 7)], "restarted once, with the step's weight version"
    assert result.replica_failures == 1 and result.replica_restarts == 1
    assert result.requeued_requests > 0 and result.failed_attempts == 0  # not the requests' fault
    assert sorted(g for g, _ in trained) == [0, 1, 2, 3]
    assert len(result.recovery_s) == 1 and result.recovery_s[0] >= 0.2


def test_without_restart_a_dead_replica_is_retired_and_the_other_finishes_its_requests():
    behave, _ = _dies_once(replica=0)
    sup = FakeSupervisor(restart=False)
    req, trained = _request(replicas=(0, 1))
    result = Driver(behave, sup).run(req)
    assert sup.retired == [0]
    assert result.replica_failures == 1 and result.replica_restarts == 0
    assert sorted(g for g, _ in trained) == [0, 1, 2, 3]
    late = [reps for g, reps in trained if g >= 1]
    assert all(set(reps) == {1} for reps in late), "after the death only replica 1 serves"


@pytest.mark.parametrize("supervisor", [None, FakeSupervisor(restart=False), FakeSupervisor(fail=True)])
def test_no_replica_left_is_a_clear_error(supervisor):
    behave, _ = _dies_once()
    req, _ = _request()
    with pytest.raises(ReplicaLostError, match="no replica is left"):
        Driver(behave, supervisor).run(req)


def test_groups_scored_off_the_loop_are_handed_over_in_completion_order(monkeypatch):
    """rolloutpipe.reward.score_by_group: a group's reward call runs while the loop goes on; a slow call for an
    early group holds the later groups back (hand-over in completion order, so the batch takes the same groups as
    when every response is scored on its own), and groups still scoring when the batch fills end late."""
    import verl_pipe.rollout.stream as stream

    scoring_s = {0: 0.3}  # group 0's reward call is slow; the others answer at once
    scored = []

    async def fake_score_group(outputs, handles, timeout_s=None):
        g = outputs[0].group
        await asyncio.sleep(scoring_s.get(g, 0.0))
        scored.append(g)

    monkeypatch.setattr(stream, "score_group", fake_score_group)
    # group g completes at 0.02 * g s; 6 groups for a batch of 4 (oversampled)
    drv = Driver(lambda g, i, attempt, r: 0.02 * g)
    drv.worker.score_by_group, drv.worker.reward_loop_worker_handles = True, [object()]
    req, trained = _request(groups=6, target=4)
    result = drv.run(req)
    assert [g for g, _ in trained] == [0, 1, 2, 3], "handed over in completion order, group 0 first"
    assert result.groups_done == 4 and result.late_groups + result.aborted >= 1
    assert 0 in scored


def _group_rewards(monkeypatch, fail: dict):
    """score_by_group with a stand-in group call: groups in ``fail`` raise ("raise") or time out ("hang") with
    ``timeout_s``; the others are scored 1 with extra-info key "acc"."""
    import verl_pipe.rollout.stream as stream
    from verl_pipe.rollout.group_scores import bounded

    calls = []

    async def score(outputs, handles, timeout_s=None):
        g = outputs[0].group
        calls.append((g, timeout_s))
        if fail.get(g) == "raise":
            raise ValueError("reward function raised on this record")
        if fail.get(g) == "hang":
            await bounded(asyncio.sleep(3600), timeout_s, "scoring the group's 2 responses")
        for o in outputs:
            o.reward_score, o.extra_fields["reward_extra_info"] = 1.0, {"acc": 1.0}

    monkeypatch.setattr(stream, "score_group", score)
    drv = Driver(lambda g, i, attempt, r: 0.01 * g)
    drv.worker.score_by_group, drv.worker.reward_loop_worker_handles = True, [object()]
    return drv, calls


def test_a_failing_group_reward_call_fails_the_step_naming_the_record(monkeypatch):
    drv, _ = _group_rewards(monkeypatch, {2: "raise"})
    req, _ = _request()
    with pytest.raises(RewardFailedError, match=r"reward of the group of group 2, record index 102, data_source "
                                                r"digit_math failed.*raised on this record.*Not retried"):
        drv.run(req)


def test_a_hanging_group_reward_scores_zero_or_drops_its_group(monkeypatch):
    drv, calls = _group_rewards(monkeypatch, {2: "hang"})
    # every group of the step is needed (no oversampling): which groups fill the batch cannot depend on how the
    # machine's load orders the others against the 0.2 s timeout
    req, trained = _request(groups=5, target=5, reward_timeout_s=0.2, on_reward_failure="zero_reward")
    trained_outs = {}
    req.on_group = lambda g, outs: trained_outs.setdefault(g, outs) and trained.append(g) or True
    result = drv.run(req)
    assert (2, 0.2) in calls and result.reward_failures == 1 and result.dropped_groups == 0
    assert sorted(trained) == [0, 1, 2, 3, 4], "the group that timed out trains with reward 0"
    assert [o.reward_score for o in trained_outs[2]] == [0.0, 0.0]
    assert [o.extra_fields["reward_extra_info"] for o in trained_outs[2]] == [{"acc": 0.0}] * 2

    drv, _ = _group_rewards(monkeypatch, {2: "hang"})
    req, trained = _request(groups=5, target=4, reward_timeout_s=0.2, on_reward_failure="drop_group")
    result = drv.run(req)
    assert sorted(g for g, _ in trained) == [0, 1, 3, 4], "group 4 (oversampled) took group 2's place"
    assert result.reward_failures == 1 and result.dropped_groups == 1


def test_zero_reward_before_any_response_is_scored_drops_the_group(monkeypatch):
    drv, _ = _group_rewards(monkeypatch, {0: "raise"})
    req, trained = _request(groups=5, target=4, on_reward_failure="zero_reward")
    result = drv.run(req)
    assert sorted(g for g, _ in trained) == [1, 2, 3, 4] and result.dropped_groups == 1


@pytest.mark.parametrize("policy", ["fail", "zero_reward", "drop_group"])
def test_a_responses_own_reward_failure_is_decided_not_retried(policy):
    """verl's per-response path (score_by_group off): the error its reward call left on the response."""
    drv = Driver(lambda g, i, attempt, r: 0.01 * g)
    drv.reward_error[(2, 1)] = "RewardTimeout: the response's reward took longer than rolloutpipe.reward.timeout_s=5"
    # zero_reward keeps the group: a batch of every group, so which ones fill it cannot depend on the machine's load
    # (a batch of 4 of 5 trained [0, 1, 3, 4] beside two burning processes); drop_group leaves exactly 4 of 5
    target = 5 if policy == "zero_reward" else 4
    req, trained = _request(groups=5, target=target, on_reward_failure=policy)
    if policy == "fail":
        with pytest.raises(RewardFailedError, match=r"response s1-g2-r1 of group 2, record index 102.*timeout_s=5"):
            drv.run(req)
        return
    result = drv.run(req)
    assert result.reward_failures == 1 and result.failed_attempts == 0, "not a request failure: not retried"
    assert drv.calls.count((2, 1, 0)) == 1
    expected = [0, 1, 2, 3, 4] if policy == "zero_reward" else [0, 1, 3, 4]
    assert sorted(g for g, _ in trained) == expected
