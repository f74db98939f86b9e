"""The multi-turn bench's analysis (``verl_pipe_lab.bench.multiturn``): the simulator's prediction of every measured step
and its error per metric, and the per-mode summary. Pure (no Ray, no vLLM): it reads the bench's recorded steps.

The engine is calibrated on the run's own calibration steps (``calibration``: single-turn episodes of the setting's
turn lengths, sync, on the same stack just before the measured rounds), with the single-turn bench's fit
(``verl_pipe.sim.calib.fit_engine``: decode step and prefill cost from each request's engine interval); the
multi-turn rounds are never fitted on, so the engine side is an out-of-sample prediction. The ``cpu_tiny`` preset's
prediction is kept beside it (``sim_preset``). The trainer side is fitted on the measured rounds' trainer spans
(in-sample, as the single-turn bench's ``sim_validation``), so ``rollout_to_train_end_s`` is predicted too.

Each step is simulated from its round's episodes (the environment's own plans for the round's tasks and seed), the
measured prompt length and mean tool-message length, the engine's KV block as prefix-cache granularity, and the
measured mode's admission (sync / cgp: verl's FCFS dispatch; cgp_fgd: the frontier policy with its window; the peer:
verl's FCFS dispatch of its whole batch), and its timeline's metrics are read by the same ``StepTimeline`` code as
the real step's, so "first unit ready" means the same in both.
"""

from __future__ import annotations

import re

from verl_pipe.core.variants import BASE, FGD_VARIANT, ON_POLICY_PEER, PIPELINED_BASE, variant

METRICS = ("first_unit_ready_s", "rollout_end_s", "rollout_to_train_end_s")
PEER_MODE = ON_POLICY_PEER


def _episodes(cfg: dict, shape: dict, rnd: dict, step: dict):
    from verl_pipe.assets.multiturn_env import EnvConfig
    from verl_pipe.sim.turns import from_env

    env = EnvConfig.from_dict({**cfg["multiturn"], "seed": rnd["seed"]})
    return from_env(env, len(rnd["tasks"]), shape["n"], response_length=shape["max_response_length"],
                    tool_tokens=round(step["tool_tokens"]), task=lambda g: rnd["tasks"][g],
                    cache_block=int(shape.get("cache_block") or 1))


def fit_engine_on(calibration: list[dict], shape: dict):
    """The engine fitted on the calibration steps ({"events": timeline dict, "prompt_len"}), or None without any."""
    from verl_pipe.sim.calib import fit_engine
    from verl_pipe.sim.engine import CPU_TINY

    steps = [{"timeline": c["events"], "prompt_len": c["prompt_len"]} for c in calibration if c.get("events")]
    if not steps:
        return None
    return fit_engine(steps, shape["max_num_seqs"], CPU_TINY.with_(max_num_seqs=shape["max_num_seqs"]))


def calibration_check(calibration: list[dict], shape: dict, engine) -> list[dict]:
    """The fitted engine on its own calibration steps: each step re-simulated from its measured response lengths
    (single-turn), its second group's completion and rollout end against the measured ones (signed error)."""
    from verl_pipe.sim.simulate import rollout_for_mode
    from verl_pipe.sim.turns import Episodes

    out = []
    for c in calibration:
        ev = c["events"]
        t0 = min(r["t"] for r in ev["requests"])
        n, groups = shape["n"], sorted({r["group"] for r in ev["requests"]})
        # a request id ends with its sample index ("s4-g0-r1" live, "0-1" simulated)
        lengths = {(r["group"], int(re.findall(r"\d+", r["request_id"])[-1])): int(r["num_tokens"])
                   for r in ev["responses"]}
        eps = Episodes([[(lengths[(g, i)],) for i in range(n)] for g in groups], [[()] * n for _ in groups])
        res = rollout_for_mode("sync", eps.workload(prompt_len=round(c["prompt_len"])),
                               engine.with_(max_num_seqs=shape["max_num_seqs"]), shape["replicas"],
                               shape["groups_per_unit"], shape.get("baseline_window"), episodes=eps)
        done = sorted(g["t"] - t0 for g in ev["groups"])
        k = shape["groups_per_unit"] - 1
        measured = {"first_unit_ready_s": done[k], "rollout_end_s": max(r["t"] for r in ev["responses"]) - t0}
        sim = {"first_unit_ready_s": res.completions[k][0], "rollout_end_s": res.rollout_end}
        out.append({"seed": c.get("seed"), "measured": measured, "sim": sim, "rel_error": _errors(sim, measured)})
    return out


def fit_trainer_on(cfg: dict, live: dict):
    """The trainer's cost model fitted on the measured rounds' spans (their responses as the episodes plan them),
    or None when the steps carry no events or spans."""
    from verl_pipe.sim.calib import fit_trainer

    shape, rows = live["shape"], []
    for st in live["steps"]:
        if not st.get("events") or st["mode"] == PEER_MODE:
            continue
        eps = _episodes(cfg, shape, live["rounds"][st["round"]], st)
        rows.append({"timeline": st["events"], "prompt_len": st["prompt_len"], "mode": st["mode"],
                     "lengths": eps.workload(prompt_len=round(st["prompt_len"])).lengths})
    try:
        return fit_trainer(rows, shape["micro_rows"]) if rows else None
    except ValueError:
        return None


def simulate_one(cfg: dict, shape: dict, rnd: dict, step: dict, engine, trainer=None) -> dict:
    """The simulated metrics of one measured step (``METRICS``; without ``trainer`` the rollout's only)."""
    from verl_pipe.sim.simulate import rollout_for_mode, timeline_for

    from verl_pipe.sim.calib import PaddedWorkload

    eps = _episodes(cfg, shape, rnd, step)
    wl = eps.workload(prompt_len=round(step["prompt_len"]))
    # the trainer pads each micro-batch (one group of n rows here) to its longest row
    wl = PaddedWorkload(wl.num_groups, wl.n, wl.lengths, wl.prompt_len, wl.name)
    mode, gpu = step["mode"], shape["groups_per_unit"]
    fgd = variant(mode).fgd
    window = shape.get("fgd_window") if fgd else (None if mode == PEER_MODE else shape.get("baseline_window"))
    res = rollout_for_mode(mode, wl, engine.with_(max_num_seqs=shape["max_num_seqs"]), shape["replicas"], gpu, window,
                           order=shape.get("baseline_order") or "group_major", episodes=eps)
    if trainer is None:
        return {"rollout_end_s": res.rollout_end,
                "first_unit_ready_s": res.completions[gpu - 1][0] if len(res.completions) >= gpu else None}
    m = timeline_for(res, wl, trainer, mode, gpu, weight_sync_s=0.0).metrics()
    return {k: m[k] for k in METRICS}


def _errors(sim: dict, measured: dict) -> dict:
    return {k: (v - measured[k]) / measured[k] for k, v in sim.items()
            if v is not None and measured.get(k) is not None and measured[k] > 0}


def simulate_steps(cfg: dict, live: dict, engine=None, trainer=None) -> list[dict]:
    """Per measured step: the simulator's metrics with the calibrated ``engine`` (default: the ``cpu_tiny`` preset)
    and ``trainer`` (None: rollout metrics only), and the relative error of each (signed, sim - measured)."""
    from verl_pipe.sim.engine import CPU_TINY

    engine = engine or CPU_TINY
    out = []
    for st in live["steps"]:
        sim = simulate_one(cfg, live["shape"], live["rounds"][st["round"]], st, engine, trainer)
        out.append({"round": st["round"], "mode": st["mode"], "sim": sim, "rel_error": _errors(sim, st["timeline"])})
    return out


def error_table(sims: list[dict]) -> dict:
    """Per mode and metric: the mean and max |relative error| over the steps."""
    errs: dict = {}
    for s in sims:
        for k, e in s["rel_error"].items():
            errs.setdefault(s["mode"], {}).setdefault(k, []).append(abs(e))
    return {m: {k: {"mean": sum(v) / len(v), "max": max(v), "steps": len(v)} for k, v in d.items()}
            for m, d in errs.items()}


def analyze(cfg: dict, live: dict, target: float = 0.15) -> dict:
    """The JSON's ``sim`` section: the calibration, each step's prediction and error (calibrated and preset), the
    error table per mode and metric, and whether every error is within ``target``."""
    from verl_pipe.sim.calib import _engine_summary

    fit = fit_engine_on(live.get("calibration") or [], live["shape"])
    trainer = fit_trainer_on(cfg, live)
    steps = simulate_steps(cfg, live, fit.params if fit else None, trainer.params if trainer else None)
    preset = simulate_steps(cfg, live)
    table = error_table(steps)
    worst = max((e["max"] for d in table.values() for e in d.values()), default=None)
    return {"engine": "calibrated on the calibration steps" if fit else "cpu_tiny preset (no calibration steps)",
            "calibration": _engine_summary(fit) if fit else None,
            "calibration_check": calibration_check(live["calibration"], live["shape"], fit.params) if fit else None,
            "trainer_fit": ({"update_line": trainer.update_line, "logprob_line": trainer.logprob_line,
                             "spans": trainer.num_spans} if trainer else None),
            "cache_block": live["shape"].get("cache_block"), "target_rel_error": target,
            "max_abs_rel_error": worst, "within_target": worst is not None and worst <= target,
            "abs_rel_error": table, "steps": steps,
            "preset": {"abs_rel_error": error_table(preset), "steps": preset}}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(steps: list[dict], figures: tuple[str, ...], sims: list[dict] | None = None) -> dict:
    """Per mode: the mean of each figure over rounds; per mode its change vs sync (relative, same rounds); FGD's
    effect (cgp_fgd vs cgp) and CGP+FGD vs verl's peer on first unit ready and rollout→train end; the simulator's
    mean and max |error| per mode and metric."""
    modes = list(dict.fromkeys(st["mode"] for st in steps))
    by = {(st["mode"], st["round"]): st["timeline"] for st in steps}
    rounds = sorted({st["round"] for st in steps})
    per_mode = {m: {k: _mean([by[(m, r)].get(k) for r in rounds if (m, r) in by]) for k in figures} for m in modes}

    def change(a: str, b: str, key: str):
        pairs = [(by[(a, r)].get(key), by[(b, r)].get(key)) for r in rounds if (a, r) in by and (b, r) in by]
        return _mean([(x - y) / y for x, y in pairs if x is not None and y]) if pairs else None

    keys = ("first_unit_ready_s", "rollout_to_train_end_s", "rollout_end_s")
    out = {"modes": per_mode,
           "vs_sync": {m: {k: change(m, BASE, k) for k in ("rollout_to_train_end_s", "first_unit_ready_s",
                                                             "trainer_wait_ratio")} for m in modes if m != BASE}}
    if PIPELINED_BASE in modes and FGD_VARIANT in modes:
        out["fgd_vs_cgp"] = {k: change(FGD_VARIANT, PIPELINED_BASE, k) for k in keys}
    if PEER_MODE in modes:
        for m in (PIPELINED_BASE, FGD_VARIANT):
            if m in modes:
                out[f"{m}_vs_peer"] = {k: change(m, PEER_MODE, k) for k in keys}
    if sims:
        out["sim_abs_rel_error"] = {m: {k: {"mean": v["mean"], "max": v["max"]} for k, v in d.items()}
                                    for m, d in error_table(sims).items()}
    return out
