"""Response lengths and accuracy of a model on the tiny tasks, sampled with the real vLLM engine on CPU.

``python tools/eval_lengths.py --model DIR --data val.parquet [--n 8] [--temperature 1.0] [--out lengths.json]
[--hist lengths.png]``: vLLM (the CPU build, fp32, as the rollout runs it) generates ``--n`` responses per prompt at
the rollout's temperature (verl's default 1.0, top-p 1, no top-k) and one greedy response per prompt (verl's
validation), with ``--max-tokens`` (the run's ``data.max_response_length``). It prints one JSON object:

- ``sampled.lengths``: response length in tokens (EOS included, as verl counts it): percentiles, max, p95/median, the
  share cut at ``--max-tokens``, and ``icc_log_length``: the intraclass correlation ICC(1) of log length over the groups
  of ``--n`` responses of one prompt (between-prompt share of the variance: 1 when a prompt fixes its length);
- ``sampled.acc`` / ``greedy.acc``: the reward's accuracy (verl_pipe/assets/reward.py), and for the chain task
  (verl_pipe/assets/chain_data.py) ``carries``: the share of steps that start from the last digit of the previous
  result (right), from its tens digit (the sloppy teacher's) or from neither, ``steps_match``: the share of responses
  with one step per operation, accuracy per chain length, ``partial_reward``: the mean of the task's partial-credit
  reward (verl_pipe/assets/chain_reward.py), and ``groups_with_reward_variance``: the share of prompts whose ``--n``
  responses do not all score the same, under the exact answer and under the partial credit (GRPO learns only from
  those);
- with ``--hist``, a histogram of the sampled lengths (log-scaled counts) with the median, p95 and max marked.

``--engine hf`` samples with Hugging Face ``generate`` on one CPU thread instead (same temperature, top-p 1, no
top-k, EOS counted the same way): no vLLM start, so it needs no machine-wide lock, but it is not the rollout's engine;
figures from it are labelled ``"engine": "hf"`` in the JSON.

docs/learning.md quotes its output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import time
from collections import defaultdict

STEP = re.compile(r"^[a-zA-Z](\d+)([+*])(\d)=(\d+)$")


def icc1(groups: list[list[float]]) -> float:
    """One-way random-effects ICC(1) of equal-size groups: (MSB - MSW) / (MSB + (n - 1) MSW)."""
    groups = [g for g in groups if len(g) > 1]
    if len(groups) < 2:
        return float("nan")
    n = len(groups[0])
    if any(len(g) != n for g in groups):
        raise ValueError("ICC(1) here needs groups of one size")
    means = [statistics.fmean(g) for g in groups]
    msb = n * statistics.variance(means)
    msw = statistics.fmean(statistics.variance(g) for g in groups)
    denom = msb + (n - 1) * msw
    return (msb - msw) / denom if denom > 0 else float("nan")


def percentiles(values: list[int]) -> dict:
    import numpy as np

    a = np.asarray(values, dtype=float)
    q = {f"p{p}": float(np.percentile(a, p)) for p in (5, 25, 50, 75, 90, 95, 99)}
    return {**q, "mean": float(a.mean()), "max": int(a.max()), "min": int(a.min()),
            "p95_over_median": q["p95"] / q["p50"], "n": len(values)}


def carries(text: str) -> tuple[int, int, int, int]:
    """(steps, carries from the last digit, from the tens digit, from neither) of a chain solution."""
    lines = [ln.strip() for ln in text.split("Answer:")[0].strip().splitlines() if ln.strip()]
    steps = [STEP.match(ln) for ln in lines]
    last = tens = other = 0
    prev = None
    for m in steps:
        if m is None:
            other += 1
            prev = None
            continue
        x, r = int(m.group(1)), int(m.group(4))
        if prev is not None:
            if x == prev % 10:
                last += 1
            elif x == prev // 10:
                tens += 1
            else:
                other += 1
        prev = r
    return len(lines), last, tens, other


def summarize(rows: list[dict], outputs: list, n: int, max_tokens: int) -> dict:
    from verl_pipe.assets.reward import compute_score

    from verl_pipe.assets.chain_reward import compute_score as chain_score

    lengths, groups, correct, by_k = [], [], [], defaultdict(list)
    steps_match, counts, partial, spread = [], [0, 0, 0], [], {"exact": [], "partial": []}
    for row, out in zip(rows, outputs):
        truth = row["reward_model"]["ground_truth"]
        k = row["extra_info"].get("k")
        group, exact_scores, partial_scores = [], [], []
        for c in out.outputs:
            lengths.append(len(c.token_ids))
            group.append(math.log(max(1, len(c.token_ids))))
            ok = compute_score(row["data_source"], c.text, truth) == 1.0
            correct.append(ok)
            exact_scores.append(ok)
            if k is not None:
                by_k[k].append(ok)
                n_steps, last, tens, other = carries(c.text)
                steps_match.append(n_steps == k)
                counts = [counts[0] + last, counts[1] + tens, counts[2] + other]
                partial_scores.append(chain_score(row["data_source"], c.text, truth, row["extra_info"])["score"])
        groups.append(group)
        partial += partial_scores
        # A group whose rewards are all equal gives GRPO no signal (its advantages are all zero).
        spread["exact"].append(len(set(exact_scores)) > 1)
        spread["partial"].append(len(set(partial_scores)) > 1)
    result = {"acc": sum(correct) / len(correct), "lengths": percentiles(lengths),
              "cut_at_max_tokens": sum(x >= max_tokens for x in lengths) / len(lengths)}
    if n > 1:
        result["icc_log_length"] = icc1(groups)
    if by_k:
        total = max(1, sum(counts))
        result["carries"] = {"last_digit": counts[0] / total, "tens_digit": counts[1] / total,
                             "other": counts[2] / total}
        result["steps_match"] = sum(steps_match) / len(steps_match)
        # The chain task's partial-credit reward (verl_pipe/assets/chain_reward.py), and the share of the prompts'
        # groups of n whose rewards differ, under the exact-answer reward and under the partial credit.
        result["partial_reward"] = statistics.fmean(partial)
        if n > 1:
            result["groups_with_reward_variance"] = {name: statistics.fmean(v) for name, v in spread.items()}
        buckets = ((1, 1), (2, 3), (4, 6), (7, 12), (13, 24), (25, 40))
        result["acc_by_k"] = {f"{lo}-{hi}": round(statistics.fmean(v for k, oks in by_k.items() if lo <= k <= hi
                                                                   for v in oks), 3)
                              for lo, hi in buckets if any(lo <= k <= hi for k in by_k)}
    return result, lengths


def histogram(lengths: list[int], stats: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.hist(lengths, bins=range(0, max(lengths) + 8, 6), color="#4c72b0")
    ax.set_yscale("log")
    for key, label, style in (("p50", "median", "-"), ("p95", "p95", "--"), ("max", "max", ":")):
        ax.axvline(stats[key], color="k", linestyle=style, linewidth=1)
        ax.text(stats[key], ax.get_ylim()[1] * 0.6, f" {label} {stats[key]:.0f}", fontsize=8)
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("responses (log scale)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model directory (with its tokenizer)")
    ap.add_argument("--data", required=True, help="RL parquet (verl's format) whose prompts are sampled")
    ap.add_argument("--n", type=int, default=8, help="sampled responses per prompt")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=320, help="the run's data.max_response_length")
    ap.add_argument("--max-model-len", type=int, default=448)
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="the engine's seed (vLLM-CPU takes no per-request seed)")
    ap.add_argument("--cores", default="0-1", help="cores vLLM's threads bind to")
    ap.add_argument("--no-greedy", action="store_true")
    ap.add_argument("--out", help="write the JSON (with every sampled length) here")
    ap.add_argument("--hist", help="write a histogram PNG of the sampled lengths here")
    ap.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    args = ap.parse_args()
    if args.engine == "hf":
        return main_hf(args)

    from verl_pipe.platform.env import cpu_env

    os.environ.update(cpu_env(args.cores, args.cores))
    import pyarrow.parquet as pq
    from vllm import LLM, SamplingParams

    rows = pq.read_table(args.data).to_pylist()
    if args.limit:
        rows = rows[:args.limit]
    llm = LLM(model=args.model, dtype="float32", enforce_eager=True, max_model_len=args.max_model_len,
              max_num_seqs=64, max_num_batched_tokens=2048, seed=args.seed)
    tok = llm.get_tokenizer()
    prompts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    report = {"model": args.model, "data": args.data, "prompts": len(rows), "n": args.n,
              "temperature": args.temperature, "max_tokens": args.max_tokens}
    t0 = time.perf_counter()
    sampled = llm.generate(prompts, SamplingParams(n=args.n, temperature=args.temperature, top_p=1.0, top_k=-1,
                                                   max_tokens=args.max_tokens))
    report["sampled_s"] = round(time.perf_counter() - t0, 1)
    report["sampled"], lengths = summarize(rows, sampled, args.n, args.max_tokens)
    if not args.no_greedy:
        t0 = time.perf_counter()
        greedy = llm.generate(prompts, SamplingParams(n=1, temperature=0.0, max_tokens=args.max_tokens))
        report["greedy_s"] = round(time.perf_counter() - t0, 1)
        report["greedy"], _ = summarize(rows, greedy, 1, args.max_tokens)
    _write({"engine": "vllm", **report}, lengths, args)


def _hf_generate(model, tok, prompts: list[str], n: int, temperature: float, max_tokens: int, batch: int = 128):
    """vLLM-shaped outputs (``.outputs[i].token_ids`` up to and including EOS, ``.text``) from HF ``generate``."""
    from types import SimpleNamespace

    import torch

    eos = tok.eos_token_id
    out = []
    for start in range(0, len(prompts), max(1, batch // n)):
        chunk = prompts[start:start + max(1, batch // n)]
        enc = tok([p for p in chunk for _ in range(n)], return_tensors="pt", padding=True, add_special_tokens=False)
        kw = dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0) if temperature > 0 else \
            dict(do_sample=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_tokens, pad_token_id=tok.pad_token_id, eos_token_id=eos,
                                 **kw)[:, enc["input_ids"].shape[1]:].tolist()
        for i in range(len(chunk)):
            completions = []
            for ids in gen[i * n:(i + 1) * n]:
                ids = ids[:ids.index(eos) + 1] if eos in ids else ids
                completions.append(SimpleNamespace(token_ids=ids, text=tok.decode(ids, skip_special_tokens=True)))
            out.append(SimpleNamespace(outputs=completions))
    return out


def main_hf(args) -> None:
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rows = pq.read_table(args.data).to_pylist()
    if args.limit:
        rows = rows[:args.limit]
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts = [tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    report = {"engine": "hf", "model": args.model, "data": args.data, "prompts": len(rows), "n": args.n,
              "temperature": args.temperature, "max_tokens": args.max_tokens}
    t0 = time.perf_counter()
    sampled = _hf_generate(model, tok, prompts, args.n, args.temperature, args.max_tokens)
    report["sampled_s"] = round(time.perf_counter() - t0, 1)
    report["sampled"], lengths = summarize(rows, sampled, args.n, args.max_tokens)
    if not args.no_greedy:
        t0 = time.perf_counter()
        greedy = _hf_generate(model, tok, prompts, 1, 0.0, args.max_tokens)
        report["greedy_s"] = round(time.perf_counter() - t0, 1)
        report["greedy"], _ = summarize(rows, greedy, 1, args.max_tokens)
    _write(report, lengths, args)


def _write(report: dict, lengths: list[int], args) -> None:
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**report, "sampled_lengths": lengths}, f, indent=1)
    if args.hist:
        s = report["sampled"]["lengths"]
        histogram(lengths, s, args.hist, f"{report['prompts']} prompts x n={args.n}, T={args.temperature} "
                  f"({report.get('engine', 'vllm')}): median {s['p50']:.0f}, p95 {s['p95']:.0f} "
                  f"({s['p95_over_median']:.1f}x), max {s['max']}, ICC(log len) "
                  f"{report['sampled'].get('icc_log_length', float('nan')):.2f}")


if __name__ == "__main__":
    main()
