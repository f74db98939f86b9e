"""The planner against every measured run in docs/bench: ``python -m verl_pipe.plan --validate [--update-doc FILE]``.

Each bench JSON carries the costs the bench fitted on its own steps (``sim_validation.calibration``, per model
size) and the measured figures per setting and mode. Where the run's per-step file was kept beside it
(``NAME_steps_DATE.json.gz`` for ``NAME_DATE.json``), the planner refits from the steps themselves. What is done:

- in-run: the run's own calibration predicts its own settings (the planner's ``--calibrate`` case);
- held out (per-step files kept): each measured round predicted by a calibration on the run's other rounds
  (a workload the fit never saw), and each kept run's peer setting predicted from *another* kept run of another
  shape (``cross_config``: the planner used on a config that was not the calibration's);
- cross-run: every other JSON of the same model size (another day, another run) predicts them;
- verl's peer costed as verl: in-run, its trainer fitted on its own spans (``calibrate.fit_verl_trainer``) where
  the per-step file was kept, else scaled to its own measured trainer busy time (the spans' total); held out, fitted
  on the other rounds' spans; cross-run, scaled as in another run. With our trainer's costs it is shown beside, not
  used. One-step-off: verl's trainer as fitted on the same run's
  on-policy peer (never on the one-step-off run itself).

Pure except reading the JSONs and writing the outputs.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from verl_pipe.core.variants import BASE, ON_POLICY_PEER, OURS, PEERS, modelled_as, variant
from verl_pipe.core.workload import from_spec
from verl_pipe.plan.calibrate import calibrate_steps, fit_verl_trainer, steps_file
from verl_pipe.plan.predict import one_step_off
from verl_pipe.sim.calib import PaddedWorkload, StepShape, simulate_like, with_own_speeds
from verl_pipe.sim.peer_fit import scaled
from verl_pipe.sim.records import engine_from_summary, trainer_from_summary
from verl_pipe.sim.simulate import rollout_for_mode

BEGIN, END = "<!-- plan-validation:begin -->", "<!-- plan-validation:end -->"


def _why_skipped(p: Path, d) -> str:
    if not isinstance(d, dict):
        return "not a bench result"
    if "soak" in p.name:
        return "a soak: one mode's memory and step time over a long run"
    if "worker_log" in d:
        return "span tables of docs/trainer_gap.md, not a bench result"
    if "learn" in p.name or "curves" in d:
        return "a learning-curve run: accuracy, not step time"
    return "no per-mode settings with a calibration"


def steps_path(bench_dir, name: str) -> Path | None:
    """The per-step file kept beside ``NAME_DATE.json``: ``NAME_steps_DATE.json.gz`` (or ``.json``)."""
    m = re.match(r"^(.*)_(\d{4}-\d{2}-\d{2})\.json$", name)
    if not m:
        return None
    for ext in (".json.gz", ".json"):
        p = Path(bench_dir) / f"{m.group(1)}_steps_{m.group(2)}{ext}"
        if p.is_file():
            return p
    return None


def load_runs(bench_dir) -> tuple[list[dict], list[dict]]:
    """The bench JSONs with settings and a calibration (with their kept per-step file, if any), and the skipped
    files with why."""
    runs, skipped = [], []
    for p in sorted(Path(bench_dir).glob("*.json")):
        d = json.loads(p.read_text())
        if not isinstance(d, dict) or "settings" not in d or "calibration" not in d.get("sim_validation", {}):
            skipped.append({"file": p.name, "why": _why_skipped(p, d)})
            continue
        runs.append({"file": p.name, "data": d, "steps_path": steps_path(bench_dir, p.name)})
    return runs, skipped


def _setting_window(s: dict, shape: StepShape):
    m = re.search(r"-w(\d+)$", s["name"])  # the window sweep's settings name their window
    return int(m.group(1)) if m else s.get("fgd_window") or shape.fgd_window or shape.max_num_seqs


def _predict(run: dict, s: dict, mode: str, entry: dict, cal: dict, verl_scale: float = 1.0,
             own_speed: bool = False) -> float:
    """Mean predicted rollout→train end of ``mode`` on setting ``s`` over the measured rounds' workloads;
    ``own_speed`` (``cal`` is the run's own): our modes at the setting's own engine speed where the bench fitted one
    (``calib.with_setting_engines``), else at the pooled one."""
    size = s["model_size"]
    shape = StepShape(**run["data"]["config"]["shapes"][size])
    alone, over = engine_from_summary(cal["engine_alone"], shape), engine_from_summary(cal["engine_overlapped"], shape)
    if own_speed and mode in OURS:
        own = (cal.get("engine_scale_per_setting") or {}).get(s["name"], {})
        alone, over = scaled(alone, own.get("alone", 1.0)), scaled(over, own.get("overlapped", 1.0))
    trainer = trainer_from_summary(cal["trainer"])
    if mode in PEERS:
        trainer = trainer.with_(time_scale=verl_scale)
    num_groups = int(next(v for v in s["modes"].values() if "num_groups" in v)["num_groups"])
    window = _setting_window(s, shape)
    out = []
    for r in range(int(entry.get("runs", 1))):
        wl = from_spec(dict(s["workload"]), num_groups, shape.n, prompt_len=0, seed=r)
        step = {"lengths": wl.lengths, "prompt_len": s["prompt_len_mean"], "weight_sync_s": 0.0, "fgd_window": window}
        v = modelled_as(mode)  # a tuned / synchronous peer as the simulated schedule it follows
        if not v.simulated:  # verl's one-batch-ahead peer: the planner's steady-state model of it
            pw = PaddedWorkload(num_groups, shape.n, wl.lengths, int(round(s["prompt_len_mean"])))
            ro = rollout_for_mode("sync", pw, over, shape.num_replicas, shape.groups_per_unit, shape.baseline_window,
                                  shape.baseline_order)
            out.append(one_step_off(ro, pw, trainer, shape.groups_per_unit, 0.0)["rollout_to_train_end_s"])
            continue
        gran = entry.get("granularity") or v.granularity
        m = simulate_like(step, v.name, gran, over if v.overlapped else alone, trainer, shape)
        out.append(m["rollout_to_train_end_s"])
    return float(np.mean(out))


def _peer_busy(run: dict, s: dict, cal: dict) -> float:
    """Predicted trainer busy time of verl's on-policy peer with our trainer's costs (scale 1)."""
    size = s["model_size"]
    shape = StepShape(**run["data"]["config"]["shapes"][size])
    over, trainer = engine_from_summary(cal["engine_overlapped"], shape), trainer_from_summary(cal["trainer"])
    num_groups = int(s["modes"][BASE]["num_groups"])
    busy = []
    for r in range(int(s["modes"][ON_POLICY_PEER].get("runs", 1))):
        wl = from_spec(dict(s["workload"]), num_groups, shape.n, prompt_len=0, seed=r)
        step = {"lengths": wl.lengths, "prompt_len": s["prompt_len_mean"], "weight_sync_s": 0.0}
        busy.append(simulate_like(step, ON_POLICY_PEER, "minibatch", over, trainer, shape)["trainer_busy_s"])
    return float(np.mean(busy))


def verl_scales(runs: list[dict]) -> dict[tuple[str, str], float]:
    """(file, model size) -> verl's trainer time over ours, from that run's measured on-policy peer."""
    out = {}
    for run in runs:
        for s in run["data"]["settings"]:
            e = s["modes"].get(ON_POLICY_PEER, {})
            if "skipped" in e or not e:
                continue
            cal = run["data"]["sim_validation"]["calibration"][s["model_size"]]
            out[(run["file"], s["model_size"])] = e["trainer_busy_s"] / _peer_busy(run, s, cal)
    return out


def _reductions(rows: list[dict]) -> None:
    """The planner's headline is a mode's saving vs sync; a calibration from another day scales both alike, so
    the saving transfers where absolute seconds do not (this VM's speed varies from day to day: docs/results.md).
    Per row: the measured saving and the error of the predicted one, in percentage points."""
    sync = {(r["file"], r["setting"]): r for r in rows if r["mode"] == BASE}
    for r in rows:
        base = sync.get((r["file"], r["setting"]))
        if base is None or r["mode"] == BASE:
            continue
        r["measured_vs_sync_pct"] = 100 * (1 - r["measured_s"] / base["measured_s"])
        r["in_run_vs_sync_err_pp"] = 100 * (1 - r["in_run_s"] / base["in_run_s"]) - r["measured_vs_sync_pct"]
        if "cross_run" in r and "cross_run" in base:
            errs = [100 * (1 - p / base["cross_run"][f]) - r["measured_vs_sync_pct"]
                    for f, p in r["cross_run"].items() if f in base["cross_run"]]
            r["cross_vs_sync_max_abs_err_pp"] = float(np.max(np.abs(errs)))


def _overrides(run: dict, size: str) -> list[str]:
    return list(((run["data"]["config"].get("stacks") or {}).get(size) or {}).get("overrides", []))


def _override(run: dict, size: str, key: str, default=None):
    got = [o.split("=", 1)[1] for o in _overrides(run, size) if o.startswith(key + "=")]
    return got[-1] if got else default


def _model_of(run: dict, size: str) -> str:
    """The model a stack ran: its ``rolloutpipe.tiny_assets.size`` override, else the size's own name."""
    return _override(run, size, "rolloutpipe.tiny_assets.size", size)


def _agg(acc: dict, key, pred: float, meas: float) -> None:
    d = acc.setdefault(key, {"pred": [], "meas": []})
    d["pred"].append(pred)
    d["meas"].append(meas)


def _errors(acc: dict) -> dict:
    return {k: float(np.mean(d["pred"])) / float(np.mean(d["meas"])) - 1 for k, d in acc.items()}


def kept_steps(run: dict) -> dict[str, dict]:
    """Per model size of a run whose per-step file was kept: its steps (``plan.calibrate.steps_file``)."""
    out = {}
    if run.get("steps_path") is None:
        return out
    for size in sorted({s["model_size"] for s in run["data"]["settings"]}):
        got = steps_file(run["steps_path"], size)
        if got["ours"] and got["shape"] is not None:
            out[size] = got
    return out


def in_run_verl(got: dict) -> dict:
    """verl's peer steps predicted with its trainer fitted on all of them (the ``--calibrate`` case), and with our
    trainer's costs, per setting: {setting: {"as_verl": err, "as_ours": err, "fit": VerlFit summary}}."""
    cal = calibrate_steps(got)
    vf = fit_verl_trainer(got["peer"], cal.trainer)
    eng = cal.engine_for("verl_separate_async")
    out = {}
    for setting in sorted({p["setting"] for p in got["peer"]}):
        steps = [p for p in got["peer"] if p["setting"] == setting]
        acc: dict = {}
        for p in steps:
            meas = float(p["metrics"]["rollout_to_train_end_s"])
            for key, tr in (("as_verl", vf.params), ("as_ours", cal.trainer.params)):
                _agg(acc, key, simulate_like(p, "verl_separate_async", "minibatch", eng, tr, got["shape"])[
                    "rollout_to_train_end_s"], meas)
        out[setting] = {**_errors(acc), "fit": vf.summary(cal.trainer)}
    return out


def held_out_rounds(got: dict) -> dict[tuple[str, str], float]:
    """Each measured round predicted by a calibration on the run's other rounds (our modes, each setting at its own
    engine speed fitted on its other rounds where they hold enough requests; verl's trainer on its other rounds'
    spans): {(setting, mode): relative error of the mean}."""
    ours, peer, shape = got["ours"], got["peer"], got["shape"]
    rounds = sorted({s["round"] for s in ours})
    acc: dict = {}
    if len(rounds) < 2:
        return {}
    for r in rounds:
        train = [s for s in ours if s["round"] != r]
        # each setting at its own engine speed, fitted on its other rounds (``calib.with_own_speeds``)
        cal = with_own_speeds(calibrate_steps(got, train), train, shape, borrowed="engine_donor" in got)
        for s in (s for s in ours if s["round"] == r):
            m = simulate_like(s, s["mode"], s["granularity"], cal.engine_for(s["mode"], s["setting"]),
                              cal.trainer.params, shape)
            _agg(acc, (s["setting"], s["mode"]), m["rollout_to_train_end_s"], s["metrics"]["rollout_to_train_end_s"])
        train, test = [p for p in peer if p["round"] != r], [p for p in peer if p["round"] == r]
        if train and test:
            vf = fit_verl_trainer(train, cal.trainer)
            for p in test:
                m = simulate_like(p, "verl_separate_async", "minibatch", cal.engine_for("verl_separate_async"),
                                  vf.params, shape)
                _agg(acc, (p["setting"], p["mode"]), m["rollout_to_train_end_s"],
                     p["metrics"]["rollout_to_train_end_s"])
    return _errors(acc)


def cross_config(kept: list[tuple[dict, str, dict]]) -> list[dict]:
    """The planner on a config it was not calibrated on: every kept run's stack with verl's peer, predicted by the
    calibration (ours and verl's) of another kept run's such stack, of the same model and row order. The
    predicted stack keeps its own shape (batch, unit size, engine slots); only the costs come from the other run."""
    out = []
    prim = [(run, size, got) for run, size, got in kept if got["peer"]]
    for run_a, size_a, a in prim:
        cal = calibrate_steps(a)
        vf = fit_verl_trainer(a["peer"], cal.trainer)
        for run_b, size_b, b in prim:
            if run_b is run_a or _model_of(run_a, size_a) != _model_of(run_b, size_b) or (
                    _override(run_a, size_a, "rolloutpipe.micro_batch_order", "length")
                    != _override(run_b, size_b, "rolloutpipe.micro_batch_order", "length")):
                continue
            sh = b["shape"]
            acc: dict = {}
            for st in b["ours"] + b["peer"]:
                mode = st["mode"]
                eng = cal.engine_for(mode).with_(max_num_seqs=sh.max_num_seqs, kv_capacity_tokens=sh.kv_capacity_tokens,
                                                 max_num_batched_tokens=sh.max_num_batched_tokens,
                                                 kv_block_tokens=sh.kv_block_tokens)
                tr = vf.params if mode in PEERS else cal.trainer.params
                m = simulate_like(st, mode, st["granularity"] if mode in OURS else "minibatch", eng, tr, sh)
                _agg(acc, (st["setting"], mode), m["rollout_to_train_end_s"], st["metrics"]["rollout_to_train_end_s"])
            for (setting, mode), err in _errors(acc).items():
                out.append({"calibrated_on": f"{run_a['file']}:{size_a}", "file": run_b["file"], "size": size_b,
                            "setting": setting, "mode": mode, "err": err,
                            "measured_s": float(np.mean(acc[(setting, mode)]["meas"])),
                            "predicted_s": float(np.mean(acc[(setting, mode)]["pred"]))})
    return out


def validate(bench_dir) -> dict:
    """Every run of ``bench_dir`` predicted in-run, held out, cross-run and cross-config (the module's docstring):
    one row per run, setting and mode, the error summary per mode and the expected errors the planner quotes."""
    runs, skipped = load_runs(bench_dir)
    scales = verl_scales(runs)
    steps = [kept_steps(run) for run in runs]
    kept = [(run, size, got) for run, st in zip(runs, steps) for size, got in st.items()]
    rows = [row for rs in _each_run_rows(runs, scales, steps) for row in rs]
    _reductions(rows)
    xconf = cross_config(kept)
    summary, expected = _error_summary(rows, xconf)
    holdout = {r["file"]: r["data"]["sim_validation"].get("holdout_max_rel_error") for r in runs}
    return {"rows": rows, "per_mode": summary, "expected_error": expected, "skipped": skipped,
            "cross_config": xconf, "kept_steps": {r["file"]: str(r["steps_path"]) for r in runs if r["steps_path"]},
            "bench_holdout_max_rel_error": holdout, "verl_scales": {f"{f}:{s}": v for (f, s), v in scales.items()},
            "command": "python -m verl_pipe.plan --validate --update-doc docs/plan.md"}


def _each_run_rows(runs: list[dict], scales: dict, steps: list[dict]) -> list[list[dict]]:
    """``_run_rows`` of every run, in order: the runs are independent (each a few hundred simulated steps), so on
    a machine with more than one core they are spread over worker processes (spawned, not forked: the caller may
    hold threads, e.g. torch's, that a fork would copy mid-state)."""
    jobs = [(i, scales, st) for i, st in enumerate(steps)]
    workers = min(len(runs), os.cpu_count() or 1)
    if workers <= 1:
        return [_run_rows(runs[i], runs, sc, st) for i, sc, st in jobs]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_set_runs, initargs=(runs,)) as ex:
        return list(ex.map(_rows_of, jobs))


_RUNS: list[dict] = []  # a worker process's copy of the runs (``_set_runs``)


def _set_runs(runs: list[dict]) -> None:
    _RUNS[:] = runs


def _rows_of(job: tuple) -> list[dict]:
    i, scales, steps = job
    return _run_rows(_RUNS[i], _RUNS, scales, steps)


def _run_rows(run: dict, runs: list[dict], scales: dict, steps: dict[str, dict]) -> list[dict]:
    """``run``'s rows, one per setting and mode (ours and verl's peers): measured, in-run, held out (from ``steps``,
    its kept per-step file) and cross-run (every other run of ``runs`` with a calibration of the same size)."""
    cals = run["data"]["sim_validation"]["calibration"]
    others = [(o["file"], o["data"]["sim_validation"]["calibration"]) for o in runs if o is not run]
    held = {k: v for got in steps.values() for k, v in held_out_rounds(got).items()}
    peer_fit = {(size, setting): v for size, got in steps.items() if got["peer"]
                for setting, v in in_run_verl(got).items()}
    rows = []
    for s in run["data"]["settings"]:
        size = s["model_size"]
        for mode, entry in s["modes"].items():
            if "skipped" in entry or mode not in OURS + PEERS:
                continue
            if variant(mode).colocated:  # taking turns, not two pools: plan/colocated_check.py on its own steps
                continue
            meas = float(entry["rollout_to_train_end_s"])
            row = {"file": run["file"], "setting": s["name"], "model_size": size, "mode": mode,
                   "runs": int(entry.get("runs", 1)), "measured_s": meas}
            if mode in PEERS:
                own = peer_fit.get((size, s["name"])) if mode == ON_POLICY_PEER else None
                _peer_in_run(row, run, s, entry, cals[size], scales, own)
            else:
                row["in_run_s"] = _predict(run, s, mode, entry, cals[size], own_speed=True)
                row["in_run_err"] = row["in_run_s"] / meas - 1
            if (s["name"], mode) in held:
                row["held_out_err"] = held[(s["name"], mode)]
            # verl's trainer from another run's measured peer (cross-run: never this run's)
            foreign = [v for (f, sz), v in scales.items() if sz == size and f != run["file"]]
            vs = float(np.mean(foreign)) if foreign else None
            cross = [(f, _predict(run, s, mode, entry, c[size], (vs or 1.0) if mode in PEERS else 1.0))
                     for f, c in others if size in c]
            if cross:
                errs = [p / meas - 1 for _, p in cross]
                row["cross_run"] = {f: p for f, p in cross}
                row["cross_mean_abs_err"] = float(np.mean(np.abs(errs)))
                row["cross_max_abs_err"] = float(np.max(np.abs(errs)))
            rows.append(row)
    return rows


def _peer_in_run(row: dict, run: dict, s: dict, entry: dict, cal: dict, scales: dict, own: dict | None) -> None:
    """A peer's in-run prediction into ``row``: with our trainer's costs (``as_ours_err``, shown beside) and as verl
    (``in_run_*``, ``basis``): its trainer fitted on its own spans (``own``, per-step file kept), else scaled to its
    or its on-policy sibling's measured trainer busy time (``scales``), else our trainer's costs."""
    mode, meas, size = row["mode"], row["measured_s"], row["model_size"]
    row["as_ours_err"] = _predict(run, s, mode, entry, cal) / meas - 1
    if own is not None:  # its trainer fitted on its own spans (per-step file kept)
        row["in_run_err"], row["as_ours_err"] = own["as_verl"], own["as_ours"]
        row["in_run_s"] = meas * (1 + own["as_verl"])
        row["basis"], row["verl_fit"] = "its own spans, per step", own["fit"]
    elif (run["file"], size) in scales:  # scaled to its (or its on-policy sibling's) measured busy
        row["in_run_s"] = _predict(run, s, mode, entry, cal, scales[(run["file"], size)])
        row["in_run_err"] = row["in_run_s"] / meas - 1
        row["basis"] = ("its own trainer busy total" if mode == ON_POLICY_PEER
                        else "the on-policy peer's trainer busy total, same run")
        row["verl_scale"] = scales[(run["file"], size)]
    else:
        row["in_run_s"] = _predict(run, s, mode, entry, cal)
        row["in_run_err"], row["basis"] = row["in_run_s"] / meas - 1, "our trainer's costs"


def _error_summary(rows: list[dict], xconf: list[dict]) -> tuple[dict, dict]:
    """Per mode: each error kind's max, mean and count (``per_mode``), and the expected errors the planner quotes
    (``expected_error``; verl's one-step-off peer under the planner's name for it)."""
    per_mode: dict[str, dict] = {}

    def kinds(mode: str) -> dict:
        return per_mode.setdefault(mode, {"in_run": [], "held_out": [], "cross_config": [], "cross": [],
                                          "as_ours": [], "vs_sync_pp": []})

    for r in rows:
        pm = kinds(r["mode"])
        if "in_run_vs_sync_err_pp" in r:
            pm["vs_sync_pp"].append(max(abs(r["in_run_vs_sync_err_pp"]), r.get("cross_vs_sync_max_abs_err_pp", 0.0)))
        pm["in_run"].append(abs(r["in_run_err"]))
        if "held_out_err" in r:
            pm["held_out"].append(abs(r["held_out_err"]))
        if "cross_mean_abs_err" in r:
            pm["cross"].append(r["cross_mean_abs_err"])
        if "as_ours_err" in r:
            pm["as_ours"].append(abs(r["as_ours_err"]))
    for x in xconf:
        kinds(x["mode"])["cross_config"].append(abs(x["err"]))
    summary, expected = {}, {}
    for mode, pm in per_mode.items():
        summary[mode] = {k: {"max": max(v), "mean": float(np.mean(v)), "n": len(v)} for k, v in pm.items() if v}
        held = pm["held_out"] + pm["cross_config"]
        expected[variant(mode).row] = {
            "max_rel_error": max(pm["in_run"]), "basis": "CPU bench, in-run",
            "held_out_max_rel_error": max(held) if held else None,
            "held_out_basis": "CPU bench: a round or a config the calibration did not see",
            "cross_max_rel_error": max(pm["cross"]) if pm["cross"] else None,
            "cross_basis": "CPU bench, another day's run",
            "vs_sync_max_err_pp": max(pm["vs_sync_pp"]) if pm["vs_sync_pp"] else None}
    return summary, expected


def _pp(r: dict, k: str) -> str:
    return f"{r[k]:+.1f}" if k in r else "–"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def _abs(pm: dict, k: str) -> str:
    return f"{100 * pm[k]['max']:.1f}% ({100 * pm[k]['mean']:.1f}%)" if k in pm else "–"


def markdown(v: dict) -> str:
    lines = ["| run | setting | mode | measured s | in-run | held out (round) | cross-run (mean abs, max abs) | "
             "measured vs sync | its error in-run / cross-run max |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in v["rows"]:
        cross = (f"{100 * r['cross_mean_abs_err']:.1f}%, {100 * r['cross_max_abs_err']:.1f}%"
                 if "cross_mean_abs_err" in r else "–")
        lines.append(f"| {r['file'].removesuffix('.json')} | {r['setting']} | {r['mode']} | {r['measured_s']:.2f} | "
                     f"{_pct(r['in_run_err'])} | {_pct(r.get('held_out_err'))} | {cross} | "
                     f"{_pp(r, 'measured_vs_sync_pct')} | {_pp(r, 'in_run_vs_sync_err_pp')} / "
                     f"{_pp(r, 'cross_vs_sync_max_abs_err_pp')} |")
    lines += ["", "verl's peer: with our trainer's costs, and calibrated as verl (in-run above):", "",
              "| run | setting | mode | measured s | our trainer's costs | verl's own, in-run | "
              "verl's trainer fitted on | verl / ours, update s per 1k padded tokens |",
              "|---|---|---|---|---|---|---|---|"]
    for r in v["rows"]:
        if "as_ours_err" not in r:
            continue
        fit = r.get("verl_fit")
        ratio = (f"{fit['update_s_per_1k_padded_tokens']:.3f} / {fit['ours_update_s_per_1k_padded_tokens']:.3f}"
                 if fit else (f"busy x{r['verl_scale']:.2f} ours" if "verl_scale" in r else "–"))
        lines.append(f"| {r['file'].removesuffix('.json')} | {r['setting']} | {r['mode']} | {r['measured_s']:.2f} | "
                     f"{_pct(r['as_ours_err'])} | {_pct(r['in_run_err'])} | {r.get('basis', '–')} | {ratio} |")
    if v["cross_config"]:
        lines += ["", "A config the calibration did not see: each kept per-step run predicted with another kept run's "
                      "calibration (ours and verl's), its own shape:", "",
                  "| calibrated on | predicted run | setting | mode | measured s | predicted s | error |",
                  "|---|---|---|---|---|---|---|"]
        for x in v["cross_config"]:
            lines.append(f"| {x['calibrated_on'].replace('.json', '')} | "
                         f"{x['file'].removesuffix('.json')}:{x['size']} | {x['setting']} | {x['mode']} | "
                         f"{x['measured_s']:.2f} | {x['predicted_s']:.2f} | {_pct(x['err'])} |")
    lines += ["", "Per mode (absolute relative error of rollout→train end, max (mean)):", "",
              "| mode | in-run | held out: round | held out: config | cross-run | verl with our trainer's costs | "
              "saving vs sync, max error (points) | settings |",
              "|---|---|---|---|---|---|---|---|"]
    for mode, pm in v["per_mode"].items():
        pp = f"{pm['vs_sync_pp']['max']:.1f}" if "vs_sync_pp" in pm else "–"
        n = pm["in_run"]["n"] if "in_run" in pm else 0
        lines.append(f"| {mode} | {_abs(pm, 'in_run')} | {_abs(pm, 'held_out')} | {_abs(pm, 'cross_config')} | "
                     f"{_abs(pm, 'cross')} | {_abs(pm, 'as_ours')} | {pp} | {n} |")
    lines += ["", "Per-step files kept (held-out columns): " + (", ".join(
                  f"`{Path(p).name}`" for p in v["kept_steps"].values()) or "none") + ".",
              "", "Skipped: " + "; ".join(f"`{s['file']}` ({s['why']})" for s in v["skipped"]),
              "", "The bench's own leave-one-setting-out figure, computed when it ran (max relative error): "
              + ", ".join(f"`{f}` {('%.1f%%' % (100 * h)) if h is not None else '– (one setting)'}"
                          for f, h in v["bench_holdout_max_rel_error"].items()) + ".",
              "", f"Regenerate: `{v['command']}`."]
    return "\n".join(lines)


def update_doc(path, table: str, begin: str = BEGIN, end: str = END) -> None:
    """Replaces the block between the ``begin`` and ``end`` markers of the markdown file ``path`` with ``table``."""
    text = Path(path).read_text()
    if begin not in text or end not in text:
        raise ValueError(f"--update-doc {path}: no {begin} ... {end} block to replace")
    head, rest = text.split(begin, 1)
    Path(path).write_text(head + begin + "\n" + table + "\n" + end + rest.split(end, 1)[1])


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
