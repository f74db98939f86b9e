"""A steering reward for checking that GRPO learns: 1 when the final answer equals a fixed ``target``, else 0.

Whatever the question, it asks the policy for one behaviour shared by every prompt, so a working RL loop moves the
policy toward it within a few steps. The learning e2e test used it, on the previous data, to fail fast when training
stops learning (a sign error in the advantages, rewards joined to the wrong responses, an optimizer that does not
step, weights that never reach the rollout); it is kept as an example of a custom reward (docs/learning.md, "What
GRPO does on it (measured)"). verl's custom reward signature; select it with
``reward.custom_reward_function.path=pkg://verl_pipe.assets.target_reward``.
"""

from __future__ import annotations

from verl_pipe.assets.reward import extract_answer


def compute_score(data_source, solution_str, ground_truth, extra_info=None, target: int = 7, **kwargs) -> float:
    return 1.0 if extract_answer(solution_str) == int(target) else 0.0
