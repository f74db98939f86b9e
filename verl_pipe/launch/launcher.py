"""What ``python -m verl_pipe.main_grpo`` does with its composed config: check it, prepare it, start Ray, run the
TaskRunner, print the run's summary; and stop it all on SIGTERM / SIGINT.

Module state: the run's id (``RUN_ID``), its stop file, the signals that stopped it. One run per process.
"""

from __future__ import annotations

import signal
import sys
import time

from omegaconf import DictConfig

from verl_pipe.launch import ray_start, stop_request

# The run's id (128 random bits, printed at start): its stop request through the Ray cluster, for a TaskRunner on
# another node, and its TaskRunner's actor name (verl_pipe/launch/stop_request.py). The stop file, made when the
# launcher is signalled, is in a private directory of the run's (stop_request.LocalStop).
RUN_ID = stop_request.new_run_id()
_local_stop: stop_request.LocalStop | None = None


def say(msg: str) -> None:
    print(msg, flush=True)


def request_stop() -> None:
    if _local_stop is not None:
        _local_stop.request()
    if not ray_start.attached():
        # A Ray this launcher started is on this node, and so is its TaskRunner, which reads the file. Its GCS is in
        # the launcher's process group and gets the same signal: a put would wait for a dead GCS (Ray's client gives
        # up after 60 s and ends the process) instead of tearing the run down.
        return
    try:
        import ray

        if ray.is_initialized():
            stop_request.request(RUN_ID, known=True)
    except Exception as e:  # noqa: BLE001 -- the teardown that follows ends the run either way
        say(f"[verl_pipe] could not put the stop request in the Ray cluster: {e}")


def run(config: DictConfig) -> dict:
    """Runs training in a TaskRunner actor; returns its summary. Ray must be started."""
    import ray

    from verl_pipe.launch.task_runner import PipeTaskRunner

    global _local_stop
    _local_stop = stop_request.LocalStop()
    say(f"[verl_pipe] run id {RUN_ID}: `python -m verl_pipe.launch.stop_request {RUN_ID}` from any machine of the "
        "cluster stops it before its next step")
    from verl_pipe.platform.node_roles import on_this_node

    runner = PipeTaskRunner.options(name=stop_request.runner_name(RUN_ID), namespace=stop_request.NAMESPACE,
                                    scheduling_strategy=on_this_node()).remote()  # not on a role node of a cluster
    return ray.get(runner.run.remote(config, str(_local_stop.file), RUN_ID))


def clear_stop_request(local: bool = True, cluster: bool = True) -> None:
    """Every way out of the launcher: its stop directory goes (``local``), and its key in a cluster it attached to
    (``cluster``: that GCS outlives it); a cluster it started takes its key with it."""
    if local and _local_stop is not None:
        _local_stop.remove()
    if cluster and ray_start.attached():
        try:
            import ray

            if ray.is_initialized():
                stop_request.clear(RUN_ID)
        except Exception as e:  # noqa: BLE001 -- the id is never reused: a key left behind stops no other run
            say(f"[verl_pipe] could not clear the stop request of run {RUN_ID}: {e}")


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

    say(f"[verl_pipe] stopping ({reason}): shutting down Ray and the rollout engines")
    if before_shutdown is not None:
        before_shutdown()
    if ray.is_initialized() and not run_ignoring(ray.shutdown, shutdown_timeout_s):
        say(f"[verl_pipe] ray.shutdown did not return within {shutdown_timeout_s:.0f}s; ending the run's "
            "processes directly")
    killed = reap()
    if killed:
        say(f"[verl_pipe] ended {len(killed)} process(es) left behind")


def launch(config: DictConfig) -> None:
    """The launcher's whole run: the config checked (a bad key or value ends it here, in seconds, with exit
    status 2), prepared (a first run builds the tiny assets), Ray started, the TaskRunner run, the summary printed."""
    from verl_pipe.config import ConfigError
    from verl_pipe.launch.prepare import prepare_config
    from verl_pipe.launch.teardown import become_subreaper

    t0 = time.perf_counter()
    try:
        config = prepare_config(config)  # checked first; a first run then builds the tiny assets (minutes)
    except ConfigError as e:
        print(f"[verl_pipe] config error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    t_run = time.perf_counter()
    become_subreaper()  # the run's orphaned processes stay ours to end (verl_pipe/launch/teardown.py)
    try:
        ray_start.start_ray(config)
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
        say("[verl_pipe] stopped; the latest completed checkpoint (if any) is in "
            f"{config.trainer.default_local_dir}; resume with trainer.resume_mode=auto")
        raise SystemExit(128 + signum) from None
    from verl_pipe.trainer.step_record import done_line, learning_line, pipeline_line

    say(learning_line(summary.get("val_before"), summary.get("val_after"), summary.get("steps", 0),
                      summary.get("rewards")))
    pipe = summary.get("pipeline") or {}
    say(pipeline_line(pipe.get("totals") or {}, summary.get("steps", 0), pipe.get("variants") or pipe.get("modes")
                      or ()))
    say(done_line(summary, time.perf_counter() - t_run, t_run - t0))
