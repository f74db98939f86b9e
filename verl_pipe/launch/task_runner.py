"""The Ray actor that builds the workers and runs RolloutPipeTrainer (verl's TaskRunner pattern)."""

from __future__ import annotations

import time

import ray


@ray.remote(num_cpus=1)
class PipeTaskRunner:
    def run(self, config, stop_file: str | None = None, run_id: str | None = None) -> dict:
        from verl_pipe.assets.progress import waiting
        from verl_pipe.config import rollout_replicas
        from verl_pipe.launch.stop_request import StopCheck

        t0 = time.perf_counter()
        # The launcher's stop request, the trainer's stop check (RunLoop.stop_requested): a file on its node, and the
        # same request through the cluster's GCS under the run's id (verl_pipe/launch/stop_request.py).
        with waiting("loading the tokenizer and the datasets"):
            trainer = build_trainer(config, stop_check=StopCheck(stop_file, run_id))
        trainer_ranks = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
        replicas = rollout_replicas(config)
        # verl's init_workers: the trainer pool's workers and the vLLM replicas start, each loading the model
        with waiting(f"trainer workers init ({trainer_ranks} rank(s)) and {replicas} vLLM replica(s) starting"):
            trainer.init_workers()
        startup_s = time.perf_counter() - t0
        print(f"[verl_pipe] workers ready in {startup_s:.1f}s", flush=True)
        trainer.fit()
        history = trainer.history
        return {"steps": history.steps_run, "startup_s": startup_s,
                "val_before": dict(getattr(trainer, "initial_val_metrics", None) or {}),
                "val_after": dict(getattr(trainer, "last_val_metrics", None) or {}),
                "rewards": list(history.rewards),
                "pipeline": {"totals": dict(history.totals), "modes": sorted(history.modes),
                             "variants": sorted(history.variants)},
                "timelines": [t.to_dict() for t in history.timelines]}  # the last ones (step_record.KEEP_TIMELINES)


def build_trainer(config, stop_check=None):
    from omegaconf import OmegaConf

    from verl.experimental.separation.utils import create_resource_pool_manager, create_role_worker_mapping
    from verl.trainer.ppo.utils import Role, create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.config import validate_config
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.fs import copy_to_local

    from verl_pipe.data_check import GuardedDataset, guarded_collate
    from verl_pipe.launch.preflight import check_runtime
    from verl_pipe.trainer import RolloutPipeTrainer
    from verl_pipe.trainer.workers import PipeActorWorker

    OmegaConf.resolve(config)
    check_runtime(config)  # before any worker: the weight-sync backend and the attention kernel are usable here
    role_worker_mapping, ray_worker_group_cls = create_role_worker_mapping(config)
    # Our actor worker: verl's DetachActorWorker pinned to the trainer pool's cores.
    for role in (Role.Actor, Role.RefPolicy):
        if role in role_worker_mapping:
            role_worker_mapping[role] = ray.remote(PipeActorWorker)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    local_path = copy_to_local(config.actor_rollout_ref.model.path)
    tokenizer = hf_tokenizer(local_path, trust_remote_code=config.data.get("trust_remote_code", False))
    processor = hf_processor(local_path, trust_remote_code=config.data.get("trust_remote_code", False), use_fast=True)
    resource_pool_manager = create_resource_pool_manager(config, role_worker_mapping.keys())
    from verl_pipe.platform.node_roles import place_pools_by_role

    resource_pool_manager = place_pools_by_role(resource_pool_manager)  # a cluster with role nodes: pools on them
    train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor,
                                      max_samples=config.data.get("train_max_samples", -1))
    val_dataset = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor,
                                    max_samples=config.data.get("val_max_samples", -1))
    train_sampler = create_rl_sampler(config.data, train_dataset)
    # a record that fails in verl's dataset mid-run is named, and fails the run or is skipped (on_bad_record)
    train_dataset = GuardedDataset(train_dataset, config.data.train_files,
                                   policy=str(config.rolloutpipe.fault.get("on_bad_record", "fail")))
    trainer_cls = RolloutPipeTrainer
    if config.rolloutpipe.get("trainer_class"):
        from verl.utils.import_utils import load_class_from_fqn

        trainer_cls = load_class_from_fqn(config.rolloutpipe.trainer_class, "rolloutpipe.trainer_class")
        if not issubclass(trainer_cls, RolloutPipeTrainer):
            raise TypeError(f"rolloutpipe.trainer_class: {config.rolloutpipe.trainer_class} must subclass "
                            "verl_pipe.trainer.RolloutPipeTrainer")
    return trainer_cls(
        config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=role_worker_mapping,
        resource_pool_manager=resource_pool_manager, ray_worker_group_cls=ray_worker_group_cls,
        train_dataset=train_dataset, val_dataset=val_dataset, collate_fn=guarded_collate(collate_fn),
        train_sampler=train_sampler, device_name=config.trainer.device, stop_check=stop_check,
    )
