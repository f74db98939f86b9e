"""A group's rewards in one call to verl's reward worker, when the group completes.

verl 0.9.1's agent loop scores every response on its own: ``AgentLoopWorker._compute_score`` builds a one-row
DataProto and sends it to a ``RewardLoopWorker`` with ``compute_score.remote`` (a Ray call, its pickling on both
sides), n calls per group. A trainable group needs all n scores anyway, so here the row verl builds is kept on the
response instead of being sent (``CaptureHandle`` stands in for the reward worker's handle in verl's own method: the
row is verl's, built by verl's code), and when the group completes its rows go to the reward worker together
through verl's batch seam, ``RewardLoopWorker.compute_score_batch``, which scores each row with the same
``compute_score`` as the single call: the same reward function on the same row, one Ray call per group instead of n.

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
NO_SCORE = {"reward_score": None, "reward_extra_info": {}}


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


async def score_group(outputs: list[Any], handles: list) -> None:
    """Scores the responses of one group whose rows were kept (``DEFERRED_ROW``), in one
    ``compute_score_batch`` call, and sets each response's ``reward_score`` and ``reward_extra_info`` as verl's
    ``_compute_score`` would have. Responses scored otherwise (an agent loop that set its own score) are left."""
    pending = [(o, o.extra_fields.pop(DEFERRED_ROW)) for o in outputs if DEFERRED_ROW in o.extra_fields]
    if not pending:
        return
    rows = [row for _, row in pending]
    handle = random.choice(handles)
    if same_prompt_width(rows):
        results = await handle.compute_score_batch.remote(pad_rows(rows))
    else:
        results = await asyncio.gather(*(handle.compute_score.remote(row) for row in rows))
    for (out, _), res in zip(pending, results):
        out.reward_score = res["reward_score"]
        out.extra_fields["reward_extra_info"] = res["reward_extra_info"]

