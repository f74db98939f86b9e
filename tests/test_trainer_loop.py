"""RolloutPipeTrainer.fit keeps verl's loop semantics (verl's SeparateRayPPOTrainer.fit): val_only stops after
the validation before training, and a resumed run goes on in the epoch its checkpoint is in. No workers: a bare
trainer whose begin/fit_step/end record what the loop does."""

import os

from omegaconf import OmegaConf

from verl_pipe.trainer import RolloutPipeTrainer


class _Loop(RolloutPipeTrainer):
    def __init__(self, resumed_step: int, batches_per_epoch: int, epochs: int, total_steps: int, val_only=False,
                 stop_file=None, after_step=lambda: None):
        self.config = OmegaConf.create({"trainer": {"total_epochs": epochs, "val_only": val_only}})
        self.train_dataloader = [{"row": i} for i in range(batches_per_epoch)]
        self.global_steps = 0
        self._resumed, self.total_training_steps = resumed_step, total_steps  # verl's attribute (RunLoop fits it)
        self.stop_check = (lambda: os.path.exists(stop_file)) if stop_file else None
        self._after_step = after_step
        self.calls: list = []

    def begin(self):  # verl's: load the checkpoint (global_steps = its step), validate, then step + 1
        self.calls.append("begin")
        self.global_steps = self._resumed + 1

    def fit_step(self, batch_dict=None):
        self.calls.append((self.epoch, self.global_steps))
        self.is_last_step = self.global_steps >= self.total_training_steps
        self.global_steps += 1
        self._after_step()

    def end(self):
        self.calls.append("end")


def test_fresh_run_walks_every_epoch():
    t = _Loop(resumed_step=0, batches_per_epoch=2, epochs=2, total_steps=4)
    t.fit()
    assert t.calls == ["begin", (0, 1), (0, 2), (1, 3), (1, 4), "end"]


def test_resumed_run_continues_in_the_checkpoints_epoch():
    """Step 3 of 2-batch epochs is in epoch 1: the resumed run's next step (4) is epoch 1, not epoch 0 again
    (verl: current_epoch = global_steps // len(train_dataloader))."""
    t = _Loop(resumed_step=3, batches_per_epoch=2, epochs=3, total_steps=6)
    t.fit()
    assert t.calls[1][0] == 1 and t.calls[-2] == (2, 6)


def test_val_only_stops_after_the_first_validation():
    t = _Loop(resumed_step=0, batches_per_epoch=2, epochs=1, total_steps=2, val_only=True)
    t.fit()
    assert t.calls == ["begin", "end"]


def test_a_stop_request_starts_no_new_step(tmp_path):
    """The launcher touches its stop file when signalled (verl_pipe/launch/launcher.py: request_stop): the loop starts no
    step after that and ends; without the file it runs on."""
    stop = tmp_path / "stop"

    def signal_during_step_2():
        if t.global_steps == 3:
            stop.touch()

    t = _Loop(resumed_step=0, batches_per_epoch=4, epochs=1, total_steps=4, stop_file=str(stop),
              after_step=signal_during_step_2)
    t.fit()
    assert t.calls == ["begin", (0, 1), (0, 2), "end"]
