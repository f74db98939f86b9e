"""The row order of a PPO update, and what its micro-batches cost in padding. Pure Python.

verl's FSDP engine without remove-padding (``use_remove_padding=false``: our CPU default, and any model or attention
kernel without varlen support) pads every micro-batch to its own longest sequence (verl 0.9.1,
``workers/engine/fsdp/transformer_impl.py``: ``max_seq_len = seq_len_effective.max()`` of the micro-batch), and
the micro-batches are consecutive runs of ``ppo_micro_batch_size_per_gpu`` rows of each DP rank's contiguous share.
So the rows' order decides what a fixed-size update costs:

- ``arrival``: the rows as the trainer got them, group after group. A micro-batch of n rows is one group and pays
  for that group's longest response; a long-tailed group pads every one of its rows to its tail.
- ``length`` (the default): each DP rank's share sorted by sequence length (longest first, ties in arrival order),
  so a micro-batch holds rows of similar length. This is what verl's V1 trainer gets without asking: its rows come
  out of TransferQueue in completion order, which on a long-tailed rollout is close to length order
  (docs/trainer_gap.md measures both).

A PPO mini-batch's loss is normalized by totals of the whole mini-batch (verl's ``global_token_num`` /
``global_batch_size``), so the order of its rows changes only the float summation order of the gradient; sync and
CGP sort the same unit's rows the same way, so they stay bit-identical to each other.
"""

from __future__ import annotations

from collections.abc import Sequence

ORDERS = ("length", "arrival")


def length_order(lengths: Sequence[int], shares: int = 1) -> list[int]:
    """The row permutation that sorts each of ``shares`` equal contiguous shares (the DP ranks') by length, longest
    first, ties in their given order. ``len(lengths)`` must split into ``shares`` equal parts (verl's dispatch
    chunks the batch that way)."""
    if shares < 1 or len(lengths) % shares:
        raise ValueError(f"{len(lengths)} rows do not split into {shares} equal DP shares")
    size = len(lengths) // shares
    order: list[int] = []
    for start in range(0, len(lengths), size):
        order.extend(sorted(range(start, start + size), key=lambda i: -lengths[i]))
    return order


def padded_tokens(lengths: Sequence[int], micro_batch_size: int) -> int:
    """Tokens the engine computes over when it pads each run of ``micro_batch_size`` rows to its longest."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size={micro_batch_size}: expected >= 1")
    return sum(len(mb) * max(mb) for mb in (lengths[i:i + micro_batch_size]
                                            for i in range(0, len(lengths), micro_batch_size)))
