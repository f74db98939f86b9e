"""A table of bad configs: every rolloutpipe.* key and the verl keys verl_pipe depends on.

Each row is (command-line overrides, the key the message must name, a word of what is allowed).
``++`` adds or overrides, so a row works whether or not the base config already has the key.
"""

import pytest
from omegaconf import DictConfig

from verl_pipe.config import INTERNAL, ROLLOUTPIPE, ConfigError, schema_leaves, validate
from verl_pipe.launch.session import compose

CGP = "rolloutpipe.mode=cgp"
RPPB = "algorithm.adv_estimator=reinforce_plus_plus_baseline"
WL = "++rolloutpipe.workload="
LOGNORMAL = "kind: lognormal, median: 8, sigma: 1, rho: 0.5, cap: 16"
GPU = ["rolloutpipe.platform=gpu", "trainer.device=cuda"]
NCCL = "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"
REBUILD = "++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group=true"
NCCL_ENGINE = "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=verl_pipe.platform.nccl_engine"
MT = ["actor_rollout_ref.rollout.agent.default_agent_loop=verl_pipe_multiturn",
      "actor_rollout_ref.rollout.agent.agent_loop_config_path=pkg://verl_pipe.recipes/lib/multiturn_agent_loops.yaml"]

ROLLOUTPIPE_BAD = [
    (["rolloutpipe.mode=turbo"], "rolloutpipe.mode", "sync, cgp"),
    (["rolloutpipe.mode=true"], "rolloutpipe.mode", "sync, cgp"),
    (["rolloutpipe.trainer_class=MyTrainer"], "rolloutpipe.trainer_class", "package.module.ClassName"),
    (["rolloutpipe.trainer_class=3"], "rolloutpipe.trainer_class", "package.module.ClassName"),
    (["rolloutpipe.platform=tpu"], "rolloutpipe.platform", "cpu, gpu"),
    (["rolloutpipe.cpu.rollout_cores=abc"], "rolloutpipe.cpu.rollout_cores", "CPU list"),
    (["rolloutpipe.cpu.rollout_cores=0-4096"], "rolloutpipe.cpu.rollout_cores", "do not exist"),
    (["rolloutpipe.cpu.trainer_cores=1-x"], "rolloutpipe.cpu.trainer_cores", "CPU list"),
    (["rolloutpipe.cpu.trainer_cores=0"], "rolloutpipe.cpu.trainer_cores", "disjoint"),
    (["rolloutpipe.cpu.system_cores=trainer"], "rolloutpipe.cpu.system_cores", "'rollout', 'all'"),
    (["rolloutpipe.cpu.system_cores=1"], "rolloutpipe.cpu.system_cores", "overlaps trainer_cores"),
    (["rolloutpipe.cpu.trainer_nice=20"], "rolloutpipe.cpu.trainer_nice", "from 0 to 19"),
    (["rolloutpipe.cpu.trainer_nice=-1"], "rolloutpipe.cpu.trainer_nice", "from 0 to 19"),
    (["rolloutpipe.cpu.kv_cache_gib=0"], "rolloutpipe.cpu.kv_cache_gib", "integer >= 1"),
    (["rolloutpipe.cpu.kv_cache_gib=1.5"], "rolloutpipe.cpu.kv_cache_gib", "integer >= 1"),
    (["rolloutpipe.cpu.ray_num_cpus=0"], "rolloutpipe.cpu.ray_num_cpus", "integer >= 1"),
    (["rolloutpipe.tiny_assets.enable=maybe"], "rolloutpipe.tiny_assets.enable", "true or false"),
    (["rolloutpipe.tiny_assets.size=huge"], "rolloutpipe.tiny_assets.size", "one of tiny"),
    (["rolloutpipe.tiny_assets.task=chains"], "rolloutpipe.tiny_assets.task", "one of chain, digit_math"),
    (["rolloutpipe.tiny_assets.cache_dir=''"], "rolloutpipe.tiny_assets.cache_dir", "null or a path"),
    (["rolloutpipe.tiny_assets.warm_start.steps=-1"], "rolloutpipe.tiny_assets.warm_start.steps", "integer >= 0"),
    (["rolloutpipe.tiny_assets.warm_start.lr=0"], "rolloutpipe.tiny_assets.warm_start.lr", "number > 0"),
    (["rolloutpipe.tiny_assets.warm_start.batch_size=0"], "rolloutpipe.tiny_assets.warm_start.batch_size",
     "integer >= 1"),
    (["rolloutpipe.tiny_assets.warm_start.length_batches=sorted"], "rolloutpipe.tiny_assets.warm_start.length_batches",
     "true or false"),
    (["rolloutpipe.trace_dir=7"], "rolloutpipe.trace_dir", "null or a path"),
    (["rolloutpipe.cgp.granularity=token"], "rolloutpipe.cgp.granularity", "minibatch, group"),
    (["rolloutpipe.cgp.coalesce_log_probs=sometimes"], "rolloutpipe.cgp.coalesce_log_probs", "true or false"),
    (["rolloutpipe.cgp.unit_fill=arrival"], "rolloutpipe.cgp.unit_fill", "dispatch"),
    (["rolloutpipe.micro_batch_order=random"], "rolloutpipe.micro_batch_order", "length"),
    (["rolloutpipe.minibatch_order=shortest"], "rolloutpipe.minibatch_order", "length, dataloader"),
    (["rolloutpipe.theta_k.store=host"], "rolloutpipe.theta_k.store", "one of device, pinned, auto"),
    (["rolloutpipe.theta_k.store=true"], "rolloutpipe.theta_k.store", "one of device, pinned, auto"),
    (["rolloutpipe.theta_k.auto_margin_gib=-1"], "rolloutpipe.theta_k.auto_margin_gib", "number of GiB >= 0"),
    (["rolloutpipe.theta_k.auto_margin_gib=lots"], "rolloutpipe.theta_k.auto_margin_gib", "null"),
    (["++rolloutpipe.theta_k.placement=device"], "rolloutpipe.theta_k.placement", "keys under rolloutpipe.theta_k"),
    (["rolloutpipe.fgd.enable=yes"], "rolloutpipe.fgd.enable", "true, false or 'auto'"),
    (["rolloutpipe.fgd.frontier_groups=0"], "rolloutpipe.fgd.frontier_groups", "'auto' or an integer >= 1"),
    (["rolloutpipe.fgd.frontier_groups=all"], "rolloutpipe.fgd.frontier_groups", "'auto' or an integer >= 1"),
    (["rolloutpipe.fgd.slack=-1"], "rolloutpipe.fgd.slack", "integer >= 0"),
    (["rolloutpipe.fgd.window=0"], "rolloutpipe.fgd.window", "null (max_num_seqs), 'auto'"),
    (["rolloutpipe.fgd.window=2.5"], "rolloutpipe.fgd.window", "'auto' (two training units' requests) or an integer >= 1"),
    (["rolloutpipe.fgd.policy=FrontierPolicy"], "rolloutpipe.fgd.policy", "a class path 'package.module:Class'"),
    (["rolloutpipe.fgd.policy=no_such_pkg.mod:Policy"], "rolloutpipe.fgd.policy",
     "module 'no_such_pkg.mod' is not importable"),
    (["rolloutpipe.fgd.policy=verl_pipe.core.frontier:NoSuch"], "rolloutpipe.fgd.policy", "has no 'NoSuch'"),
    (["rolloutpipe.fgd.policy=verl_pipe.core.frontier:Request"], "rolloutpipe.fgd.policy",
     "is not an admission policy"),
    (["rolloutpipe.fgd.lengths=oracle"], "rolloutpipe.fgd.lengths", "predicted"),
    (["rolloutpipe.fgd.rest_order=lpt"], "rolloutpipe.fgd.rest_order", "auto, rank, shortest"),
    (["rolloutpipe.workload={kind: lognormal, median: 12, sigma: 0.8, rho: 0.7, cap: 32, prompts: 17}"],
     "rolloutpipe.workload.prompts", "a multiple of data.train_batch_size"),
    (["rolloutpipe.workload={kind: lognormal, median: 12, sigma: 0.8, rho: 0.7, cap: 32, cross_epoch: 1.5}"],
     "rolloutpipe.workload.cross_epoch", "a number in [0, 1]"),
    (["rolloutpipe.dispatch.order=random"], "rolloutpipe.dispatch.order", "group_major or interleave:<k>"),
    (["rolloutpipe.dispatch.order=interleave:0"], "rolloutpipe.dispatch.order", "interleave:<k>"),
    (["rolloutpipe.dispatch.window=0"], "rolloutpipe.dispatch.window", "null or an integer >= 1"),
    (["rolloutpipe.filter_zero_variance=1"], "rolloutpipe.filter_zero_variance", "true or false"),
    (["rolloutpipe.allow_ray_store_on_gpu=yes"], "rolloutpipe.allow_ray_store_on_gpu", "true or false"),
    (["rolloutpipe.oversample=-1"], "rolloutpipe.oversample", "integer >= 0"),
    (["rolloutpipe.oversample=2.5"], "rolloutpipe.oversample", "integer >= 0"),
    (["rolloutpipe.request_timeout_s=0"], "rolloutpipe.request_timeout_s", "null (no deadline)"),
    (["rolloutpipe.nccl_sync.min_gib_per_s=0"], "rolloutpipe.nccl_sync.min_gib_per_s", "bandwidth floor in GiB/s > 0"),
    (["rolloutpipe.nccl_sync.min_gib_per_s=fast"], "rolloutpipe.nccl_sync.min_gib_per_s", "null"),
    (["rolloutpipe.nccl_sync.setup_s=null"], "rolloutpipe.nccl_sync.setup_s", "a number of seconds > 0"),
    (["rolloutpipe.nccl_sync.setup_s=-5"], "rolloutpipe.nccl_sync.setup_s", "a number of seconds > 0"),
    (["rolloutpipe.request_timeout_s=soon"], "rolloutpipe.request_timeout_s", "seconds > 0"),
    (["rolloutpipe.reward.score_by_group=maybe"], "rolloutpipe.reward.score_by_group", "true or false"),
    (["rolloutpipe.reward.timeout_s=0"], "rolloutpipe.reward.timeout_s", "null (no deadline)"),
    (["rolloutpipe.reward.on_failure=skip"], "rolloutpipe.reward.on_failure", "one of fail, zero_reward, drop_group"),
    (["rolloutpipe.fault.on_bad_record=drop"], "rolloutpipe.fault.on_bad_record", "one of fail, skip"),
    (["rolloutpipe.weight_sync_timeout_s=-1"], "rolloutpipe.weight_sync_timeout_s", "seconds > 0"),
    (["++rolloutpipe.multiturn=3"], "rolloutpipe.multiturn", "null (single-turn) or a mapping"),
    ([*MT, "++rolloutpipe.multiturn.turns.median=0.5"], "rolloutpipe.multiturn", "turns.median must be >= 1"),
    ([*MT, "++rolloutpipe.multiturn.turnz=3"], "rolloutpipe.multiturn", "unknown key(s) turnz"),
    ([*MT, "++rolloutpipe.multiturn.on_tool_failure=retry"], "rolloutpipe.multiturn", "zero_reward, fail_request"),
    ([*MT, "++rolloutpipe.multiturn.tool_failure_p=2"], "rolloutpipe.multiturn", "tool_failure_p must be in [0, 1]"),
    (["++rolloutpipe.multiturn.seed=0"], "rolloutpipe.multiturn", "default_agent_loop is 'single_turn_agent'"),
    ([MT[0], "++rolloutpipe.multiturn.seed=0"], "rolloutpipe.multiturn", "agent_loop_config_path is null"),
    ([*MT, "++rolloutpipe.multiturn.seed=0", WL + "{kind: equal, length: 8}"], "rolloutpipe.multiturn",
     "rolloutpipe.workload=null"),
    ([MT[0]], "actor_rollout_ref.rollout.agent.default_agent_loop", "rolloutpipe.multiturn is null"),
    ([WL + "lognormal"], "rolloutpipe.workload", "null or a mapping"),
    ([WL + "{kind: gamma}"], "rolloutpipe.workload.kind", "lognormal, equal"),
    ([WL + "{kind: lognormal, median: 8, sigma: 1, rho: 0.5, cap: 4096}"], "rolloutpipe.workload.cap",
     "data.max_response_length=32"),
    ([WL + "{kind: lognormal, median: 8, sigma: 1, rho: 0.5}"], "rolloutpipe.workload.cap", "missing"),
    ([WL + "{kind: lognormal, median: 8, sigma: -1, rho: 0.5, cap: 16}"], "rolloutpipe.workload.sigma", ">= 0"),
    ([WL + "{kind: lognormal, median: 8, sigma: 1, rho: 1.5, cap: 16}"], "rolloutpipe.workload.rho", "[0, 1]"),
    ([WL + "{kind: lognormal, median: 0, sigma: 1, rho: 0.5, cap: 16}"], "rolloutpipe.workload.median", "> 0"),
    ([WL + "{kind: lognormal, mean: 8, median: 8, sigma: 1, rho: 0.5, cap: 16}"], "rolloutpipe.workload.median",
     "exactly one of median, mean"),
    ([WL + "{kind: lognormal, mean: -2, sigma: 1, rho: 0.5, cap: 16}"], "rolloutpipe.workload.mean", "> 0"),
    ([WL + "{" + LOGNORMAL + ", seed: -1}"], "rolloutpipe.workload.seed", "integer >= 0"),
    ([WL + "{" + LOGNORMAL + ", name: 5}"], "rolloutpipe.workload.name", "a string"),
    ([WL + "{" + LOGNORMAL + ", sigmaa: 1}"], "rolloutpipe.workload.sigmaa", "did you mean rolloutpipe.workload.sigma"),
    ([WL + "{kind: equal, length: 0}"], "rolloutpipe.workload.length", "between 1 and"),
    ([WL + "{kind: equal, length: 8, cap: 8}"], "rolloutpipe.workload.cap", "allowed: kind, name, seed, length"),
    (["++rolloutpipe.fault.replica_restart=sometimes"], "rolloutpipe.fault.replica_restart", "true or false"),
    (["++rolloutpipe.fault.on_request_failure=retry"], "rolloutpipe.fault.on_request_failure", "fail, drop_group"),
    (["++rolloutpipe.fault.max_request_retries=-1"], "rolloutpipe.fault.max_request_retries", "integer >= 0"),
    (["++rolloutpipe.fault.replica_restart_timeout_s=0"], "rolloutpipe.fault.replica_restart_timeout_s",
     "seconds > 0"),
    (["++rolloutpipe.fault.health_check_timeout_s=-5"], "rolloutpipe.fault.health_check_timeout_s", "seconds > 0"),
    (["++rolloutpipe.fault.checkpoint_on_failure=2"], "rolloutpipe.fault.checkpoint_on_failure", "true or false"),
    # Unknown keys (Hydra's "+"/"++" and recipe files may add any): refused, with a suggestion.
    (["++rolloutpipe.modee=cgp"], "rolloutpipe.modee", "did you mean rolloutpipe.mode?"),
    (["++rolloutpipe.fgd.windw=4"], "rolloutpipe.fgd.windw", "did you mean rolloutpipe.fgd.window?"),
    (["++rolloutpipe.window=4"], "rolloutpipe.window", "rolloutpipe.fgd.window or rolloutpipe.dispatch.window"),
    (["++rolloutpipe.fault.restart=true"], "rolloutpipe.fault.restart", "did you mean rolloutpipe.fault.replica_restart"),
    (["++rolloutpipe.colour=blue"], "rolloutpipe.colour", "keys under rolloutpipe: mode"),
]

VERL_BAD = [
    (["data.train_batch_size=0"], "data.train_batch_size", "integer >= 1"),
    (["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"],
     "actor_rollout_ref.actor.ppo_mini_batch_size", "multiple"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=0"], "actor_rollout_ref.actor.ppo_mini_batch_size", ">= 1"),
    (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n", "at least 2"),
    (["actor_rollout_ref.actor.ppo_epochs=0"], "actor_rollout_ref.actor.ppo_epochs", "integer >= 1"),
    ([CGP, "actor_rollout_ref.actor.ppo_epochs=2"], "actor_rollout_ref.actor.ppo_epochs", "ppo_epochs=1"),
    (["data.max_prompt_length=0"], "data.max_prompt_length", "integer >= 1"),
    (["data.max_response_length=0"], "data.max_response_length", "integer >= 1"),
    (["actor_rollout_ref.rollout.max_model_len=64"], "actor_rollout_ref.rollout.max_model_len",
     ">= data.max_prompt_length + data.max_response_length = 96"),
    ([CGP, "rolloutpipe.cgp.granularity=group", "actor_rollout_ref.rollout.n=4",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"], "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
     "must divide n"),
    ([CGP, "rolloutpipe.cgp.granularity=group", "actor_rollout_ref.actor.loss_agg_mode=seq-sum"],
     "actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
    (["algorithm.adv_estimator=gae"], "algorithm.adv_estimator", "no critic"),
    ([CGP, "algorithm.adv_estimator=gae"], "algorithm.adv_estimator", "no critic"),
    (["algorithm.adv_estimator=remax"], "algorithm.adv_estimator", "greedy baseline"),
    (["algorithm.adv_estimator=reinforce_plus_plus"], "algorithm.adv_estimator", "grpo"),
    (["algorithm.adv_estimator=gdpo"], "algorithm.adv_estimator", "grpo"),
    (["algorithm.adv_estimator=my_estimator"], "algorithm.adv_estimator", "register_streaming"),
    ([CGP, "algorithm.adv_estimator=reinforce_plus_plus_baseline"], "algorithm.adv_estimator",
     "rolloutpipe.cgp.granularity=group"),
    ([CGP, RPPB, "rolloutpipe.cgp.granularity=group", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
     "actor_rollout_ref.actor.policy_loss.loss_mode", "'vanilla'"),
    ([CGP, RPPB, "rolloutpipe.cgp.granularity=group", "algorithm.rollout_correction.bypass_mode=true"],
     "algorithm.rollout_correction.bypass_mode", "must be false"),
    ([CGP, "algorithm.adv_estimator=gpg"], "algorithm.adv_estimator", "mode=sync"),
    (["algorithm.use_kl_in_reward=true"], "algorithm.use_kl_in_reward", "use_kl_loss=true"),
    ([CGP, "algorithm.use_kl_in_reward=true"], "algorithm.use_kl_in_reward", "use_kl_loss=true"),
    (["critic.enable=true"], "critic.enable", "no critic"),
    (["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=false"],
     "actor_rollout_ref.rollout.calculate_log_probs", "must be true"),
    (["actor_rollout_ref.hybrid_engine=true"], "actor_rollout_ref.hybrid_engine", "must be false"),
    ([CGP, "actor_rollout_ref.actor.fsdp_config.param_offload=true"],
     "actor_rollout_ref.actor.fsdp_config.param_offload", "θ_k snapshot"),
    ([CGP, "actor_rollout_ref.actor.fsdp_config.offload_policy=true"],
     "actor_rollout_ref.actor.fsdp_config.offload_policy", "θ_k snapshot"),
    ([CGP, "actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy", "fsdp2"),
    ([CGP, "actor_rollout_ref.actor.strategy=fsdp", "rolloutpipe.platform=gpu", "trainer.device=cuda",
      "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"], "actor_rollout_ref.actor.strategy",
     "rolloutpipe.theta_k.store keeps this rank's FSDP2 shards"),
    (["actor_rollout_ref.rollout.checkpoint_engine.backend=naive"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "ray_store"),
    (["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "on CPU allowed: ray_store"),
    (["rolloutpipe.mode=sync", "rolloutpipe.fgd.enable=true"], "rolloutpipe.fgd.enable", "rolloutpipe.mode=cgp"),
    ([CGP, "rolloutpipe.fgd.enable=true", "actor_rollout_ref.rollout.scheduling_policy=fcfs"],
     "actor_rollout_ref.rollout.scheduling_policy", "'priority'"),
    (["actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name", "allowed: vllm"),
    (["trainer.device=cuda"], "trainer.device", "must be 'cpu'"),
    (["rolloutpipe.platform=gpu", "rolloutpipe.allow_ray_store_on_gpu=true"], "trainer.device", "trainer.device=cuda"),
    # GPU weight sync: ray_store only when asked for; nccl must rebuild its group when a replica can change.
    ([*GPU, "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_store"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "rolloutpipe.allow_ray_store_on_gpu=true"),
    ([*GPU, NCCL], "actor_rollout_ref.rollout.checkpoint_engine.backend", "rolloutpipe.fault.replica_restart=true"),
    ([*GPU, NCCL], "actor_rollout_ref.rollout.checkpoint_engine.backend", "engine_kwargs.nccl.rebuild_group=true"),
    ([*GPU, NCCL, "++rolloutpipe.fault.replica_restart=false", "actor_rollout_ref.rollout.n_gpus_per_node=2"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "2 rollout replicas: a dead replica is retired"),
    ([*GPU, NCCL, "++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.nccl.rebuild_group=false"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend", "rolloutpipe.fault.replica_restart"),
    # nccl only as verl_pipe's engine that survives a replica dying mid-sync (verl's keeps its group)
    ([*GPU, NCCL, REBUILD], "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module",
     "it must import verl_pipe.platform.nccl_engine"),
    ([*GPU, NCCL, REBUILD, "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=null"],
     "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module", "keeps its group"),
    # verl's trainer switches honoured only in some settings.
    (["trainer.val_only=true", "trainer.val_before_train=false"], "trainer.val_only", "val_before_train=true"),
    ([CGP, "rolloutpipe.cgp.granularity=group", "trainer.balance_batch=true"], "trainer.balance_batch",
     "granularity=minibatch"),
    (["actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
     "actor_rollout_ref.rollout.tensor_model_parallel_size", "must be 1 on CPU"),
]

GOOD = [
    [],
    [*MT, "++rolloutpipe.multiturn.seed=1", "++rolloutpipe.multiturn.turns.median=3"],  # the rest: defaults
    [CGP, "rolloutpipe.cgp.granularity=group", "actor_rollout_ref.rollout.n=8"],
    [CGP, "rolloutpipe.fgd.enable=true", "rolloutpipe.fgd.window=32", "rolloutpipe.fgd.frontier_groups=6"],
    [CGP, "rolloutpipe.fgd.enable=true", "rolloutpipe.fgd.window=auto"],
    [CGP, "rolloutpipe.fgd.enable=true", "rolloutpipe.fgd.policy=verl_pipe.core.frontier:FCFSPolicy",
     "rolloutpipe.fgd.lengths=shuffled", "rolloutpipe.fgd.rest_order=longest"],
    ["rolloutpipe.workload={kind: lognormal, median: 12, sigma: 0.8, rho: 0.7, cap: 32, prompts: 32, "
     "cross_epoch: 0.6}"],
    [CGP, "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"],  # not part of the θ_k snapshot
    [CGP, "actor_rollout_ref.actor.fsdp_config.param_offload=true", "actor_rollout_ref.actor.ppo_mini_batch_size=16"],
    ["rolloutpipe.mode=sync", "actor_rollout_ref.actor.fsdp_config.param_offload=true"],  # sync takes no snapshot
    ["rolloutpipe.mode=sync", "algorithm.adv_estimator=reinforce_plus_plus_baseline", "algorithm.adv_estimator=gpg"],
    [CGP, RPPB, "rolloutpipe.cgp.granularity=group", "rolloutpipe.fgd.enable=true",
     "actor_rollout_ref.actor.use_kl_loss=true"],
    ["rolloutpipe.dispatch.order=interleave:8", "rolloutpipe.dispatch.window=16", "rolloutpipe.trace_dir=traces"],
    ["rolloutpipe.request_timeout_s=null", "rolloutpipe.weight_sync_timeout_s=2.5", "rolloutpipe.oversample=4",
     "rolloutpipe.trainer_class=pkg.mod.MyTrainer", "rolloutpipe.cpu.rollout_cores='0'"],
    ["rolloutpipe.cpu.system_cores=all"], ["rolloutpipe.cpu.system_cores='0'"],
    [CGP, "rolloutpipe.theta_k.store=device"], [CGP, "rolloutpipe.theta_k.store=pinned"],
    [CGP, "rolloutpipe.theta_k.auto_margin_gib=8", "rolloutpipe.cgp.granularity=group"],
    ["rolloutpipe.theta_k.auto_margin_gib=0.5"],
    [WL + "{" + LOGNORMAL + ", seed: 3, name: tail}"],
    [WL + "{kind: equal, length: 32}"],
    ["++rolloutpipe.fault.on_request_failure=drop_group", "++rolloutpipe.fault.max_request_retries=0",
     "++rolloutpipe.fault.replica_restart_timeout_s=null", "++rolloutpipe.fault.replica_restart=false"],
    [*GPU, NCCL, REBUILD, NCCL_ENGINE],
    [*GPU, NCCL, REBUILD, NCCL_ENGINE, "actor_rollout_ref.rollout.n_gpus_per_node=4"],
    [*GPU, NCCL, NCCL_ENGINE, "++rolloutpipe.fault.replica_restart=false"],  # one replica: a dead one stops the run
    [*GPU, NCCL, REBUILD, "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module="
                          "[verl_pipe.platform.nccl_engine,my.engines]"],
    [*GPU, NCCL, REBUILD, NCCL_ENGINE, "rolloutpipe.nccl_sync.min_gib_per_s=null", "rolloutpipe.nccl_sync.setup_s=5"],
    [*GPU, "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_store", "rolloutpipe.allow_ray_store_on_gpu=true"],
    ["trainer.balance_batch=true"], [CGP, "trainer.balance_batch=true"],
    ["trainer.val_only=true", "trainer.val_before_train=true"],
]


def _id(row):
    return row[1] + ":" + ",".join(o.split("=", 1)[1][:24] for o in row[0] if "=" in o)


@pytest.mark.parametrize("overrides,key,allowed", ROLLOUTPIPE_BAD + VERL_BAD, ids=[_id(r) for r in ROLLOUTPIPE_BAD + VERL_BAD])
def test_bad_config_names_the_key_and_what_is_allowed(overrides, key, allowed):
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides), check_paths=False)
    msg = str(err.value)
    assert msg.startswith(key + ":"), msg
    assert allowed in msg, msg


@pytest.mark.parametrize("overrides", GOOD, ids=lambda o: ",".join(o) or "default")
def test_good_configs_pass(overrides):
    validate(compose(overrides), check_paths=False)


def test_every_rolloutpipe_key_has_a_bad_row():
    covered = {row[1] for row in ROLLOUTPIPE_BAD}
    missing = [k for k in schema_leaves() if k not in covered]
    assert not missing, f"keys without a bad config in ROLLOUTPIPE_BAD: {missing}"


def _config_leaves(node: DictConfig, table: dict, prefix: str):
    for k in node:
        spec = table.get(k)
        if isinstance(spec, dict) and isinstance(node.get(k), DictConfig):
            yield from _config_leaves(node.get(k), spec, f"{prefix}.{k}")
        else:
            yield f"{prefix}.{k}", spec


def test_every_key_of_the_base_config_is_in_the_table():
    """conf/rolloutpipe_trainer.yaml and config.ROLLOUTPIPE stay in step: a new key needs a rule."""
    unknown = [k for k, spec in _config_leaves(compose([]).rolloutpipe, ROLLOUTPIPE, "rolloutpipe")
               if spec is None or spec is INTERNAL]
    assert not unknown, f"rolloutpipe keys without a rule in verl_pipe.config.ROLLOUTPIPE: {unknown}"
