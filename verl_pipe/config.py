"""Validation of a run's config, before Ray starts.

Every message names the offending key and what is allowed, so a user can fix the
command line without reading our code.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

MODES = ("sync", "cgp")
GRANULARITIES = ("minibatch", "group")
PLATFORMS = ("cpu", "gpu")
# verl estimators whose advantage of a response depends only on its own group (uid): a group's
# advantages are final the moment it completes, so CGP can stream it.
STREAMABLE_ESTIMATORS = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "grpo_passk", "opo")
# Group-based estimators that also normalize across the whole batch (masked_whiten over the batch
# in reinforce_plus_plus_baseline, the batch's non-zero share in gpg, ...): exact only when the
# batch is complete, so sync mode only.
BATCH_NORMALIZED_ESTIMATORS = ("reinforce_plus_plus_baseline", "gpg", "optimal_token_baseline",
                               "tir_optimal_token_baseline")
GROUP_ESTIMATORS = STREAMABLE_ESTIMATORS + BATCH_NORMALIZED_ESTIMATORS


class ConfigError(ValueError):
    pass


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"{key}: {msg}")


def groups_per_unit(config: DictConfig) -> int:
    return int(config.actor_rollout_ref.actor.ppo_mini_batch_size)


def validate(config: DictConfig, check_paths: bool = True) -> None:
    rp = config.rolloutpipe
    if rp.mode not in MODES:
        raise _err("rolloutpipe.mode", f"unknown mode {rp.mode!r}; allowed: {', '.join(MODES)}")
    if rp.platform not in PLATFORMS:
        raise _err("rolloutpipe.platform", f"unknown platform {rp.platform!r}; allowed: {', '.join(PLATFORMS)}")
    if rp.cgp.granularity not in GRANULARITIES:
        raise _err("rolloutpipe.cgp.granularity",
                   f"unknown granularity {rp.cgp.granularity!r}; allowed: {', '.join(GRANULARITIES)}")

    bsz = int(config.data.train_batch_size)
    mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    if bsz < 1:
        raise _err("data.train_batch_size", f"must be >= 1, got {bsz}")
    if mini < 1 or bsz % mini != 0:
        raise _err("actor_rollout_ref.actor.ppo_mini_batch_size",
                   f"data.train_batch_size={bsz} must be a multiple of ppo_mini_batch_size={mini} "
                   "(a training unit is one PPO mini-batch of whole groups)")
    n = int(config.actor_rollout_ref.rollout.n)
    est = str(config.algorithm.adv_estimator)
    if est in GROUP_ESTIMATORS and n < 2:
        raise _err("actor_rollout_ref.rollout.n",
                   f"the group-based estimator {est!r} needs at least 2 responses per prompt, got n={n}")
    if est not in STREAMABLE_ESTIMATORS and rp.mode == "cgp":
        why = ("normalizes across the whole batch, so a group's advantages are not final when it completes"
               if est in BATCH_NORMALIZED_ESTIMATORS else "is not a group-based estimator")
        raise _err("algorithm.adv_estimator",
                   f"{est!r} {why}; CGP streams complete groups and supports: "
                   f"{', '.join(STREAMABLE_ESTIMATORS)} (use rolloutpipe.mode=sync for others)")
    if config.algorithm.get("use_kl_in_reward", False) and rp.mode == "cgp":
        raise _err("algorithm.use_kl_in_reward",
                   "KL in the reward needs reference log-probs before advantages; with CGP use "
                   "actor_rollout_ref.actor.use_kl_loss=true instead")
    if config.actor_rollout_ref.hybrid_engine:
        raise _err("actor_rollout_ref.hybrid_engine", "must be false: verl_pipe runs rollout and training on separate pools")
    if int(config.rolloutpipe.oversample) < 0:
        raise _err("rolloutpipe.oversample", f"must be >= 0, got {rp.oversample}")
    if int(config.actor_rollout_ref.actor.ppo_epochs) != 1 and rp.mode == "cgp":
        raise _err("actor_rollout_ref.actor.ppo_epochs", "CGP streams each unit once; only ppo_epochs=1 is supported")

    wl = rp.get("workload")
    if wl:
        kind = wl.get("kind", "lognormal")
        if kind not in ("lognormal", "equal"):
            raise _err("rolloutpipe.workload.kind", f"unknown kind {kind!r}; allowed: lognormal, equal")
        cap = int(wl.get("cap", wl.get("length", 0)))
        max_resp = int(config.data.max_response_length)
        if cap < 1 or cap > max_resp:
            raise _err("rolloutpipe.workload.cap" if kind == "lognormal" else "rolloutpipe.workload.length",
                       f"must be between 1 and data.max_response_length={max_resp}, got {cap}")

    if rp.cgp.granularity == "group" and not config.actor_rollout_ref.actor.use_dynamic_bsz:
        for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"):
            node, leaf = key.rsplit(".", 1)
            micro = OmegaConf.select(config, key)
            if micro and n % int(micro) != 0:
                raise _err(key, f"group granularity trains one group (n={n} rows) at a time; the micro-batch "
                                f"size {micro} must divide n (or set actor_rollout_ref.actor.use_dynamic_bsz=true)")

    order = rp.dispatch.order
    if order is not None and not (order == "group_major" or (str(order).startswith("interleave:")
                                                             and str(order).split(":", 1)[1].isdigit())):
        raise _err("rolloutpipe.dispatch.order", f"must be null, group_major or interleave:<k>, got {order!r}")
    if rp.dispatch.window is not None and (not isinstance(rp.dispatch.window, int) or rp.dispatch.window < 1):
        raise _err("rolloutpipe.dispatch.window", f"must be null or an integer >= 1, got {rp.dispatch.window!r}")

    fgd = rp.fgd
    fg = fgd.frontier_groups
    if not (fg == "auto" or (isinstance(fg, int) and fg >= 1)):
        raise _err("rolloutpipe.fgd.frontier_groups", f"must be 'auto' or an integer >= 1, got {fg!r}")
    if fgd.window is not None and (not isinstance(fgd.window, int) or fgd.window < 1):
        raise _err("rolloutpipe.fgd.window", f"must be null or an integer >= 1, got {fgd.window!r}")
    if fgd.enable and config.actor_rollout_ref.rollout.get("scheduling_policy", "fcfs") != "priority":
        raise _err("actor_rollout_ref.rollout.scheduling_policy",
                   "frontier-group dispatch sends per-request priorities; set it to 'priority'")
    if fgd.enable and rp.mode != "cgp":
        raise _err("rolloutpipe.fgd.enable", "frontier-group dispatch feeds the CGP pipeline; set rolloutpipe.mode=cgp")

    if rp.platform == "cpu":
        _validate_cpu(config)
    if check_paths:
        _validate_paths(config)


def _validate_cpu(config: DictConfig) -> None:
    from verl_pipe.platform.env import parse_cpu_list

    cpu = config.rolloutpipe.cpu
    try:
        rollout = set(parse_cpu_list(str(cpu.rollout_cores)))
    except ValueError as e:
        raise _err("rolloutpipe.cpu.rollout_cores", str(e)) from None
    try:
        trainer = set(parse_cpu_list(str(cpu.trainer_cores)))
    except ValueError as e:
        raise _err("rolloutpipe.cpu.trainer_cores", str(e)) from None
    available = os.sched_getaffinity(0)
    for key, cores in (("rollout_cores", rollout), ("trainer_cores", trainer)):
        missing = sorted(cores - available)
        if missing:
            raise _err(f"rolloutpipe.cpu.{key}",
                       f"cores {missing} do not exist here (available: {sorted(available)}); "
                       "the pools ask for more resources than the machine has")
    if rollout & trainer:
        raise _err("rolloutpipe.cpu.trainer_cores",
                   f"overlaps rollout_cores on {sorted(rollout & trainer)}; the pools must use disjoint cores "
                   "or pipelining only time-slices them")
    if config.trainer.device != "cpu":
        raise _err("trainer.device", f"must be 'cpu' with rolloutpipe.platform=cpu, got {config.trainer.device!r}")
    if int(config.actor_rollout_ref.rollout.tensor_model_parallel_size) != 1:
        raise _err("actor_rollout_ref.rollout.tensor_model_parallel_size", "must be 1 on CPU")


def _validate_paths(config: DictConfig) -> None:
    model = config.actor_rollout_ref.model.path
    if not model:
        raise _err("actor_rollout_ref.model.path", "is not set (set it, or rolloutpipe.tiny_assets.enable=true)")
    if not Path(os.path.expanduser(str(model))).exists() and "://" not in str(model):
        raise _err("actor_rollout_ref.model.path", f"{model} does not exist")
    for key in ("train_files", "val_files"):
        files = config.data[key]
        if not files:
            raise _err(f"data.{key}", "is not set (set it, or rolloutpipe.tiny_assets.enable=true)")
        for f in [files] if isinstance(files, str) else list(files):
            if not Path(os.path.expanduser(str(f))).exists() and "://" not in str(f):
                raise _err(f"data.{key}", f"{f} does not exist")
