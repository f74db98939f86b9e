"""The run around the steps: verl's fit loop, with ``fit_step`` as its step (a base class of RolloutPipeTrainer).

One job: what verl's ``SeparateRayPPOTrainer.fit`` does before, between and after its steps, on the trainer it is
mixed into: ``begin`` (logger, checkpoint, θ_0 into the rollout pool, the validation before training, verl's
profiler state), ``restore`` / ``replay`` (a live run back to a saved step; a recorded step trained again), the epochs (a resumed run goes on in its checkpoint's epoch; ``trainer.val_only`` stops after the
validation), a stop request from the launcher, and ``end``. verl seams (verl 0.9.1, RayPPOTrainer /
SeparateRayPPOTrainer): ``_load_checkpoint``, ``_validate``, ``_init_dump_executor`` / ``_shutdown_dump_executor``,
``checkpoint_manager.update_weights``, ``total_training_steps``, ``is_last_step`` and the profiler attributes
(``prev_step_profile``, ``curr_step_profile``, ``next_step_profile``) its ``_fit_*`` pieces read.
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf


class RunLoop:
    # The launcher touches this file when it is signalled (verl_pipe/main_grpo.py): Ray's workers run in process
    # groups of their own, so a signal to the launcher's group does not reach this loop, which would otherwise go on
    # with new steps until the teardown ends it. The file is on the launcher's node; ``stop_key`` carries the same
    # request through the Ray cluster to a loop on any node (verl_pipe/launch/stop_request.py).
    stop_file: str | None = None
    stop_key: str | None = None  # the launcher's run id: the same request through the cluster's GCS (any node)
    progress_bar = None

    def fit(self):
        self.begin()
        if self.config.trainer.get("val_only", False):  # verl's val_only: validate (in begin) and stop
            self.end()
            return
        # On resume, go on in the epoch the checkpoint is in (verl's fit: global_steps // len(dataloader)).
        first_epoch = (self.global_steps - 1) // max(1, len(self.train_dataloader))
        for epoch in range(first_epoch, self.config.trainer.total_epochs):
            for batch_dict in self.train_dataloader:
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
        from verl_pipe.launch import stop_request

        if bool(self.stop_file) and os.path.exists(self.stop_file):
            return True
        if stop_request.requested(self.stop_key):
            stop_request.clear(self.stop_key)
            return True
        return False

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

    def end(self) -> None:
        if self.progress_bar is not None:
            self.progress_bar.close()
        if getattr(self, "_dump_executor", None) is not None:
            self._shutdown_dump_executor()  # verl's: the rollout-data dumps (trainer.rollout_data_dir) are written
        self.rollout.shutdown()
