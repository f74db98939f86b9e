"""What a completed step leaves behind: its metrics, its record (``trainer.last_step_record``, which
``PipeSession.step`` returns), its trace files (``rolloutpipe.trace_dir``: ``step_NNNNN.json`` and ``steps.jsonl``)
and its summary line on stdout (docs/metrics.md).

One job: RolloutPipeTrainer.fit_step's bookkeeping after a step completed. The pieces are pure except
``write_trace`` (files) and ``record_step`` (the run's ``StepHistory``, verl's step metrics and stdout). verl seam:
``record_step`` calls verl's ``RayPPOTrainer._fit_collect_metrics`` (verl's step metrics on the trained batch: data,
``timing_s/*``, throughput) through the trainer's seam (``TrainerSeam.collect_verl_metrics``), which reads and
writes the trainer's ``metrics`` and reads its ``timing_raw``.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from verl_pipe.core.timeline import StepTimeline, write_chrome_trace
from verl_pipe.core.variants import pipelines
from verl_pipe.data_check import skip_metrics
from verl_pipe.trainer.knobs import StepKnobs

KEEP_TIMELINES = 16  # the last steps' StepTimelines kept in memory (StepHistory.timelines)
# Timeline figures summed over the run for its closing pipelining line (pipeline_line).
PIPELINE_SUMS = ("rollout_end_s", "rollout_to_train_end_s", "trainer_busy_s", "trainer_busy_in_rollout_s")


@dataclass
class StepHistory:
    """The run's completed steps as it keeps them: the last steps' timelines (tests, the bench; a long run keeps
    them bounded, the full history goes to rolloutpipe.trace_dir and the logger), the count of every completed
    step, each step's training reward, the last step's record."""
    timelines: deque = field(default_factory=lambda: deque(maxlen=KEEP_TIMELINES))
    steps_run: int = 0
    rewards: list[float] = field(default_factory=list)
    last_record: dict = field(default_factory=dict)
    # sums over the completed steps of the timeline figures the run's pipelining line reports (PIPELINE_SUMS)
    totals: dict[str, float] = field(default_factory=dict)
    modes: set[str] = field(default_factory=set)  # the trainer modes the run's steps ran in
    variants: set[str] = field(default_factory=set)  # what the run's steps ran as (variant_label)


def rollout_metrics(tm: dict, rollout_result, trained_groups: int, health=None) -> dict:
    """The step's ``rolloutpipe/*`` metrics: its timeline's (``tm``), the rollout's fault counts, the replica deaths
    found outside the rollout's requests (``health``: verl_pipe.rollout.replicas.Health), the groups trained."""
    m = {f"rolloutpipe/{k}": v for k, v in tm.items()}
    m["rolloutpipe/failed_request_attempts"] = rollout_result.failed_attempts
    m["rolloutpipe/aborted_requests"] = rollout_result.aborted
    m["rolloutpipe/untrainable_groups"] = rollout_result.untrainable
    m["rolloutpipe/late_groups_dropped"] = rollout_result.late_groups
    m["rolloutpipe/failed_groups_dropped"] = rollout_result.dropped_groups
    m["rolloutpipe/reward_failures"] = rollout_result.reward_failures
    found = sum(health.found.values()) if health is not None else 0
    recovery = list(rollout_result.recovery_s) + (list(health.recovery_s) if health is not None else [])
    m["rolloutpipe/replica_failures"] = rollout_result.replica_failures + found
    m["rolloutpipe/replica_restarts"] = rollout_result.replica_restarts + (health.restarts if health is not None else 0)
    m["rolloutpipe/requeued_requests"] = rollout_result.requeued_requests
    if recovery:
        m["rolloutpipe/replica_recovery_s"] = max(recovery)
    if health is not None:
        m.update(health.metrics())
    m["rolloutpipe/trained_groups"] = trained_groups
    return m


def step_record(step: int, data_index: list, trained_groups: list[int], tm: dict, knobs: dict | None = None) -> dict:
    record = {
        "step": step,
        "data_index": data_index,  # the dataset rows the step drew, in order
        "trained_groups": trained_groups,
        "timeline": tm,
    }
    if knobs is not None:
        record["knobs"] = knobs  # what the step ran as (StepKnobs.record(): variant, mode, FGD window resolved, ...)
    return record


def write_trace(trace_dir, timeline: StepTimeline, record: dict, metrics: dict) -> None:
    """The step's Chrome trace, and its record with the numeric metrics appended to ``steps.jsonl``."""
    Path(trace_dir).mkdir(parents=True, exist_ok=True)
    write_chrome_trace([timeline], Path(trace_dir) / f"step_{record['step']:05d}.json")
    record = dict(record, metrics={k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
    with open(Path(trace_dir) / "steps.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def variant_label(knobs: StepKnobs) -> str:
    """What a step runs as, in words: the trainer mode, ``+fgd`` when frontier-group dispatch admits the rollout, and
    for a pipelined mode its granularity and unit fill (rolloutpipe.cgp.granularity, rolloutpipe.cgp.unit_fill), then the
    mini-batch order when it is not the dataloader's (rolloutpipe.minibatch_order), e.g.
    ``cgp+fgd, group granularity, dispatch fill, length order``; sync trains whole mini-batches after the rollout:
    ``sync`` (``sync, length order``)."""
    name = knobs.mode + ("+fgd" if knobs.fgd else "")
    order = [] if knobs.minibatch_order == "dataloader" else [f"{knobs.minibatch_order} order"]
    if not pipelines(knobs.mode):
        return ", ".join([name, *order])
    return ", ".join([name, f"{knobs.granularity} granularity", f"{knobs.unit_fill} fill", *order])


def summary_line(step: int, variant: str, m: dict, tm: dict) -> str:
    """The step's line on stdout; ``variant``: what it ran as (``variant_label``)."""
    train_s = tm["trainer_busy_s"]
    return (f"[verl_pipe] step {step} ({variant}): "
            f"reward {m.get('critic/score/mean', float('nan')):.3f} | "
            f"resp_len {m.get('response_length/mean', float('nan')):.1f} | "
            f"rollout {tm['rollout_end_s']:.2f}s | train {train_s:.2f}s | "
            f"weight_sync {tm['weight_sync_s']:.2f}s | step {tm['step_time_s']:.2f}s | "
            f"rollout→train_end {tm['rollout_to_train_end_s']:.2f}s | "
            f"trainer_wait {tm['trainer_wait_ratio']:.2f}")


def record_step(seam, history: StepHistory, *, step: int, knobs: StepKnobs, outcome, timeline: StepTimeline,
                rollout_result, data_index: list, step_s: float, health=None, lengths: list | None = None) -> dict:
    """Completes the step's metrics (``seam.metrics``, verl's), adds the step to ``history``, writes the trace (if
    ``rolloutpipe.trace_dir``), prints the summary line; returns the step's record. ``health``: the replica
    supervisor's (verl_pipe.rollout.replicas.Health), if any; ``step_s``: the step's wall time; ``lengths``: each
    group's predicted and actual response lengths (verl_pipe.core.lengths.StepLengths.record), kept as the record's
    ``lengths``."""
    metrics, tm = seam.metrics, timeline.metrics()
    tm_run = dict(tm, trainer_busy_in_rollout_s=timeline.trainer_busy_in_rollout_s())
    metrics.update(rollout_metrics(tm, rollout_result, len(outcome.trained), health))
    metrics["rolloutpipe/trainer_busy_in_rollout_s"] = tm_run["trainer_busy_in_rollout_s"]
    metrics.update(skip_metrics(seam.config))  # records the launcher's data check skipped
    multiturn = None
    if outcome.batch is not None:
        # verl's own step metrics (data, timing_s/*, throughput, variance proxy) on the trained groups.
        seam.collect_verl_metrics(outcome.batch)
        if "mt_turns" in (getattr(outcome.batch, "non_tensor_batch", None) or {}):  # multi-turn (docs/multiturn.md)
            from verl_pipe.rollout.multiturn import step_summary

            multiturn = step_summary(outcome.batch)
            metrics.update(multiturn[0])
    metrics["timing_s/step"] = step_s
    record = step_record(step, data_index, [g.index for g in outcome.trained], tm, knobs.record())
    if lengths is not None:
        record["lengths"] = lengths
    from verl_pipe.platform.node_roles import pool_nodes

    nodes = pool_nodes(getattr(seam, "_trainer", None))  # {"trainer": [...], "rollout": [...]}: Ray node ids
    if nodes:
        record["nodes"] = nodes
    history.timelines.append(timeline)  # bounded (KEEP_TIMELINES)
    history.steps_run += 1
    history.rewards.append(float(metrics.get("critic/score/mean", float("nan"))))
    history.modes.add(knobs.mode)
    history.variants.add(variant_label(knobs))
    for k in PIPELINE_SUMS:
        history.totals[k] = history.totals.get(k, 0.0) + float(tm_run[k])
    history.last_record = record
    trace_dir = seam.config.rolloutpipe.trace_dir
    if trace_dir:
        write_trace(trace_dir, timeline, record, metrics)
    print(summary_line(step, variant_label(knobs), metrics, tm), flush=True)
    if multiturn is not None:
        print(f"[verl_pipe] step {step} multi-turn: {multiturn[1]}", flush=True)
    return record


def val_core(metrics: dict | None) -> dict[str, float]:
    """verl's headline validation metrics (``val-core/<data source>/<metric>``) of a validation's metrics."""
    return {k.removeprefix("val-core/"): float(v) for k, v in (metrics or {}).items() if k.startswith("val-core/")}


def learning_line(before: dict | None, after: dict | None, steps: int, rewards: list[float] | None = None) -> str:
    """The run's learning: each val-core metric before training and after its last step, and the training reward
    (mean over the step's responses) of the first and last tenth of the steps."""
    b, a = val_core(before), val_core(after)
    names = sorted(set(b) | set(a))
    lines = []
    if rewards and len(rewards) >= 2:
        k = max(1, len(rewards) // 10)
        lines.append(f"[verl_pipe] training reward: {sum(rewards[:k]) / k:.3f} over the first {k} step(s) -> "
                     f"{sum(rewards[-k:]) / k:.3f} over the last {k}")
    if not names:
        return "\n".join(lines + ["[verl_pipe] no validation ran (trainer.val_before_train, trainer.test_freq)"])
    parts = []
    for name in names:
        before_s = f"{b[name]:.3f}" if name in b else "not measured"
        after_s = f"{a[name]:.3f}" if name in a else "not measured"
        parts.append(f"{name}: {before_s} before training -> {after_s} after {steps} steps")
    return "\n".join(lines + ["[verl_pipe] validation " + "; ".join(parts)])


# What a long run keeps of each step's learning (bench, soak, learning curves): a regression in learning shows up in
# their JSON like a regression in speed.
LEARNING_KEYS = ("critic/score/mean", "response_length/mean", "actor/entropy", "actor/pg_loss", "actor/grad_norm")


def learning_metrics(metrics: dict) -> dict[str, float]:
    """The step's reward, length, entropy, loss and gradient norm, and its validation metrics when it validated."""
    out = {k: float(metrics[k]) for k in LEARNING_KEYS if isinstance(metrics.get(k), (int, float))}
    out.update({f"val-core/{k}": v for k, v in val_core(metrics).items()})
    return out


def pipeline_line(totals: dict[str, float], steps: int, variants) -> str:
    """What pipelining did over the run, from its own timelines (``StepHistory.totals``): how much of the training
    ran while the rollout still generated, and the steps' rollout->train end against the rollout and the training
    back to back (each step's ``rollout_end_s + trainer_busy_s``: what a sync step of the same work and the same
    per-phase speeds takes). The overlap slows each side a little on shared hardware, which that estimate leaves out:
    the measured comparison with sync is the learning bench's (docs/learning.md). ``variants``: what the steps ran as
    (``variant_label``; trainer mode names do too)."""
    if steps < 1 or not totals:
        return "[verl_pipe] pipelining: no step completed"
    ran = "; ".join(sorted(variants)) or "?"
    busy, overlap = totals["trainer_busy_s"], totals["trainer_busy_in_rollout_s"]
    window, serial = totals["rollout_to_train_end_s"], totals["rollout_end_s"] + totals["trainer_busy_s"]
    wait = window - busy
    if overlap <= 0:
        return (f"[verl_pipe] {ran}: over {steps} steps the trainer trained {busy:.1f}s and waited "
                f"{wait:.1f}s for the rollout ({wait / window:.0%} of rollout->train end, {window:.1f}s); a pipelined "
                "mode (rolloutpipe.mode=cgp) trains complete groups during the rollout")
    saved = serial - window
    return (f"[verl_pipe] pipelining ({ran}) over {steps} steps: the trainer trained {overlap:.1f}s "
            f"of its {busy:.1f}s while the rollout still ran ({overlap / busy:.0%}) and waited {wait:.1f}s; "
            f"rollout->train end {window:.1f}s against {serial:.1f}s for rollout then training back to back: "
            f"{saved:.1f}s ({saved / serial:.0%}) saved. Computed from this run's step timelines (the steps' rollout "
            "end + trainer busy time, minus their rollout->train end): an estimate of sync at this run's phase "
            "speeds, not a measured sync run")


def done_line(summary: dict, run_s: float, prepare_s: float) -> str:
    """The run's closing line: its steps and time from Ray's start (start-up included), and, when it took a while
    (a first run builds the tiny assets), the config's preparation before it, apart."""
    prepared = f"; before it, the config and assets {prepare_s:.1f}s" if prepare_s >= 1.0 else ""
    return (f"[verl_pipe] done: {summary.get('steps', 0)} steps in {run_s:.1f}s "
            f"(start-up {summary.get('startup_s', float('nan')):.1f}s{prepared})")
