"""The run around the steps: verl's fit loop, with ``fit_step`` as its step (a base class of RolloutPipeTrainer).

One job: what verl's ``SeparateRayPPOTrainer.fit`` does before, between and after its steps, on the trainer it is
mixed into: ``begin`` (logger, checkpoint, θ_0 into the rollout pool, the validation before training, verl's
profiler state), ``restore`` / ``replay`` (a live run back to a saved step; a recorded step trained again), the epochs (a resumed run goes on in its checkpoint's epoch; ``trainer.val_only`` stops after the
validation), a stop request from the launcher, a record that fails in the data loader mid-run, the checkpoints'
completeness (verl_pipe/trainer/checkpoints.py: ``_save_checkpoint`` records a completed save, ``_load_checkpoint``
resumes from the newest complete one), and ``end``. verl seams (verl 0.9.1, RayPPOTrainer /
SeparateRayPPOTrainer): ``_save_checkpoint``, ``_load_checkpoint``, ``_validate``, ``_init_dump_executor`` / ``_shutdown_dump_executor``,
``checkpoint_manager.update_weights``, ``total_training_steps``, ``is_last_step`` and the profiler attributes
(``prev_step_profile``, ``curr_step_profile``, ``next_step_profile``) its ``_fit_*`` pieces read.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import OmegaConf, open_dict

from verl_pipe.data_check import BadRecordError
from verl_pipe.trainer import checkpoints


class RunLoop:
    # Whether the launcher asked the run to stop (given by whoever builds the trainer: the launch layer's TaskRunner
    # checks the launcher's stop file and the run's key in the Ray cluster, verl_pipe/launch/stop_request.py). Ray's
    # workers run in process groups of their own, so a signal to the launcher's group does not reach this loop, which
    # would otherwise go on with new steps until the teardown ends it.
    stop_check: Callable[[], bool] | None = None
    progress_bar = None

    def fit(self):
        self._fit_steps_to_the_data()  # the launcher's run ends with its epochs (a session steps on past them)
        self.begin()
        if self.config.trainer.get("val_only", False):  # verl's val_only: validate (in begin) and stop
            self.end()
            return
        # On resume, go on in the epoch the checkpoint is in (verl's fit: global_steps // len(dataloader)).
        first_epoch = (self.global_steps - 1) // max(1, len(self.train_dataloader))
        for epoch in range(first_epoch, self.config.trainer.total_epochs):
            for batch_dict in self.epoch_batches():
                if self.stop_requested():
                    print(f"[verl_pipe] stop requested: no step after {self.global_steps - 1}", flush=True)
                    self.end()
                    return
                self.epoch = epoch
                self.fit_step(batch_dict)
                if self.is_last_step:
                    self.end()
                    return
        self.end()

    def begin(self) -> None:
        """Before the first step: logger, checkpoint, θ_0 into the rollout pool, optional validation."""
        from tqdm import tqdm

        from verl.utils.tracking import Tracking

        self.logger = Tracking(project_name=self.config.trainer.project_name,
                               experiment_name=self.config.trainer.experiment_name,
                               default_backend=self.config.trainer.logger,
                               config=OmegaConf.to_container(self.config, resolve=True))
        self.global_steps = 0
        # verl's rollout-data dump writer (trainer.rollout_data_dir): RayPPOTrainer.__init__ makes it, the
        # separate-pool trainer we build on does not; fit() re-makes a shut-down one, as here.
        if getattr(self, "_dump_executor", None) is None or self._dump_executor._shutdown:
            self._init_dump_executor()
        self._load_checkpoint()
        self._data_state = self.train_dataloader.state_dict()  # before the next step draws its batch
        self.checkpoint_manager.update_weights(self.global_steps)
        self.initial_val_metrics = {}  # the validation before training, for the run's summary
        if self.config.trainer.get("val_before_train", True):
            val_metrics = self.initial_val_metrics = self._validate()
            self.logger.log(data=val_metrics, step=self.global_steps)
        self.progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training")
        self.global_steps += 1
        self.last_val_metrics = None
        self.max_steps_duration = 0
        # verl's profiler state (SeparateRayPPOTrainer.fit), read by its _fit_start_profile/_fit_stop_profile.
        steps = self.config.global_profiler.get("steps")
        self.prev_step_profile = False
        self.curr_step_profile = self.global_steps in steps if steps is not None else False
        self.next_step_profile = False

    def stop_requested(self) -> bool:
        return bool(self.stop_check is not None and self.stop_check())

    def epoch_batches(self):
        """The data loader's batches of one epoch. A record that fails in verl's dataset (``GuardedDataset``:
        rolloutpipe.fault.on_bad_record=fail) stops the run naming the record, after the last completed step is
        checkpointed with the data loader as it was before this batch, so nothing is lost: fixed, the run resumes
        at this batch. With ``skip`` a batch whose every record was skipped is passed over."""
        batches = iter(self.train_dataloader)
        while True:
            try:
                batch_dict = next(batches)
            except StopIteration:
                return
            except BadRecordError as e:
                raise BadRecordError(f"{e}; {self._checkpoint_before_bad_batch()}") from e
            if batch_dict is not None:
                yield batch_dict

    def _checkpoint_before_bad_batch(self) -> str:
        last = self.global_steps - 1
        where = self.config.trainer.default_local_dir
        resume = ("fix or remove the record (or set rolloutpipe.fault.on_bad_record=skip) and run again with "
                  "trainer.resume_mode=auto")
        if last < 1 or not self.config.rolloutpipe.fault.get("checkpoint_on_failure", True):
            return resume
        folder = checkpoints.step_dir(where, last)
        if checkpoints.problem(folder) is None:
            return f"{folder} is the latest complete checkpoint; {resume}"
        try:
            self.actor_seam.save_checkpoint(last, self._data_state)
        except Exception as e:  # noqa: BLE001 -- reported with the record's error
            return f"saving step {last} failed too ({type(e).__name__}: {e}); {resume}"
        return f"saved {folder} (the data loader before this batch); {resume}"

    def _save_checkpoint(self):
        """verl's save (``RayPPOTrainer._save_checkpoint``, on the trainer or a ``seam._VerlView`` of it), recorded
        complete when it returns; a failed save (a full disk) raises CheckpointSaveError naming the folder and the
        latest complete checkpoint left."""
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        checkpoints.guarded_save(lambda: RayPPOTrainer._save_checkpoint(self), self.config.trainer.default_local_dir,
                                 self.global_steps)

    def _load_checkpoint(self):
        """verl's resume, from the newest complete checkpoint (resume_mode=auto): a newer folder whose save did not
        finish or whose files were truncated since is named and passed over; with none complete the run stops
        naming them (verl_pipe/trainer/checkpoints.py)."""
        trainer = self.config.trainer
        if trainer.get("resume_mode") != "auto" or trainer.get("default_hdfs_dir") is not None:
            return super()._load_checkpoint()
        folder, skipped = checkpoints.resume_folder(trainer.default_local_dir)
        for f, why in skipped:
            print(f"[verl_pipe] checkpoint {f} is not complete ({why}): resuming from an earlier one", flush=True)
        if folder is None or not skipped:
            return super()._load_checkpoint()
        before = trainer.get("resume_from_path")
        with open_dict(trainer):
            trainer.resume_mode, trainer.resume_from_path = "resume_path", folder
        try:
            return super()._load_checkpoint()
        finally:
            with open_dict(trainer):
                trainer.resume_mode, trainer.resume_from_path = "auto", before

    def restore(self, checkpoint_dir: str, global_steps: int) -> None:
        """A live run back to a saved step: the actor and its optimizer from ``checkpoint_dir`` (written by
        ``actor_wg.save_checkpoint``), the step counter at ``global_steps``, those weights into the rollout pool."""
        self.actor_wg.load_checkpoint(checkpoint_dir)
        self.global_steps = global_steps
        self.checkpoint_manager.update_weights(global_steps - 1)

    def replay(self, queue, global_step: int, timeline, **changes):
        """Trains the groups already in ``queue`` as step ``global_step``, with that step's metrics fresh and no
        rollout: a recorded step trained again, e.g. under another schedule (``changes``: StepKnobs fields, as
        ``train`` takes them). Returns the StepOutcome."""
        self.global_steps = global_step
        self.metrics = {}
        return self.train(queue, timeline, **changes)

    def _fit_steps_to_the_data(self) -> None:
        """trainer.total_training_steps beyond what the data gives (batches per epoch x trainer.total_epochs) would
        end the run when the epochs run out, before its "last step" (verl's seam: ``is_last_step`` from
        ``total_training_steps``), so without the final validation and checkpoint: the run's last step is the data's
        last, said at the start."""
        per_epoch = len(self.train_dataloader)
        epochs = int(self.config.trainer.total_epochs)
        if per_epoch and self.total_training_steps > per_epoch * epochs:
            print(f"[verl_pipe] trainer.total_training_steps={self.total_training_steps} is more than the data gives: "
                  f"{per_epoch} batches per epoch x trainer.total_epochs={epochs}; the run ends at step "
                  f"{per_epoch * epochs}, validated and checkpointed as its last (raise trainer.total_epochs or add "
                  "prompts for more)", flush=True)
            self.total_training_steps = per_epoch * epochs

    def end(self) -> None:
        if self.progress_bar is not None:
            self.progress_bar.close()
        if getattr(self, "_dump_executor", None) is not None:
            self._shutdown_dump_executor()  # verl's: the rollout-data dumps (trainer.rollout_data_dir) are written
        self.rollout.shutdown()
