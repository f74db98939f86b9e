"""What a model does on the digit-math validation questions: accuracy, and which procedure it follows.

``python -m verl_pipe_lab.bench eval_warm_start [--model DIR] [--samples K]`` (default: the default config's
warm-start, built and cached like ``make setup`` does). Hugging Face ``generate`` on the 128 held-out questions,
greedy and K samples at temperature 1 (verl's rollout temperature), and one JSON line:

- ``acc``: the reward's accuracy (the first integer after the last ``Answer:``), as verl's ``val-core`` reports it;
- ``last_digit`` / ``tens_digit``: the share of answers whose second step starts from the last digit of the first
  result (the right procedure) or from its tens digit (the sloppy teacher's, ``verl_pipe/assets/math_data.py``);
  the rest copied neither;
- ``acc_given_last_digit``: accuracy when the right procedure was taken, i.e. how well the lookup tables were learned
  (what GRPO can reach by choosing the right procedure everywhere).

docs/learning.md quotes its output for the warm-starts it compares.
"""

from __future__ import annotations

import argparse
import json
import re

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_pipe.assets.math_data import OPERATIONS
from verl_pipe.assets.reward import compute_score

QUESTION = re.compile(r"What is \((\d) ([+*]) (\d)\) % 10 ([+*]) (\d)\?")
SECOND_STEP = re.compile(r"= (\d+)\. (\d+) ")


def procedure(question: str, text: str) -> str:
    """``last_digit``, ``tens_digit`` or ``other``: which digit of a op1 b the answer's second step starts from (below
    10 the tens digit is 0; where both digits are equal, as in 11, it counts as the last digit)."""
    a, op1, b, _, _ = QUESTION.match(question).groups()
    first = OPERATIONS[op1](int(a), int(b))
    step = SECOND_STEP.search(text)
    if not step:
        return "other"
    digit = step.group(2)
    if digit == str(first % 10):
        return "last_digit"
    return "tens_digit" if digit == str(first // 10) else "other"


def summary(rows: list[dict], texts: list[str]) -> dict:
    outcome = [(compute_score(r["data_source"], t, r["reward_model"]["ground_truth"]) == 1.0,
                procedure(r["extra_info"]["question"], t)) for r, t in zip(rows, texts)]
    right_way = [ok for ok, how in outcome if how == "last_digit"]
    share = lambda how: round(sum(h == how for _, h in outcome) / len(outcome), 3)  # noqa: E731
    return {"acc": round(sum(ok for ok, _ in outcome) / len(outcome), 3), "last_digit": share("last_digit"),
            "tens_digit": share("tens_digit"),
            "acc_given_last_digit": round(sum(right_way) / max(1, len(right_way)), 3), "n": len(outcome)}


def generate(model, tok, prompts: list[str], do_sample: bool) -> list[str]:
    enc = tok(prompts, return_tensors="pt", padding=True)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0) if do_sample else dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=32, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                             **kwargs)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def _default_paths() -> tuple[str, str]:
    """The default config's warm-start (its directory carries its tokenizer) and validation file."""
    from verl_pipe.launch.prepare import prepare_config
    from verl_pipe.launch.session import compose

    config = prepare_config(compose([]))
    return config.actor_rollout_ref.model.path, config.data.val_files


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench eval_warm_start", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: the default config's warm-start)")
    ap.add_argument("--val", help="validation parquet (default: the default config's)")
    ap.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
    ap.add_argument("--samples", type=int, default=4, help="sampled answers per question")
    args = ap.parse_args(argv)
    model_dir, val, tok_dir = (args.model, args.val, args.tokenizer)
    if not (model_dir and val):
        default_model, default_val = _default_paths()
        model_dir, val = model_dir or default_model, val or default_val
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tok_dir or model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = pq.read_table(val).to_pylist()
    prompts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    sampled = [t for _ in range(args.samples) for t in generate(model, tok, prompts, True)]
    print(json.dumps({"model": str(model_dir), "greedy": summary(rows, generate(model, tok, prompts, False)),
                      "sampled": summary(rows * args.samples, sampled)}))


if __name__ == "__main__":
    main()
