"""Pure mapping of what verl's separate_async trainer exposes (plus our hook events) onto StepTimeline metrics.

No Ray, no verl: the inputs are plain dicts recorded by ``hooks`` (wall-clock ``time.time()`` seconds, since
they come from several processes on one host), verl's ``timing_raw`` and the trained batch's TransferQueue tags.
"""

from __future__ import annotations

import math

from verl_pipe.core.timeline import StepTimeline

# Trainer spans of one mini-step, by our kind name <- the verl method wrapped by hooks.PeerTrainerMixin.
SPAN_KINDS = {"_compute_old_log_prob": "old_log_prob", "_compute_ref_log_prob": "ref_log_prob",
              "_update_actor": "update"}

# Metrics the peer cannot give, with why (the same for every step).
UNAVAILABLE = {
    "num_aborted": "verl's FullyAsyncLLMServerClient aborts and resumes in-flight requests at a weight sync "
                   "(partial rollout) inside one agent-loop call; the agent loop never sees the abort, so it "
                   "is not countable from outside (0 when nothing is in flight at the sync, as on-policy)",
}


def step_timeline(step: int, groups_per_unit: int, groups: dict[str, dict], spans: list[dict],
                  weight_sync: tuple[float, float] | None, step_t0: float | None = None) -> StepTimeline:
    """The StepTimeline of one peer step.

    groups: uid -> {"group": int, "submitted": t, "requests": {session: {"start", "end", "tokens"}}, "done": t}:
    the groups trained in this step. ``submitted`` is when the trainer submitted the group's batch (verl's
    _submit_batch_to_rollout; each request counts as submitted then, as our client submits a batch at once,
    falling back to the agent-loop call's start), ``end`` when its output was put into TransferQueue, ``done``
    when the group's terminal status was. spans: {"kind", "start", "end", "unit"} per trainer call.

    ``step_t0``: the step's own submission (its prepare_step). Events of data submitted earlier (a batch
    generated ahead) are moved up to it, so the metrics are over the step's window [step_t0, ...] like ours:
    rollout_end_s 0 then means the trained data was complete when the step began."""
    def at(t: float) -> float:
        return t if step_t0 is None else max(t, step_t0)

    tl = StepTimeline(step, groups_per_unit, clock=lambda: math.nan)
    for uid, g in groups.items():
        gid = int(g["group"])
        for sid, r in sorted(g["requests"].items(), key=lambda kv: str(kv[0])):
            rid = f"{uid}_{sid}"
            tl.request_submitted(rid, gid, t=at(g.get("submitted", r["start"])))
            if r.get("end") is not None:
                tl.response_done(rid, gid, int(r.get("tokens") or 0), t=at(r["end"]))
        if g.get("done") is not None:
            tl.group_done(gid, True, t=at(g["done"]))
    for s in spans:
        tl.train_span(s["kind"], s["start"], s["end"], unit=s.get("unit"))
    if weight_sync is not None:
        tl.weight_sync(*weight_sync)
    return tl


def weight_versions(tags: list[dict], step: int) -> dict:
    """Weight versions of the trajectories trained in ``step`` (from their TransferQueue tags).

    verl tags each trajectory with min/max_global_steps: the rollout weight version at its first and last
    generated token (FullyAsyncLLMServerClient); weights synced after step k carry version k, the initial sync
    version 0. So step k is exactly on-policy iff every trajectory has min == max == k - 1."""
    mins = [t["min_global_steps"] for t in tags if t.get("min_global_steps") is not None]
    maxs = [t["max_global_steps"] for t in tags if t.get("max_global_steps") is not None]
    prompts = [t["global_steps"] for t in tags if t.get("global_steps") is not None]
    out = {"trajectories": len(tags), "with_version": len(mins), "policy_version": step - 1}
    if mins and maxs:
        out.update(min_global_steps=min(mins), max_global_steps=max(maxs),
                   spanning=sum(1 for t in tags if t.get("min_global_steps") != t.get("max_global_steps")),
                   max_staleness=(step - 1) - min(mins),
                   on_policy=len(mins) == len(tags) and min(mins) == max(maxs) == step - 1)
    else:
        out.update(min_global_steps=None, max_global_steps=None, spanning=None, max_staleness=None,
                   on_policy=None)
    if prompts:
        out.update(prompt_global_steps_min=min(prompts), prompt_global_steps_max=max(prompts))
    return out


def step_record(step: int, groups_per_unit: int, groups: dict[str, dict], spans: list[dict],
                weight_sync: tuple[float, float] | None, step_start: float, step_end: float,
                timing_raw: dict, tags: list[dict], step_t0: float | None = None) -> dict:
    """One peer step as a bench mode entry: {"metrics": {metric: value}, "unavailable": {metric: reason},
    "weight_versions": {...}, "verl_timing_s": timing_raw}.

    ``metrics`` are StepTimeline.metrics() over the step's window from ``step_t0`` (this step's batch
    submission, as our t0; see step_timeline), plus: ``step_wall_s`` (verl's step, on_step_begin to the end of
    on_step_end's weight sync: the throughput figure), ``step_start_to_t0_s``, ``verl_gen_wait_s`` (verl's
    accumulated "gen" timer: the trainer blocked in replay_buffer.sample), ``verl_update_weights_s``, and the
    trained data's own latency: ``data_rollout_end_s`` / ``data_latency_s`` (its first submission to its last
    response / to the step's last trainer span; equal to rollout_end_s / rollout_to_train_end_s when the step
    trains what it submitted, i.e. on-policy; longer with a batch generated ahead)."""
    unavailable = dict(UNAVAILABLE)
    if not groups:
        raise ValueError(f"step {step}: no rollout events for the trained groups (hooks not installed?)")
    tl = step_timeline(step, groups_per_unit, groups, spans, weight_sync, step_t0)
    m = tl.metrics()
    m.pop("num_aborted", None)
    data = step_timeline(step, groups_per_unit, groups, spans, weight_sync).metrics()
    m["data_rollout_end_s"] = data["rollout_end_s"]
    m["data_latency_s"] = data["rollout_to_train_end_s"]
    m["step_wall_s"] = float(step_end - step_start)
    m["step_start_to_t0_s"] = float(tl.t0 - step_start)
    if "gen" in timing_raw:
        m["verl_gen_wait_s"] = float(timing_raw["gen"])
    if "update_weights" in timing_raw:
        m["verl_update_weights_s"] = float(timing_raw["update_weights"])
    lengths = [[int(r.get("tokens") or 0) for _, r in sorted(g["requests"].items(), key=lambda kv: str(kv[0]))]
               for g in sorted(groups.values(), key=lambda g: g["group"])]
    t0 = tl.t0
    return {"step": step, "metrics": m, "unavailable": unavailable, "weight_versions": weight_versions(tags, step),
            "verl_timing_s": {k: float(v) for k, v in timing_raw.items()}, "lengths": lengths,
            "train_spans": [{"kind": s["kind"], "start": float(s["start"] - t0), "end": float(s["end"] - t0),
                             "unit": s.get("unit")} for s in spans]}
