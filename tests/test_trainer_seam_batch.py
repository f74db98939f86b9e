"""trainer_seam.for_actor_worker: what verl's actor worker is sent of a batch (pure, no Ray)."""

import numpy as np
import torch
from verl import DataProto

from verl_pipe.trainer import RolloutPipeTrainer
from verl_pipe.trainer.seam import for_actor_worker


def _batch():
    return DataProto.from_dict(
        tensors={"input_ids": torch.arange(6).view(2, 3), "response_mask": torch.ones(2, 3)},
        non_tensors={"uid": np.array(["a", "b"], dtype=object), "raw_prompt": np.array([[1], [2]], dtype=object),
                     "multi_modal_inputs": np.array([{}, {}], dtype=object)},
        meta_info={"temperature": 1.0})


def test_only_the_columns_the_worker_reads_travel():
    b = _batch()
    out = for_actor_worker(b, RolloutPipeTrainer.actor_non_tensor_keys)
    assert set(out.non_tensor_batch) == {"multi_modal_inputs"}
    assert out.batch is b.batch and out.meta_info is b.meta_info  # the same tensors: the same numbers
    assert set(b.non_tensor_batch) == {"uid", "raw_prompt", "multi_modal_inputs"}  # the trainer's batch keeps all
    td = out.to_tensordict()
    assert "uid" not in td.keys() and torch.equal(td["input_ids"], b.batch["input_ids"])


def test_a_batch_with_nothing_to_drop_is_passed_as_is():
    b = _batch()
    assert for_actor_worker(b, ("uid", "raw_prompt", "multi_modal_inputs")) is b
    assert set(for_actor_worker(b, ("uid",)).non_tensor_batch) == {"uid"}
