"""Turn a finished group into a trainable DataProto piece, with verl's own math.

Rewards were computed per response by verl's reward loop while the rollout ran
(``rm_scores``); here the group's prompt row is repeated n times and joined with
its responses exactly as ``RayPPOTrainer`` does for a whole batch, and the
advantage comes from verl's ``compute_advantage`` on this one group. Group-based
estimators (GRPO, RLOO, REINFORCE++-baseline, ...) normalize within a ``uid``, so
a group's advantages are the same whether computed alone or inside the batch.
"""

from __future__ import annotations

import numpy as np
import torch

from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage, compute_response_mask
from verl.trainer.ppo.reward import extract_reward


def advantages(piece: DataProto, config, n: int) -> DataProto:
    """verl's compute_advantage with the run's algorithm settings (on a group or a whole batch)."""
    algo = config.algorithm
    return compute_advantage(
        piece,
        adv_estimator=algo.adv_estimator,
        gamma=algo.gamma,
        lam=algo.lam,
        num_repeat=n,
        norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True),
        config=algo,
    )


def materialize_group(prompt_row: DataProto, gen_out: DataProto, config) -> DataProto:
    n = len(gen_out)
    # Per-sample agent-loop timings; verl's AgentLoopManager pops them before the union too.
    gen_out.meta_info.pop("metrics", None)
    piece = prompt_row.repeat(repeat_times=n, interleave=True).union(gen_out)
    if "response_mask" not in piece.batch.keys():
        piece.batch["response_mask"] = compute_response_mask(piece)
    reward_tensor, reward_extra = extract_reward(piece)
    piece.batch["token_level_scores"] = reward_tensor
    if reward_extra:
        piece.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra.items()})
    piece.batch["token_level_rewards"] = piece.batch["token_level_scores"]
    return advantages(piece, config, n)


def sequence_scores(piece: DataProto) -> torch.Tensor:
    return piece.batch["token_level_scores"].sum(dim=-1)


def is_trainable(piece: DataProto, filter_zero_variance: bool) -> bool:
    """DAPO dynamic sampling: a group whose rewards are all equal carries no signal."""
    if not filter_zero_variance:
        return True
    scores = sequence_scores(piece)
    return bool((scores.max() - scores.min()).abs() > 1e-8)


def weight_versions(piece: DataProto) -> set:
    """Weight versions the group's responses were generated with (vLLM server's global_steps)."""
    versions = piece.non_tensor_batch.get("min_global_steps")
    maxes = piece.non_tensor_batch.get("max_global_steps")
    out = set()
    for arr in (versions, maxes):
        if arr is not None:
            out.update(int(v) if v is not None else None for v in arr)
    return out
