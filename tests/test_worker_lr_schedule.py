"""The trainer worker's LR-scheduler step (verl_pipe/trainer/workers.py) against verl 0.9.1's own mini-batch loop.

verl's ``TrainingWorker.train_mini_batch`` steps the scheduler with a call's last mini-batch of its last epoch
(``update_lr_scheduler`` on the mini-batch it hands to ``train_batch``): once per call. We make one call per unit,
so our ``update_actor`` lets verl step it only in the call that carries ``rolloutpipe_lr_step=True`` (the step's last
optimizer step, from the schedule: tests/test_schedule.py), whatever ``ppo_epochs``; group granularity's
``finish_unit`` steps it only with ``lr_step``; ``step_lr_schedule`` steps it alone. No Ray, no model: verl's real
loop over a fake engine.
"""

from contextlib import contextmanager

import pytest
import torch
from tensordict import TensorDict

from verl.utils import tensordict_utils as tu
from verl.utils.profiler import DistProfiler
from verl.workers.engine import FSDPEngine
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from tests.fakes import fake_of
from verl_pipe.trainer import workers
from verl_pipe.trainer.seam import LR_STEP_KEY


@fake_of(FSDPEngine, extra=("lr_steps",))
class FakeEngine:
    """One DP rank, outputs on this rank off (train_mini_batch then returns no metrics), an optimizer step that
    returns a gradient norm and a scheduler that counts its steps."""

    def __init__(self):
        self.module = torch.nn.Linear(2, 1)
        self.lr_steps = 0

    def get_data_parallel_size(self):
        return 1

    def get_data_parallel_rank(self):
        return 0

    def is_mp_src_rank_with_outputs(self):
        return False

    @contextmanager
    def train_mode(self, **kwargs):
        yield

    def optimizer_step(self):
        return 1.0

    def lr_scheduler_step(self):
        self.lr_steps += 1
        return 0.25


@fake_of(DistProfiler)
class FakeProfiler:
    def step(self):
        pass


class RecordingTrainingWorker(TrainingWorker):
    """verl's TrainingWorker (its train_mini_batch as it is) whose train_batch records verl's flag per mini-batch."""

    def train_batch(self, data):
        self.flags.append(bool(tu.get(data, key="update_lr_scheduler", default=False)))
        if self.flags[-1]:
            self.engine.lr_scheduler_step()
        return None


class _EngineConfig:
    micro_batch_size_per_gpu = 2


def _worker():
    actor = object.__new__(RecordingTrainingWorker)
    actor.engine, actor.profiler, actor.flags, actor.engine_config = FakeEngine(), FakeProfiler(), [], _EngineConfig()
    worker = object.__new__(workers.PipeActorWorker)
    worker.actor = actor
    return worker, actor


def _data(rows: int, mini: int, epochs: int, lr_step: bool | None) -> TensorDict:
    td = TensorDict({"x": torch.arange(rows)}, batch_size=[rows])
    tu.assign_non_tensor(td, mini_batch_size=mini, epochs=epochs)
    if lr_step is not None:
        tu.assign_non_tensor(td, **{LR_STEP_KEY: lr_step})
    return td


@pytest.mark.parametrize("epochs", [1, 2, 3])
@pytest.mark.parametrize("lr_step", [None, True, False])
def test_update_actor_steps_the_lr_schedule_only_in_the_call_that_says_so(monkeypatch, epochs, lr_step):
    seen = []

    def verls_update_actor(self, data):  # verl's ActorRolloutRefWorker.update_actor: the actor's train_mini_batch
        seen.append(LR_STEP_KEY in data.keys())
        return TrainingWorker.train_mini_batch(self.actor, data)

    monkeypatch.setattr(ActorRolloutRefWorker, "update_actor", verls_update_actor)
    worker, actor = _worker()
    workers.PipeActorWorker.update_actor(worker, _data(4, 2, epochs, lr_step))  # 2 mini-batches per epoch
    stepped = lr_step is not False  # absent: verl's behaviour
    assert actor.flags == [False] * (2 * epochs - 1) + [stepped], "verl's: the last mini-batch of the last epoch"
    assert actor.engine.lr_steps == int(stepped)
    assert seen == [False], "the key is ours: verl's worker does not see it"
    assert "train_batch" not in vars(actor), "the hold ends with the call"


def test_finish_unit_steps_the_lr_schedule_only_when_told():
    worker, actor = _worker()
    for p in actor.engine.module.parameters():
        p.grad = torch.ones_like(p)
    out = workers.PipeActorWorker.finish_unit(worker, "token-mean", 2, 1, None, lr_step=False)
    assert out == {"actor/grad_norm": 1.0} and actor.engine.lr_steps == 0
    out = workers.PipeActorWorker.finish_unit(worker, "token-mean", 2, 1, None, lr_step=True)
    assert out == {"actor/grad_norm": 1.0, "actor/lr": 0.25} and actor.engine.lr_steps == 1
    assert workers.PipeActorWorker.step_lr_schedule(worker) == {"actor/lr": 0.25} and actor.engine.lr_steps == 2
