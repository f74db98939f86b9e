"""Synthetic digit arithmetic in verl's RL parquet format (as gsm8k.py writes it), plus the worked solutions a
supervised warm-start trains on (verl's multi-turn SFT format: a ``messages`` column).

"What is (7 * 3) % 10 + 4?": digits a, b, c and operations + or ×; the answer is an integer 0-81, so a guess is
rarely right and the reward measures the skill. The worked solution takes three steps a 2-layer model can learn
("7 * 3 = 21. 1 + 4 = 5." then "Answer: 5"): a one-digit table lookup, the last digit, a second lookup. Train, SFT
and validation questions are disjoint.

The SFT data comes from a sloppy teacher: a ``SLOPPY`` share of its worked solutions read "% 10" as "// 10" and carry
on with the tens digit ("7 * 3 = 21. 2 + 4 = 6."), a systematic error of the kind distilled data carries. Both
procedures use the same lookup tables, so the warm-started model learns the tables from all of its data and is left
split between the two procedures; the verifiable reward knows the right one, which is what GRPO then learns
(docs/learning.md has the measurements behind the share).
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "verl_pipe/digit_math"
INSTRUCTION = "Put the final answer after 'Answer:'"
OPERATIONS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}
# The share of the SFT teacher's worked solutions that take the tens digit instead of the last one (docs/learning.md).
SLOPPY = 0.6


def _problem(rng: random.Random) -> tuple[str, str, int, str, int]:
    """(question, worked solution, answer, the sloppy teacher's solution, its answer)."""
    a, b, c = rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 9)
    op1, op2 = rng.choice(sorted(OPERATIONS)), rng.choice(sorted(OPERATIONS))
    first = OPERATIONS[op1](a, b)
    ans = OPERATIONS[op2](first % 10, c)
    question = f"What is ({a} {op1} {b}) % 10 {op2} {c}?"
    solution = f"{a} {op1} {b} = {first}. {first % 10} {op2} {c} = {ans}."
    sloppy = OPERATIONS[op2](first // 10, c)  # "% 10" read as "// 10"
    return question, solution, ans, f"{a} {op1} {b} = {first}. {first // 10} {op2} {c} = {sloppy}.", sloppy


def _problems(n: int, seed: int) -> list[tuple]:
    """n distinct problems (``_problem``'s tuples); distinct so that the splits never share a question."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out = []
    for _ in range(50 * n + 1000):
        if len(out) == n:
            return out
        problem = _problem(rng)
        if problem[0] not in seen:
            seen.add(problem[0])
            out.append(problem)
    raise ValueError(f"cannot draw {n} distinct problems")


def worked_answer(solution: str, ans: int) -> str:
    """The assistant's turn in the SFT data: the worked solution, then the answer the reward checks."""
    return f"{solution}\nAnswer: {ans}"


def _record(split: str, index: int, question: str, solution: str, ans: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(ans)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": worked_answer(solution, ans)},
    }


def _sft_record(question: str, solution: str, ans: int) -> dict:
    return {"messages": [{"role": "user", "content": f"{question} {INSTRUCTION}"},
                         {"role": "assistant", "content": worked_answer(solution, ans)}]}


def sample_corpus(n: int, seed: int = 0) -> list[str]:
    """Prompt and solution text for tokenizer training."""
    return [f"{p[0]} {INSTRUCTION}\n{worked_answer(p[1], p[2])}" for p in _problems(n, seed + 1)]


def build_dataset(out_dir: Path, n_train: int = 1024, n_val: int = 128, n_sft: int = 512, sloppy: float = SLOPPY,
                  seed: int = 0) -> tuple[Path, Path, Path]:
    """train.parquet (RL prompts), val.parquet (held-out prompts) and sft.parquet (the teacher's worked solutions of
    other questions, a ``sloppy`` share of them with the tens digit for the last); returns their paths in that order."""
    if not 0.0 <= sloppy <= 1.0:
        raise ValueError(f"sloppy: the share of SFT solutions with the sloppy step must be in [0, 1], got {sloppy}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    problems = _problems(n_train + n_val + n_sft, seed)
    train, val, sft = problems[:n_train], problems[n_train:n_train + n_val], problems[n_train + n_val:]
    teacher = random.Random(seed + 2)
    rows = []
    for question, solution, ans, sloppy_solution, sloppy_ans in sft:
        if teacher.random() < sloppy:
            solution, ans = sloppy_solution, sloppy_ans
        rows.append(_sft_record(question, solution, ans))
    return write_splits(out_dir, [_record("train", i, *p[:3]) for i, p in enumerate(train)],
                        [_record("test", i, *p[:3]) for i, p in enumerate(val)], rows)


def write_splits(out_dir: Path, train: list[dict], val: list[dict], sft: list[dict]) -> tuple[Path, Path, Path]:
    """A task's train.parquet, val.parquet and sft.parquet under ``out_dir`` from their records; their paths.
    pyarrow, not pandas: pandas 3 would store large_string, unlike verl's own (datasets-written) files."""
    paths = []
    for name, rows in (("train", train), ("val", val), ("sft", sft)):
        path = Path(out_dir) / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(path)
    return tuple(paths)
