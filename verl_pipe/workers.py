"""The trainer-pool worker: verl's DetachActorWorker, pinned to the trainer's cores.

``DetachActorWorker`` (verl/experimental/separation) is verl's actor worker for
separate pools; it adds ``save_model_to_cpu`` / ``restore_model_from_cpu``, which
CGP uses to compute old log-probs under the step's rollout weights θ_k after
earlier units already moved the actor. On a CPU machine the worker pins itself
to ``VERL_PIPE_TRAINER_CORES`` so the trainer pool and the rollout pool run on
disjoint cores, like separate GPUs.
"""

import os

import torch

from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, register

from verl_pipe.platform.env import pin_current_process


class PipeActorWorker(DetachActorWorker):
    def __init__(self, config, role, **kwargs):
        cores = pin_current_process("VERL_PIPE_TRAINER_CORES")
        if cores:
            # One intra-op thread per pinned core: more would only time-slice.
            torch.set_num_threads(len(cores))
            os.environ["OMP_NUM_THREADS"] = str(len(cores))
        super().__init__(config, role, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def actor_state(self) -> dict:
        """The actor's full (unsharded) parameters on CPU, by HF name: for checks and tests."""
        params, _ = self.actor.engine.get_per_tensor_param()
        return {name: t.detach().to("cpu", copy=True) for name, t in params}
