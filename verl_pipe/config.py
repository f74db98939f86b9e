"""Validation of a run's config, before Ray starts.

Every message names the offending key (its full path) and what is allowed, so a user can fix
the command line without reading our code. Two parts:

- ``ROLLOUTPIPE``: every key under ``rolloutpipe:`` with its type and range. Unknown keys are
  refused with a did-you-mean suggestion (Hydra lets ``+rolloutpipe.x=...`` and recipe files add
  keys freely, so a typo would otherwise be ignored silently).
- the verl keys verl_pipe depends on (batching, estimator, KL, critic, offload, weight sync, ...),
  checked in ``validate()`` below the table.
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from omegaconf.errors import MissingMandatoryValue

from verl_pipe import estimators
from verl_pipe.assets import TASKS as _TINY_TASKS  # the embedded tiny tasks (that package imports nothing heavy)
from verl_pipe.core.admission import FGD_LENGTHS, REST_ORDER_CHOICES
from verl_pipe.core.micro_batches import ORDERS as MICRO_BATCH_ORDERS
from verl_pipe.core.minibatch_order import MINIBATCH_ORDERS
from verl_pipe.core.release import UNIT_FILLS
from verl_pipe.core.rollout_core import ON_REWARD_FAILURE
from verl_pipe.core.variants import FGD_AUTO, GRANULARITIES, pipelines, resolve_fgd
from verl_pipe.core.variants import TRAINER_MODES as MODES
from verl_pipe.data_check import ON_BAD_RECORD
from verl_pipe.errors import ConfigError  # defined there (no omegaconf); verl_pipe.config.ConfigError stays public

PLATFORMS = ("cpu", "gpu")
ON_REQUEST_FAILURE = ("fail", "drop_group")
# Which estimators stream, and how: verl_pipe/estimators.py (register_streaming, beside verl's register_adv_est).
# verl estimators that are not group-based: verl_pipe computes advantages per group (sync mode
# recomputes only the batch-normalized ones over the whole batch), so these would be wrong or fail.
NOT_GROUP_ESTIMATORS = {
    "gae": "needs a critic's values (GAE); verl_pipe trains no critic",
    "remax": "needs a greedy baseline rollout per prompt (reward_baselines), which verl_pipe does not generate",
    "reinforce_plus_plus": "whitens returns over the whole batch of single samples, not within a group",
    "gdpo": "whitens over the whole batch after per-group normalization; verl_pipe does not recompute it over "
            "the batch",
}
# Loss aggregations whose normalizer group granularity can rescale (verl_pipe.trainer.workers.unit_loss_scale).
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")
# Where θ_k and the optimizer's rollback snapshot live (verl_pipe.trainer.theta_store.PLACEMENTS; not imported here:
# it imports torch).
THETA_K_PLACEMENTS = ("device", "pinned", "auto")
# Weight-sync backends: naive is verl's colocated engine; separate pools need one that crosses pools.
CPU_CHECKPOINT_BACKENDS = ("ray_store",)
CHECKPOINT_BACKEND_KEY = "actor_rollout_ref.rollout.checkpoint_engine.backend"
# Backends that keep one collective group across syncs unless verl's own `rebuild_group` engine argument is
# set (verl 0.9.1: NCCLCheckpointEngine.init_process_group asserts an unchanged rank and world size when the
# group exists; HCCLCheckpointEngine registers as "nccl" on Ascend and does the same). A restarted replica is
# a new process and a retired one shrinks the group, so with rebuild_group=false the next sync asserts or hangs.
FIXED_GROUP_BACKENDS = ("nccl",)
CUSTOM_BACKEND_KEY = "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module"
# verl's NCCL engine with a group per sync, a deadline and a teardown when a peer dies mid-sync (registered over
# verl's "nccl"); verl's own engine would wait for a dead replica until weight_sync_timeout_s and could not sync again.
NCCL_ENGINE_MODULE = "verl_pipe.platform.nccl_engine"


class CpuBf16Warning(UserWarning):
    """bf16 compute asked for on a CPU without native bf16 (verl_pipe.platform.cpu_info.bf16_problem)."""


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"{key}: {msg}")


def groups_per_unit(config: DictConfig) -> int:
    return int(config.actor_rollout_ref.actor.ppo_mini_batch_size)


# ---------------------------------------------------------------- rules for single values


@dataclass(frozen=True)
class Rule:
    allowed: str  # what the message says is allowed
    ok: Callable[[Any], bool]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def choice(*values: str) -> Rule:
    return Rule("one of " + ", ".join(values), lambda v: isinstance(v, str) and v in values)


def integer(lo: int, null: bool = False) -> Rule:
    allowed = f"an integer >= {lo}"
    return Rule(f"null or {allowed}" if null else allowed,
                lambda v: (null and v is None) or (_is_int(v) and v >= lo))


BOOLEAN = Rule("true or false", lambda v: isinstance(v, bool))
NICE = Rule("an integer from 0 to 19 (a Linux nice value)", lambda v: _is_int(v) and 0 <= v <= 19)
SECONDS = Rule("null (no deadline) or a number of seconds > 0", lambda v: v is None or (_is_number(v) and v > 0))
PATH_OR_NULL = Rule("null or a path", lambda v: v is None or (isinstance(v, str) and v.strip() != ""))
CLASS_PATH = Rule("null or a class path 'package.module.ClassName'",
                  lambda v: v is None or (isinstance(v, str) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", v)))


def _is_cpu_list(v) -> bool:
    from verl_pipe.platform.env import parse_cpu_list

    if isinstance(v, bool) or not isinstance(v, (str, int)):
        return False
    try:
        parse_cpu_list(str(v))
    except ValueError:
        return False
    return True


def _check_model_size(value, key: str, config: DictConfig) -> None:
    from verl_pipe.assets.model_sizes import MODEL_SIZES

    _check_value(Rule("one of " + ", ".join(MODEL_SIZES), lambda v: isinstance(v, str) and v in MODEL_SIZES),
                 value, key)


CPU_LIST = Rule("a Linux CPU list such as '0', '0-3' or '0,2'", _is_cpu_list)
SYSTEM_CORES = Rule("'rollout', 'all' or a Linux CPU list such as '0'", lambda v: v in ("rollout", "all")
                    or _is_cpu_list(v))
FGD_WINDOW = Rule("null (max_num_seqs), 'auto' (two training units' requests) or an integer >= 1, or 'adaptive' "
                  "(the default: max_num_seqs plus a refill margin, docs/fgd.md)",
                  lambda v: v is None or v in ("auto", "adaptive") or (_is_int(v) and v >= 1))
FRONTIER_GROUPS = Rule("'auto' or an integer >= 1", lambda v: v == "auto" or (_is_int(v) and v >= 1))
DISPATCH_ORDER = Rule("null, group_major or interleave:<k> with k >= 1",
                      lambda v: v is None or v == "group_major"
                      or (isinstance(v, str) and re.fullmatch(r"interleave:[1-9]\d*", v) is not None))
INTERNAL = object()  # written by the launcher (data check counts), not set by users


def _check_workload(value, key: str, config: DictConfig) -> None:
    """rolloutpipe.workload: null or a length spec as verl_pipe.core.workload.from_spec reads it."""
    if value is None:
        return
    if not isinstance(value, DictConfig):
        raise _err(key, f"got {value!r}; allowed: null or a mapping such as {{kind: lognormal, median: 12, "
                        "sigma: 0.8, rho: 0.7, cap: 32, seed: 0}} or {kind: equal, length: 16}")
    kind = value.get("kind", "lognormal")
    keys = {"lognormal": ("kind", "name", "seed", "median", "mean", "sigma", "rho", "cap", "prompts", "cross_epoch"),
            "equal": ("kind", "name", "seed", "length")}
    if kind not in keys:
        raise _err(f"{key}.kind", f"got {kind!r}; allowed: one of lognormal, equal")
    for k in value:
        if k not in keys[kind]:
            raise _err(f"{key}.{k}", f"unknown key for kind {kind}{_did_you_mean(k, keys[kind], key)}; "
                                     f"allowed: {', '.join(keys[kind])}")
    max_resp = config.data.max_response_length
    length_rule = Rule(f"an integer between 1 and data.max_response_length={max_resp}",
                       lambda v: _is_int(v) and 1 <= v <= max_resp)
    rules = {"name": Rule("a string", lambda v: isinstance(v, str)), "seed": integer(0)}
    if kind == "equal":
        rules["length"] = length_rule
        required = ("length",)
    else:
        rules.update(cap=length_rule, sigma=Rule("a number >= 0", lambda v: _is_number(v) and v >= 0),
                     rho=Rule("a number in [0, 1]", lambda v: _is_number(v) and 0 <= v <= 1),
                     median=Rule("a number > 0", lambda v: _is_number(v) and v > 0),
                     mean=Rule("a number > 0", lambda v: _is_number(v) and v > 0),
                     prompts=Rule("null (new prompts every step) or a multiple of data.train_batch_size",
                                  lambda v: v is None or (_is_int(v) and v >= 1
                                                          and v % int(config.data.train_batch_size) == 0)),
                     cross_epoch=Rule("a number in [0, 1]", lambda v: _is_number(v) and 0 <= v <= 1))
        required = ("sigma", "rho", "cap")
        if ("mean" in value) == ("median" in value):
            raise _err(f"{key}.median", "give exactly one of median, mean (the log-normal's body before the cap)")
    for k in required:
        if k not in value:
            raise _err(f"{key}.{k}", f"missing; kind {kind} needs {', '.join(required)}")
    for k in value:
        if k in rules:
            _check_value(rules[k], value.get(k), f"{key}.{k}")


def _check_fgd_policy(value, key: str, config: DictConfig) -> None:
    """rolloutpipe.fgd.policy: a class path 'package.module:Class' naming an admission policy, imported here (at
    launch) so a typo or a class that is not a policy fails before any worker starts."""
    from verl_pipe.core.admission import PolicyPathError, load_policy

    try:
        load_policy(value, key)
    except PolicyPathError as e:
        raise ConfigError(str(e)) from None


MULTITURN_AGENT = "verl_pipe_multiturn"  # verl_pipe.rollout.multiturn.AGENT_NAME (not imported here: it imports verl)


def _check_multiturn(value, key: str, config: DictConfig) -> None:
    """rolloutpipe.multiturn: null (single-turn) or the toy environment's settings
    (verl_pipe.assets.multiturn_env.EnvConfig), with the multi-turn agent loop selected."""
    if value is None:
        return
    if not isinstance(value, DictConfig):
        raise _err(key, f"got {value!r}; allowed: null (single-turn) or a mapping such as {{seed: 0, "
                        "turns: {median: 2, sigma: 0.8, rho: 0.7, cap: 4}, latency_s: {median: 0.05, sigma: 1.0, "
                        "rho: 0.7, cap: 2.0}, turn_max_tokens: 16, tool_failure_p: 0.0, on_tool_failure: zero_reward}")
    from verl_pipe.assets.multiturn_env import EnvConfig

    try:
        EnvConfig.from_dict(OmegaConf.to_container(value, resolve=True))
    except (TypeError, ValueError) as e:
        raise _err(key, str(e)) from None
    agent = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.default_agent_loop")
    if agent != MULTITURN_AGENT:
        raise _err(key, f"is set but actor_rollout_ref.rollout.agent.default_agent_loop is {agent!r}; set it to "
                        f"{MULTITURN_AGENT} (and agent_loop_config_path to "
                        "pkg://verl_pipe.recipes/lib/multiturn_agent_loops.yaml), or rolloutpipe.multiturn=null")
    if not OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_config_path"):
        raise _err(key, "is set but actor_rollout_ref.rollout.agent.agent_loop_config_path is null: verl's own "
                        "agent-loop workers (validation) find the agent loop only through that file; set it to "
                        "pkg://verl_pipe.recipes/lib/multiturn_agent_loops.yaml")
    if OmegaConf.select(config, "rolloutpipe.workload") is not None:
        raise _err(key, "and rolloutpipe.workload are both set: the workload fixes single-turn response lengths, the "
                        "multi-turn environment draws its own turns and tool latencies; set rolloutpipe.workload=null")


# Every key under rolloutpipe: a Rule, a nested table, INTERNAL, or a function (value, key, config).
ROLLOUTPIPE: dict[str, Any] = {
    "mode": choice(*MODES),
    "trainer_class": CLASS_PATH,
    "platform": choice(*PLATFORMS),
    "cpu": {
        "rollout_cores": CPU_LIST,
        "trainer_cores": CPU_LIST,
        "system_cores": SYSTEM_CORES,
        "trainer_nice": NICE,
        "kv_cache_gib": integer(1),
        "ray_num_cpus": integer(1),
    },
    "tiny_assets": {
        "enable": BOOLEAN,
        "task": choice(*sorted(_TINY_TASKS)),
        "size": _check_model_size,
        "cache_dir": PATH_OR_NULL,
        "warm_start": {
            "steps": integer(0),
            "lr": Rule("a number > 0", lambda v: _is_number(v) and v > 0),
            "batch_size": integer(1),
            "length_batches": BOOLEAN,
        },
    },
    "trace_dir": PATH_OR_NULL,
    "cgp": {"granularity": choice(*GRANULARITIES), "coalesce_log_probs": BOOLEAN, "unit_fill": choice(*UNIT_FILLS)},
    "micro_batch_order": choice(*MICRO_BATCH_ORDERS),
    "minibatch_order": choice(*MINIBATCH_ORDERS),
    "theta_k": {
        "store": choice(*THETA_K_PLACEMENTS),
        "auto_margin_gib": Rule("null (a quarter of the device's memory) or a number of GiB >= 0",
                                lambda v: v is None or (_is_number(v) and v >= 0)),
    },
    "fgd": {
        "enable": Rule("true, false or 'auto' (on with mode cgp, off with sync)",
                       lambda v: isinstance(v, bool) or v == FGD_AUTO),
        "frontier_groups": FRONTIER_GROUPS,
        "slack": integer(0),
        "window": FGD_WINDOW,
        "policy": _check_fgd_policy,
        "lengths": choice(*FGD_LENGTHS),
        "rest_order": choice(*REST_ORDER_CHOICES),
    },
    "dispatch": {
        "order": DISPATCH_ORDER,
        "window": integer(1, null=True),
    },
    "filter_zero_variance": BOOLEAN,
    "allow_ray_store_on_gpu": BOOLEAN,
    "oversample": integer(0),
    "request_timeout_s": SECONDS,
    "reward": {"score_by_group": BOOLEAN, "timeout_s": SECONDS, "on_failure": choice(*ON_REWARD_FAILURE)},
    "weight_sync_timeout_s": SECONDS,
    "nccl_sync": {
        "min_gib_per_s": Rule("null (weight_sync_timeout_s alone) or a bandwidth floor in GiB/s > 0",
                              lambda v: v is None or (_is_number(v) and v > 0)),
        "setup_s": Rule("a number of seconds > 0", lambda v: _is_number(v) and v > 0),
    },
    "workload": _check_workload,
    "multiturn": _check_multiturn,
    "fault": {
        "replica_restart": BOOLEAN,
        "on_request_failure": choice(*ON_REQUEST_FAILURE),
        "max_request_retries": integer(0),
        "replica_restart_timeout_s": SECONDS,
        "health_check_timeout_s": SECONDS,
        "checkpoint_on_failure": BOOLEAN,
        "on_bad_record": choice(*ON_BAD_RECORD),
    },
    "data_check_counts": INTERNAL,
}


def schema_leaves(table: dict = ROLLOUTPIPE, prefix: str = "rolloutpipe") -> list[str]:
    """Full paths of every user key the table checks (for tests and docs)."""
    out = []
    for k, spec in table.items():
        if isinstance(spec, dict):
            out.extend(schema_leaves(spec, f"{prefix}.{k}"))
        elif spec is not INTERNAL:
            out.append(f"{prefix}.{k}")
    return out


def _did_you_mean(key: str, siblings, prefix: str) -> str:
    close = difflib.get_close_matches(key, list(siblings), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {prefix}.{close[0]}?)"
    # Maybe the right name at the wrong level, e.g. rolloutpipe.window for rolloutpipe.fgd.window.
    leaves = schema_leaves()
    close = difflib.get_close_matches(key, [p.rsplit(".", 1)[1] for p in leaves], n=1, cutoff=0.8)
    if close:
        return f" (did you mean {' or '.join(p for p in leaves if p.endswith('.' + close[0]))}?)"
    return ""


def _check_value(rule: Rule, value, key: str) -> None:
    if not rule.ok(value):
        raise _err(key, f"got {value!r}; allowed: {rule.allowed}")


def _check_table(node: DictConfig, table: dict, prefix: str, config: DictConfig) -> None:
    for key in node:
        path = f"{prefix}.{key}"
        if key not in table:
            raise _err(path, f"unknown key{_did_you_mean(str(key), table, prefix)}; keys under {prefix}: "
                             f"{', '.join(k for k in table if table[k] is not INTERNAL)}")
        spec = table[key]
        try:
            value = node.get(key)
        except MissingMandatoryValue:
            raise _err(path, "is mandatory (???) but not set") from None
        if spec is INTERNAL:
            continue
        if isinstance(spec, dict):
            if not isinstance(value, DictConfig):
                raise _err(path, f"got {value!r}; allowed: a mapping with keys {', '.join(spec)}")
            _check_table(value, spec, path, config)
        elif isinstance(spec, Rule):
            _check_value(spec, value, path)
        else:
            spec(value, path, config)


# ---------------------------------------------------------------- the whole config


def validate(config: DictConfig, check_paths: bool = True) -> None:
    rp = config.get("rolloutpipe")
    if not isinstance(rp, DictConfig):
        raise _err("rolloutpipe", "missing: compose the run from conf/rolloutpipe_trainer.yaml (or a recipe on it)")
    _check_table(rp, ROLLOUTPIPE, "rolloutpipe", config)
    _check_verl_keys(config)
    _validate_batching(config)
    _validate_algorithm(config)
    _validate_trainer_pool(config)
    _validate_rollout(config)
    _validate_verl_hooks(config)
    if rp.platform == "cpu":
        _validate_cpu(config)
    elif config.trainer.device == "cpu":
        raise _err("trainer.device", "is 'cpu' with rolloutpipe.platform=gpu; set trainer.device=cuda "
                                     "(or rolloutpipe.platform=cpu)")
    if check_paths:
        validate_paths(config)


def _check_verl_keys(config: DictConfig) -> None:
    """Every other key is one verl 0.9.1 knows (verl_pipe/config_keys.py: its YAML and dataclasses)."""
    from verl_pipe.config_keys import UnknownKeyError, check_known_keys

    try:
        check_known_keys(config)
    except UnknownKeyError as e:
        raise ConfigError(str(e)) from None


def _int_at_least(config: DictConfig, key: str, lo: int) -> int:
    value = OmegaConf.select(config, key)
    if not _is_int(value) or value < lo:
        raise _err(key, f"got {value!r}; allowed: an integer >= {lo}")
    return value


def _validate_batching(config: DictConfig) -> None:
    rp = config.rolloutpipe
    actor = config.actor_rollout_ref.actor
    bsz = _int_at_least(config, "data.train_batch_size", 1)
    mini = _int_at_least(config, "actor_rollout_ref.actor.ppo_mini_batch_size", 1)
    if bsz % mini != 0:
        raise _err("actor_rollout_ref.actor.ppo_mini_batch_size",
                   f"data.train_batch_size={bsz} must be a multiple of ppo_mini_batch_size={mini} "
                   "(a training unit is one PPO mini-batch of whole groups)")
    n = _int_at_least(config, "actor_rollout_ref.rollout.n", 1)
    epochs = _int_at_least(config, "actor_rollout_ref.actor.ppo_epochs", 1)
    if epochs != 1 and pipelines(rp.mode):
        raise _err("actor_rollout_ref.actor.ppo_epochs",
                   f"got {epochs}; CGP streams each unit once: only ppo_epochs=1 (or rolloutpipe.mode=sync)")
    prompt = _int_at_least(config, "data.max_prompt_length", 1)
    response = _int_at_least(config, "data.max_response_length", 1)
    max_model_len = config.actor_rollout_ref.rollout.get("max_model_len")
    if max_model_len is not None and max_model_len < prompt + response:
        raise _err("actor_rollout_ref.rollout.max_model_len",
                   f"got {max_model_len}; must be null or >= data.max_prompt_length + data.max_response_length "
                   f"= {prompt + response}")

    if pipelines(rp.mode) and rp.cgp.granularity == "group":
        loss_agg = actor.get("loss_agg_mode", "token-mean")
        if loss_agg not in LOSS_AGG_MODES:
            raise _err("actor_rollout_ref.actor.loss_agg_mode",
                       f"got {loss_agg!r}; group granularity rescales the loss normalizer and supports: "
                       f"{', '.join(LOSS_AGG_MODES)}")
    if rp.cgp.granularity == "group" and not actor.use_dynamic_bsz:
        for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"):
            micro = OmegaConf.select(config, key)
            if micro and n % int(micro) != 0:
                raise _err(key, f"group granularity trains one group (n={n} rows) at a time; the micro-batch "
                                f"size {micro} must divide n (or set actor_rollout_ref.actor.use_dynamic_bsz=true)")


def _validate_algorithm(config: DictConfig) -> None:
    rp = config.rolloutpipe
    algo = config.algorithm
    est = str(algo.adv_estimator)
    n = int(config.actor_rollout_ref.rollout.n)
    import_error = None
    if estimators.streaming(est) is None and rp.get("trainer_class"):
        # a custom estimator registers in the module of the trainer class (or one it imports)
        import_error = _import_module_of(str(rp.trainer_class))
    if estimators.streaming(est) is None:
        why = NOT_GROUP_ESTIMATORS.get(est, "is not registered with verl_pipe.estimators.register_streaming")
        if import_error:
            why += f" (importing rolloutpipe.trainer_class's module failed: {import_error})"
        raise _err("algorithm.adv_estimator",
                   f"{est!r} {why}. verl_pipe computes advantages per group; allowed: "
                   f"{', '.join(estimators.registered(estimators.GROUP))} (any mode), "
                   f"{', '.join(estimators.registered(estimators.AFFINE_BATCH))} (sync, or CGP at group granularity), "
                   f"{', '.join(estimators.registered(estimators.BATCH))} (rolloutpipe.mode=sync). A custom "
                   "group-based estimator: register it with verl_pipe.estimators.register_streaming beside verl's "
                   "core_algos.register_adv_est, in the module of rolloutpipe.trainer_class or one it imports "
                   "(docs/extending.md)")
    if n < 2:
        raise _err("actor_rollout_ref.rollout.n",
                   f"the group-based estimator {est!r} needs at least 2 responses per prompt, got n={n}")
    if pipelines(rp.mode):
        _validate_batch_normalized_in_cgp(config, est)
    if algo.get("use_kl_in_reward", False):
        raise _err("algorithm.use_kl_in_reward",
                   "must be false: verl_pipe computes a group's advantages when it completes, before reference "
                   "log-probs exist, so a KL penalty in the reward would be ignored; use "
                   "actor_rollout_ref.actor.use_kl_loss=true instead")
    if config.get("critic") is not None and config.critic.get("enable"):
        raise _err("critic.enable", "must be null or false: verl_pipe trains no critic (use a group-based estimator)")
    bypass = OmegaConf.select(config, "algorithm.rollout_correction.bypass_mode", default=False)
    if bypass and not config.actor_rollout_ref.rollout.calculate_log_probs:
        raise _err("actor_rollout_ref.rollout.calculate_log_probs",
                   "must be true with algorithm.rollout_correction.bypass_mode=true (old log-probs are then "
                   "vLLM's); or set bypass_mode=false to recompute them under θ_k")


def _import_module_of(fqn: str) -> str | None:
    """Imports the module of a class path, so that its estimator registrations run; returns the import error."""
    import importlib

    try:
        importlib.import_module(fqn.rsplit(".", 1)[0])
    except Exception as e:  # noqa: BLE001 -- reported in the estimator's error message
        return f"{type(e).__name__}: {e}"
    return None


def cgp_estimator_problem(est: str, granularity: str) -> str | None:
    """Why CGP at this granularity cannot train estimator ``est`` exactly (None: it can, or it is unknown: the
    config check reports that)."""
    if estimators.streaming(est) is None:
        return None
    return estimators.cgp_problem(est, granularity)


def _validate_batch_normalized_in_cgp(config: DictConfig, est: str) -> None:
    problem = cgp_estimator_problem(est, config.rolloutpipe.cgp.granularity)
    if problem:
        raise _err("algorithm.adv_estimator", problem)
    if estimators.streaming(est) != estimators.AFFINE_BATCH:
        return
    # Groups trained before the batch is complete rely on the policy gradient being linear in the
    # advantages at θ_k: verl's vanilla PPO loss, old log-probs recomputed under θ_k.
    loss_mode = OmegaConf.select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", default="vanilla")
    if loss_mode != "vanilla":
        raise _err("actor_rollout_ref.actor.policy_loss.loss_mode",
                   f"got {loss_mode!r}; {est!r} in CGP needs 'vanilla' (its first unit is trained before the batch "
                   "statistics exist, which is exact only for a loss linear in the advantages at θ_k)")
    if OmegaConf.select(config, "algorithm.rollout_correction.bypass_mode", default=False):
        raise _err("algorithm.rollout_correction.bypass_mode",
                   f"must be false for {est!r} in CGP: with vLLM's log-probs as old log-probs the PPO ratio is not 1 "
                   "at θ_k, tokens can be clipped and the first unit's gradient is no longer linear in the "
                   "advantages")


def _validate_trainer_pool(config: DictConfig) -> None:
    rp = config.rolloutpipe
    actor = config.actor_rollout_ref.actor
    if config.actor_rollout_ref.hybrid_engine:
        raise _err("actor_rollout_ref.hybrid_engine",
                   "must be false: verl_pipe runs rollout and training on separate pools")
    units = int(config.data.train_batch_size) // groups_per_unit(config)
    if not pipelines(rp.mode) or units < 2:
        return
    # CGP with several units per step keeps θ_k in the worker's store (verl_pipe/trainer/theta_store.py) for later
    # units' old log-probs: persistent buffers beside this rank's FSDP2 shards, swapped in by rebinding the
    # shards' storage. Parameters that verl moves between host and device (offload) replace that storage
    # behind the store's back.
    fsdp = actor.get("fsdp_config") or {}
    for leaf in ("param_offload", "offload_policy"):
        if fsdp.get(leaf, False):
            raise _err(f"actor_rollout_ref.actor.fsdp_config.{leaf}",
                       f"must be false with rolloutpipe.mode=cgp and {units} units per step: the θ_k snapshot for "
                       "later units' old log-probs needs the actor's parameters on the device "
                       "(optimizer_offload is fine)")
    if actor.strategy != "fsdp2":
        raise _err("actor_rollout_ref.actor.strategy",
                   f"got {actor.strategy!r}; CGP with {units} units per step needs fsdp2 (rolloutpipe.theta_k.store "
                   "keeps this rank's FSDP2 shards, verl_pipe/trainer/theta_store.py)")


def _validate_rollout(config: DictConfig) -> None:
    rp = config.rolloutpipe
    rollout = config.actor_rollout_ref.rollout
    backend = OmegaConf.select(config, "actor_rollout_ref.rollout.checkpoint_engine.backend")
    if backend == "naive":
        raise _err("actor_rollout_ref.rollout.checkpoint_engine.backend",
                   "'naive' only works with rollout and actor colocated; verl_pipe's pools are separate: use "
                   "ray_store (CPU), nccl (GPU), or another cross-pool backend")
    if rp.platform == "cpu" and backend not in CPU_CHECKPOINT_BACKENDS:
        raise _err("actor_rollout_ref.rollout.checkpoint_engine.backend",
                   f"got {backend!r}; on CPU allowed: {', '.join(CPU_CHECKPOINT_BACKENDS)} (the others need "
                   "CUDA or RDMA)")
    if rp.platform == "gpu" and backend == "ray_store" and not rp.get("allow_ray_store_on_gpu", False):
        raise _err(CHECKPOINT_BACKEND_KEY,
                   "'ray_store' (weights through Ray's object store, host memory) with rolloutpipe.platform=gpu: "
                   "use nccl between GPU pools, or set rolloutpipe.allow_ray_store_on_gpu=true to ask for it")
    _validate_weight_sync_faults(config, backend)
    _validate_nccl_engine(config, backend)
    if rp.fgd.enable is True and not pipelines(rp.mode):
        raise _err("rolloutpipe.fgd.enable", "true: frontier-group dispatch feeds the CGP pipeline; set "
                   "rolloutpipe.mode=cgp, or rolloutpipe.fgd.enable=auto (on with cgp, off with sync) or false")
    fgd = resolve_fgd(rp.fgd.enable, str(rp.mode))
    if fgd and rollout.get("scheduling_policy", "fcfs") != "priority":
        raise _err("actor_rollout_ref.rollout.scheduling_policy",
                   "frontier-group dispatch sends per-request priorities; set it to 'priority'")
    if rollout.agent.get("default_agent_loop") == MULTITURN_AGENT and rp.get("multiturn") is None:
        raise _err("actor_rollout_ref.rollout.agent.default_agent_loop",
                   f"is {MULTITURN_AGENT} but rolloutpipe.multiturn is null; set rolloutpipe.multiturn to the "
                   "environment's settings (a mapping, {} for the defaults: docs/multiturn.md)")
    if (rp.platform == "cpu" or fgd) and rollout.name != "vllm":
        raise _err("actor_rollout_ref.rollout.name",
                   f"got {rollout.name!r}; allowed: vllm (" + ("the CPU build is vLLM's" if rp.platform == "cpu"
                                                               else "FGD's priorities need vLLM's scheduler") + ")")


def _validate_verl_hooks(config: DictConfig) -> None:
    """verl's trainer switches that RolloutPipeTrainer honours only in some settings: refused where not."""
    rp, trainer = config.rolloutpipe, config.trainer
    if trainer.get("val_only", False) and not trainer.get("val_before_train", True):
        raise _err("trainer.val_only", "needs trainer.val_before_train=true (as in verl, val_only stops the run after "
                                       "the validation before training)")
    if trainer.get("balance_batch", False) and pipelines(rp.mode) and rp.cgp.granularity == "group":
        raise _err("trainer.balance_batch",
                   "is applied per training unit (verl's _balance_batch over one PPO mini-batch); at "
                   "rolloutpipe.cgp.granularity=group each group is trained as it arrives and nothing is balanced: "
                   "set trainer.balance_batch=false, or rolloutpipe.cgp.granularity=minibatch")


def rollout_replicas(config: DictConfig) -> int:
    """How many vLLM replicas the rollout pool holds (verl: one per tensor x data x pipeline parallel group)."""
    r = config.actor_rollout_ref.rollout
    gpus = int(r.nnodes) * int(r.n_gpus_per_node)
    per_replica = (int(r.tensor_model_parallel_size) * int(r.get("data_parallel_size", 1) or 1)
                   * int(r.get("pipeline_model_parallel_size", 1) or 1))
    return max(1, gpus // max(1, per_replica))


def _validate_weight_sync_faults(config: DictConfig, backend) -> None:
    """A replica restart or retirement changes the weight-sync group; a fixed-group backend must rebuild it."""
    if backend not in FIXED_GROUP_BACKENDS:
        return
    kwargs = OmegaConf.select(config, f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{backend}",
                              default=None) or {}
    if kwargs.get("rebuild_group", False):
        return
    rebuild = f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{backend}.rebuild_group"
    why = (f"verl's {backend!r} checkpoint engine keeps one collective group and asserts an unchanged world size "
           f"unless {rebuild}=true, so the weight sync after a replica restart or retirement asserts or hangs")
    if config.rolloutpipe.fault.replica_restart:
        raise _err(CHECKPOINT_BACKEND_KEY,
                   f"{backend!r} with rolloutpipe.fault.replica_restart=true: {why}. Set {rebuild}=true (the GPU "
                   "recipes do; the group is rebuilt at every sync), or rolloutpipe.fault.replica_restart=false "
                   "with a single rollout replica")
    replicas = rollout_replicas(config)
    if replicas > 1:
        raise _err(CHECKPOINT_BACKEND_KEY,
                   f"{backend!r} with rolloutpipe.fault.replica_restart=false and {replicas} rollout replicas: a dead "
                   f"replica is retired and {why}. Set {rebuild}=true")


def _validate_nccl_engine(config: DictConfig, backend) -> None:
    """nccl must be verl_pipe's recoverable engine (imported by every worker through custom_backend_module)."""
    if backend != "nccl":
        return
    modules = OmegaConf.select(config, CUSTOM_BACKEND_KEY, default=None)
    listed = list(modules) if isinstance(modules, (list, ListConfig)) else [modules]
    if NCCL_ENGINE_MODULE not in listed:
        raise _err(CUSTOM_BACKEND_KEY,
                   f"got {modules!r} with checkpoint_engine.backend=nccl; it must import {NCCL_ENGINE_MODULE}: verl's "
                   "own NCCL engine waits for a replica that died mid-sync until rolloutpipe.weight_sync_timeout_s and "
                   "keeps its group, so the retry cannot create one (the GPU recipes set it)")


def _validate_cpu(config: DictConfig) -> None:
    from verl_pipe.platform.env import parse_cpu_list, run_cores

    cpu = config.rolloutpipe.cpu
    rollout = set(parse_cpu_list(str(cpu.rollout_cores)))
    trainer = set(parse_cpu_list(str(cpu.trainer_cores)))
    system_spec = str(cpu.get("system_cores", "all"))
    system = set() if system_spec in ("rollout", "all") else set(parse_cpu_list(system_spec))
    available = run_cores()
    for key, cores in (("rollout_cores", rollout), ("trainer_cores", trainer), ("system_cores", system)):
        missing = sorted(cores - available)
        if missing:
            raise _err(f"rolloutpipe.cpu.{key}",
                       f"cores {missing} do not exist here (available: {sorted(available)}); "
                       "the run asks for more cores than the machine has")
    if rollout & trainer:
        raise _err("rolloutpipe.cpu.trainer_cores",
                   f"overlaps rollout_cores on {sorted(rollout & trainer)}; the pools must use disjoint cores "
                   "or pipelining only time-slices them")
    if system & trainer:
        raise _err("rolloutpipe.cpu.system_cores",
                   f"overlaps trainer_cores on {sorted(system & trainer)}: the launcher, Ray and the rollout's "
                   "helper processes would time-slice with the trainer ('all' allows that on purpose)")
    if config.trainer.device != "cpu":
        raise _err("trainer.device", f"must be 'cpu' with rolloutpipe.platform=cpu, got {config.trainer.device!r}")
    if int(config.actor_rollout_ref.rollout.tensor_model_parallel_size) != 1:
        raise _err("actor_rollout_ref.rollout.tensor_model_parallel_size", "must be 1 on CPU")
    from verl_pipe.platform.cpu_info import bf16_problem

    problem = bf16_problem(config)
    if problem:
        warnings.warn(problem, CpuBf16Warning, stacklevel=2)


# A Hugging Face hub id, as verl's GPU users name models (``Qwen/Qwen3-1.7B``): transformers' repo-id shape (an
# optional owner, one slash, a name of letters, digits, '-', '_', '.'; no '--' or '..', not starting or ending with
# '-' or '.'). Checked for shape only, never fetched here (verl's workers download it).
HUB_ID = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?")


def is_hub_id(path: str) -> bool:
    text = str(path)
    return bool(HUB_ID.fullmatch(text)) and not text.startswith((".", "/", "~"))


def validate_paths(config: DictConfig, unset_ok: bool = False) -> None:
    """The model and data paths exist (or the model is a hub id). ``unset_ok``: an unset one passes (the launcher
    fills it with the tiny assets after this check: verl_pipe/launch/prepare.py)."""
    model = config.actor_rollout_ref.model.path
    if not model and not unset_ok:
        raise _err("actor_rollout_ref.model.path", "is not set (set it, or rolloutpipe.tiny_assets.enable=true)")
    if model and not Path(os.path.expanduser(str(model))).exists() and "://" not in str(model) \
            and not is_hub_id(model):
        raise _err("actor_rollout_ref.model.path",
                   f"{model} does not exist, and it is not a Hugging Face hub id (owner/name, e.g. "
                   "Qwen/Qwen3-1.7B)")
    for key in ("train_files", "val_files"):
        files = config.data[key]
        if not files and unset_ok:
            continue
        if not files:
            raise _err(f"data.{key}", "is not set (set it, or rolloutpipe.tiny_assets.enable=true)")
        for f in [files] if isinstance(files, str) else list(files):
            if not Path(os.path.expanduser(str(f))).exists() and "://" not in str(f):
                raise _err(f"data.{key}", f"{f} does not exist")


def resolve_pkg_path(path: str) -> str:
    """``pkg://package.name/rel/path`` -> the absolute path of that file of the installed package."""
    from importlib.resources import files

    package, _, rel = path[len("pkg://"):].partition("/")
    resolved = Path(str(files(package).joinpath(rel)))
    if not resolved.is_file():
        raise FileNotFoundError(f"{path}: no file {rel!r} in package {package} ({resolved})")
    return str(resolved)
