"""Digit chains: a verifiable task whose response length the problem sets and the model decides, with a long tail.

"Chain 7, then a+3b*4c+9d*2e+5, carrying the last digit of each result.": a start digit and k operations (+ or ×,
one digit each), labelled a, b, c, ... (then A, B, ...), worked left to right, each step starting from the last digit
of the previous result. The worked solution writes one line per step, led by its label, then the answer, the full
result of the last step (0-81, so a guess is rarely right). The task's reward (``verl_pipe/assets/chain_reward.py``)
gives partial credit per correct step plus the exact answer, which ``verl_pipe/assets/reward.py`` checks as for
digit_math (the validation accuracy)::

    a7+3=10
    b0*4=0
    c0+9=9
    d9*2=18
    e8+5=13
    Answer: 13

The labels make the k-th operation of the prompt one exact lookup for a 2-layer model (the step's label is a single
token that occurs once in the prompt, right before its operation); without them the tiny model lost its place in
the chain (docs/learning.md). Nothing caps or forces the length: a response is as long as the model writes steps,
one per operation of its prompt, and k is drawn from a truncated power law (P(k) proportional to k^-``K_ALPHA`` on
[``K_MIN``, ``K_MAX``], a discrete Pareto), so most chains are short and a few are long; the response lengths of a
sampled batch inherit that tail. The lengths of one prompt's responses agree (the prompt sets them), so a group's
length is predictable from its prompt.

The SFT data comes from a sloppy teacher, as in ``math_data``: a ``SLOPPY`` share of its solutions carry the tens
digit instead of the last digit at every step ("a7+3=10" then "b1*4=4"), a systematic procedural error that GRPO's
verifiable reward then corrects. Train, validation and SFT questions are disjoint; the train pool is small (256
prompts) so that prompts repeat within a run. docs/learning.md has the measurements behind the shape.
"""

from __future__ import annotations

import random
from pathlib import Path


from verl_pipe.assets.math_data import DATA_SOURCE, INSTRUCTION, OPERATIONS, worked_answer, write_splits

# The chain length k: P(k) proportional to k ** -K_ALPHA for K_MIN <= k <= K_MAX. Questions are distinct, and only
# 9 x 19 one-step chains exist, so k = 1 gets at most those 171 (tests/test_chain_data.py). The splits'
# lengths: docs/learning.md, "The chain task".
K_ALPHA = 1.5
K_MIN = 1
K_MAX = 36
# The steps' labels, one token each: a-z, then A-Z.
LABELS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# The share of the SFT teacher's worked solutions that carry the tens digit instead of the last one. At 0.75 the
# warm-started model takes the sloppy carry often enough that the carry, the one decision GRPO learns fast, decides
# many answers: held-out accuracy then rises in a 40-step run by far more than at 0.6, where the model's remaining
# errors were mostly arithmetic in long chains (docs/learning.md, "The chain task").
SLOPPY = 0.75
# The split sizes of the default build: a small train pool (prompts repeat within a 40-step run), a validation set
# the learning benchmark can use (512), and the teacher's solutions of other questions.
N_TRAIN = 256
N_VAL = 512
N_SFT = 2048


def k_weights() -> dict[int, float]:
    """The chain length's distribution: {k: P(k)}."""
    w = {k: k ** -K_ALPHA for k in range(K_MIN, K_MAX + 1)}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def draw_k(rng: random.Random) -> int:
    """One chain length from ``k_weights``."""
    w = k_weights()
    return rng.choices(list(w), weights=list(w.values()))[0]


def _operand(rng: random.Random, op: str) -> int:
    # No "*0": it would zero the rest of the chain.
    return rng.randint(0, 9) if op == "+" else rng.randint(1, 9)


def solve(start: int, ops: list[tuple[str, int]], sloppy: bool = False) -> tuple[list[str], int]:
    """The worked steps ("bx+d=r": label, then the step, one per operation) and the answer (the last step's full
    result). ``sloppy``: each step starts from the tens digit of the previous result instead of its last digit (the
    teacher's error)."""
    steps, x, result = [], start, start
    for i, (op, d) in enumerate(ops):
        if i:
            x = result // 10 if sloppy else result % 10
        result = OPERATIONS[op](x, d)
        steps.append(f"{LABELS[i]}{x}{op}{d}={result}")
    return steps, result


def question(start: int, ops: list[tuple[str, int]]) -> str:
    labelled = "".join(f"{LABELS[i]}{op}{d}" for i, (op, d) in enumerate(ops))
    return f"Chain {start}, then {labelled}, carrying the last digit of each result."


def parse_question(text: str) -> tuple[int, list[tuple[str, int]]]:
    """(start, operations) of a ``question`` (the prompt may carry the instruction after it)."""
    start, rest = text.split("Chain ", 1)[1].split(", then ", 1)
    chain = rest.split(",", 1)[0]
    return int(start), [(chain[i + 1], int(chain[i + 2])) for i in range(0, len(chain), 3)]


def _problem(rng: random.Random) -> tuple[int, list[tuple[str, int]]]:
    k = draw_k(rng)
    ops = []
    for _ in range(k):
        op = rng.choice(sorted(OPERATIONS))
        ops.append((op, _operand(rng, op)))
    return rng.randint(1, 9), ops


def _problems(n: int, seed: int) -> list[tuple[int, list[tuple[str, int]]]]:
    """n problems with distinct questions, so that the splits never share one."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out = []
    for _ in range(50 * n + 1000):
        if len(out) == n:
            return out
        problem = _problem(rng)
        q = question(*problem)
        if q not in seen:
            seen.add(q)
            out.append(problem)
    raise ValueError(f"cannot draw {n} distinct chains")


def _record(split: str, index: int, start: int, ops: list[tuple[str, int]]) -> dict:
    steps, ans = solve(start, ops)
    q = question(start, ops)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(ans)},
        "extra_info": {"split": split, "index": index, "question": q, "answer": worked_answer("\n".join(steps), ans),
                       "k": len(ops)},
    }


def sample_corpus(n: int, seed: int = 0) -> list[str]:
    """Prompt and solution text for tokenizer training."""
    out = []
    for start, ops in _problems(n, seed + 1):
        steps, ans = solve(start, ops)
        out.append(f"{question(start, ops)} {INSTRUCTION}\n{worked_answer(chr(10).join(steps), ans)}")
    return out


def build_dataset(out_dir: Path, n_train: int = N_TRAIN, n_val: int = N_VAL, n_sft: int = N_SFT,
                  sloppy: float = SLOPPY, seed: int = 0) -> tuple[Path, Path, Path]:
    """train.parquet (RL prompts), val.parquet (held-out prompts) and sft.parquet (the teacher's worked solutions of
    other questions, a ``sloppy`` share of them carrying the tens digit); returns their paths in that order."""
    if not 0.0 <= sloppy <= 1.0:
        raise ValueError(f"sloppy: the share of SFT solutions with the sloppy carry must be in [0, 1], got {sloppy}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    problems = _problems(n_train + n_val + n_sft, seed)
    train, val, sft = problems[:n_train], problems[n_train:n_train + n_val], problems[n_train + n_val:]
    teacher = random.Random(seed + 2)
    rows = []
    for start, ops in sft:
        steps, ans = solve(start, ops, sloppy=teacher.random() < sloppy)
        rows.append({"messages": [{"role": "user", "content": f"{question(start, ops)} {INSTRUCTION}"},
                                  {"role": "assistant", "content": worked_answer("\n".join(steps), ans)}]})
    return write_splits(out_dir, [_record("train", i, *p) for i, p in enumerate(train)],
                        [_record("test", i, *p) for i, p in enumerate(val)], rows)
