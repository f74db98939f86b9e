"""Length-matched SFT batches (verl_pipe/assets/length_batches.py): every sample once per epoch, each batch of about
one length, the batches' order and composition varying with the epoch, and the padding they save."""

import random

import pytest

from verl_pipe.assets.length_batches import LengthBatchSampler, message_lengths


def _lengths(n=256, seed=0):
    rng = random.Random(seed)
    return [int(20 + 400 * rng.random() ** 4) for _ in range(n)]  # mostly short, a few long


def _chunks(sampler):
    order = list(sampler)
    return [order[i:i + sampler.batch_size] for i in range(0, len(order), sampler.batch_size)]


def test_each_epoch_is_a_permutation_in_length_matched_batches():
    lengths = _lengths()
    s = LengthBatchSampler(lengths, 32, seed=1)
    batches = _chunks(s)
    assert sorted(i for b in batches for i in b) == list(range(256)) and len(s) == 256
    # The batches, sorted by their shortest sample, do not overlap in length.
    spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
    assert all(hi <= nxt_lo for (_, hi), (nxt_lo, _) in zip(spans, spans[1:]))
    # Padded tokens (each batch padded to its longest): far fewer than a random split's.
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    rng = random.Random(0)
    shuffled = rng.sample(range(256), 256)
    random_padded = sum(32 * max(lengths[i] for i in shuffled[j:j + 32]) for j in range(0, 256, 32))
    assert padded < 0.6 * random_padded


def test_batch_order_is_shuffled_and_varies_per_epoch():
    lengths = list(range(320))  # distinct lengths: the batches are fixed, only their order can vary
    s = LengthBatchSampler(lengths, 32, seed=0)
    first = _chunks(s)
    assert [min(b) for b in first] != sorted(min(b) for b in first)  # not short-to-long
    assert list(s) == [i for b in first for i in b]  # an epoch is reproducible
    s.set_epoch(1)
    assert _chunks(s) != first
    # Ties are broken at random per epoch, so equal-length samples do not always share a batch.
    ties = LengthBatchSampler([5] * 64, 32, seed=0)
    a = {frozenset(b) for b in _chunks(ties)}
    ties.set_epoch(1)
    assert {frozenset(b) for b in _chunks(ties)} != a


def test_a_partial_last_batch_drops_a_random_subset():
    s = LengthBatchSampler(list(range(70)), 32, seed=0)
    dropped = set()
    for epoch in range(6):
        s.set_epoch(epoch)
        order = list(s)
        assert len(order) == len(s) == 64 and len(set(order)) == 64
        dropped |= set(range(70)) - set(order)
    assert len(dropped) > 6  # not always the same (longest) samples


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="batch_size"):
        LengthBatchSampler([1, 2], 0)
    with pytest.raises(ValueError, match="cannot fill one batch of 32"):
        LengthBatchSampler([1] * 31, 32)


def test_message_lengths_counts_every_messages_characters():
    assert message_lengths([[{"role": "user", "content": "abc"}, {"role": "assistant", "content": "de"}],
                            [{"role": "user", "content": ""}]]) == [5, 0]
