"""Checkpoint completeness (verl_pipe/trainer/checkpoints.py), on real files: a save records its folder complete; a
save cut short by a full disk leaves no partial folder and names the previous, intact checkpoint; a resume passes over a
truncated or unfinished newer checkpoint, or refuses naming the folders when none is complete. The same on the real
stack (a size-limited file system filling during verl's save): tests/e2e/test_faults.py."""

import errno
import os
import shutil

import pytest

from verl_pipe.trainer import checkpoints
from verl_pipe.trainer.checkpoints import (COMPLETE, CheckpointError, CheckpointSaveError, guarded_save, problem,
                                           resume_folder, step_dir)


def _verl_save(root, step, fail_after=None, exc=None):
    """What verl's _save_checkpoint writes: the actor's files, data.pt, then the tracker."""
    def save():
        folder = step_dir(root, step)
        os.makedirs(os.path.join(folder, "actor"), exist_ok=True)
        for i, name in enumerate(("actor/model.pt", "actor/optim.pt", "data.pt")):
            if fail_after is not None and i >= fail_after:
                raise exc
            with open(os.path.join(folder, name), "wb") as f:
                f.write(os.urandom(1000 + 100 * i))
        with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(step))
    return save


def test_a_completed_save_is_recorded_and_checked(tmp_path):
    guarded_save(_verl_save(tmp_path, 3), tmp_path, 3)
    folder = step_dir(tmp_path, 3)
    assert os.path.exists(os.path.join(folder, COMPLETE)) and problem(folder) is None
    with open(os.path.join(folder, "actor", "optim.pt"), "r+b") as f:
        f.truncate(10)
    assert problem(folder) == "actor/optim.pt has 10 bytes, 1100 when it was written"
    os.remove(os.path.join(folder, "actor", "optim.pt"))
    assert problem(folder) == "actor/optim.pt is missing"


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"),
                                 RuntimeError("RayTaskError(OSError): ... [Errno 28] No space left on device")])
def test_a_disk_that_fills_leaves_no_partial_folder_and_the_previous_intact(tmp_path, exc):
    guarded_save(_verl_save(tmp_path, 1), tmp_path, 1)
    with pytest.raises(CheckpointSaveError) as err:
        guarded_save(_verl_save(tmp_path, 2, fail_after=1, exc=exc), tmp_path, 2)
    msg = str(err.value)
    assert f"saving the checkpoint of step 2 to {step_dir(tmp_path, 2)} failed: the disk is full" in msg
    assert "its partial folder was removed" in msg and f"latest complete checkpoint is {step_dir(tmp_path, 1)}" in msg
    assert "free space on that file system" in msg
    assert not os.path.exists(step_dir(tmp_path, 2)) and problem(step_dir(tmp_path, 1)) is None
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"


def test_torchs_silent_write_error_on_a_full_file_system_is_named_by_the_free_space(tmp_path, monkeypatch):
    """torch's zip writer says only 'file write failed' on a full disk: the free space left tells."""
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 0))
    exc = RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/0: "
                       "file write failed")
    with pytest.raises(CheckpointSaveError, match="the disk is full"):
        guarded_save(_verl_save(tmp_path, 1, fail_after=0, exc=exc), tmp_path, 1)


def test_a_failed_save_over_a_complete_checkpoint_leaves_it(tmp_path):
    """A rolled-back step re-saves the previous step's folder; if that save fails (its workers gone) the folder stays,
    and its record still checks its files."""
    guarded_save(_verl_save(tmp_path, 4), tmp_path, 4)
    with pytest.raises(CheckpointSaveError, match="it raised: ConnectionError: trainer node lost") as err:
        guarded_save(_verl_save(tmp_path, 4, fail_after=0, exc=ConnectionError("trainer node lost")), tmp_path, 4)
    assert "partial folder" not in str(err.value)
    assert problem(step_dir(tmp_path, 4)) is None


def test_a_resume_passes_over_a_truncated_latest_or_refuses_naming_it(tmp_path):
    assert resume_folder(tmp_path) == (None, []), "nothing there: verl starts afresh"
    for step in (1, 2):
        guarded_save(_verl_save(tmp_path, step), tmp_path, step)
    assert resume_folder(tmp_path) == (step_dir(tmp_path, 2), [])
    with open(os.path.join(step_dir(tmp_path, 2), "data.pt"), "r+b") as f:
        f.truncate(0)
    folder, skipped = resume_folder(tmp_path)
    assert folder == step_dir(tmp_path, 1)
    assert skipped == [(step_dir(tmp_path, 2), "data.pt has 0 bytes, 1200 when it was written")]
    # a save newer than the tracker (cut short before verl wrote it) is never resumed, as in verl
    os.makedirs(step_dir(tmp_path, 3))
    assert resume_folder(tmp_path)[0] == step_dir(tmp_path, 1)
    os.remove(os.path.join(step_dir(tmp_path, 1), "actor", "model.pt"))
    with pytest.raises(CheckpointError, match=rf"no complete checkpoint to resume from in {tmp_path} "
                                               rf"\({step_dir(tmp_path, 2)}: data.pt has 0 bytes.*; "
                                               rf"{step_dir(tmp_path, 1)}: actor/model.pt is missing\)"):
        resume_folder(tmp_path)


def test_checkpoints_without_records_are_left_to_verl(tmp_path):
    _verl_save(tmp_path, 5)()
    assert resume_folder(tmp_path) == (None, [])
