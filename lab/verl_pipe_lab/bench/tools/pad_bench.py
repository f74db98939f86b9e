"""What one padding call of verl's agent-loop post-processing costs: verl's ``tokenizer.pad`` path against ours.

    python -m verl_pipe_lab.bench pad_bench [--tokenizer DIR]

verl's ``AgentLoopWorker._agent_loop_postprocess`` pads each response's prompt ids (left, to the prompt length),
response ids and response mask (right, to the response length) with ``_pad_token_ids``: three calls per response,
each through ``tokenizer.pad``. ``PipeAgentLoopWorker._pad_token_ids`` builds the same tensors with torch. This
loads the project's tokenizer (or ``--tokenizer DIR``), checks that both methods give the same tensors for each call, and prints the best
per-call time of each over 5 x 500 calls, for the three calls at the tiny default's lengths (prompt 64, response
32) and their mean.
"""

from __future__ import annotations

import argparse
import os
import timeit

import torch
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

from verl_pipe.assets import ensure_assets
from verl_pipe.rollout.agent_worker import PipeAgentLoopWorker

# (name, tokens, max_length, padding_side, return_attention_mask): the three calls of one response
CALLS = [("prompt ids", list(range(3, 38)), 64, "left", True),
         ("response ids", list(range(40, 64)), 32, "right", True),
         ("response mask", [1] * 24, 32, "right", False)]


def bare_worker(tokenizer) -> PipeAgentLoopWorker:
    """Our worker with only the tokenizer set (the padding methods read nothing else)."""
    w = object.__new__(PipeAgentLoopWorker)
    w.tokenizer = tokenizer
    return w


def time_call(fn, number: int = 500, repeat: int = 5) -> float:
    """Best per-call microseconds of ``fn()``."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench pad_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the tiny default's, built if needed)")
    args = ap.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(args.tokenizer or str(ensure_assets().tokenizer_dir))
    w = bare_worker(tok)
    print(f"load average {os.getloadavg()[0]:.1f}; tokenizer {type(tok).__name__} ({tok.name_or_path}); "
          "best of 5 x 500 calls", flush=True)
    totals = {"verl": 0.0, "ours": 0.0}
    for name, tokens, max_length, side, mask in CALLS:
        kw = dict(max_length=max_length, padding_side=side, return_attention_mask=mask)
        ours, theirs = w._pad_token_ids(tokens, **kw), AgentLoopWorker._pad_token_ids(w, tokens, **kw)
        same = set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
        t_verl = time_call(lambda: AgentLoopWorker._pad_token_ids(w, tokens, **kw))
        t_ours = time_call(lambda: w._pad_token_ids(tokens, **kw))
        totals["verl"] += t_verl
        totals["ours"] += t_ours
        print(f"{name:14s} verl tokenizer.pad {t_verl:7.1f} us  ours {t_ours:6.1f} us  same tensors: {same}", flush=True)
    n = len(CALLS)
    print(f"per call (mean of the {n}) verl {totals['verl'] / n:.1f} us  ours {totals['ours'] / n:.1f} us; "
          f"per response ({n} calls) verl {totals['verl']:.1f} us  ours {totals['ours']:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
