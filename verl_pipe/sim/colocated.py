"""verl's default step: the hybrid engine, rollout and training taking turns on every device.

verl 0.9.1's ``main_ppo`` runs its V1 synchronous trainer (``trainer.v1.trainer_mode=sync``,
``verl/trainer/ppo/v1/trainer_sync.py``) with ``actor_rollout_ref.hybrid_engine=true``: one worker group holds the
FSDP actor and a vLLM replica on each device (``tensor_model_parallel_size`` devices per replica). A step, as its
code runs it (``PPOTrainer.fit`` / ``_step_once`` in ``trainer_base.py``, the hooks in ``trainer_sync.py``):

1. **rollout** (inside ``timing_s/gen``): the step's prompts on every replica, the engines awake;
2. **sleep** (inside ``timing_s/gen``, ``on_sample_end``): ``CheckpointEngineManager.sleep_replicas`` drains each
   replica and calls vLLM's ``engine.sleep(level=2)`` (``vLLMHttpServer._sleep_hybrid``): weights and KV cache
   freed on the device (``rollout.free_cache_engine``, true by default);
3. **training** on every device: reward, batch balancing, old log-prob over the whole batch, reference log-prob
   (KL loss), advantages, and the actor's update, one optimizer step per PPO mini-batch — the schedule of our
   ``sync`` (``core/variants.py``: ``schedule_as``), with verl's trainer costs;
4. **weight reload** (``timing_s/update_weights``, ``PPOTrainerSync.on_step_end`` ->
   ``CheckpointEngineManager.update_weights`` with the ``naive`` backend -> ``ActorRolloutRefWorker.update_weights``
   in ``engine_workers.py``): the engine's weight memory resumed, the FSDP parameters gathered tensor by tensor
   (``get_per_tensor_param``) and copied into the sleeping engine (CUDA IPC), the parameters offloaded to the host
   when ``fsdp_config.param_offload`` is on (off by default), a barrier, the KV cache resumed and the prefix cache
   reset. The next step's rollout starts after it.

The parameters are costs per step (``ColocatedParams``): the sleep (2), the reload (4) and, where the trainer
offloads its parameters or optimizer (verl's ``param_offload`` / ``optimizer_offload``; both off by default),
the round trip of the offloaded states. The planner derives them from a hardware profile or a verl log
(``timing_s/update_weights`` is 4 as measured); docs/plan.md gives each figure's source.

The rollout is the simulator's (``simulate.rollout_for_mode("sync", ...)`` over every replica of the N devices) and
the training the trainer model's (``trainer.schedule``); this module only lays the four phases end to end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from verl_pipe.core.variants import variant
from verl_pipe.core.workload import Workload
from verl_pipe.sim.simulate import RolloutResult
from verl_pipe.sim.trainer import TrainerParams, schedule

MODE = "verl_colocated"  # the variant (verl_pipe/core/variants.py)


@dataclass(frozen=True)
class ColocatedParams:
    """What taking turns costs per step, in seconds: ``sleep_s`` (2: drain and free the engines),
    ``update_weights_s`` (4: resume the engine's memory, gather and copy the weights, resume the KV cache: verl's
    ``timing_s/update_weights``), ``offload_s`` (the trainer's offloaded states to the host and back, when verl
    offloads; 0 by default)."""

    sleep_s: float = 0.0
    update_weights_s: float = 0.0
    offload_s: float = 0.0

    def __post_init__(self):
        for k, v in asdict(self).items():
            if v < 0:
                raise ValueError(f"ColocatedParams.{k} must be >= 0, got {v}")

    @property
    def transition_s(self) -> float:
        """Everything a step spends switching between rollout and training."""
        return self.sleep_s + self.update_weights_s + self.offload_s


def colocated_step(rollout: RolloutResult, workload: Workload, trainer: TrainerParams, groups_per_unit: int,
                   params: ColocatedParams) -> dict:
    """One colocated step's figures from its rollout on every replica (``rollout``) and the trainer on every device
    (``trainer``, its ``num_gpus`` the same devices): the planner's figures (``step_time_s``, ``rollout_to_train_end_s``
    — rollout start to the last optimizer step —, ``trainer_wait_ratio``, ``rollout_end_s``, ``trainer_busy_s``,
    ``first_unit_ready_s``, ``weight_sync_s`` = the reload) and each phase (``sleep_s``, ``train_s``,
    ``update_weights_s``, ``offload_s``)."""
    train_start = rollout.rollout_end + params.sleep_s + params.offload_s / 2  # states back on the device
    plan = schedule(variant(MODE).schedule_as, rollout.completions, workload.seq_lens, trainer, groups_per_unit,
                    train_start)
    busy = sum(e - s for _, s, e, *_ in plan.spans)
    train_end = plan.end if plan.spans else train_start
    r2t = train_end
    step = train_end + params.offload_s / 2 + params.update_weights_s  # states to the host, then the reload
    return {"step_time_s": step, "rollout_to_train_end_s": r2t, "trainer_wait_ratio": 1 - busy / r2t if r2t else 0.0,
            "rollout_end_s": rollout.rollout_end, "trainer_busy_s": busy, "first_unit_ready_s": train_start,
            "weight_sync_s": params.update_weights_s, "sleep_s": params.sleep_s, "train_s": train_end - train_start,
            "update_weights_s": params.update_weights_s, "offload_s": params.offload_s}


def simulate_colocated(workload: Workload, engine, trainer: TrainerParams, replicas: int, groups_per_unit: int,
                       params: ColocatedParams, *, order: str = "group_major", window=None) -> dict:
    """The step of ``colocated_step`` with its rollout simulated here: verl's stock dispatch over ``replicas``
    engines (every device's, ``N / tensor_model_parallel_size``)."""
    from verl_pipe.sim.simulate import rollout_for_mode

    ro = rollout_for_mode("sync", workload, engine, replicas, groups_per_unit, window, order)
    return colocated_step(ro, workload, trainer, groups_per_unit, params)
