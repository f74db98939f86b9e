"""A record that fails in verl's dataset mid-run (verl_pipe/data_check.py GuardedDataset, the run loop's
epoch_batches): named (the split's files, the row, its record index), then the run stops after checkpointing its
last completed step with the data loader before the batch (on_bad_record=fail), or the record is left out of its
batch and counted (skip). Pure: a stand-in for verl's dataset. On the real stack: tests/e2e/test_faults.py."""

import pytest
from omegaconf import OmegaConf

from verl_pipe.data_check import (BAD_RECORD_METRIC, BadRecordError, GuardedDataset, bad_record_metrics,
                                  guarded_collate)
from verl_pipe.trainer.run_loop import RunLoop


class VerlLikeDataset:
    """Rows 0..9; row 3's prompt is null, which verl's _build_messages iterates (TypeError)."""

    def __init__(self):
        self.dataframe = [{"prompt": None if i == 3 else [{"role": "user", "content": f"q{i}"}],
                           "extra_info": {"index": 100 + i}} for i in range(10)]
        self.max_prompt_length = 64

    def __len__(self):
        return len(self.dataframe)

    def __getitem__(self, i):
        row = dict(self.dataframe[i])
        row["raw_prompt"] = [m for m in row["prompt"]]
        return row


def test_fail_names_the_file_the_row_and_the_record():
    ds = GuardedDataset(VerlLikeDataset(), ["/data/train.parquet"], policy="fail")
    assert len(ds) == 10 and ds.max_prompt_length == 64  # verl's dataset otherwise
    assert ds[2]["raw_prompt"][0]["content"] == "q2"
    with pytest.raises(BadRecordError, match=r"data.train_files \(/data/train.parquet\) row 3 \(record index 103\) "
                                             r"failed in verl's dataset: TypeError: 'NoneType' object is not iterable "
                                             r"\(rolloutpipe.fault.on_bad_record=fail\)"):
        ds[3]


def test_skip_leaves_the_record_out_of_its_batch_and_counts_it(capsys):
    ds = GuardedDataset(VerlLikeDataset(), "/data/train.parquet", policy="skip")
    collate = guarded_collate(lambda rows: [r["extra_info"]["index"] for r in rows])
    assert collate([ds[i] for i in range(5)]) == [100, 101, 102, 104]
    assert "row 3 (record index 103) failed in verl's dataset" in capsys.readouterr().out
    assert bad_record_metrics(ds) == {BAD_RECORD_METRIC: 1}
    assert bad_record_metrics(ds) == {BAD_RECORD_METRIC: 0}, "counted once, in the step that drew it"
    assert collate([ds[3]]) is None
    assert bad_record_metrics([1, 2]) == {}
    with pytest.raises(ValueError, match="on_bad_record: got 'drop'"):
        GuardedDataset(VerlLikeDataset(), [], policy="drop")


class _Seam:
    def __init__(self):
        self.saved = []

    def save_checkpoint(self, step, data_state):
        self.saved.append((step, data_state))


def _loop(tmp_path, batches):
    loop = RunLoop()
    loop.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path)},
                                    "rolloutpipe": {"fault": {"checkpoint_on_failure": True}}})
    loop.train_dataloader, loop.actor_seam = batches, _Seam()
    loop.global_steps, loop._data_state = 5, {"before": "this batch"}
    return loop


def test_a_failing_batch_checkpoints_the_last_step_with_the_loader_before_it(tmp_path):
    class Loader:
        def __iter__(self):
            yield {"rows": 1}
            yield None  # every record of it skipped
            raise BadRecordError("data.train_files (x) row 3 failed in verl's dataset: TypeError")

    loop = _loop(tmp_path, Loader())
    batches = loop.epoch_batches()
    assert next(batches) == {"rows": 1}
    with pytest.raises(BadRecordError, match=rf"row 3 failed.*; saved {tmp_path}/global_step_4 \(the data loader "
                                             r"before this batch\); fix or remove the record.*resume_mode=auto"):
        next(batches)
    assert loop.actor_seam.saved == [(4, {"before": "this batch"})]
