"""The trainer's calls span by span: what the driver waited for against what the worker spent, per mode and setting.

``python -m verl_pipe_lab.bench.trainer_gap STEPS_JSON WORKER_LOG [--out FILE.json]``: STEPS_JSON is a bench run's
``*_steps.json`` (either may be gzipped: ``.gz``), WORKER_LOG the file the run's ``VERL_PIPE_WORKER_LOG`` named (verl_pipe/trainer/worker_log.py).
For each setting and mode, means per measured step of:

- ``driver_s``: the trainer's spans of the call kind (old log-probs, updates) as the driver timed them: the call's
  data conversion (DataProto -> TensorDict, no-padding layout) and transfer, the worker's work, the result's return;
- ``worker_s``: the same calls' time inside the worker (verl's engine worker: its mini-batch iterator, the
  micro-batches' forward/backward, the optimizer step, the metrics);
- ``overhead_s``: the difference (conversion, transfer, dispatch), and ``padded_tokens`` / ``tokens``: what the
  engine computed over against the real tokens, with ``worker_ms_per_padded_ktok``.

Our modes' worker calls are matched to their steps by the steps' wall-clock windows. verl's peer runs in its own
Ray cluster with its own worker process: its calls are the log's remaining ones, in order, one step's worth (its
own span count) at a time after its warm-up steps.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from verl_pipe.trainer import worker_log
from verl_pipe_lab.bench.readme_tables import trainer_spans
from verl_pipe.core.micro_batches import padded_tokens

# A call kind: the trainer's span kinds (verl_pipe/core/schedule.py) and the worker calls (verl_pipe/trainer/workers.py) it
# covers. Group granularity's update is its forward/backward passes and its optimizer step.
KINDS = {"old_log_prob": (("old_log_prob",), ("compute_log_prob",)),
         "update": (("update", "forward_backward", "optimizer_step"), ("update_actor", "accumulate_group", "finish_unit"))}


def _spans(step: dict) -> list[dict]:
    return step["train_spans"] if step.get("peer") else step["timeline"]["train_spans"]


def _cost(records: list[dict]) -> dict:
    out = {"worker_s": 0.0, "calls": len(records), "tokens": 0, "padded_tokens": 0}
    for r in records:
        out["worker_s"] += r["end"] - r["start"]
        if r.get("lengths") and r.get("micro_batch_size"):
            out["tokens"] += sum(r["lengths"])
            out["padded_tokens"] += padded_tokens(r["lengths"], int(r["micro_batch_size"]))
    return out


def _ours(step: dict, records: list[dict]) -> dict[str, list[dict]]:
    lo, hi = step["wall_window"]
    mine = [r for r in records if lo <= r["start"] <= hi]
    return {kind: [r for r in mine if r["call"] in calls] for kind, (_, calls) in KINDS.items()}


def _peer(steps: list[dict], records: list[dict], warmup: int) -> list[dict[str, list[dict]]]:
    """The peer's calls per measured step: its records in order, each step taking as many calls of a kind as it has
    spans of that kind (the warm-up steps first, with the first measured step's counts)."""
    queues = {kind: [r for r in records if r["call"] in calls] for kind, (_, calls) in KINDS.items()}
    per_step = []
    for i, step in enumerate([steps[0]] * warmup + steps):
        counts = {kind: sum(s["kind"] in spans for s in _spans(step)) for kind, (spans, _) in KINDS.items()}
        got = {}
        for kind, q in queues.items():
            got[kind], queues[kind] = q[:counts[kind]], q[counts[kind]:]
        if i >= warmup:
            per_step.append(got)
    return per_step


def table(steps_json: dict, records: list[dict], warmup: int = 1) -> list[dict]:
    steps = steps_json["steps"]
    ours = [s for s in steps if not s.get("peer")]
    matched = {id(s): _ours(s, records) for s in ours}
    used = {id(r) for calls in matched.values() for rs in calls.values() for r in rs}
    ours_pids = {r["pid"] for r in records if id(r) in used}
    rest = [r for r in records if r["pid"] not in ours_pids]
    by_setting: dict[tuple, list[dict]] = defaultdict(list)
    for s in steps:
        by_setting[(s["setting"], s["mode"])].append(s)
    rows = []
    for (setting, mode), group in by_setting.items():
        if group[0].get("peer"):
            calls = _peer(group, [r for r in rest], warmup)
        else:
            calls = [matched[id(s)] for s in group]
        row = {"setting": setting, "mode": mode, "rounds": len(group)}
        for kind, (spans, _) in KINDS.items():
            driver = [sum(sp["end"] - sp["start"] for sp in _spans(s) if sp["kind"] in spans) for s in group]
            cost = [_cost(c[kind]) for c in calls]
            n = len(group)
            worker = sum(c["worker_s"] for c in cost) / n
            padded = sum(c["padded_tokens"] for c in cost) / n
            row[kind] = {"driver_s": sum(driver) / n, "worker_s": worker, "overhead_s": sum(driver) / n - worker,
                         "calls": sum(c["calls"] for c in cost) / n, "tokens": sum(c["tokens"] for c in cost) / n,
                         "padded_tokens": padded,
                         "worker_ms_per_padded_ktok": 1e6 * worker / padded if padded else None}
        row["trainer_busy_s"] = sum(s["metrics"]["trainer_busy_s"] for s in group) / len(group)
        row["rollout_to_train_end_s"] = sum(s["metrics"]["rollout_to_train_end_s"] for s in group) / len(group)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("steps_json")
    p.add_argument("worker_log")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps of each stack and of the peer (bench config)")
    p.add_argument("--out", help="write the rows as JSON here")
    a = p.parse_args(argv)
    with worker_log.open_text(a.steps_json) as f:
        rows = table(json.load(f), worker_log.read(a.worker_log), a.warmup)
    print("\n".join(trainer_spans({"rows": rows})))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "steps_json": a.steps_json, "worker_log": a.worker_log}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
