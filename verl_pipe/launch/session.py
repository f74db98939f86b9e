"""A live RolloutPipe setup that runs single steps: for tests and benchmarks.

It is the same path as ``python -m verl_pipe.main_grpo`` (``prepare_config``,
``start_ray``, ``build_trainer``, ``init_workers``, ``begin``), but in the calling
process, so a caller can run steps in different modes on the same workers and
engines (one Ray cluster, one vLLM start-up) and look at the trainer between steps.
"""

from __future__ import annotations

import time

from omegaconf import DictConfig

from verl_pipe.trainer.knobs import StepKnobs, step_knobs


class PipeSession:
    def __init__(self, config: DictConfig):
        from verl_pipe.launch.prepare import prepare_config
        from verl_pipe.launch.ray_start import start_ray
        from verl_pipe.launch.task_runner import build_trainer

        t0 = time.perf_counter()
        self.config = prepare_config(config)
        start_ray(self.config)
        self.trainer = build_trainer(self.config)
        self.trainer.init_workers()
        self.trainer.begin()
        self.startup_s = time.perf_counter() - t0
        self._batches = self._batch_iter()
        self._changes: dict = {}  # the knobs set by earlier steps' arguments: they stay until set again

    def _batch_iter(self):
        epoch = getattr(self.trainer, "epoch", 0)
        while True:
            for batch_dict in self.trainer.epoch_batches():  # the run loop's (a bad record named, skipped or failing)
                # As the run loop's fit: the step's epoch, by which the length history keys a prompt's groups (a
                # prompt's earlier epochs predict its lengths: verl_pipe/core/lengths.py).
                self.trainer.epoch = epoch
                yield batch_dict
            epoch += 1

    @property
    def knobs(self) -> StepKnobs:
        """The knobs the next step runs with: the config's, with what earlier steps (or ``change``) set."""
        return step_knobs(self.trainer.config, **self._changes)

    def change(self, mode: str | None = None, granularity: str | None = None, fgd: bool | None = None,
               workload: dict | None | str = "keep", **knobs) -> StepKnobs:
        """Sets knobs for this and later steps: ``mode``, ``granularity``, ``fgd`` (None: as they are),
        ``workload`` ("keep": as it is; None: the model decides the lengths) and any other StepKnobs field
        (``fgd_window``, ``sampling_overrides``, ``baseline_order``, ...). Returns the knobs now in force."""
        changes = {k: v for k, v in dict(mode=mode, granularity=granularity, fgd=fgd).items() if v is not None}
        if workload != "keep":
            changes["workload"] = workload
        changes.update(knobs)
        step_knobs(self.trainer.config, **{**self._changes, **changes})  # refuses unknown or invalid knobs first
        self._changes.update(changes)
        return self.knobs

    def step(self, mode: str | None = None, batch_dict=None, granularity: str | None = None,
             fgd: bool | None = None, workload: dict | None | str = "keep", backend_cls=None, **knobs) -> dict:
        """Runs one training step with the knobs ``change`` sets from the same arguments (they stay for later
        steps) and, for this step only, ``backend_cls`` as the schedule's executor; returns the step's record."""
        step_knobs_now = self.change(mode, granularity, fgd, workload, **knobs)
        trainer = self.trainer
        trainer.fit_step(batch_dict if batch_dict is not None else next(self._batches), knobs=step_knobs_now,
                         backend_cls=backend_cls)
        record = dict(trainer.last_step_record)
        record["metrics"] = dict(trainer.metrics)
        return record

    def actor_state(self) -> dict:
        return self.trainer.actor_wg.actor_state()[0]

    def close(self) -> None:
        import ray

        try:
            self.trainer.end()
        finally:
            ray.shutdown()


def compose(overrides: list[str] | None = None, config_name: str = "rolloutpipe_trainer") -> DictConfig:
    """The Hydra config that ``main_grpo`` would see for these command-line overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from verl_pipe.launch.prepare import CONF_MODULE

    with initialize_config_module(CONF_MODULE, version_base=None):
        return hydra_compose(config_name, overrides=list(overrides or []))
