"""Starting (or attaching to) the run's Ray cluster: the platform's environment, ray.init's arguments, Ray's
settings for a long run. ``attached()`` says whether the launcher attached to a cluster it did not start."""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

# verl's own switch for how a DataProto is pickled (verl/protocol.py, read in every process that pickles or unpickles
# one, so all of a run's processes get the same value: the launcher's environment and each Ray worker's runtime_env).
# Unset, verl consolidates the TensorDict and torch.saves it; "numpy" sends each tensor's bytes as a numpy array, the
# same dtypes, shapes and values. The rollout driver pickles one DataProto per response for the reward worker, and
# numpy's is the cheaper pickle (docs/cpu.md, "The cuts", 3). CPU platform only: the numpy path cannot pickle a
# tensor on a GPU.
CPU_ENV_DEFAULTS = {"VERL_DATAPROTO_SERIALIZATION_METHOD": "numpy"}


def select_platform(config: DictConfig) -> dict:
    """Sets the platform's environment in this process (before verl resolves its platform); returns the
    variables every process Ray starts for the run gets (its runtime_env)."""
    if config.rolloutpipe.platform != "cpu":
        from verl_pipe.launch.preflight import check_environment, check_gpu_driver, gpu_runtime_env

        check_environment(config)  # no CPU-run leftovers in the launcher's environment
        check_gpu_driver(config)  # a driver that runs torch's CUDA build, before Ray starts (CUDA 13: >= 580)
        return gpu_runtime_env()  # ... nor from a raylet's: blanked for the run's processes
    from verl_pipe.platform.env import cpu_env
    from verl_pipe.platform.plugin import activate_cpu

    cpu = config.rolloutpipe.cpu
    env = cpu_env(str(cpu.rollout_cores), str(cpu.trainer_cores), int(cpu.kv_cache_gib), int(cpu.get("trainer_nice", 0)))
    env.update({k: os.environ.get(k, v) for k, v in CPU_ENV_DEFAULTS.items()})  # a launcher's own value kept
    os.environ.update(env)  # the driver and every process Ray starts from it
    activate_cpu()
    return env


def ray_init_kwargs(config: DictConfig) -> dict:
    env = select_platform(config)
    num_gpus = None
    if config.rolloutpipe.platform == "cpu":
        # One logical GPU per trainer rank and per rollout rank: verl's pools always ask for GPUs.
        num_gpus = (config.trainer.n_gpus_per_node * config.trainer.nnodes
                    + config.actor_rollout_ref.rollout.n_gpus_per_node * config.actor_rollout_ref.rollout.nnodes)
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    runtime_env = get_ppo_ray_runtime_env(config)
    runtime_env.setdefault("env_vars", {}).update(env)
    kwargs = OmegaConf.to_container(config.ray_kwargs.get("ray_init", {}), resolve=True) or {}
    kwargs = {k: v for k, v in kwargs.items() if v is not None and k != "runtime_env"}
    if attaches(kwargs):
        # A running cluster (``ray start`` on its nodes, docs/recipes.md#multi-node): its nodes declared their CPUs,
        # GPUs and role resources when they started; ray.init refuses num_cpus / num_gpus when it connects.
        kwargs.pop("num_cpus", None)
        kwargs.pop("num_gpus", None)
    else:
        # Ray's dashboard (its head process and module subprocesses) costs CPU all run long and serves nothing the
        # run reads (verl 0.9.1's only state-API call, RayWorkerGroup._is_worker_alive, is never called): off unless
        # ray_kwargs.ray_init.include_dashboard (verl's seam to ray.init) says otherwise. A cluster started with
        # `ray start` decides for itself.
        kwargs.setdefault("include_dashboard", False)
        if config.rolloutpipe.platform == "cpu":
            kwargs.setdefault("num_cpus", int(config.rolloutpipe.cpu.ray_num_cpus))
            kwargs["num_gpus"] = num_gpus
    kwargs["runtime_env"] = runtime_env
    return kwargs


def attaches(init_kwargs: dict, environ=os.environ) -> bool:
    """Whether ray.init with these arguments connects to a running cluster instead of starting one: an ``address``
    (``auto`` or host:port) other than ``local``, or RAY_ADDRESS in the environment when none is given."""
    address = init_kwargs.get("address") or environ.get("RAY_ADDRESS")
    return bool(address) and str(address) != "local"


# Ray settings a long run needs, unless the launcher's environment sets them (read by the processes ray.init starts;
# a cluster started with `ray start` takes them from that command's environment: docs/reliability.md). Ray's GCS keeps
# the events of the last RAY_task_events_max_num_task_in_gcs tasks (Ray 2.60's default: 100,000) for its dashboard and
# state API, and a step makes hundreds of tasks: with Ray's default the GCS grows every step, capped it stops. Ray's
# metrics collection (the core workers' and raylet's Prometheus series, exported through each node's DashboardAgent)
# grows the DashboardAgent and the weight-sync and reward workers every step, with the Name label dropped too
# (RAY_metric_cardinality_level=low); off, they are flat (docs/reliability.md, "Long runs: memory and step time
# (soak)"). It is off unless the environment
# turns it on: RAY_enable_metrics_collection=1 keeps Ray's dashboard metrics for a run that scrapes them.
RAY_ENV_DEFAULTS = {"RAY_task_events_max_num_task_in_gcs": "10000", "RAY_enable_metrics_collection": "0"}


def ray_env_defaults(environ=os.environ) -> dict[str, str]:
    """Sets RAY_ENV_DEFAULTS in ``environ`` where unset; returns what it set."""
    added = {k: v for k, v in RAY_ENV_DEFAULTS.items() if k not in environ}
    environ.update(added)
    return added


def _say(msg: str) -> None:
    print(msg, flush=True)


_attached = False  # start_ray attached to a cluster this launcher did not start


def attached() -> bool:
    """Whether ``start_ray`` attached to a running cluster (whose GCS outlives the launcher) instead of starting one."""
    return _attached


def start_ray(config: DictConfig, log=None) -> None:
    global _attached
    import ray

    log = log or _say
    if ray.is_initialized():
        return
    ray_env_defaults()  # before ray.init: its GCS and raylet read them when they start
    kwargs = ray_init_kwargs(config)
    if config.rolloutpipe.platform == "cpu":  # what Ray starts inherits the launcher's cores
        from verl_pipe.platform.env import confine_launcher, system_core_list

        cpu = config.rolloutpipe.cpu
        confine_launcher(system_core_list(str(cpu.get("system_cores", "all")), str(cpu.rollout_cores)))
    if attaches(kwargs):
        log(f"[verl_pipe] attaching to the running Ray cluster at {kwargs.get('address') or os.environ['RAY_ADDRESS']}"
            " (the run's actors end with the run; the cluster stays up)")
        _attached = True
    else:
        log("[verl_pipe] starting Ray (a local cluster for this run)")
    ray.init(**kwargs)
