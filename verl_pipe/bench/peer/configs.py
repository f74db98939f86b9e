"""The two peer configurations and the Hydra overrides that run verl's V1 separate_async trainer on our stack.

Pure (no Ray): builds override lists on top of a bench config's own overrides, so the peer gets the same model,
data, batch shape, pools and core pinning as our modes. verl seams: ``trainer.v1.*`` and ``transfer_queue.*`` of
verl 0.9.1's ppo_trainer.yaml (read by PPOTrainer / PPOTrainerSeparateAsync / ReplayBufferAsync).
"""

from __future__ import annotations

from verl_pipe.core.variants import PEER_MODE_NAMES

# Mode names under which the integrator drops the results into the bench report (one per configuration): the
# variant table's (verl_pipe/core/variants.py).
MODE_NAMES = dict(PEER_MODE_NAMES)

# What each configuration sets in verl. onpolicy: nothing generated ahead (num_warmup_batches=0), staleness
# threshold 1 (ReplayBufferAsync drops a group whose prompt is older than the current step), so the step's
# batch is submitted in prepare_step and fully consumed by the step's parameter_sync_step mini-steps: nothing is
# in flight at the weight sync, hence no partial rollout. default: verl's own defaults (one batch ahead,
# threshold 8, partial rollout across the sync through FullyAsyncLLMServerClient).
CONFIGS: dict[str, dict] = {
    "onpolicy": {"num_warmup_batches": 0, "max_off_policy_threshold": 1},
    "default": {"num_warmup_batches": 1, "max_off_policy_threshold": 8},
}


def _int_setting(overrides: list[str], key: str, default: int | None = None) -> int:
    """The last value a Hydra override list gives ``key`` (an int), else ``default``."""
    value = None
    for o in overrides:
        k, sep, v = o.lstrip("+").partition("=")
        if sep and k == key:
            value = v
    if value is None:
        if default is None:
            raise ValueError(f"{key}: the peer needs it set in the bench overrides")
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key}={value!r}: expected an integer") from None


def peer_overrides(config: str, base: list[str], steps: int, storage_units: int = 2) -> list[str]:
    """Hydra overrides (rolloutpipe_trainer.yaml) for ``config`` on top of the bench's ``base`` overrides.

    Raises ValueError naming the setting when the batch shape cannot run separate_async
    (train_batch_size must be a multiple of ppo_mini_batch_size: verl asserts
    train_batch_size == parameter_sync_step * ppo_mini_batch_size)."""
    if config not in CONFIGS:
        raise ValueError(f"peer config {config!r}: expected one of {sorted(CONFIGS)}")
    if steps < 1:
        raise ValueError(f"steps={steps}: expected >= 1")
    if storage_units < 1:
        raise ValueError(f"transfer_queue.backend.SimpleStorage.num_data_storage_units={storage_units}: expected >= 1")
    batch = _int_setting(base, "data.train_batch_size", 8)
    mini = _int_setting(base, "actor_rollout_ref.actor.ppo_mini_batch_size", 4)
    if mini < 1 or batch % mini:
        raise ValueError(f"data.train_batch_size={batch} is not a multiple of "
                         f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}: verl's separate_async trains "
                         "train_batch_size / ppo_mini_batch_size mini-batches per weight sync")
    c = CONFIGS[config]
    return list(base) + [
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=separate_async",
        f"trainer.v1.separate_async.parameter_sync_step={batch // mini}",
        f"trainer.v1.separate_async.num_warmup_batches={c['num_warmup_batches']}",
        "trainer.v1.separate_async.hybrid_rollout.enable_switch=false",
        f"trainer.v1.sampler.max_off_policy_threshold={c['max_off_policy_threshold']}",
        "trainer.v1.sampler.max_off_policy_strategy=drop",
        "transfer_queue.enable=true",
        # verl's default is 8 storage actors; 2 hold a few hundred samples with less start-up on 2 cores.
        f"transfer_queue.backend.SimpleStorage.num_data_storage_units={storage_units}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
    ]
