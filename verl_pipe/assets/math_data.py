"""Synthetic arithmetic whose answer is one digit, in verl's RL parquet format (as gsm8k.py writes it).

One-digit answers make a random-init model that emits digits right about 10% of the time, so GRPO groups
have reward variance — a learning signal — from step one.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "verl_pipe/digit_math"
INSTRUCTION = "Put the final answer after 'Answer:'"


def _add_mod(rng: random.Random) -> tuple[str, str, int]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    ans = (a + b) % 10
    return f"What is {a} + {b} modulo 10?", f"{a} + {b} = {a + b}, and {a + b} modulo 10 is {ans}.", ans


def _mul_mod(rng: random.Random) -> tuple[str, str, int]:
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    ans = (a * b) % 10
    return f"What is {a} * {b} modulo 10?", f"{a} * {b} = {a * b}, and {a * b} modulo 10 is {ans}.", ans


def _sub(rng: random.Random) -> tuple[str, str, int]:
    a = rng.randint(0, 99)
    b = rng.randint(max(0, a - 9), a)
    return f"What is {a} - {b}?", f"{a} - {b} = {a - b}.", a - b


def _remainder(rng: random.Random) -> tuple[str, str, int]:
    a, d = rng.randint(10, 99), rng.randint(2, 9)
    ans = a % d
    return (
        f"What is the remainder when {a} is divided by {d}?",
        f"{a} = {d} * {a // d} + {ans}, so the remainder is {ans}.",
        ans,
    )


_KINDS = (_add_mod, _mul_mod, _sub, _remainder)


def _problems(n: int, seed: int) -> list[tuple[str, str, int]]:
    """n distinct problems; distinct so that train and val never share a question."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out = []
    for _ in range(50 * n + 1000):
        if len(out) == n:
            return out
        question, solution, ans = rng.choice(_KINDS)(rng)
        if question not in seen:
            seen.add(question)
            out.append((question, solution, ans))
    raise ValueError(f"cannot draw {n} distinct problems")


def _record(split: str, index: int, question: str, solution: str, ans: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(ans)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": f"{solution}\nAnswer: {ans}"},
    }


def sample_corpus(n: int, seed: int = 0) -> list[str]:
    """Prompt and solution text for tokenizer training."""
    return [f"{q} {INSTRUCTION}\n{s}\nAnswer: {a}" for q, s, a in _problems(n, seed + 1)]


def build_dataset(out_dir: Path, n_train: int = 1024, n_val: int = 64, seed: int = 0) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    problems = _problems(n_train + n_val, seed)
    paths = []
    for split, chunk in (("train", problems[:n_train]), ("test", problems[n_train:])):
        records = [_record(split, i, *p) for i, p in enumerate(chunk)]
        path = out_dir / ("train.parquet" if split == "train" else "val.parquet")
        # pyarrow, not pandas: pandas 3 would store large_string, unlike verl's own (datasets-written) files.
        pq.write_table(pa.Table.from_pylist(records), path)
        paths.append(path)
    return paths[0], paths[1]
