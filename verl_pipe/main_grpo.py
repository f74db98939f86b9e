"""Entry point: ``python -m verl_pipe.main_grpo [hydra overrides]``.

With no arguments it trains the embedded tiny CPU default: a 2-layer Qwen3, a
local tokenizer and a synthetic digit-math set, built and cached on first run,
with a real vLLM engine on one core and verl's FSDP2 actor on the other.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from verl_pipe.launch import stop_request

# The base config is the subpackage verl_pipe.conf (conf/ at the top of the checkout, mapped there by pyproject's
# package-dir; verl_pipe/conf in a wheel), found by module name, so an installed verl_pipe runs outside a checkout;
# recipes and verl's ppo_trainer come from the search-path plugin (hydra_plugins/).
CONF_MODULE = "verl_pipe.conf"
# What ``python -m verl_pipe.main_grpo`` runs with no --config-name: the chain recipe (recipes/tiny_cpu_chain.yaml,
# the embedded task whose response lengths have a natural long tail, pipelined: what `make demo` trains). The base
# config it extends (conf/rolloutpipe_trainer.yaml, the digit-math task) is what every test composes; name it with
# --config-name rolloutpipe_trainer.
DEFAULT_RECIPE = "tiny_cpu_chain"


def prepare_config(config: DictConfig) -> DictConfig:
    """Fills what the launcher derives (asset paths, pool sizes) and validates, before Ray starts."""
    from verl_pipe.config import resolve_pkg_path, validate

    rp = config.rolloutpipe
    with open_dict(config):
        if rp.tiny_assets.enable and not (config.actor_rollout_ref.model.path and config.data.train_files):
            from verl_pipe.assets import ensure_assets

            cache = Path(rp.tiny_assets.cache_dir).expanduser() if rp.tiny_assets.cache_dir else None
            assets = ensure_assets(cache, size=rp.tiny_assets.size, task=rp.tiny_assets.task)
            config.actor_rollout_ref.model.path = config.actor_rollout_ref.model.path or str(_tiny_model(assets, rp))
            config.data.train_files = config.data.train_files or str(assets.train_file)
            config.data.val_files = config.data.val_files or str(assets.val_file)
            if not config.reward.custom_reward_function.path:
                import importlib

                from verl_pipe.assets import TASKS

                reward_mod = importlib.import_module(TASKS[rp.tiny_assets.task].reward_module)  # the task's reward
                config.reward.custom_reward_function.path = reward_mod.__file__
                config.reward.custom_reward_function.name = "compute_score"
        # Oversampling (with the zero-variance filter): the loader yields the extra prompts too;
        # the step trains the first train_batch_size trainable groups and aborts the rest.
        if int(rp.oversample) > 0:
            config.data.gen_batch_size = int(config.data.train_batch_size) + int(rp.oversample)
        # verl finds an agent-loop file only by an absolute or working-directory-relative path: a pkg:// one (the
        # multi-turn recipe's) becomes the installed file's absolute path, so every process finds it.
        agent = config.actor_rollout_ref.rollout.agent
        if str(agent.get("agent_loop_config_path") or "").startswith("pkg://"):
            agent.agent_loop_config_path = resolve_pkg_path(agent.agent_loop_config_path)
        # verl's one-step-off wiring reads the top-level rollout pool size.
        config.rollout = {"nnodes": config.actor_rollout_ref.rollout.nnodes,
                          "n_gpus_per_node": config.actor_rollout_ref.rollout.n_gpus_per_node}
    validate(config)
    from verl_pipe.data_check import clean_datasets

    clean_datasets(config)
    return config


def _tiny_model(assets, rp) -> Path:
    """The tiny default's model: the random-init base, or its SFT warm-start (rolloutpipe.tiny_assets.warm_start)."""
    ws = rp.tiny_assets.warm_start
    if int(ws.steps) == 0:
        return assets.model_dir
    from verl_pipe.assets import ensure_warm_start
    from verl_pipe.assets.warm_start import WarmStart

    return ensure_warm_start(assets, WarmStart(steps=int(ws.steps), lr=float(ws.lr), batch_size=int(ws.batch_size),
                                               length_batches=bool(ws.get("length_batches", False))))


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


def start_ray(config: DictConfig) -> None:
    global _attached
    import ray

    if ray.is_initialized():
        return
    ray_env_defaults()  # before ray.init: its GCS and raylet read them when they start
    kwargs = ray_init_kwargs(config)
    if config.rolloutpipe.platform == "cpu":  # what Ray starts inherits the launcher's cores
        from verl_pipe.platform.env import confine_launcher, system_core_list

        cpu = config.rolloutpipe.cpu
        confine_launcher(system_core_list(str(cpu.get("system_cores", "all")), str(cpu.rollout_cores)))
    if attaches(kwargs):
        print(f"[verl_pipe] attaching to the running Ray cluster at {kwargs.get('address') or os.environ['RAY_ADDRESS']}"
              " (the run's actors end with the run; the cluster stays up)", flush=True)
        _attached = True
    ray.init(**kwargs)


# The run's id (128 random bits, printed at start): its stop request through the Ray cluster, for a TaskRunner on
# another node, and its TaskRunner's actor name (verl_pipe/launch/stop_request.py). The stop file, made when the
# launcher is signalled, is in a private directory of the run's (stop_request.LocalStop).
RUN_ID = stop_request.new_run_id()
_local_stop: stop_request.LocalStop | None = None
_attached = False  # start_ray attached to a cluster this launcher did not start


def request_stop() -> None:
    if _local_stop is not None:
        _local_stop.request()
    if not _attached:
        # A Ray this launcher started is on this node, and so is its TaskRunner, which reads the file. Its GCS is in
        # the launcher's process group and gets the same signal: a put would wait for a dead GCS (Ray's client gives
        # up after 60 s and ends the process) instead of tearing the run down.
        return
    try:
        import ray

        if ray.is_initialized():
            stop_request.request(RUN_ID, known=True)
    except Exception as e:  # noqa: BLE001 -- the teardown that follows ends the run either way
        print(f"[verl_pipe] could not put the stop request in the Ray cluster: {e}", flush=True)


def run(config: DictConfig) -> dict:
    """Runs training in a TaskRunner actor; returns its summary. Ray must be started."""
    import ray

    from verl_pipe.launch.task_runner import PipeTaskRunner

    global _local_stop
    _local_stop = stop_request.LocalStop()
    print(f"[verl_pipe] run id {RUN_ID}: `python -m verl_pipe.launch.stop_request {RUN_ID}` from any machine of the cluster "
          "stops it before its next step", flush=True)
    from verl_pipe.platform.node_roles import on_this_node

    runner = PipeTaskRunner.options(name=stop_request.runner_name(RUN_ID), namespace=stop_request.NAMESPACE,
                                    scheduling_strategy=on_this_node()).remote()  # not on a role node of a cluster
    return ray.get(runner.run.remote(config, str(_local_stop.file), RUN_ID))


def clear_stop_request(local: bool = True, cluster: bool = True) -> None:
    """Every way out of the launcher: its stop directory goes (``local``), and its key in a cluster it attached to
    (``cluster``: that GCS outlives it); a cluster it started takes its key with it."""
    if local and _local_stop is not None:
        _local_stop.remove()
    if cluster and _attached:
        try:
            import ray

            if ray.is_initialized():
                stop_request.clear(RUN_ID)
        except Exception as e:  # noqa: BLE001 -- the id is never reused: a key left behind stops no other run
            print(f"[verl_pipe] could not clear the stop request of run {RUN_ID}: {e}", flush=True)



_SIGNALS: list[int] = []  # what stopped the run (Ray's ray.get re-raises a plain KeyboardInterrupt)


def _stop_on(signum, frame):
    """SIGTERM (e.g. a preemption) or SIGINT: stop and tear everything down. Only the first signal interrupts: the
    main thread runs Python handlers late while it waits in ray.get, so a scheduler's second signal (SIGINT, then
    SIGTERM 0.5 s on) may run right after the first one's KeyboardInterrupt, inside the teardown, and cut it short."""
    _SIGNALS.append(signum)
    if len(_SIGNALS) == 1:
        raise KeyboardInterrupt(signal.Signals(signum).name)


def _signalled(wait_s: float = 1.0) -> bool:
    """Whether a signal stopped the run. A signal to the whole process group reaches the TaskRunner actor at the
    same moment as this process: the actor's death may surface from ray.get before our handler has run (Python runs
    it between bytecodes of the main thread). Gives a pending handler ``wait_s`` to run."""
    deadline = time.monotonic() + wait_s
    try:
        while not _SIGNALS and time.monotonic() < deadline:
            time.sleep(0.02)
    except KeyboardInterrupt:  # the handler ran here
        pass
    return bool(_SIGNALS)


def stop(reason: str, shutdown_timeout_s: float = 20.0, before_shutdown=None) -> None:
    """Tears down what this run started: the Ray cluster (if this process started it) with every
    actor in it, and the vLLM engines under the server actors. When the whole process group was signalled,
    Ray's own processes may be gone already and ``ray.shutdown`` may wait on them: it gets a deadline, then every
    process left in the launcher's tree (orphans included: verl_pipe/launch/teardown.py) is terminated."""
    import ray

    from verl_pipe.launch.teardown import reap, run_ignoring

    print(f"[verl_pipe] stopping ({reason}): shutting down Ray and the rollout engines", flush=True)
    if before_shutdown is not None:
        before_shutdown()
    if ray.is_initialized() and not run_ignoring(ray.shutdown, shutdown_timeout_s):
        print(f"[verl_pipe] ray.shutdown did not return within {shutdown_timeout_s:.0f}s; ending the run's "
              "processes directly", flush=True)
    killed = reap()
    if killed:
        print(f"[verl_pipe] ended {len(killed)} process(es) left behind", flush=True)


@hydra.main(config_path=f"pkg://{CONF_MODULE}", config_name=DEFAULT_RECIPE, version_base=None)
def main(config: DictConfig) -> None:
    from verl_pipe.launch.teardown import become_subreaper

    t0 = time.perf_counter()
    config = prepare_config(config)  # a first run builds the tiny assets here (the warm-start: minutes)
    t_run = time.perf_counter()
    become_subreaper()  # the run's orphaned processes stay ours to end (verl_pipe/launch/teardown.py)
    try:
        start_ray(config)
        # After ray.init, which installs its own fatal-signal handler (it aborts the driver with a dump).
        for s in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: a scheduler's (not a terminal's) is remembered
            signal.signal(s, _stop_on)
        summary = run(config)
        clear_stop_request()
    except BaseException as e:
        # A signal to the whole process group also reaches the TaskRunner actor: its death (RayActorError) may
        # surface before our own handler's KeyboardInterrupt does. Either way it is the signal's stop.
        if not (isinstance(e, KeyboardInterrupt) or _signalled()):
            clear_stop_request()
            raise
        for s in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the teardown short
            signal.signal(s, signal.SIG_IGN)
        signum = _SIGNALS[0] if _SIGNALS else signal.SIGINT
        request_stop()  # before the teardown, which takes seconds: no new step starts meanwhile
        # the key goes before the shutdown, which ends the run's actors on every node; the file (read by a TaskRunner
        # on this node until the shutdown ends it) after
        stop(signal.Signals(signum).name, before_shutdown=lambda: clear_stop_request(local=False))
        clear_stop_request(cluster=False)
        print("[verl_pipe] stopped; the latest completed checkpoint (if any) is in "
              f"{config.trainer.default_local_dir}; resume with trainer.resume_mode=auto", flush=True)
        raise SystemExit(128 + signum) from None
    from verl_pipe.trainer.step_record import done_line, learning_line, pipeline_line

    print(learning_line(summary.get("val_before"), summary.get("val_after"), summary.get("steps", 0),
                        summary.get("rewards")))
    pipe = summary.get("pipeline") or {}
    print(pipeline_line(pipe.get("totals") or {}, summary.get("steps", 0), pipe.get("modes") or ()))
    print(done_line(summary, time.perf_counter() - t_run, t_run - t0))



if __name__ == "__main__":
    main()
