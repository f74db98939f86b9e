"""The update's row order (verl_pipe/core/micro_batches.py) and the worker log's records
(verl_pipe/trainer/worker_log.py)."""

import json

import pytest

from verl_pipe.trainer import worker_log
from verl_pipe.core.micro_batches import length_order, padded_tokens


def test_padded_tokens_pads_each_micro_batch_to_its_longest():
    assert padded_tokens([3, 9, 2, 2], 2) == 2 * 9 + 2 * 2
    assert padded_tokens([5, 1, 1], 2) == 2 * 5 + 1 * 1  # a short last micro-batch pays for its own rows only
    with pytest.raises(ValueError, match="micro_batch_size=0"):
        padded_tokens([1], 0)


def test_length_order_sorts_within_each_dp_share_longest_first_stably():
    lengths = [4, 9, 4, 1, 7, 7, 2, 8]
    assert length_order(lengths) == [1, 7, 4, 5, 0, 2, 6, 3]  # ties (4, 4) and (7, 7) keep their order
    # two DP shares: no row crosses to the other rank (verl's dispatch chunks the batch contiguously)
    order = length_order(lengths, 2)
    assert order == [1, 0, 2, 3, 7, 4, 5, 6]
    assert sorted(order[:4]) == [0, 1, 2, 3] and sorted(order[4:]) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="3 equal DP shares"):
        length_order(lengths, 3)


def test_sorting_never_pads_more_and_helps_long_tailed_groups():
    # two groups of 8: one with a long tail row, one short
    groups = [[10, 11, 12, 90, 10, 11, 12, 13], [14, 15, 80, 16, 17, 18, 19, 20]]
    rows = [x for g in groups for x in g]
    arrival = padded_tokens(rows, 8)
    by_length = padded_tokens([rows[i] for i in length_order(rows)], 8)
    assert by_length < arrival
    assert by_length == 8 * 90 + 8 * 14  # the two tails share a micro-batch


def test_worker_log_records_nothing_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(worker_log.ENV, raising=False)
    with worker_log.call("update_actor", {}, 8):
        pass
    assert not list(tmp_path.iterdir())


def test_worker_log_records(tmp_path, monkeypatch):
    path = tmp_path / "w.jsonl"
    monkeypatch.setenv(worker_log.ENV, str(path))

    class Nested:
        def offsets(self):
            import torch
            return torch.tensor([0, 3, 10, 12])

    with worker_log.call("update_actor", {"input_ids": Nested()}, 2):
        pass
    with worker_log.call("compute_log_prob", {}, 2):  # no known layout: timed, no lengths
        pass
    records = worker_log.read(str(path))
    assert [r["call"] for r in records] == ["update_actor", "compute_log_prob"]
    assert records[0]["lengths"] == [3, 7, 2]
    assert records[1]["lengths"] is None and records[1]["micro_batch_size"] == 2
