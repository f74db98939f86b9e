"""rollout.group_scores and PipeAgentLoopWorker._compute_score: a group's rewards in one call to the reward worker.

Pure logic with a stand-in reward worker (no Ray): the rows kept are the rows verl would have sent, and scoring them
together gives every response the score its own call would have given."""

import asyncio

import numpy as np
import pytest
import torch

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from tests.fakes import fake_of
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker
from verl_pipe.rollout.group_scores import (DEFERRED_ROW, REWARD_ERROR, RewardTimeout, extra_keys, pad_rows,
                                           score_group, zero_scores)


def reward_of(row) -> float:
    """A reward that reads the row the way verl's naive reward manager does (valid response length from the
    attention mask after the prompt), and depends on every valid token and on the ground truth."""
    prompt_len = int(row.batch["prompts"].shape[-1])
    valid = int(row.batch["attention_mask"][0, prompt_len:].sum())
    resp = row.batch["responses"][0, :valid].tolist()
    truth = row.non_tensor_batch["reward_model"][0]["ground_truth"]
    return float(sum((i + 1) * t for i, t in enumerate(resp)) + len(resp) * 1000 + int(truth))


@fake_of(RewardLoopWorker, extra=("single", "batches", "_Method", "_one", "_batch"))
class FakeRewardWorker:
    """Stands in for a RewardLoopWorker's handle: compute_score(data) and compute_score_batch(data), as verl's."""

    def __init__(self):
        self.single, self.batches = [], []
        self.compute_score = self._Method(self._one)
        self.compute_score_batch = self._Method(self._batch)

    class _Method:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, data):
            return asyncio.ensure_future(self.fn(data))

    async def _one(self, data):
        self.single.append(data)
        return {"reward_score": reward_of(data), "reward_extra_info": {"acc": reward_of(data) > 0}}

    async def _batch(self, data):  # verl's compute_score_batch: compute_score on each row
        self.batches.append(data)
        return [{"reward_score": reward_of(data[i:i + 1]), "reward_extra_info": {"acc": reward_of(data[i:i + 1]) > 0}}
                for i in range(len(data))]


def worker(handles, by_group: bool) -> PipeAgentLoopWorker:
    w = object.__new__(PipeAgentLoopWorker)  # verl's attributes _compute_score reads, nothing connected
    w.reward_loop_worker_handles, w.processor, w.mm_processor_kwargs = handles, None, None
    w.score_by_group = by_group
    return w


def output(prompt, response) -> AgentLoopOutput:
    return AgentLoopOutput(prompt_ids=list(prompt), response_ids=list(response), response_mask=[1] * len(response),
                           num_turns=2, metrics=AgentLoopMetrics(), extra_fields={"raw_prompt": "q"})


KWARGS = {"data_source": "arith", "reward_model": {"ground_truth": "7"}, "index": 3}
RESPONSES = [[5, 6, 7], [9], [4, 4, 4, 4, 4, 4], [8, 2]]


async def keep_then_score(outs, fake) -> None:
    """What the driver does with score_by_group: each response's row kept as it completes, then one group call."""
    w = worker([fake], by_group=True)
    for o in outs:
        await w._compute_score([o], KWARGS)
    await score_group(outs, [fake])


def test_the_kept_rows_are_what_verl_sends_and_one_call_scores_the_group():
    sent = FakeRewardWorker()
    verl_way = [output([1, 2, 3], r) for r in RESPONSES]
    for o in verl_way:
        asyncio.run(worker([sent], by_group=False)._compute_score([o], KWARGS))
    assert len(sent.single) == len(RESPONSES) and not sent.batches

    fake = FakeRewardWorker()
    ours = [output([1, 2, 3], r) for r in RESPONSES]

    async def run():
        w = worker([fake], by_group=True)
        for o in ours:
            await w._compute_score([o], KWARGS)
        assert all(o.reward_score is None for o in ours) and not fake.single and not fake.batches
        for o, row in zip(ours, sent.single):  # the row kept is the row verl sent, tensor for tensor
            kept = o.extra_fields[DEFERRED_ROW]
            assert set(kept.batch.keys()) == set(row.batch.keys())
            for k in row.batch.keys():
                assert torch.equal(kept.batch[k], row.batch[k]), k
            assert set(kept.non_tensor_batch) == set(row.non_tensor_batch)
        await score_group(ours, [fake])

    asyncio.run(run())
    assert len(fake.batches) == 1 and len(fake.batches[0]) == len(RESPONSES) and not fake.single
    assert [o.reward_score for o in ours] == [o.reward_score for o in verl_way]
    assert [o.extra_fields["reward_extra_info"] for o in ours] == [o.extra_fields["reward_extra_info"]
                                                                    for o in verl_way]
    assert all(DEFERRED_ROW not in o.extra_fields for o in ours)  # nothing of ours reaches verl's post-processing


def test_padding_only_extends_the_response_side():
    sent = FakeRewardWorker()
    outs = [output([1, 2, 3], r) for r in RESPONSES]
    for o in outs:
        asyncio.run(worker([sent], by_group=False)._compute_score([o], KWARGS))
    batch = pad_rows(sent.single)
    width = max(len(r) for r in RESPONSES)
    assert batch.batch["responses"].shape == (len(RESPONSES), width)
    assert batch.batch["prompts"].shape == (len(RESPONSES), 3)
    for i, r in enumerate(RESPONSES):
        assert batch.batch["attention_mask"][i].tolist() == [1] * (3 + len(r)) + [0] * (width - len(r))
        assert reward_of(batch[i:i + 1]) == reward_of(sent.single[i])
    assert list(batch.non_tensor_batch["response_len"]) == [len(r) for r in RESPONSES]


def test_prompts_of_different_widths_are_scored_row_by_row():
    fake = FakeRewardWorker()
    outs = [output([1, 2, 3], [5, 6]), output([1, 2], [5, 6, 7])]
    asyncio.run(keep_then_score(outs, fake))
    assert not fake.batches and len(fake.single) == 2
    assert all(o.reward_score is not None for o in outs)


def test_what_is_not_deferred_goes_as_verl_sends_it():
    fake = FakeRewardWorker()
    several = [output([1, 2], [3]), output([1, 2], [4, 5])]  # one trajectory of two outputs: verl scores it as one
    asyncio.run(worker([fake], by_group=True)._compute_score(several, KWARGS))
    assert len(fake.single) == 1 and len(fake.single[0]) == 2 and several[-1].reward_score is not None
    scored = output([1], [2])
    scored.reward_score = 0.5  # an agent loop that scores its own trajectories
    asyncio.run(worker([fake], by_group=True)._compute_score([scored], KWARGS))
    assert DEFERRED_ROW not in scored.extra_fields and scored.reward_score == 0.5
    asyncio.run(score_group([scored], [fake]))  # nothing kept: no call
    assert len(fake.single) == 1 and not fake.batches


def test_a_failing_reward_worker_raises_from_the_group_call():
    class Broken(FakeRewardWorker):
        async def _batch(self, data):
            raise ValueError("reward function raised")

    fake = Broken()
    outs = [output([1, 2, 3], r) for r in RESPONSES]
    with pytest.raises(ValueError, match="reward function raised"):
        asyncio.run(keep_then_score(outs, fake))
    assert np.all([o.reward_score is None for o in outs])


class Hanging(FakeRewardWorker):
    """A reward worker whose reward never answers (a hung reward function)."""

    async def _one(self, data):
        await asyncio.sleep(3600)

    async def _batch(self, data):
        await asyncio.sleep(3600)


def test_a_hanging_group_reward_times_out_naming_the_setting():
    outs = [output([1, 2, 3], r) for r in RESPONSES]

    async def run():
        w = worker([Hanging()], by_group=True)
        for o in outs:
            await w._compute_score([o], KWARGS)
        await score_group(outs, w.reward_loop_worker_handles, timeout_s=0.1)

    with pytest.raises(RewardTimeout, match=r"rolloutpipe.reward.timeout_s=0.1"):
        asyncio.run(run())
    assert all(o.reward_score is None for o in outs)


def test_verls_per_response_call_is_bounded_and_its_failure_kept_for_the_driver():
    """With catch_reward_errors (the streaming driver) a reward that hangs or raises leaves the response unscored with
    the error on it, instead of failing the request (which would be retried and regenerate the response)."""
    class Raising(FakeRewardWorker):
        async def _one(self, data):
            raise ValueError("reward function raised on this record")

    for fake, expected in ((Hanging(), "RewardTimeout: the response's reward took longer than "
                                       "rolloutpipe.reward.timeout_s=0.1"),
                           (Raising(), "ValueError: reward function raised on this record")):
        w = worker([fake], by_group=False)
        w.catch_reward_errors, w.reward_timeout_s = True, 0.1
        o = output([1, 2, 3], [4])
        asyncio.run(w._compute_score([o], KWARGS))
        assert o.reward_score is None and o.extra_fields[REWARD_ERROR] == expected
    w = worker([FakeRewardWorker()], by_group=False)
    w.catch_reward_errors, w.reward_timeout_s = True, 5.0
    o = output([1, 2, 3], [4])
    asyncio.run(w._compute_score([o], KWARGS))
    assert o.reward_score is not None and REWARD_ERROR not in o.extra_fields
    # without it (verl's own workers) the error is verl's
    w = worker([Raising()], by_group=False)
    with pytest.raises(ValueError, match="raised on this record"):
        asyncio.run(w._compute_score([output([1], [2])], KWARGS))


def test_zero_scores_keep_the_rewards_keys():
    scored, failed = output([1], [2]), output([1], [3])
    scored.reward_score, scored.extra_fields["reward_extra_info"] = 1.0, {"acc": 1.0, "pred": "7"}
    assert extra_keys([failed]) is None and extra_keys([failed, scored]) == ("acc", "pred")
    assert zero_scores([failed, scored], ("acc", "pred")) == 1
    assert failed.reward_score == 0.0 and failed.extra_fields["reward_extra_info"] == {"acc": 0.0, "pred": 0.0}
    assert scored.reward_score == 1.0
