"""A stop request that reaches the training loop wherever it runs: a key in the Ray cluster's GCS key-value store.

The launcher's stop file (``main_grpo.request_stop``) is in the launcher's ``/tmp``; on a multi-node cluster the
TaskRunner, which runs the training loop, may be on another machine and never see it. The GCS is the one store every
node of the cluster reads, so the launcher also puts ``stop/<run id>`` there, and ``RunLoop.stop_requested`` checks
both before every step: the step in progress completes (and is checkpointed when ``trainer.save_freq`` says so), no
new one starts. The launcher prints its run id; a stop can also be asked for from any machine that reaches the
cluster, without a signal:

    python -m verl_pipe.launch.stop_request <run id> [--address <head>:6379]    # default: RAY_ADDRESS, else auto
"""

from __future__ import annotations

import argparse
import os

NAMESPACE = "verl_pipe"


def _key(run_id: str) -> bytes:
    if not run_id or not isinstance(run_id, str):
        raise ValueError(f"stop request: run id must be a non-empty string, got {run_id!r}")
    return f"stop/{run_id}".encode()


def request(run_id: str) -> None:
    """Asks run ``run_id`` to stop before its next step. Ray must be initialized (connected to the run's cluster)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_key(run_id), b"1", overwrite=True, namespace=NAMESPACE)


def requested(run_id: str | None) -> bool:
    """Whether a stop of run ``run_id`` was asked for; False without a run id or outside a Ray cluster."""
    import ray

    if not run_id or not ray.is_initialized():
        return False
    from ray.experimental import internal_kv

    return bool(internal_kv._internal_kv_exists(_key(run_id), namespace=NAMESPACE))


def clear(run_id: str | None) -> None:
    """Drops run ``run_id``'s request (the run saw it, or ended), where Ray is initialized."""
    import ray

    if run_id and ray.is_initialized():
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(_key(run_id), namespace=NAMESPACE)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_id", help="the run id the launcher printed ('[verl_pipe] run id ...')")
    ap.add_argument("--address", default=None, help="the cluster's head, host:port (default: RAY_ADDRESS, else auto)")
    args = ap.parse_args(argv)
    import ray

    ray.init(address=args.address or os.environ.get("RAY_ADDRESS") or "auto", logging_level="ERROR",
             log_to_driver=False)
    try:
        request(args.run_id)
    finally:
        ray.shutdown()
    print(f"[verl_pipe] stop requested for run {args.run_id}: it starts no new step", flush=True)


if __name__ == "__main__":
    main()
