"""The real executor of the schedule (verl_pipe/trainer/actor_backend.py) against a fake trainer and worker group: no Ray.

The fake records what reaches verl and the worker: which weights each old log-prob was computed with, the
mini-batch size verl's _update_actor was given, where group granularity's passes went. Every mode trains each
group once at θ_k, the trainer's config is never edited, and the whitened path's advantages are verl's over the
whole batch. The real worker and vLLM are the e2e suite's (tests/e2e/test_pipeline.py).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage

from verl_pipe.trainer.actor_backend import ActorBackend, StepOutcome
from verl_pipe.core.group_queue import Group, GroupQueue
from verl_pipe.core.timeline import StepTimeline
from verl_pipe.trainer.knobs import StepKnobs
from tests.fakes import fake_of
from verl_pipe.trainer import RolloutPipeTrainer
from verl_pipe.trainer.workers import PipeActorWorker
from verl_pipe.trainer.seam import LR_STEP_KEY, TrainerSeam

N, GPU, UNITS, R = 2, 2, 2, 3


@fake_of(PipeActorWorker, extra=("t",))
class FakeWorkers:
    def __init__(self, trainer):
        self.t = trainer

    def save_train_state(self, *args):
        self.t.log.append("save")
        self.t.saved_version = self.t.version
        return [{"theta_k_bytes": 1.0}]

    def enter_theta_k(self):
        self.t.held = self.t.version
        self.t.version = self.t.saved_version

    def leave_theta_k(self):
        self.t.version = self.t.held

    def begin_unit(self):
        self.t.log.append("begin")

    def accumulate_group(self, batch_td):
        self.t.log.append(("accumulate", batch_td.get("grad_buffer", None)))
        return {"metrics": {}}

    def finish_unit(self, loss_agg_mode, tokens, seqs, coeffs, lr_step=True):
        self.t.log.append(("finish", seqs, coeffs is not None))
        self.t.version += 1
        return [{"actor/grad_norm": 1.0, **self.t.lr_scheduler_step(lr_step)}]

    def step_lr_schedule(self):
        self.t.log.append("lr_step")
        return [self.t.lr_scheduler_step(True)]

    def update_actor(self, batch_td):
        raise AssertionError("the fake's _update_actor does not reach the worker group")


@fake_of(RolloutPipeTrainer, extra=("log", "lp_versions", "version", "saved_version", "held", "lr_steps",
                                    "lr_scheduler_step"),
         unused=("_group_filters", "stop_check", "progress_bar"))
class FakeTrainer:
    backend_cls = ActorBackend
    train = RolloutPipeTrainer.train
    _units_per_step = RolloutPipeTrainer._units_per_step
    actor_non_tensor_keys = RolloutPipeTrainer.actor_non_tensor_keys

    def __init__(self, estimator="grpo"):
        self.config = OmegaConf.create({
            "data": {"train_batch_size": GPU * UNITS},
            "algorithm": {"adv_estimator": estimator, "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": GPU, "loss_agg_mode": "token-mean",
                                            "use_kl_loss": False, "entropy_coeff": 0.0},
                                  "rollout": {"n": N, "temperature": 1.0}},
            "trainer": {"balance_batch": False},
            "rolloutpipe": {"theta_k": {"store": "device", "auto_margin_gib": None},
                            "fault": {"checkpoint_on_failure": True}, "micro_batch_order": "arrival"}})
        self.n, self.groups_per_unit = N, GPU
        self.configured_knobs = StepKnobs(mode="sync", granularity="minibatch", coalesce_log_probs=True)
        self.metrics, self.log, self.lp_versions = {}, [], []
        self.version = 0  # the actor's weights: k = 0 until the step's first optimizer step
        self.lr_steps: list[int] = []  # the optimizer steps (versions) after which the LR scheduler stepped
        self.use_reference_policy = False
        self.actor_wg = self.actor_rollout_wg = FakeWorkers(self)
        self.actor_seam = TrainerSeam(self)  # the real seam (its θ_k swap context) over the fake worker group

    def _fit_compute_log_prob(self, batch):
        self.lp_versions += [self.version] * (len(batch) // N)
        batch.batch["old_log_probs"] = torch.full_like(batch.batch["response_mask"], float(self.version))
        return batch

    def lr_scheduler_step(self, lr_step: bool) -> dict:
        """The worker's LR scheduler (verl's train_batch with update_lr_scheduler, our finish_unit): steps when
        told, after the optimizer step, and reports the LR it set (here: the number of scheduler steps so far)."""
        if not lr_step:
            return {}
        self.lr_steps.append(self.version)
        return {"actor/lr": float(len(self.lr_steps))}

    def _update_actor(self, batch):  # verl's signature; ``self`` is the backend's view
        mini = self.config.actor_rollout_ref.actor.ppo_mini_batch_size
        if isinstance(self.actor_rollout_wg, FakeWorkers):
            self.log.append(("update", mini, len(batch) // N))
            self._trainer.version += 1
            # the worker's update_actor: verl steps the scheduler unless our flag holds it (absent: verl's default)
            lr = self._trainer.lr_scheduler_step(batch.meta_info.get(LR_STEP_KEY, True))
            return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.0], **{k: [v] for k, v in lr.items()}}})
        # group granularity's accumulate_group, through verl's preprocessing
        assert LR_STEP_KEY not in batch.meta_info, "an accumulated pass takes no optimizer step"
        self.actor_rollout_wg.update_actor({"grad_buffer": batch.meta_info.get("grad_buffer")})
        return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.0]}})


def group(g: int, score: float) -> Group:
    rewards = torch.zeros(N, R)
    rewards[:, -1] = torch.tensor([score, score / 2 + g])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": torch.ones(N, R),
                                        "attention_mask": torch.ones(N, R + 1), "advantages": torch.zeros(N, R)},
                               non_tensors={"uid": np.array([f"u{g}"] * N, dtype=object)})
    return Group(g, data, 0, 0.0)


def queue_of(groups: list[Group]) -> GroupQueue:
    q = GroupQueue(weight_version=0)
    for g in groups:
        q.put(g)
    q.close()
    return q


@pytest.mark.parametrize("mode,granularity", [("sync", "minibatch"), ("cgp", "minibatch"), ("cgp", "group")])
@pytest.mark.parametrize("groups", [4, 3])  # a full batch, and a short last unit
def test_every_mode_trains_each_group_once_at_theta_k(mode, granularity, groups):
    t = FakeTrainer()
    arrived = [group(g, float(g % 2)) for g in (2, 0, 3, 1)[:groups]]
    out = t.train(queue_of(arrived), StepTimeline(1, GPU), mode=mode, granularity=granularity)
    assert isinstance(out, StepOutcome)
    assert sorted(g.index for g in out.trained) == sorted(g.index for g in arrived)
    assert len(out.batch) == groups * N and t.lp_versions == [0] * groups, "old log-probs at θ_k"
    assert set(out.batch.batch["old_log_probs"].unique().tolist()) == {0.0}
    assert len(out.unit_metrics) == -(-groups // GPU), "one optimizer step per unit"
    assert t.config.actor_rollout_ref.actor.ppo_mini_batch_size == GPU, "the config is never edited"
    if granularity == "minibatch":
        updates = [e[1:] for e in t.log if isinstance(e, tuple) and e[0] == "update"]
        assert updates == [(GPU, GPU), (groups - GPU, groups - GPU)], "a short last unit: one step of its own size"
    else:
        finishes = [e for e in t.log if isinstance(e, tuple) and e[0] == "finish"]
        assert [f[1] for f in finishes] == [GPU * N, (groups - GPU) * N]
        assert all(e[1] is None for e in t.log if isinstance(e, tuple) and e[0] == "accumulate")
    assert ("save" in t.log) == (mode == "cgp"), "θ_k kept for the later units in CGP only"



@pytest.mark.parametrize("mode,granularity,coalesce", [("sync", "minibatch", True), ("cgp", "minibatch", False),
                                                       ("cgp", "group", True)])
def test_the_steps_actor_metrics_are_verls_over_the_whole_batch(mode, granularity, coalesce):
    """Each unit's update reports its own values and each old-log-prob call its own entropy (verl's
    _fit_compute_log_prob: a token-mean over its rows); the step reports what verl's sync step reports on the same
    batch: the mean over the units and one token-mean over all the calls' rows, not the last unit's or call's. The
    units keep their own values."""

    class Reporting(FakeTrainer):
        def _fit_compute_log_prob(self, batch):
            gid = torch.tensor([float(u[1:]) for u in batch.non_tensor_batch["uid"]])
            batch.batch["gid"] = gid
            mask = batch.batch["response_mask"]
            self.metrics["actor/entropy"] = float((gid[:, None] * mask).sum() / mask.sum())  # each token: its group
            return super()._fit_compute_log_prob(batch)

        def _update_actor(self, batch):  # ``self``: the backend's view
            out = FakeTrainer._update_actor(self, batch)
            out.meta_info["metrics"]["actor/pg_loss"] = [float(batch.batch["gid"].mean())]
            return out

    class Workers(FakeWorkers):
        def finish_unit(self, loss_agg_mode, tokens, seqs, coeffs, lr_step=True):
            super().finish_unit(loss_agg_mode, tokens, seqs, coeffs, lr_step)
            return [{"actor/grad_norm": float(tokens)}]

    t = Reporting()
    t.actor_wg = t.actor_rollout_wg = Workers(t)
    arrived = [group(g, float(g % 2)) for g in (2, 0, 3, 1)]
    for g in arrived:
        g.data.batch["response_mask"][0, :g.index % R] = 0  # response tokens per group: 6, 5, 4, 6
    tokens = {g.index: int(g.data.batch["response_mask"].sum()) for g in arrived}
    out = t.train(queue_of(arrived), StepTimeline(1, GPU), mode=mode, granularity=granularity,
                  coalesce_log_probs=coalesce)
    whole = sum(g * n for g, n in tokens.items()) / sum(tokens.values())  # sync's one call over the batch
    assert out.metrics["actor/entropy"] == pytest.approx(whole, rel=1e-6)
    if granularity == "group":  # units (2, 0) and (3, 1), each a call of its own
        assert [m["actor/grad_norm"] for m in out.unit_metrics] == [tokens[2] + tokens[0], tokens[3] + tokens[1]]
        assert out.metrics["actor/grad_norm"] == pytest.approx((sum(tokens.values())) / 2)
    else:  # sync: units (0, 1) and (2, 3); cgp: (2, 0) and (3, 1), each a call of its own
        units = [[0, 1], [2, 3]] if mode == "sync" else [[2, 0], [3, 1]]
        assert [m["actor/pg_loss"] for m in out.unit_metrics] == [sum(u) / 2 for u in units]
        assert out.metrics["actor/pg_loss"] == pytest.approx(1.5), "the mean over the units, as in sync"

@pytest.mark.parametrize("mode,granularity", [("sync", "minibatch"), ("cgp", "minibatch"), ("cgp", "group")])
@pytest.mark.parametrize("groups", [4, 3, 2])  # a full batch, a short last unit, out of groups at a unit boundary
def test_the_lr_scheduler_steps_once_after_the_steps_last_optimizer_step(mode, granularity, groups):
    """verl steps the LR scheduler once per step (its last mini-batch) and reports the LR after it as actor/lr; a
    step here is one verl call per unit, and only the last one steps it (update_actor: LR_STEP_KEY; finish_unit:
    lr_step), or step_lr_schedule after the last one when the step runs out of groups at a unit boundary."""
    t = FakeTrainer()
    arrived = [group(g, float(g % 2)) for g in (2, 0, 3, 1)[:groups]]
    out = t.train(queue_of(arrived), StepTimeline(1, GPU), mode=mode, granularity=granularity)
    units = -(-groups // GPU)
    assert t.version == units and t.lr_steps == [units], "once, after the step's last optimizer step"
    assert ("lr_step" in t.log) == (mode == "cgp" and groups == GPU), "apart only when the step learns it late"
    assert [("actor/lr" in m) for m in out.unit_metrics] == [False] * (units - 1) + [True]
    assert out.metrics["actor/lr"] == 1.0, "the LR after the step's scheduler step, as verl reports it"
    out = t.train(queue_of(arrived), StepTimeline(2, GPU), mode=mode, granularity=granularity)
    assert t.lr_steps == [units, 2 * units] and out.metrics["actor/lr"] == 2.0, "one scheduler step per step"


def test_a_unit_across_two_coalesced_log_prob_calls():
    """Mini-batch CGP, coalesced: unit 0 takes the 3 groups queued (one old log-prob call at θ_k); the 4th arrives
    during unit 0's step and gets its own call, with θ_k swapped in; unit 1 is the 3rd group's rows of the first
    piece and the 4th's of the second, in FIFO order, with their token counts recounted for the unit."""
    t = FakeTrainer()
    arrived = [group(g, float(g % 2)) for g in (2, 0, 3, 1)]
    q = GroupQueue(weight_version=0)
    for g in arrived[:3]:
        q.put(g)
    feeder = threading.Timer(0.3, lambda: (q.put(arrived[3]), q.close()))
    feeder.start()
    made = []

    class Recording(ActorBackend):  # keeps the step's executor, to read unit 1's rows from it
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    out = t.train(q, StepTimeline(1, GPU), mode="cgp", granularity="minibatch", backend_cls=Recording)
    feeder.join()
    assert [g.index for g in out.trained] == [2, 0, 3, 1]
    assert t.lp_versions == [0] * 4, "both calls at θ_k"
    assert [e[1:] for e in t.log if isinstance(e, tuple) and e[0] == "update"] == [(GPU, GPU), (GPU, GPU)]
    assert out.batch.non_tensor_batch["uid"].tolist() == [f"u{g}" for g in (2, 2, 0, 0, 3, 3, 1, 1)]
    unit_1 = ActorBackend._rows_of(made[0], (3, 1))
    assert unit_1.non_tensor_batch["uid"].tolist() == ["u3", "u3", "u1", "u1"]
    assert "global_token_num" not in unit_1.meta_info and unit_1.meta_info["temperature"] == 1.0


def test_whitened_group_schedule_buffers_unit_zero_and_ends_with_verls_advantages():
    t = FakeTrainer("reinforce_plus_plus_baseline")
    arrived = [group(g, float(g % 2)) for g in range(4)]
    q = GroupQueue(weight_version=0)
    q.put(arrived[0])  # unit 0's first group arrives alone: the batch is not complete
    feeder = threading.Timer(0.2, lambda: ([q.put(g) for g in arrived[1:]], q.close()))
    feeder.start()
    out = t.train(q, StepTimeline(1, GPU), mode="cgp", granularity="group")
    feeder.join()
    assert out.buffered and set(out.buffered) <= {0, 1}
    buffers = [e[1] for e in t.log if isinstance(e, tuple) and e[0] == "accumulate" and e[1] is not None]
    assert set(buffers) == {"centered", "one"}
    assert [e[2] for e in t.log if isinstance(e, tuple) and e[0] == "finish"] == [True, False]
    assert out.metrics["rolloutpipe/groups_trained_before_batch_complete"] == len(out.buffered)
    b = out.batch
    fresh = DataProto.from_dict(tensors={"token_level_rewards": b.batch["token_level_rewards"].clone(),
                                         "response_mask": b.batch["response_mask"]},
                                non_tensors={"uid": b.non_tensor_batch["uid"]})
    expected = compute_advantage(fresh, adv_estimator="reinforce_plus_plus_baseline", num_repeat=N)
    torch.testing.assert_close(b.batch["advantages"], expected.batch["advantages"])


def test_checkpoint_at_an_earlier_step_leaves_the_trainer_alone():
    class Loader:
        def state_dict(self):
            return {"now": True}

    class T:
        global_steps, train_dataloader, seen = 7, Loader(), []

        def _save_checkpoint(self):  # verl's reads plain attributes of self
            self.seen.append((self.global_steps, self.train_dataloader.state_dict()))

    t = T()
    TrainerSeam(t).save_checkpoint(6, {"before_step_7": True})
    assert t.seen == [(6, {"before_step_7": True})]
    assert t.global_steps == 7 and t.train_dataloader.state_dict() == {"now": True}
