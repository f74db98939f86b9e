"""Length-matched SFT batches: each batch holds samples of about the same length, the batches in a random order.

verl's SFT trainer pads a batch to its longest sample (``use_remove_padding=false`` on CPU: no flash-attn varlen
kernels). With a long-tailed task (verl_pipe/assets/chain_data.py) nearly every random batch of 32 holds one long
chain, so most of the compute is padding. Sorting each epoch's samples by length (ties broken at random, so the
batches differ per epoch), cutting them into batches and shuffling the batches' order trains on the same samples with
the same batch size and about a third of the padded tokens (docs/learning.md). The order of the samples *within* the
optimizer's view is what changes: one batch is all short or all long chains.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence


class LengthBatchSampler:
    """Sample indices for a ``DataLoader(batch_size=batch_size, drop_last=True)``: every run of ``batch_size``
    consecutive indices is one length-matched batch. ``lengths``: a length proxy per sample (any monotone measure of
    its token count). ``set_epoch`` reshuffles, as ``DistributedSampler``'s does; one process (no data parallel)."""

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(lengths) < batch_size:
            raise ValueError(f"{len(lengths)} samples cannot fill one batch of {batch_size}")
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths) // self.batch_size * self.batch_size

    def batches(self) -> list[list[int]]:
        rng = random.Random(f"{self.seed}-{self.epoch}")
        # A random subset when the samples do not fill the last batch, so no sample is always the one left out.
        kept = rng.sample(range(len(self.lengths)), len(self))
        kept.sort(key=lambda i: (self.lengths[i], rng.random()))
        out = [kept[i:i + self.batch_size] for i in range(0, len(kept), self.batch_size)]
        rng.shuffle(out)
        return out

    def __iter__(self) -> Iterator[int]:
        for batch in self.batches():
            yield from batch


def message_lengths(messages: Sequence[Sequence[dict]]) -> list[int]:
    """A length proxy per SFT sample: the characters of its messages' contents (verl's ``messages`` column)."""
    return [sum(len(m["content"]) for m in sample) for sample in messages]
