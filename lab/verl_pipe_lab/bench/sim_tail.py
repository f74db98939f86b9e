"""The calibrated simulator on a bench config's settings, per length knowledge: what ordering by predicted lengths
can give (the bound: perfect knowledge) and what the predictor gives.

    python -m verl_pipe_lab.bench.sim_tail --config lab/verl_pipe_lab/bench/conf/fgd_tail.yaml \
        --calibration docs/bench/bench_queue_after_cuts_2026-12-02.json \
        --calibration docs/bench/bench_fgd_order_2026-12-02.json \
        [--knowledge off,perfect,perfect~0.5,predicted,siblings,shuffled] [--unit-fill completion,dispatch] \
        [--granularity minibatch,group] [--rounds 12] [--out FILE.json]

Pure Python (Hydra's compose for the stacks' shapes, the simulator; no Ray, no vLLM), like ``sim_windows``. Each
setting (settings with ``knobs`` are controls of the real bench and skipped) runs ``rounds`` steps of one run (its
repeated prompts carry their history from step to step, verl_pipe/sim/tail.py): cgp, and cgp_fgd once per length
knowledge (``off`` is FGD's rank order, ``perfect`` the bound, ``perfect~e`` perfect with a log-normal error of
sigma e), per unit fill and CGP granularity (``rolloutpipe.cgp.granularity``; default mini-batch; at group
granularity the baseline is the cgp_group variant). Reported: mean rollout→train end and its change against cgp,
per-step paired differences' standard error, and the predictor's rank correlation per source.
"""

from __future__ import annotations

import argparse
import math
import statistics

from verl_pipe_lab.bench.sim_windows import load_calibrations, stack_shape, write_rows
from verl_pipe.core.admission import TrainerRatio, rest_order
from verl_pipe.core.lengths import prediction_quality
from verl_pipe.core.variants import GRANULARITIES, PIPELINED_BASE, fifo_variant
from verl_pipe.sim.calib import simulate_like
from verl_pipe.sim.records import engine_from_summary, trainer_from_summary
from verl_pipe.sim.tail import Knowledge, RunPredictor

FIGURES = ("rollout_to_train_end_s", "rollout_end_s", "first_unit_ready_s")


def simulate_setting(setting: dict, shape, num_groups: int, calibration: dict, knowledge: list[Knowledge],
                     rounds: int, seed: int, prompt_len: float, unit_fill: str, trainer_scale: float = 1.0,
                     granularity: str = "minibatch") -> dict:
    """{mode: {figure means, vs_cgp_pct, paired_se_pct}} over ``rounds`` steps, and the predictor's quality;
    ``trainer_scale`` scales the trainer's costs (another balance of trainer and rollout); ``granularity`` is CGP's
    (mini-batch units, or groups accumulated into them: almost no training left after the rollout)."""
    from verl_pipe_lab.bench.settings import workload_for

    overlapped = engine_from_summary(calibration["engine_overlapped"], shape)
    trainer = trainer_from_summary(calibration["trainer"]).with_(time_scale=trainer_scale)
    predictors = {k.label: RunPredictor(k) for k in knowledge}
    runs: dict[str, list[dict]] = {}
    records = []
    ratio = TrainerRatio()  # the run's steps so far (their cgp runs): what the trainer orders beyond the frontier by
    for r in range(rounds):
        wl = workload_for(setting["workload"], num_groups, shape.n, seed=seed, round_=r)
        step = {"lengths": wl.lengths, "prompt_len": prompt_len, "weight_sync_s": 0.0, "unit_fill": unit_fill}
        order = rest_order(unit_fill, ratio.value, granularity)
        # the baseline ("cgp" in the rows) is CGP's FIFO variant at this granularity: the cgp variant's own is fixed at
        # mini-batch units, so the rows compare FGD with CGP at one granularity
        last = simulate_like(step, fifo_variant(granularity), granularity, overlapped, trainer, shape)
        ratio.update(last["trainer_busy_s"], last["rollout_end_s"])
        runs.setdefault("cgp", []).append(last)
        for label, pred in predictors.items():
            lengths = pred.lengths(wl, r)
            runs.setdefault(f"cgp_fgd[{label}]", []).append(simulate_like(
                dict(step, fgd_window=shape.fgd_window), "cgp_fgd", granularity, overlapped, trainer, shape,
                predictions=lengths, rest_order=pred.knowledge.order or order))
            pred.learn(wl, r)
            if label == "predicted" and lengths is not None:
                records += lengths.record()
    base = [m["rollout_to_train_end_s"] for m in runs["cgp"]]
    modes = {"trainer_to_rollout": statistics.mean(m["trainer_busy_s"] / m["rollout_end_s"] for m in runs["cgp"])}
    for mode, ms in runs.items():
        e = {k: statistics.mean(m[k] for m in ms) for k in FIGURES}
        diffs = [100 * (m["rollout_to_train_end_s"] / b - 1) for m, b in zip(ms, base)]
        e["vs_cgp_pct"] = statistics.mean(diffs)
        e["paired_se_pct"] = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
        modes[mode] = e
    ratio_cgp = modes.pop("trainer_to_rollout")
    return {"modes": modes, "cgp_trainer_to_rollout": ratio_cgp,
            "prediction_quality": prediction_quality(records) if records else None}


def study(cfg: dict, calibrations: dict, calibrate_as: dict, knowledge: list[Knowledge], unit_fills: list[str],
          rounds: int, prompt_len: float, kv_tokens_per_gib: dict, trainer_scale: float = 1.0,
          granularities: tuple[str, ...] = ("minibatch",)) -> list[dict]:
    from verl_pipe_lab.bench.settings import stack_of

    rows = []
    for s in cfg["settings"]:
        if s.get("knobs"):
            continue
        stack = stack_of(s, cfg)
        size = calibrate_as.get(stack, stack)
        if size not in calibrations:
            raise ValueError(f"setting {s['name']}: no calibration for {size!r} (have {sorted(calibrations)}); "
                             f"borrow one with --calibrate-as {stack}=<size>")
        shape, num_groups = stack_shape(cfg, stack, kv_tokens_per_gib[size])
        for gran, fill in ((g, f) for g in granularities for f in unit_fills):
            res = simulate_setting(s, shape, num_groups, calibrations[size], knowledge, rounds,
                                   int(cfg.get("seed", 0)), prompt_len, fill, trainer_scale, gran)
            rows.append({"setting": s["name"], "stack": stack, "calibration": size, "unit_fill": fill,
                         "granularity": gran, "trainer_scale": trainer_scale,
                         "rounds": rounds, "max_num_seqs": shape.max_num_seqs,
                         "kv_capacity_tokens": shape.kv_capacity_tokens, **res})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = ["== simulated (calibrated): rollout→train end s, change vs cgp (paired standard error), rollout end s, "
             "first unit ready s"]
    for r in rows:
        lines.append(f"{r['setting']} [{r['stack']}, max_num_seqs {r['max_num_seqs']}, KV {r['kv_capacity_tokens']} "
                     f"tokens, unit_fill {r['unit_fill']}, granularity {r.get('granularity', 'minibatch')}, "
                     f"{r['rounds']} steps, trainer x{r['trainer_scale']:g}: "
                     f"cgp's trainer work / rollout {r['cgp_trainer_to_rollout']:.2f}]")
        for m, e in r["modes"].items():
            vs = "" if m == PIPELINED_BASE else f"{e['vs_cgp_pct']:+6.1f}% ({e['paired_se_pct']:.1f})"
            lines.append(f"  {m:<24} r2t {e['rollout_to_train_end_s']:7.2f} {vs:<16} rollout {e['rollout_end_s']:6.2f}"
                         f"  1st unit {e['first_unit_ready_s']:6.2f}")
        q = r.get("prediction_quality")
        if q:
            lines.append("  predictor rank correlation: " + ", ".join(
                f"{src} {v['rank_correlation']:.2f} ({v['groups']} groups)" if v["rank_correlation"] is not None
                else f"{src} - ({v['groups']} groups)" for src, v in q.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    from verl_pipe_lab.bench.settings import load_config

    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench.sim_tail", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a bench YAML (lab/verl_pipe_lab/bench/conf/*.yaml)")
    ap.add_argument("--calibration", required=True, action="append", help="a bench results JSON (docs/bench/*.json)")
    ap.add_argument("--calibrate-as", action="append", default=[], metavar="STACK=SIZE",
                    help="simulate STACK with the calibration of SIZE (a stack the JSONs did not measure)")
    ap.add_argument("--knowledge", default="off,perfect,perfect~0.5,predicted,siblings,shuffled",
                    help="length knowledge of FGD, comma-separated (verl_pipe/sim/tail.py)")
    ap.add_argument("--unit-fill", default="completion,dispatch", help="unit fills, comma-separated")
    ap.add_argument("--granularity", default="minibatch", help="CGP granularities, comma-separated (minibatch, group)")
    ap.add_argument("--rounds", type=int, default=12, help="steps per setting (one run: prompts repeat)")
    ap.add_argument("--settings", help="comma-separated setting names (default: all without knobs)")
    ap.add_argument("--trainer-scale", type=float, default=1.0, help="scale the trainer's costs (another balance)")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    granularities = tuple(g.strip() for g in args.granularity.split(",") if g.strip())
    if not granularities or set(granularities) - set(GRANULARITIES):
        ap.error(f"--granularity: got {args.granularity!r}; allowed: {', '.join(GRANULARITIES)}, comma-separated")
    cals, per_gib, prompt_len = load_calibrations(args.calibration)
    cfg = load_config(args.config)
    if args.settings:
        wanted = {x.strip() for x in args.settings.split(",")}
        cfg = dict(cfg, settings=[s for s in cfg["settings"] if s["name"] in wanted])
    rows = study(cfg, cals, dict(a.split("=", 1) for a in args.calibrate_as),
                 [Knowledge.parse(k.strip()) for k in args.knowledge.split(",") if k.strip()],
                 [f.strip() for f in args.unit_fill.split(",") if f.strip()], args.rounds, prompt_len, per_gib,
                 args.trainer_scale, granularities)
    print(format_rows(rows))
    if args.out:
        write_rows(args.out, args.config, args.calibration, prompt_len, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
