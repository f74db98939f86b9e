"""A custom group-based advantage estimator, registered with verl and with verl_pipe (docs/extending.md).

``grpo_median``: each response's score minus its group's median score, on every response token (a baseline that
a single outlier in the group does not move). It depends only on the response's own group, so its advantages
are final when the group completes: it streams (``how="group"``) and CGP trains it at either granularity.

Seams: verl's ``core_algos.register_adv_est`` (verl's ``compute_advantage`` finds it by
``algorithm.adv_estimator``) and ``verl_pipe.estimators.register_streaming`` (the config check and the trainer
ask it how the estimator streams). ``trainer.py`` next to this file imports this module, so selecting
``rolloutpipe.trainer_class=...ExampleTrainer`` registers both in the launcher and in the trainer's process::

    python -m verl_pipe.main_grpo --config-name tiny_cpu_extension_example algorithm.adv_estimator=grpo_median
"""

from __future__ import annotations

import torch

from verl.trainer.ppo import core_algos

from verl_pipe.estimators import register_streaming

NAME = "grpo_median"


@register_streaming(NAME, how="group")
@core_algos.register_adv_est(NAME)
def compute_grpo_median_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                                  config=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both ``score - median(score of the group)`` on the response mask."""
    scores = token_level_rewards.sum(dim=-1)
    baseline = torch.empty_like(scores)
    with torch.no_grad():
        for uid in dict.fromkeys(index):  # groups, in first-seen order
            rows = torch.as_tensor([i for i, u in enumerate(index) if u == uid])
            baseline[rows] = scores[rows].median()
        adv = (scores - baseline).unsqueeze(-1) * response_mask
    return adv, adv
