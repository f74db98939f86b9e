"""The chain task's reward: partial credit per correct step of the worked solution, plus the exact answer.

verl's ``custom_reward_function`` signature; the chain task's default (``verl_pipe.assets.TASKS``, chosen by
``verl_pipe.main_grpo`` when ``reward.custom_reward_function.path`` is unset; any other path replaces it). It returns
a dict, as verl's reward loop allows: ``score`` is the reward GRPO trains on, and the other keys are kept per
response (``reward_extra_info``). ``acc`` is the exact final answer (``verl_pipe.assets.reward``, the digit_math
checker), so verl's validation metric ``val-core/<data source>/acc/mean@1`` stays exact-answer accuracy.

    score = step_credit * (correct steps) / max(k, written steps) + (1 - step_credit) * (exact answer)

A step is one line ``<label><x><op><d>=<r>`` (``chain_data.solve``); the i-th written step is correct when its label,
operator and operand are the prompt's i-th operation (the chain is read from ``extra_info["question"]``), its input
``x`` is the start digit (first step) or the last digit of the result the response wrote on the line before, and
``r`` is ``x op d``. So a step is judged on the procedure, from the response's own previous result: a slip in one
step costs that step, not every step after it. Steps past the prompt's k count against the response (the
denominator), so writing more steps earns nothing. A right worked solution scores 1; the sloppy teacher's
(carrying the tens digit) earns its first step and the steps where both digits agree; text with no step and no
right answer scores 0.

Why: at the chain warm-start's low sampled accuracy most of a step's groups of 8 had no right answer, so their
0/1 rewards were all equal and GRPO had no signal (docs/learning.md, "The chain task"). Per-step credit gives a
group reward variance whenever its samples differ in how many steps they carry right.
"""

from __future__ import annotations

import re

from verl_pipe.assets.chain_data import LABELS, parse_question, solve
from verl_pipe.assets.math_data import OPERATIONS
from verl_pipe.assets.reward import _ground_truth_int, extract_answer

STEP_CREDIT = 0.5
_STEP = re.compile(r"^([a-zA-Z])(\d{1,3})([+*])(\d)=(\d{1,4})$")
_SETTING = "reward.custom_reward_function.reward_kwargs.step_credit"


def chain_of(extra_info) -> tuple[int, list[tuple[str, int]]]:
    """(start, operations) of the record's question; a record without a chain question is a data bug: it raises,
    naming the record."""
    question = extra_info.get("question") if isinstance(extra_info, dict) else None
    try:
        start, ops = parse_question(str(question))
        if not ops or len(ops) > len(LABELS) or any(op not in OPERATIONS for op, _ in ops):
            raise ValueError
    except (ValueError, IndexError):
        where = {k: extra_info.get(k) for k in ("split", "index")} if isinstance(extra_info, dict) else extra_info
        raise ValueError(f"chain reward: record {where} has no chain question in extra_info['question'] "
                         f"(got {question!r})") from None
    return start, ops


def correct_steps(solution_str, start: int, ops: list[tuple[str, int]]) -> tuple[int, int]:
    """(correct steps, written steps) of a response: its step lines before the last "Answer:"."""
    if not isinstance(solution_str, str):
        return 0, 0
    body = solution_str.rsplit("Answer:", 1)[0]
    right = written = 0
    prev = None  # the result the response wrote on its previous step line
    for line in body.splitlines():
        m = _STEP.match(line.strip())
        if m is None:
            continue
        label, x, op, d, r = m.group(1), int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5))
        i = written
        written += 1
        expected_x = start if prev is None else prev % 10
        if (i < len(ops) and label == LABELS[i] and (op, d) == ops[i] and x == expected_x
                and r == OPERATIONS[op](x, d)):
            right += 1
        prev = r
    return right, written


def compute_score(data_source, solution_str, ground_truth, extra_info=None, step_credit=STEP_CREDIT,
                  **kwargs) -> dict:
    credit = float(step_credit)
    if not 0.0 <= credit <= 1.0:
        raise ValueError(f"{_SETTING} must be in [0, 1], got {step_credit!r}")
    expected = _ground_truth_int(ground_truth)
    start, ops = chain_of(extra_info)
    truth = solve(start, ops)[1]
    if truth != expected:
        raise ValueError(f"chain reward: record {extra_info.get('split')}/{extra_info.get('index')} has ground truth "
                         f"{ground_truth!r}, but its chain {extra_info.get('question')!r} gives {truth}")
    exact = extract_answer(solution_str) == expected
    right, written = correct_steps(solution_str, start, ops)
    steps = right / max(len(ops), written)
    return {"score": credit * steps + (1.0 - credit) * float(exact), "acc": float(exact), "steps": steps}
