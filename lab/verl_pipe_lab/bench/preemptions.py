"""vLLM's preemption count per rollout replica, for the bench's per-step ``vllm_preemptions``.

Where the KV cache binds, vLLM preempts running requests (recompute) and the admission order decides whose work is
thrown away; the count says whether a setting's KV cache bound at all. vLLM counts preemptions only with stats
logging on (``actor_rollout_ref.rollout.disable_log_stats=false``; verl's default is true, and then vLLM V1 records
no scheduler events): its Prometheus counter ``vllm:num_preemptions`` lives in the process that runs ``AsyncLLM``,
i.e. verl's ``vLLMHttpServer`` actor. ``read_counter`` runs there through Ray's ``__ray_call__`` (the same seam as
``rollout/replicas.py``'s health probe), one call per replica per read, so reading it costs no HTTP request.
"""

from __future__ import annotations

PREEMPTIONS = "vllm:num_preemptions"


def counter_total(metrics, name: str = PREEMPTIONS) -> float | None:
    """Sum of counter ``name`` over its label sets (one per engine) in Prometheus ``metrics`` (what a registry's
    ``collect()`` yields); None when the counter is not there (stats logging off, or not vLLM)."""
    total, found = 0.0, False
    for metric in metrics:
        if metric.name != name:
            continue
        for sample in metric.samples:
            if sample.name == name + "_total":
                total += float(sample.value)
                found = True
    return total if found else None


def read_counter(server, name: str = PREEMPTIONS) -> float | None:
    """Runs inside the vLLM server actor (``handle.__ray_call__.remote(read_counter)``): the counter from vLLM's own
    registry (a multiprocess one when vLLM set PROMETHEUS_MULTIPROC_DIR)."""
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    return counter_total(get_prometheus_registry().collect(), name)


def replica_preemptions(handles, timeout_s: float = 30.0) -> float | None:
    """Total preemptions so far over the replicas' server actors; None if any replica does not count them."""
    import ray

    values = ray.get([h.__ray_call__.remote(read_counter) for h in handles], timeout=timeout_s)
    return None if any(v is None for v in values) else float(sum(values))


def step_delta(before: float | None, after: float | None) -> float | None:
    """Preemptions during a step from two reads; None when either read had none."""
    if before is None or after is None:
        return None
    return after - before
