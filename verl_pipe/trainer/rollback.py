"""A step that fails for good: roll the trainer back to the end of the last completed step, checkpoint there, raise.

One job: RolloutPipeTrainer.fit_step's failure path (docs/reliability.md, "A step that fails for good"), and the
lifetime of the rollback state it relies on (θ_k and the optimizer state in the worker's store, saved by the step's
executor before its first optimizer step: ``TrainerSeam.saved`` / ``stepped``).

It sees the trainer through its seam (verl_pipe/trainer/seam.py): the actor's lock, the worker's
``restore_train_state`` / ``drop_train_state`` RPCs (verl_pipe/trainer/workers.py), and verl's
``RayPPOTrainer._save_checkpoint`` (``TrainerSeam.save_checkpoint``: it reads only plain attributes of the trainer,
given explicitly there); verl's ``trainer.*`` keys (``default_local_dir``, ``resume_mode``) are in the messages.
"""

from __future__ import annotations

import os
from typing import NoReturn

from verl_pipe.trainer.seam import TrainerSeam


class StepFailedError(RuntimeError):
    """A step failed for good; the message says which checkpoint the run resumes from."""


def theta_k_saved(seam: TrainerSeam) -> bool:
    """The worker's store holds θ_k and the optimizer state from before the step's first optimizer step."""
    return seam.saved


def drop_train_state_snapshot(seam: TrainerSeam) -> None:
    seam.drop_train_state()


def describe(exc: BaseException) -> str:
    """The error and its cause (the trainer sees the rollout's error wrapped by the queue)."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    return text if cause is None else f"{text} ({type(cause).__name__}: {cause})"


def fail_step(seam: TrainerSeam, exc: Exception, trained: bool, step: int, data_before) -> NoReturn:
    """Step ``step`` failed for good. Roll the trainer back to the end of the last completed step (θ_k and the
    optimizer state from the CPU snapshot; nothing to undo if no optimizer step ran yet), save a checkpoint
    there with the data loader as it was before this step's batch (``data_before``), and raise. Resuming
    (trainer.resume_mode=auto) re-runs this step on the same prompts; no partial step is in the checkpoint."""
    last = step - 1
    where = seam.config.trainer.default_local_dir
    if not seam.config.rolloutpipe.fault.checkpoint_on_failure:
        raise StepFailedError(f"step {step} failed: {describe(exc)} "
                              f"(no checkpoint written: rolloutpipe.fault.checkpoint_on_failure=false)") from exc
    if trained:  # only the weight sync failed: the trainer holds a complete step k
        try:
            seam.save_checkpoint(step, seam.loader_state())
        except Exception as save_error:  # e.g. the trainer's workers are gone too (their node was lost)
            raise StepFailedError(f"step {step} failed after training: {describe(exc)}; saving it failed too "
                                  f"({type(save_error).__name__}: {save_error}); resume from the latest "
                                  f"checkpoint in {where}, if any") from exc
        raise StepFailedError(f"step {step} failed after training: {describe(exc)}. Saved "
                              f"{os.path.join(str(where), f'global_step_{step}')}; run again with "
                              f"trainer.resume_mode=auto to go on at step {step + 1}") from exc
    try:
        with seam.lock:
            if seam.stepped:
                if not theta_k_saved(seam):
                    raise RuntimeError("the step's first optimizer step ran without a snapshot to undo it")
                seam.restore_train_state()
            seam.save_checkpoint(last, data_before)
    except Exception as save_error:
        raise StepFailedError(f"step {step} failed: {describe(exc)}; rolling back to step {last} "
                              f"failed too ({type(save_error).__name__}: {save_error}); resume from the "
                              f"latest checkpoint in {where}, if any") from exc
    raise StepFailedError(
        f"step {step} failed: {describe(exc)}. Rolled back to the end of step {last} and saved "
        f"{os.path.join(str(where), f'global_step_{last}')}; run again with trainer.resume_mode=auto to "
        f"resume at step {step} with the same data") from exc
