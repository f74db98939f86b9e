"""Runs verl's V1 separate_async trainer for real, in THIS process and its own Ray cluster.

``python -m verl_pipe_lab.bench.peer.runner SPEC.json OUT.json``: SPEC = {"config", "steps", "overrides",
"workload", "seed"}, and for a multi-turn setting "config_name" (the recipe) and "multiturn" (its
``rolloutpipe.multiturn`` node: each submission's episodes use the bench round's seed); OUT gets the mode entry
(see ``__init__.run_peer``, which launches this as a subprocess).
Built like our stack (verl_pipe.launch.session: compose -> prepare_config -> start_ray: same assets, pools, CPU env
and core pinning), then what verl's TaskRunnerV1.run does (tq.init, trainer.init, agent-loop manager, fit),
with the hooks' subclasses in place of verl's classes.
"""

from __future__ import annotations

import json
import signal
import sys
import time


def _stop_on(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def workload_seed(submission: int, seed: int, warmup_steps: int, cycle: int = 1) -> int:
    """The workload seed of the trainer's submission-th batch, as the bench seeds its steps: warm-up steps
    10_000 + i, measured round r seed + r (so the measured steps get the bench rounds' workloads). ``cycle`` > 1:
    that many consecutive measured steps share a workload (a within-stack A/B whose arms cycle over the steps)."""
    return 10_000 + submission if submission < warmup_steps else seed + (submission - warmup_steps) // cycle


def _lengths_fn(workload: dict | None, seed: int, warmup_steps: int, cycle: int = 1):
    if not workload:
        return None
    from verl_pipe.core.workload import from_spec

    def lengths(submission: int, num_prompts: int, n: int):
        wl = from_spec(dict(workload), num_prompts, n, prompt_len=0,
                       seed=workload_seed(submission, seed, warmup_steps, cycle))
        return wl.lengths

    return lengths


def _print_step(r: dict) -> None:
    m, wv = r["metrics"], r["weight_versions"]
    print(f"[peer] step {r['step']}{' (warm-up)' if r['warmup'] else ''}: step_wall {m['step_wall_s']:.2f}s "
          f"rollout→train_end {m['rollout_to_train_end_s']:.2f}s wait {m['trainer_wait_ratio']:.3f} "
          f"rollout_end {m['rollout_end_s']:.2f}s train {m['trainer_busy_s']:.2f}s sync {m['weight_sync_s']:.2f}s "
          f"versions {wv.get('min_global_steps')}..{wv.get('max_global_steps')}"
          + (f" poll {r['poll_interval_s']:g}s" if r.get("poll_interval_s") is not None else "")
          + "".join(f" {p['phase']} {p['end'] - p['start']:.2f}s" for p in r.get("phases", [])), flush=True)


def _train(config, spec: dict, t_start: float, t_ray: float) -> tuple[list[dict], float, float]:
    """What verl's TaskRunnerV1.run does (tq.init, trainer, agent-loop manager, fit), with our subclasses (the
    spec's ``trainer_cls``, "module:Class", a subclass of PeerSeparateAsyncTrainer in its place: the learning
    bench's, lab/verl_pipe_lab/bench/peer/learn_hooks.py; imported here, after start_ray, like the hooks); verl's legacy
    separate sync trainer in ``_train_separate_sync``."""
    from verl_pipe_lab.bench.peer.configs import CONFIGS, knobs_of

    if CONFIGS[spec["config"]]["trainer"] == "separate_sync":
        return _train_separate_sync(config, spec, t_start, t_ray)
    import transfer_queue as tq
    from omegaconf import OmegaConf, open_dict

    # After start_ray: it activates the CPU platform (and our verl patches) in this process.
    from verl_pipe_lab.bench.peer.hooks import PeerAgentLoopManager, PeerColocatedSyncTrainer, PeerSeparateAsyncTrainer

    trainer_cls = (PeerColocatedSyncTrainer if CONFIGS[spec["config"]]["trainer"] == "sync_colocated"
                   else PeerSeparateAsyncTrainer)
    poll = knobs_of(spec["config"], spec.get("knobs"))["poll_interval_s"]

    with open_dict(config):
        config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    records: list[dict] = []
    warmup = int(spec.get("warmup_steps", 0))

    def on_record(r):
        r["warmup"] = len(records) < warmup  # discarded by the bench, like its own warm-up step
        records.append(r)
        _print_step(r)

    tq.init(config.transfer_queue)
    try:
        seed = int(spec.get("seed", 0))
        lengths_fn = _lengths_fn(spec.get("workload"), seed, warmup, int(spec.get("workload_cycle", 1)))
        seed_fn = (lambda k: workload_seed(k, seed, warmup)) if spec.get("multiturn") else None
        if spec.get("trainer_cls"):
            import importlib

            module, _, name = spec["trainer_cls"].partition(":")
            trainer_cls = getattr(importlib.import_module(module), name)
        extra = {"poll_interval_s": poll} if poll is not None else {}
        trainer = trainer_cls(config, lengths_fn, on_record, episode_seed_fn=seed_fn, **extra)
        trainer.init()
        manager = PeerAgentLoopManager.create(config=config, llm_client=trainer.get_llm_client(),
                                              teacher_client=trainer.get_teacher_client(),
                                              reward_loop_worker_handles=trainer.get_reward_handles())
        t_ready = time.time()
        print(f"[peer] stack up in {t_ready - t_start:.1f}s (ray {t_ray - t_start:.1f}s)", flush=True)
        trainer.fit(manager)
        return records, t_ready, time.time()
    finally:
        tq.close()


def _records(warmup: int):
    records: list[dict] = []

    def on_record(r):
        r["warmup"] = len(records) < warmup  # discarded by the bench, like its own warm-up step
        records.append(r)
        _print_step(r)

    return records, on_record


def _train_separate_sync(config, spec: dict, t_start: float, t_ray: float) -> tuple[list[dict], float, float]:
    """verl's legacy separate-pool synchronous trainer (hooks_sync.PeerSeparateSyncTrainer), built as verl's one-step-off
    recipe and our task runner build it (verl.experimental.separation.utils: role -> worker, pools), with our actor
    worker pinned to the trainer cores (as in our modes and the separate_async peer)."""
    import ray
    from omegaconf import OmegaConf

    from verl.experimental.separation.utils import create_resource_pool_manager, create_role_worker_mapping
    from verl.trainer.ppo.utils import Role, create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.config import validate_config
    from verl.utils.dataset.rl_dataset import collate_fn

    from verl_pipe_lab.bench.peer.hooks_sync import PeerSeparateSyncTrainer
    from verl_pipe.trainer.workers import PipeActorWorker

    OmegaConf.resolve(config)
    warmup = int(spec.get("warmup_steps", 0))
    records, on_record = _records(warmup)
    role_worker_mapping, ray_worker_group_cls = create_role_worker_mapping(config)
    for role in (Role.Actor, Role.RefPolicy):
        if role in role_worker_mapping:
            role_worker_mapping[role] = ray.remote(PipeActorWorker)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    path = config.actor_rollout_ref.model.path
    tokenizer = hf_tokenizer(path, trust_remote_code=False)
    processor = hf_processor(path, trust_remote_code=False, use_fast=True)
    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor)
    val = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor)
    trainer = PeerSeparateSyncTrainer(
        config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=role_worker_mapping,
        resource_pool_manager=create_resource_pool_manager(config, role_worker_mapping.keys()),
        ray_worker_group_cls=ray_worker_group_cls, train_dataset=train, val_dataset=val, collate_fn=collate_fn,
        train_sampler=create_rl_sampler(config.data, train), device_name=config.trainer.device,
        lengths_fn=_lengths_fn(spec.get("workload"), int(spec.get("seed", 0)), warmup), on_record=on_record)
    trainer.init_workers()
    t_ready = time.time()
    print(f"[peer] stack up in {t_ready - t_start:.1f}s (ray {t_ray - t_start:.1f}s)", flush=True)
    trainer.fit()
    return records, t_ready, time.time()


def recipe_shape(spec: dict) -> tuple[int, int]:
    """The (train_batch_size, ppo_mini_batch_size) the spec's recipe and overrides give, which verl's
    parameter_sync_step must match (a recipe such as tiny_cpu_chain sets its own)."""
    from verl_pipe.launch.session import compose

    cfg = compose(list(spec.get("overrides", [])) + list(spec.get("post_overrides", [])),
                  config_name=spec.get("config_name") or "rolloutpipe_trainer")
    return int(cfg.data.train_batch_size), int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)


def spec_overrides(spec: dict) -> list[str]:
    """The peer's overrides on the spec's recipe: its configuration's (at the recipe's batch shape), then the spec's
    ``post_overrides`` (they win: e.g. the learning bench's validation cadence)."""
    from verl_pipe_lab.bench.peer.configs import peer_overrides

    return peer_overrides(spec["config"], list(spec.get("overrides", [])), int(spec["steps"]),
                          knobs=spec.get("knobs"), shape=recipe_shape(spec)) + list(spec.get("post_overrides", []))


def compose_spec(spec: dict, overrides: list[str] | None = None):
    """The peer's config: the spec's recipe (default: rolloutpipe_trainer) with ``overrides`` (default:
    ``spec_overrides``) and, for a multi-turn setting, its ``rolloutpipe.multiturn`` node (as the multi-turn bench
    composes our modes')."""
    from omegaconf import OmegaConf, open_dict

    from verl_pipe.launch.session import compose

    overrides = spec_overrides(spec) if overrides is None else overrides
    config = compose(overrides, config_name=spec.get("config_name") or "rolloutpipe_trainer")
    if spec.get("multiturn"):
        with open_dict(config):
            config.rolloutpipe.multiturn = OmegaConf.create(dict(spec["multiturn"]))
    return config


def run(spec: dict) -> dict:
    t_start = time.time()
    from verl_pipe_lab.bench.peer.configs import AFTER_VALIDATION, CONFIGS, MODE_NAMES, knobs_of
    from verl_pipe.launch.prepare import prepare_config
    from verl_pipe.launch.ray_start import start_ray

    overrides = spec_overrides(spec)
    config = prepare_config(compose_spec(spec, overrides))
    kind = CONFIGS[spec["config"]]["trainer"]
    if kind in AFTER_VALIDATION:
        from omegaconf import OmegaConf, open_dict

        with open_dict(config):
            for key, value in AFTER_VALIDATION[kind].items():
                OmegaConf.update(config, key, value, merge=False)
    if kind == "sync_colocated":
        # verl's default layout: one pool of every core, actor and vLLM on it taking turns (their pools' cores are the
        # run's cores; rolloutpipe.cpu's validation, which keeps our two pools disjoint, ran above on our layout)
        from omegaconf import open_dict

        from verl_pipe.platform.env import run_cores

        cores = ",".join(str(c) for c in sorted(run_cores()))
        with open_dict(config):
            config.rolloutpipe.cpu.rollout_cores = config.rolloutpipe.cpu.trainer_cores = cores
    start_ray(config)
    t_ray = time.time()
    import ray

    try:
        # After ray.init (which installs its own handlers): SIGTERM stops like Ctrl-C, so the finally below
        # shuts the cluster down (as verl_pipe.main_grpo does).
        signal.signal(signal.SIGTERM, _stop_on)
        records, t_ready, t_end = _train(config, spec, t_start, t_ray)
    finally:
        ray.shutdown()
    return {"mode": MODE_NAMES[spec["config"]], "config": spec["config"], "steps": records,
            "warmup_steps": int(spec.get("warmup_steps", 0)), "startup_s": t_ready - t_start,
            "ray_start_s": t_ray - t_start, "run_s": t_end - t_ready,
            "overrides": overrides,
            "knobs": knobs_of(spec["config"], spec.get("knobs")),
            "workload": spec.get("workload")}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m verl_pipe_lab.bench.peer.runner SPEC.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    result = run(spec)
    with open(argv[1], "w") as f:
        json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
