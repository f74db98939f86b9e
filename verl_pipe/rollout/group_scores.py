"""A group's rewards in one call to verl's reward worker, when the group completes.

verl 0.9.1's agent loop scores every response on its own: ``AgentLoopWorker._compute_score`` builds a one-row
DataProto and sends it to a ``RewardLoopWorker`` with ``compute_score.remote`` (a Ray call, its pickling on both
sides), n calls per group. A trainable group needs all n scores anyway, so here the row verl builds is kept on the
response instead of being sent (``CaptureHandle`` stands in for the reward worker's handle in verl's own method: the
row is verl's, built by verl's code), and when the group completes its rows go to the reward worker together
through verl's batch seam, ``RewardLoopWorker.compute_score_batch``, which scores each row with the same
``compute_score`` as the single call: the same reward function on the same row, one Ray call per group instead of n.

Either way a reward call is bounded (``rolloutpipe.reward.timeout_s``, per group here, per response on verl's path) and
a reward that raises or times out is a reward failure the rollout core decides on (``rolloutpipe.reward.on_failure``:
fail the step naming the record, score the responses 0, or drop the group; ``RolloutCore.reward_failed``): on verl's
per-response path ``PipeAgentLoopWorker._compute_score`` keeps the error on the response (``REWARD_ERROR``) for the
driver, instead of failing the request, which would be retried and regenerate a response that was fine.

The rows are padded on the right to the group's longest (as verl's own multi-row construction does); the scores
do not depend on it (verl's reward managers read a response's length from its attention mask). Rows whose prompts
differ in width would move a right-padded prompt's end, so such a group is scored row by row, as verl does.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import torch.nn.functional as F
from verl import DataProto

DEFERRED_ROW = "__verl_pipe_reward_row__"  # extra_fields key: the row verl built, until the group is scored
REWARD_ERROR = "__verl_pipe_reward_error__"  # extra_fields key: why the response's own reward call failed
NO_SCORE = {"reward_score": None, "reward_extra_info": {}}


class RewardTimeout(TimeoutError):
    """A reward call took longer than rolloutpipe.reward.timeout_s."""


async def bounded(awaitable, timeout_s: float | None, what: str):
    """``awaitable`` within ``timeout_s`` seconds (None: no limit); a timeout raises RewardTimeout naming the setting.
    The reward worker's call itself is not stopped (a Ray call cannot be interrupted there): its thread runs on."""
    if not timeout_s:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout=timeout_s)
    except asyncio.TimeoutError:
        raise RewardTimeout(f"{what} took longer than rolloutpipe.reward.timeout_s={timeout_s:g}") from None


def extra_keys(outputs: list[Any]) -> tuple[str, ...] | None:
    """The reward's extra-info keys (``reward_extra_info``) of the first scored response, None if none is scored."""
    for o in outputs:
        if o.reward_score is not None and isinstance(o.extra_fields.get("reward_extra_info"), dict):
            return tuple(o.extra_fields["reward_extra_info"])
    return None


def zero_scores(outputs: list[Any], keys: tuple[str, ...]) -> int:
    """rolloutpipe.reward.on_failure=zero_reward: every response without a score gets 0, with the reward's extra-info
    ``keys`` at 0 (verl's post-processing and the batch's concatenation need the same keys on every row); returns how
    many."""
    zeroed = 0
    for o in outputs:
        if o.reward_score is None:
            o.reward_score = 0.0
            o.extra_fields["reward_extra_info"] = {k: 0.0 for k in keys}
            zeroed += 1
    return zeroed


class CaptureHandle:
    """Stands in for a reward worker's Ray handle in ``AgentLoopWorker._compute_score``: ``compute_score.remote(data)``
    keeps ``data`` and answers "no score yet" (verl then leaves ``reward_score`` None)."""

    def __init__(self):
        self.data: DataProto | None = None

    @property
    def compute_score(self) -> "CaptureHandle":
        return self

    def remote(self, data: DataProto) -> asyncio.Future:
        self.data = data
        done = asyncio.get_running_loop().create_future()
        done.set_result(dict(NO_SCORE))
        return done


def pad_rows(rows: list[DataProto]) -> DataProto:
    """One DataProto of ``rows`` (one-row DataProtos as verl's ``_compute_score`` builds them), each tensor padded
    with zeros on the right of its last dimension to the longest (``pad_sequence``'s padding in verl's own
    multi-row construction). Every row must have the same tensor keys and non-tensor keys."""
    keys = list(rows[0].batch.keys())
    width = {k: max(int(r.batch[k].shape[-1]) for r in rows) for k in keys}
    padded = []
    for r in rows:
        tensors = {k: F.pad(r.batch[k], (0, width[k] - int(r.batch[k].shape[-1]))) for k in keys}
        padded.append(DataProto.from_dict(tensors=tensors, non_tensors=dict(r.non_tensor_batch),
                                          meta_info=dict(r.meta_info)))
    return DataProto.concat(padded)


def same_prompt_width(rows: list[DataProto]) -> bool:
    return len({int(r.batch["prompts"].shape[-1]) for r in rows}) == 1


async def score_group(outputs: list[Any], handles: list, timeout_s: float | None = None) -> None:
    """Scores the responses of one group whose rows were kept (``DEFERRED_ROW``), in one
    ``compute_score_batch`` call, and sets each response's ``reward_score`` and ``reward_extra_info`` as verl's
    ``_compute_score`` would have. Responses scored otherwise (an agent loop that set its own score) are left.
    ``timeout_s``: the group's bound (RewardTimeout past it); an error leaves every response of the group unscored."""
    pending = [(o, o.extra_fields.pop(DEFERRED_ROW)) for o in outputs if DEFERRED_ROW in o.extra_fields]
    if not pending:
        return
    rows = [row for _, row in pending]
    handle = random.choice(handles)
    if same_prompt_width(rows):
        call = handle.compute_score_batch.remote(pad_rows(rows))
    else:
        call = asyncio.gather(*(handle.compute_score.remote(row) for row in rows))
    results = await bounded(call, timeout_s, f"scoring the group's {len(rows)} responses")
    for (out, _), res in zip(pending, results):
        out.reward_score = res["reward_score"]
        out.extra_fields["reward_extra_info"] = res["reward_extra_info"]

