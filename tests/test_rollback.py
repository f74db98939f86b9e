"""A failed step's rollback (verl_pipe/trainer/rollback.py) on a fake trainer seen through the real seam: what is restored,
which checkpoint is saved with which data-loader state, and what the error says."""

import pytest
from omegaconf import OmegaConf

from verl_pipe.trainer.rollback import StepFailedError, drop_train_state_snapshot, fail_step, theta_k_saved
from verl_pipe.trainer.seam import TrainerSeam


class Workers:
    def __init__(self):
        self.calls = []

    def restore_train_state(self):
        self.calls.append("restore")

    def drop_train_state(self):
        self.calls.append("drop")


class Loader:
    def state_dict(self):
        return {"now": True}


class Trainer:
    def __init__(self, saved=False, stepped=False, checkpoint_on_failure=True, save_error=None):
        self.config = OmegaConf.create({"trainer": {"default_local_dir": "/ckpt"},
                                        "rolloutpipe": {"fault": {"checkpoint_on_failure": checkpoint_on_failure}}})
        self.global_steps, self.train_dataloader, self._data_state = 5, Loader(), {"before_step_5": True}
        self.actor_wg = Workers()
        self.seam = TrainerSeam(self)
        self.seam.saved, self.seam.stepped = saved, stepped  # the step in training, as its executor left it
        self.saved_checkpoints, self._save_error = [], save_error

    def _save_checkpoint(self):  # verl's reads plain attributes of self (here: the view save_checkpoint_at passes)
        if self._save_error:
            raise self._save_error
        self.saved_checkpoints.append((self.global_steps, self.train_dataloader.state_dict()))


def _fail(t, trained=False):
    try:
        raise RuntimeError("no replica is left") from ValueError("replica 0 died")
    except RuntimeError as e:
        with pytest.raises(StepFailedError) as err:
            fail_step(t.seam, e, trained, t.global_steps, t._data_state)
    assert err.value.__cause__ is not None
    return str(err.value)


def test_rolls_back_a_stepped_actor_and_saves_the_last_step_with_the_data_before_it():
    t = Trainer(saved=True, stepped=True)
    msg = _fail(t)
    assert t.actor_wg.calls == ["restore"]
    assert t.saved_checkpoints == [(4, {"before_step_5": True})] and t.global_steps == 5
    assert "RuntimeError: no replica is left (ValueError: replica 0 died)" in msg
    assert "/ckpt/global_step_4" in msg and "resume at step 5" in msg


def test_nothing_to_undo_before_the_first_optimizer_step():
    t = Trainer(saved=False, stepped=False)
    _fail(t)
    assert t.actor_wg.calls == [] and t.saved_checkpoints == [(4, {"before_step_5": True})]


def test_a_failed_weight_sync_after_training_saves_the_complete_step():
    t = Trainer(saved=True, stepped=True)
    msg = _fail(t, trained=True)
    assert t.actor_wg.calls == [] and t.saved_checkpoints == [(5, {"now": True})]
    assert "after training" in msg and "go on at step 6" in msg


def test_a_stepped_actor_without_a_snapshot_is_not_saved_as_the_last_step():
    t = Trainer(saved=False, stepped=True)
    msg = _fail(t)
    assert t.saved_checkpoints == [] and "rolling back to step 4 failed too" in msg


def test_no_checkpoint_when_switched_off_and_a_failing_save_is_named():
    t = Trainer(saved=True, stepped=True, checkpoint_on_failure=False)
    assert "no checkpoint written" in _fail(t) and t.actor_wg.calls == [] and t.saved_checkpoints == []
    t = Trainer(save_error=OSError("disk full"))
    assert "failed too (OSError: disk full)" in _fail(t)


def test_the_snapshot_is_dropped_once():
    t = Trainer(saved=True)
    assert theta_k_saved(t.seam)
    drop_train_state_snapshot(t.seam)
    drop_train_state_snapshot(t.seam)
    assert t.actor_wg.calls == ["drop"] and not theta_k_saved(t.seam)
    t.seam = TrainerSeam(t)  # no step in training yet
    assert not theta_k_saved(t.seam)
    drop_train_state_snapshot(t.seam)
    assert t.actor_wg.calls == ["drop"]


def test_the_trainer_module_still_exports_the_error():
    from verl_pipe import trainer

    assert trainer.StepFailedError is StepFailedError


def test_a_failing_save_after_training_names_the_latest_checkpoint():
    """Only the weight sync failed, and saving the trained step fails too (the trainer's node is gone): the error
    says so and where the latest checkpoint is, instead of the save's bare error."""
    t = Trainer(saved=True, stepped=True, save_error=ConnectionError("the trainer's node is gone"))
    msg = _fail(t, trained=True)
    assert "after training" in msg and "saving it failed too (ConnectionError: the trainer's node is gone)" in msg
    assert "resume from the latest checkpoint in /ckpt" in msg and t.saved_checkpoints == []
