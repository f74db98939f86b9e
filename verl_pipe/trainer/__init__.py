"""The step: RolloutPipeTrainer and what it is made of (seam to verl, run loop, actor backend, rollback, θ_k store,
workers, knobs, step record, weight sync).

``verl_pipe.trainer.RolloutPipeTrainer`` (and ``StepFailedError``) is the public path a recipe's
``rolloutpipe.trainer_class`` subclass imports. Resolved on first use: ``verl_pipe.trainer.theta_store`` is plain torch
and must import on a machine without verl (``python -m verl_pipe.doctor``'s device checks).
"""

_PUBLIC = {"RolloutPipeTrainer": "verl_pipe.trainer.pipe_trainer", "StepFailedError": "verl_pipe.trainer.rollback"}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'verl_pipe.trainer' has no attribute {name!r}")


__all__ = sorted(_PUBLIC)
