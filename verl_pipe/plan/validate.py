"""The planner against every measured run in docs/bench: ``python -m verl_pipe.plan --validate [--update-doc FILE]``.

Each bench JSON carries the costs the bench fitted on its own steps (``sim_validation.calibration``, per model
size) and the measured figures per setting and mode. The per-step files were not kept, so a calibration cannot be
refitted here; what can be done, and is:

- in-run: the JSON's own calibration predicts its own settings (the planner's ``--calibrate`` case);
- cross-run: every other JSON of the same model size (another day, another run) predicts them; this is the
  honest figure for a user whose calibration run is not the run being predicted. Leave-one-setting-out inside a
  run needs the per-step files; the bench computed it when it ran (``holdout_max_rel_error``), quoted as is;
- verl's peer ``as ours`` (our trainer's fitted costs on verl's schedule) and ``as verl``: the trainer's cost
  scaled to verl's own measured busy time in *another* run of the same size, so the prediction is not fitted to
  the figure it predicts; one-step-off likewise.

Pure except reading the JSONs and writing the outputs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from verl_pipe.bench.calib import PaddedWorkload, StepShape, simulate_like
from verl_pipe.bench.settings import workload_for
from verl_pipe.bench.sim_windows import engine_from_summary, trainer_from_summary
from verl_pipe.plan.predict import one_step_off
from verl_pipe.sim.simulate import rollout_for_mode
from verl_pipe.variants import OURS, PEERS, variant

BEGIN, END = "<!-- plan-validation:begin -->", "<!-- plan-validation:end -->"


def load_runs(bench_dir) -> tuple[list[dict], list[dict]]:
    """The bench JSONs with settings and a calibration, and the skipped files with why."""
    runs, skipped = [], []
    for p in sorted(Path(bench_dir).glob("*.json")):
        d = json.loads(p.read_text())
        if "settings" not in d or "calibration" not in d.get("sim_validation", {}):
            skipped.append({"file": p.name, "why": "no per-mode settings or calibration (a soak: memory and step "
                                                   "time of one mode over a long run)"})
            continue
        runs.append({"file": p.name, "data": d})
    return runs, skipped


def _setting_window(s: dict, shape: StepShape):
    m = re.search(r"-w(\d+)$", s["name"])  # the window sweep's settings name their window
    return int(m.group(1)) if m else s.get("fgd_window") or shape.fgd_window or shape.max_num_seqs


def _predict(run: dict, s: dict, mode: str, entry: dict, cal: dict, verl_scale: float = 1.0) -> float:
    """Mean predicted rollout→train end of ``mode`` on setting ``s`` over the measured rounds' workloads."""
    size = s["model_size"]
    shape = StepShape(**run["data"]["config"]["shapes"][size])
    alone, over = engine_from_summary(cal["engine_alone"], shape), engine_from_summary(cal["engine_overlapped"], shape)
    trainer = trainer_from_summary(cal["trainer"])
    if mode in PEERS:
        trainer = trainer.with_(time_scale=verl_scale)
    num_groups = int(next(v for v in s["modes"].values() if "num_groups" in v)["num_groups"])
    window = _setting_window(s, shape)
    out = []
    for r in range(int(entry.get("runs", 1))):
        wl = workload_for(s["workload"], num_groups, shape.n, seed=r)
        step = {"lengths": wl.lengths, "prompt_len": s["prompt_len_mean"], "weight_sync_s": 0.0, "fgd_window": window}
        v = variant(mode)
        if not v.simulated:  # verl's one-batch-ahead peer: the planner's steady-state model of it
            pw = PaddedWorkload(num_groups, shape.n, wl.lengths, int(round(s["prompt_len_mean"])))
            ro = rollout_for_mode("sync", pw, over, shape.num_replicas, shape.groups_per_unit, shape.baseline_window,
                                  shape.baseline_order)
            out.append(one_step_off(ro, pw, trainer, shape.groups_per_unit, 0.0)["rollout_to_train_end_s"])
            continue
        gran = entry.get("granularity") or v.granularity
        m = simulate_like(step, mode, gran, over if v.overlapped else alone, trainer, shape)
        out.append(m["rollout_to_train_end_s"])
    return float(np.mean(out))


def _peer_busy(run: dict, s: dict, cal: dict) -> float:
    """Predicted trainer busy time of verl's on-policy peer with our trainer's costs (scale 1)."""
    size = s["model_size"]
    shape = StepShape(**run["data"]["config"]["shapes"][size])
    over, trainer = engine_from_summary(cal["engine_overlapped"], shape), trainer_from_summary(cal["trainer"])
    num_groups = int(s["modes"]["sync"]["num_groups"])
    busy = []
    for r in range(int(s["modes"]["verl_separate_async"].get("runs", 1))):
        wl = workload_for(s["workload"], num_groups, shape.n, seed=r)
        step = {"lengths": wl.lengths, "prompt_len": s["prompt_len_mean"], "weight_sync_s": 0.0}
        busy.append(simulate_like(step, "verl_separate_async", "minibatch", over, trainer, shape)["trainer_busy_s"])
    return float(np.mean(busy))


def verl_scales(runs: list[dict]) -> dict[tuple[str, str], float]:
    """(file, model size) -> verl's trainer time over ours, from that run's measured on-policy peer."""
    out = {}
    for run in runs:
        for s in run["data"]["settings"]:
            e = s["modes"].get("verl_separate_async", {})
            if "skipped" in e or not e:
                continue
            cal = run["data"]["sim_validation"]["calibration"][s["model_size"]]
            out[(run["file"], s["model_size"])] = e["trainer_busy_s"] / _peer_busy(run, s, cal)
    return out


def _reductions(rows: list[dict]) -> None:
    """The planner's headline is a mode's saving vs sync; a calibration from another day scales both alike, so
    the saving transfers where absolute seconds do not (this VM's speed varies ~1.8x from day to day, README).
    Per row: the measured saving and the error of the predicted one, in percentage points."""
    sync = {(r["file"], r["setting"]): r for r in rows if r["mode"] == "sync"}
    for r in rows:
        base = sync.get((r["file"], r["setting"]))
        if base is None or r["mode"] == "sync":
            continue
        r["measured_vs_sync_pct"] = 100 * (1 - r["measured_s"] / base["measured_s"])
        r["in_run_vs_sync_err_pp"] = 100 * (1 - r["in_run_s"] / base["in_run_s"]) - r["measured_vs_sync_pct"]
        if "cross_run" in r and "cross_run" in base:
            errs = [100 * (1 - p / base["cross_run"][f]) - r["measured_vs_sync_pct"]
                    for f, p in r["cross_run"].items() if f in base["cross_run"]]
            r["cross_vs_sync_max_abs_err_pp"] = float(np.max(np.abs(errs)))


def validate(bench_dir) -> dict:
    runs, skipped = load_runs(bench_dir)
    scales = verl_scales(runs)
    rows = []
    for run in runs:
        cals = run["data"]["sim_validation"]["calibration"]
        others = [(o["file"], o["data"]["sim_validation"]["calibration"]) for o in runs if o is not run]
        for s in run["data"]["settings"]:
            size = s["model_size"]
            for mode, entry in s["modes"].items():
                if "skipped" in entry or mode not in OURS + PEERS:
                    continue
                meas = float(entry["rollout_to_train_end_s"])
                row = {"file": run["file"], "setting": s["name"], "model_size": size, "mode": mode,
                       "runs": int(entry.get("runs", 1)), "measured_s": meas}
                # verl's trainer from another run's measured peer (never this run's: that would fit the answer)
                foreign = [v for (f, sz), v in scales.items() if sz == size and f != run["file"]]
                vs = float(np.mean(foreign)) if foreign else None
                row["in_run_s"] = _predict(run, s, mode, entry, cals[size])
                row["in_run_err"] = row["in_run_s"] / meas - 1
                if mode in PEERS:
                    row["basis"] = "our trainer's costs"
                    if vs is not None:
                        row["as_verl_s"] = _predict(run, s, mode, entry, cals[size], vs)
                        row["as_verl_err"] = row["as_verl_s"] / meas - 1
                        row["verl_scale"] = vs
                cross = [(f, _predict(run, s, mode, entry, c[size], vs or 1.0 if mode in PEERS else 1.0))
                         for f, c in others if size in c]
                if cross:
                    errs = [p / meas - 1 for _, p in cross]
                    row["cross_run"] = {f: p for f, p in cross}
                    row["cross_mean_abs_err"] = float(np.mean(np.abs(errs)))
                    row["cross_max_abs_err"] = float(np.max(np.abs(errs)))
                rows.append(row)
    _reductions(rows)
    per_mode: dict[str, dict] = {}
    for r in rows:
        pm = per_mode.setdefault(r["mode"], {"in_run": [], "cross": [], "as_verl": [], "vs_sync_pp": []})
        if "in_run_vs_sync_err_pp" in r:
            pm["vs_sync_pp"].append(max(abs(r["in_run_vs_sync_err_pp"]), r.get("cross_vs_sync_max_abs_err_pp", 0.0)))
        pm["in_run"].append(abs(r["in_run_err"]))
        if "cross_mean_abs_err" in r:
            pm["cross"].append(r["cross_mean_abs_err"])
        if "as_verl_err" in r:
            pm["as_verl"].append(abs(r["as_verl_err"]))
    summary, expected = {}, {}
    for mode, pm in per_mode.items():
        summary[mode] = {k: {"max": max(v), "mean": float(np.mean(v)), "n": len(v)} for k, v in pm.items() if v}
        key = "as_verl" if pm["as_verl"] else "cross" if pm["cross"] else "in_run"
        basis = {"as_verl": "verl's trainer from another run", "cross": "CPU bench, another run's calibration",
                 "in_run": "CPU bench, in-run"}[key]
        expected[mode.replace("verl_separate_async_1off", "verl_one_step_off")] = {
            "max_rel_error": max(pm["in_run"]), "basis": "CPU bench, in-run",
            "cross_max_rel_error": max(pm[key]), "cross_basis": basis,
            "vs_sync_max_err_pp": max(pm["vs_sync_pp"]) if pm["vs_sync_pp"] else None}
    holdout = {r["file"]: r["data"]["sim_validation"].get("holdout_max_rel_error") for r in runs}
    return {"rows": rows, "per_mode": summary, "expected_error": expected, "skipped": skipped,
            "bench_holdout_max_rel_error": holdout, "verl_scales": {f"{f}:{s}": v for (f, s), v in scales.items()},
            "command": "python -m verl_pipe.plan --validate --update-doc docs/plan.md"}


def _pp(r: dict, k: str) -> str:
    return f"{r[k]:+.1f}" if k in r else "–"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def markdown(v: dict) -> str:
    lines = ["| run | setting | mode | measured s | in-run | cross-run (mean abs, max abs) | verl as verl | "
             "measured vs sync | its error in-run / cross-run max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in v["rows"]:
        cross = (f"{100 * r['cross_mean_abs_err']:.1f}%, {100 * r['cross_max_abs_err']:.1f}%"
                 if "cross_mean_abs_err" in r else "–")
        lines.append(f"| {r['file'].removesuffix('.json')} | {r['setting']} | {r['mode']} | {r['measured_s']:.2f} | "
                     f"{_pct(r['in_run_err'])} | {cross} | {_pct(r.get('as_verl_err'))} | {_pp(r, 'measured_vs_sync_pct')}"
                     f" | {_pp(r, 'in_run_vs_sync_err_pp')} / {_pp(r, 'cross_vs_sync_max_abs_err_pp')} |")
    lines += ["", "Per mode (absolute relative error of rollout→train end):", "",
              "| mode | in-run max (mean) | cross-run max (mean) | verl as verl max (mean) | saving vs sync, max "
              "error (points) | settings |",
              "|---|---|---|---|---|---|"]
    for mode, pm in v["per_mode"].items():
        f = lambda k: f"{100 * pm[k]['max']:.1f}% ({100 * pm[k]['mean']:.1f}%)" if k in pm else "–"  # noqa: E731
        pp = f"{pm['vs_sync_pp']['max']:.1f}" if "vs_sync_pp" in pm else "–"
        lines.append(f"| {mode} | {f('in_run')} | {f('cross')} | {f('as_verl')} | {pp} | {pm['in_run']['n']} |")
    lines += ["", "Skipped: " + "; ".join(f"`{s['file']}` ({s['why']})" for s in v["skipped"]),
              "", "The bench's own leave-one-setting-out figure, computed when it ran (max relative error): "
              + ", ".join(f"`{f}` {('%.1f%%' % (100 * h)) if h is not None else '– (one setting)'}"
                          for f, h in v["bench_holdout_max_rel_error"].items()) + ".",
              "", f"Regenerate: `{v['command']}`."]
    return "\n".join(lines)


def update_doc(path, table: str) -> None:
    text = Path(path).read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"--update-doc {path}: no {BEGIN} ... {END} block to replace")
    head, rest = text.split(BEGIN, 1)
    Path(path).write_text(head + BEGIN + "\n" + table + "\n" + END + rest.split(END, 1)[1])


def main_validate(bench_dir, doc, validation_path, out=None) -> int:
    v = validate(bench_dir)
    table = markdown(v)
    print(table)
    Path(validation_path).write_text(json.dumps({"expected_error": v["expected_error"], "per_mode": v["per_mode"],
                                                 "command": v["command"]}, indent=1) + "\n")
    if out:
        Path(out).write_text(json.dumps(v, indent=1))
    if doc:
        update_doc(doc, table)
    return 0
