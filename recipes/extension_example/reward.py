"""A custom reward in verl's ``custom_reward_function`` signature: correctness plus a format credit.

Selected in recipes/tiny_cpu_extension_example.yaml with

    reward:
      custom_reward_function:
        path: pkg://verl_pipe.recipes.extension_example.reward   # or a file path
        name: compute_score

verl's reward loop calls it once per response, as the response finishes. For the embedded digit-math
set (integer ground truths):

- 1.0 if the final answer is right (the tiny default's checker, ``verl_pipe.assets.reward``);
- ``format_credit`` (0.25) if it is wrong but the response commits to a number at all;
- 0.0 otherwise.

Why: the tiny random-init model gets the final answer right about 3% of the time, so with the 0/1
reward almost every group has equal rewards and the zero-variance filter drops it. About a quarter of
its responses contain a number, which gives roughly 60% of the groups (n=4) reward variance -- enough
for a DAPO-style step to fill its batch from an oversampled pool.

It returns a dict: verl uses ``score`` as the reward and keeps every key per response
(``reward_extra_info``; here in the trained batch's ``non_tensor_batch``). verl passes extra keyword
arguments from ``reward.custom_reward_function.reward_kwargs``, e.g.
``+reward.custom_reward_function.reward_kwargs.format_credit=0.5``.
"""

from __future__ import annotations

import re

from verl_pipe.assets.reward import compute_score as exact_answer_score

FORMAT_CREDIT = 0.25
_INT = re.compile(r"-?\d+")


def has_number(solution_str) -> bool:
    return isinstance(solution_str, str) and _INT.search(solution_str) is not None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_credit=FORMAT_CREDIT,
                  **kwargs) -> dict:
    exact = exact_answer_score(data_source, solution_str, ground_truth, extra_info) == 1.0
    number = has_number(solution_str)
    score = 1.0 if exact else (float(format_credit) if number else 0.0)
    return {"score": score, "exact": exact, "has_number": number}
