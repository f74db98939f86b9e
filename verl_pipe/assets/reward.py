"""Rule-based reward for digit_math, in verl's custom reward function signature.

Use with `reward.custom_reward_function.path=<this file> reward.custom_reward_function.name=compute_score`.
"""

from __future__ import annotations

import re

_INT = re.compile(r"-?\d+")
_MARKER = "Answer:"


def _ground_truth_int(ground_truth) -> int:
    text = str(ground_truth).strip() if ground_truth is not None else ""
    if not re.fullmatch(r"[-+]?\d+", text):
        # A bad record is a data bug, not a wrong answer: fail loudly so the caller counts or skips it.
        raise ValueError(f"record has no integer ground truth: {ground_truth!r}")
    return int(text)


def _to_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:  # Python refuses int() of over 4300 digits; such junk is simply wrong.
        return None


def extract_answer(solution_str) -> int | None:
    """The final answer: the first integer after the last "Answer:", else the last integer anywhere."""
    if not isinstance(solution_str, str):
        return None
    marker = solution_str.rfind(_MARKER)
    if marker >= 0:
        # The marker is the model's commitment: text before it (its working) must not count.
        found = _INT.search(solution_str, marker + len(_MARKER))
        return _to_int(found.group()) if found else None
    found = _INT.findall(solution_str)
    return _to_int(found[-1]) if found else None


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    expected = _ground_truth_int(ground_truth)
    return 1.0 if extract_answer(solution_str) == expected else 0.0
