"""The planner's costs fitted on a verl log (``verl_log.fit_log``): the hardware profile's cost model
(``predict.ProfileCosts``) with the log's scales, and a colocated run's measured weight reload."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from verl_pipe.plan.predict import ProfileCosts
from verl_pipe.plan.verl_log import LogFit, LogRun, fit_log, log_notes, scale_engine


class VerlLogCosts(ProfileCosts):
    """The profile's cost model with the scales fitted on verl's log (``LogFit``): the engine's step time and
    the trainer's update time scaled, the old-log-prob ratio replaced; copies and the weight sync the
    profile's; a colocated run's weight reload the log's ``timing_s/update_weights``. verl's trainer and ours
    are costed alike (the same FSDP worker, docs/trainer_gap.md)."""

    def __init__(self, hw, model, fit: LogFit):
        super().__init__(hw, model)
        self.fit, self.label = fit, f"verl log, {hw.name} profile"

    def engine(self, shape, mode, resident_bytes: float = 0.0):
        return scale_engine(super().engine(shape, mode, resident_bytes), self.fit.engine_scale)

    def trainer(self, shape, placement):
        t = super().trainer(shape, placement)
        return t.with_(time_scale=t.time_scale * self.fit.trainer_scale, logprob_ratio=self.fit.logprob_ratio)

    def colocated_params(self, shape) -> dict:
        got = super().colocated_params(shape)
        if self.fit.colocated and self.fit.update_weights_s:
            got = dict(got, update_weights_s=self.fit.update_weights_s,
                       update_weights_from=f"the log's timing_s/update_weights ({self.fit.train_gpus} GPUs)")
        step = self.fit.measured.get("timing_s/step")
        if self.fit.colocated and step and shape.rollout_gpus == self.fit.train_gpus:  # the log's own GPU count
            got["log_step_s"] = step
        return got


def calibrated_costs(log_path, args, shape, notes: list[str], run: LogRun | None = None, user_lengths=None) -> tuple:
    """(costs, hardware record, label) for ``--calibrate LOG`` / ``--calibrate-verl-log LOG``: the ``--hardware``
    profile scaled by the log's fit; the notes say which cost came from where. ``shape``: the log's run's shape as
    the config and the log give it (``__main__._shape_from_log``)."""
    from verl_pipe.plan.hardware import model_shape, profile
    from verl_pipe.plan.runconfig import CannotModel

    if shape.cpu:
        raise CannotModel("rolloutpipe.platform=cpu / trainer.device=cpu: a verl log calibration scales a GPU "
                          "hardware profile; plan a GPU config, or calibrate a CPU run on its own step records")
    hw = profile(args.hardware)
    model = model_shape(shape.model_path)
    fit = fit_log(log_path, shape, hw, model, rollout_gpus=getattr(args, "calibrated_rollout_gpus", None),
                  train_gpus=args.calibrated_train_gpus, flag=run.flag if run else "--calibrate", run=run,
                  user_lengths=user_lengths, prompt_len=args.prompt_len)
    notes += log_notes(fit)
    hw_info = {"calibrated_from": str(log_path), "source": "verl log", "profile": hw.name, "figures": hw.figures(),
               "model": asdict(model), "verl_log": fit.summary()}
    return VerlLogCosts(hw, model, fit), hw_info, f"verl log {Path(fit.source).name} on the {hw.name} profile"
