"""``--calibrate RUN_DIR``: the engine and trainer costs fitted on a short real run's step records.

A run with ``rolloutpipe.trace_dir=RUN_DIR`` leaves ``RUN_DIR/steps.jsonl`` (one record per step: its metrics) and,
beside it, ``step_NNNNN.json`` (the step's Chrome trace: every request's submit and finish with its tokens and
replica, every trainer call with its kind and unit, the units' groups). The events come from the trace, the step
list and measured figures from steps.jsonl. The fit itself is the bench's (``verl_pipe.bench.calib``: engine
decode cost alone and beside a busy trainer, trainer cost per padded token and per call), so a planner
calibration and a bench calibration are the same numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from verl_pipe.bench.calib import Calibration, StepShape, _validation_table, calibrate, calibration_summary
from verl_pipe.variants import name_of

KV_UNBOUNDED = 1 << 40  # the fit assumes the run's KV cache never bound (the bench's assumption too)


def timeline_from_chrome(trace: dict, stride: int = 1000) -> dict:
    """A ``StepTimeline.to_dict()``-shaped event dict rebuilt from one step's Chrome trace (``to_chrome_trace``).

    Lost in the trace and not needed by the fit: the groups a span covered (a span covers its unit's groups, or
    all groups without a unit, as ``calib._trainer_spans`` reads it)."""
    ev = {k: [] for k in ("requests", "responses", "aborts", "groups", "units_ready", "train_spans", "weight_syncs")}
    s = 1e-6
    for e in trace.get("traceEvents", []):
        a, ph, pid = e.get("args") or {}, e.get("ph"), e.get("pid")
        if ph == "X" and pid == 1:
            t0, t1 = e["ts"] * s, (e["ts"] + e["dur"]) * s
            ev["requests"].append({"t": t0, "request_id": e["name"], "group": a["group"], "replica": e["tid"] // stride})
            if a.get("aborted"):
                ev["aborts"].append({"t": t1, "request_id": e["name"], "group": a["group"]})
            elif not a.get("unfinished"):
                ev["responses"].append({"t": t1, "request_id": e["name"], "group": a["group"],
                                        "num_tokens": int(a["tokens"])})
        elif ph == "i" and pid == 1 and "group" in a:
            ev["groups"].append({"t": e["ts"] * s, "group": a["group"], "trainable": a.get("trainable", True)})
        elif ph == "i" and pid == 2 and "unit" in a:
            ev["units_ready"].append({"t": e["ts"] * s, "unit": a["unit"], "groups": list(a["groups"])})
        elif ph == "X" and pid == 2:
            ev["train_spans"].append({"kind": e["name"], "start": e["ts"] * s, "end": (e["ts"] + e["dur"]) * s,
                                      "unit": a.get("unit"), "group": None})
        elif ph == "X" and pid == 3:
            ev["weight_syncs"].append({"start": e["ts"] * s, "end": (e["ts"] + e["dur"]) * s})
    return ev


def _index(request_id, default: int) -> int:
    """A response's index in its group: the "<group>-<index>" ids the driver gives, else arrival order."""
    tail = str(request_id).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else default


def mode_of(tl: dict) -> tuple[str, str]:
    """(mode, granularity) from the spans the trainer recorded: sync computes one whole-batch log-prob call (no
    unit), group granularity calls forward_backward per burst. FGD is not visible in the spans; it only changes
    the admission, which the engine fit does not model, so FGD steps fit as cgp."""
    kinds = {(sp["kind"], sp["unit"] is None) for sp in tl["train_spans"]}
    if ("old_log_prob", True) in kinds:
        mode, granularity = "sync", "minibatch"
    else:
        mode, granularity = "cgp", "group" if any(k == "forward_backward" for k, _ in kinds) else "minibatch"
    return name_of(mode, granularity), granularity


def load_run(run_dir, prompt_len: float | None = None) -> list[dict]:
    """The run's measured steps in ``bench.calib``'s form: mode, timeline, lengths by group, prompt length."""
    run = Path(run_dir)
    path = run / "steps.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise ValueError(f"--calibrate {run_dir}: no steps.jsonl (a run's rolloutpipe.trace_dir holds one)")
    steps = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--calibrate {path}: line {i} is not JSON ({e.msg})") from None
        if "step" not in rec or "timeline" not in rec:
            raise ValueError(f"--calibrate {path}: record {i} has no 'step'/'timeline' (not a rolloutpipe steps.jsonl)")
        trace = path.parent / f"step_{int(rec['step']):05d}.json"
        if not trace.is_file():
            raise ValueError(f"--calibrate {path}: record {i} (step {rec['step']}): its Chrome trace {trace.name} is "
                             "not beside it; the fit needs the per-request and per-call events it holds")
        tl = timeline_from_chrome(json.loads(trace.read_text()))
        if not tl["responses"] or not tl["train_spans"]:
            raise ValueError(f"--calibrate {trace}: no finished responses or no trainer spans")
        mode, gran = mode_of(tl)
        by: dict[int, dict[int, int]] = {}
        for r in tl["responses"]:
            got = by.setdefault(int(r["group"]), {})
            got[_index(r["request_id"], len(got))] = int(r["num_tokens"])
        lengths = [[v for _, v in sorted(by.get(g, {}).items())] or [1] for g in range(max(by) + 1)]
        metrics = rec.get("metrics") or {}
        p = prompt_len or metrics.get("prompt_length/mean")
        if not p:
            raise ValueError(f"--calibrate {path}: record {i} has no prompt_length/mean metric; pass --prompt-len")
        tm = rec["timeline"]
        steps.append({"setting": "run", "mode": mode, "granularity": gran, "timeline": tl, "lengths": lengths,
                      "prompt_len": float(p), "weight_sync_s": float(tm.get("weight_sync_s", 0.0)),
                      "metrics": tm, "step": rec["step"]})
    if not steps:
        raise ValueError(f"--calibrate {path}: no step records")
    # A run's first step pays the engines' warm-up (on the tiny default 5.5 s against ~2.2 s for the next ones,
    # docs/plan.md), as the bench's discarded warm-up step does: left out when the run has others to fit on.
    return steps[1:] if len(steps) > 1 else steps


@dataclass
class RunCalibration:
    cal: Calibration
    shape: StepShape
    train_gpus: int
    prompt_len: float
    weight_sync_s: float
    modes: dict[str, int]  # steps per mode
    self_check: dict  # re-simulating the run's own steps with the fit (in-sample error per mode)

    def summary(self) -> dict:
        return {"calibration": calibration_summary(self.cal), "train_gpus": self.train_gpus,
                "prompt_len": self.prompt_len, "weight_sync_s": self.weight_sync_s, "steps_per_mode": self.modes,
                "num_replicas": self.shape.num_replicas, "self_check": self.self_check}


def calibrate_run(run_dir, *, micro_rows: int, max_num_seqs: int, max_num_batched_tokens: int, train_gpus: int,
                  prompt_len: float | None = None) -> RunCalibration:
    """Fit on the run's steps; the shape the run had is read from its events (n, unit size, replicas) and the
    config (micro-batch rows, engine slots, trainer GPUs: what the events cannot tell)."""
    steps = load_run(run_dir, prompt_len)
    s0 = steps[0]["timeline"]
    n = max(len(g) for g in steps[0]["lengths"])
    units = sorted(s0["units_ready"], key=lambda u: u["unit"])
    if not units:
        raise ValueError(f"--calibrate {run_dir}: step {steps[0]['step']} recorded no training unit")
    shape = StepShape(n=n, groups_per_unit=len(units[0]["groups"]), micro_rows=micro_rows, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens, kv_capacity_tokens=KV_UNBOUNDED,
                      num_replicas=1 + max(r["replica"] for s in steps for r in s["timeline"]["requests"]))
    try:
        cal = calibrate(steps, shape)
    except ValueError as e:
        raise ValueError(f"--calibrate {run_dir}: {e}") from None
    check = _validation_table(steps, lambda s: cal, shape)
    modes: dict[str, int] = {}
    for s in steps:
        modes[s["mode"]] = modes.get(s["mode"], 0) + 1
    return RunCalibration(cal, shape, train_gpus, sum(s["prompt_len"] for s in steps) / len(steps),
                          sum(s["weight_sync_s"] for s in steps) / len(steps), modes,
                          {"per_mode": check["per_mode"], "max_rel_error": check["max_rel_error"]})
