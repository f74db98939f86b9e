"""rolloutpipe.minibatch_order: which prompts make each PPO mini-batch, decided before the rollout in every mode
(verl_pipe/core/minibatch_order.py, RolloutPipeTrainer.order_minibatches). Pure: a real DataProto and a real
LengthHistory, no Ray, no model."""

import numpy as np
import pytest
import torch

from verl_pipe.core.lengths import LengthHistory
from verl_pipe.core.minibatch_order import MINIBATCH_ORDERS, check_order, length_permutation, step_permutation
from verl_pipe.launch.session import compose
from verl_pipe.trainer.knobs import StepKnobs, step_knobs


def test_shortest_predicted_first_ties_and_unknowns_keep_the_dataloader_order():
    assert length_permutation([3.0, 1.0, 2.0]) == [1, 2, 0]
    assert length_permutation([2.0, 1.0, 2.0, 1.0]) == [1, 3, 0, 2]  # stable
    assert length_permutation([None, 2.0, None, 1.0]) == [3, 1, 0, 2]  # unknown after the known
    assert length_permutation([None] * 4) == [0, 1, 2, 3]  # a run's first step: the dataloader's order
    assert step_permutation("dataloader", [3.0, 1.0, 2.0]) == [0, 1, 2]
    assert step_permutation("length", [3.0, 1.0, 2.0]) == [1, 2, 0]


def test_a_bad_order_names_the_key():
    assert set(MINIBATCH_ORDERS) == {"length", "dataloader"}
    with pytest.raises(ValueError, match="rolloutpipe.minibatch_order.*'shortest'.*length, dataloader"):
        check_order("shortest")
    with pytest.raises(ValueError, match="rolloutpipe.minibatch_order"):
        StepKnobs(minibatch_order="random")


def test_the_shipped_default_is_dispatch_fill_and_length_order_in_both_modes():
    """The base config and the demo's recipe: units are sync's mini-batches (dispatch fill) and both modes build
    them in predicted-length order; the knobs record both."""
    for cfg in (compose(), compose(config_name="tiny_cpu_chain")):
        assert cfg.rolloutpipe.cgp.unit_fill == "dispatch"
        assert cfg.rolloutpipe.minibatch_order == "length"
        for mode in ("sync", "cgp"):
            rec = step_knobs(cfg, mode=mode).record()
            assert (rec["unit_fill"], rec["minibatch_order"]) == ("dispatch", "length")
    assert step_knobs(compose(["rolloutpipe.minibatch_order=dataloader"])).minibatch_order == "dataloader"


def _batch(rows: list[int]):
    from verl import DataProto

    n = len(rows)
    return DataProto.from_dict(
        tensors={"input_ids": torch.arange(n).unsqueeze(1)},
        non_tensors={"extra_info": np.array([{"index": r} for r in rows], dtype=object),
                     "uid": np.array([f"u{r}" for r in rows], dtype=object)})


def _trainer(history: LengthHistory, epoch: int):
    from verl_pipe.trainer.pipe_trainer import RolloutPipeTrainer

    t = RolloutPipeTrainer.__new__(RolloutPipeTrainer)  # no Ray, no workers: the ordering alone
    t.length_history, t.epoch, t._batch_order = history, epoch, (None, [])
    return t


def test_the_batch_is_reordered_by_its_prompts_history_the_same_in_sync_and_cgp():
    history = LengthHistory()
    for row, length in ((10, 200), (11, 20), (12, 90), (13, 20)):
        history.record(row, 0, [length] * 4)
    orders = {}
    for mode in ("sync", "cgp"):
        batch = _batch([10, 11, 12, 13])
        t = _trainer(history, epoch=1)
        out = t.order_minibatches(batch, StepKnobs(mode=mode))
        assert out is batch
        rows = [e["index"] for e in batch.non_tensor_batch["extra_info"]]
        # shortest predicted first; the two equal ones keep the dataloader's order; rows move with their tensors
        assert rows == [11, 13, 12, 10]
        assert batch.batch["input_ids"].squeeze(1).tolist() == [1, 3, 2, 0]
        assert list(batch.non_tensor_batch["uid"]) == ["u11", "u13", "u12", "u10"]
        orders[mode] = t._positions(batch, 4)
    assert orders["sync"] == orders["cgp"] == [1, 3, 2, 0]


def test_dataloader_order_and_a_first_epoch_leave_the_batch_as_verl_made_it():
    history = LengthHistory()
    history.record(10, 0, [200] * 4)
    history.record(11, 0, [20] * 4)
    batch = _batch([10, 11])
    _trainer(history, epoch=1).order_minibatches(batch, StepKnobs(minibatch_order="dataloader"))
    assert [e["index"] for e in batch.non_tensor_batch["extra_info"]] == [10, 11]
    fresh = _batch([10, 11])
    t = _trainer(LengthHistory(), epoch=0)  # nothing known: every prediction alike
    t.order_minibatches(fresh, StepKnobs())
    assert [e["index"] for e in fresh.non_tensor_batch["extra_info"]] == [10, 11]
    assert t._positions(fresh, 2) == [0, 1]
    assert t._positions(_batch([10, 11]), 2) == [0, 1]  # another batch than the one ordered: the identity


def test_forced_lengths_follow_their_prompts_through_the_reorder():
    """A forced-length workload assigns lengths by dataloader position: after the reorder, group g's requests get
    the lengths of the prompt now at g, and its length key is that prompt's."""
    history = LengthHistory()
    for key, length in (("p0", 300), ("p1", 10)):
        history.record(key, 0, [length] * 2)
    seen = []

    def overrides(g, i):
        seen.append((g, i))
        return {"max_tokens": 100 * (g + 1)}

    knobs = StepKnobs(length_keys=(("p0", 1), ("p1", 1)), sampling_overrides=overrides)
    batch = _batch([0, 1])
    t = _trainer(history, epoch=1)
    t.order_minibatches(batch, knobs)
    assert t._positions(batch, 2) == [1, 0]
    assert t._length_keys(2, batch, knobs) == [("p1", 1), ("p0", 1)]
    moved = t._sampling_overrides(batch, knobs)
    assert moved(0, 3) == {"max_tokens": 200} and moved(1, 0) == {"max_tokens": 100}
    assert seen == [(1, 3), (0, 0)]
