"""A live RolloutPipe setup that runs single steps: for tests and benchmarks.

It is the same path as ``python -m verl_pipe.main_grpo`` (``prepare_config``,
``start_ray``, ``build_trainer``, ``init_workers``, ``begin``), but in the calling
process, so a caller can run steps in different modes on the same workers and
engines (one Ray cluster, one vLLM start-up) and look at the trainer between steps.
"""

from __future__ import annotations

import time

from omegaconf import DictConfig


class PipeSession:
    def __init__(self, config: DictConfig):
        from verl_pipe.main_grpo import prepare_config, start_ray
        from verl_pipe.task_runner import build_trainer

        t0 = time.perf_counter()
        self.config = prepare_config(config)
        start_ray(self.config)
        self.trainer = build_trainer(self.config)
        self.trainer.init_workers()
        self.trainer.begin()
        self.startup_s = time.perf_counter() - t0
        self._batches = self._batch_iter()

    def _batch_iter(self):
        while True:
            for batch_dict in self.trainer.train_dataloader:
                yield batch_dict

    def step(self, mode: str | None = None, batch_dict=None, granularity: str | None = None,
             fgd: bool | None = None, workload: dict | None | str = "keep", **trainer_attrs) -> dict:
        """Runs one training step (in ``mode`` etc. if given); returns the step's record."""
        trainer = self.trainer
        if mode is not None:
            trainer.mode = mode
        if granularity is not None:
            trainer.granularity = granularity
        if fgd is not None:
            trainer.fgd_enabled = fgd
        if workload != "keep":
            trainer.workload_spec = workload
        for k, v in trainer_attrs.items():
            setattr(trainer, k, v)
        trainer.fit_step(batch_dict if batch_dict is not None else next(self._batches))
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

    from verl_pipe.main_grpo import CONF_MODULE

    with initialize_config_module(CONF_MODULE, version_base=None):
        return hydra_compose(config_name, overrides=list(overrides or []))
