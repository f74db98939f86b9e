"""The learning-curve benchmark: does each pipelined mode learn like sync, and sooner in wall-clock?

    python -m verl_pipe.bench --learn --out learn.json [--charts DIR] [--steps 100] [--seeds 0,1,2]
                              [--modes sync,cgp,cgp_fgd] [--val-every 10] [hydra overrides ...]

Each (mode, seed) trains the tiny default from its SFT warm-start (a fresh ``PipeSession``: Ray, vLLM, verl's
workers) for ``--steps`` GRPO steps on the digit-math task, validating on the held-out questions before training and
every ``--val-every`` steps (greedy, verl's ``val-core`` accuracy). A seed sets the data order and vLLM's sampling
seed; sync, cgp and cgp_fgd of one seed start from the same weights and see the same prompts in the same order.
Every step's reward, response length, step time, rollout→train end and (when validated) accuracy go into the JSON.

The comparison is fixed before any run (docs/learning.md) and reported whichever way it comes out
(``compare``): a pipelined mode learns "the same" as sync when

1. final accuracy: its mean over seeds of the last validation is within two standard errors of sync's (Welch's
   standard error of the difference of the means over seeds), and
2. per step: in at least 90% of the windows of ``WINDOW`` steps, its mean training reward (over seeds) is within two
   standard errors of sync's.

Per second, it reports each mode's training wall-clock to reach the accuracy sync ends with (sync's final mean less
one standard error), on the seeds' mean curve, and its total training time. A benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from verl_pipe.core.variants import variant

# The variants the curves compare: one entry per bench mode name, its overrides of the tiny default.
LEARN_MODES = {name: variant(name).overrides() for name in ("sync", "cgp", "cgp_fgd")}
WINDOW = 10  # steps per window of the per-step test
VAL_KEY = "val-core/verl_pipe/digit_math/acc/mean@1"
STEP_KEYS = {"reward": "critic/score/mean", "response_length": "response_length/mean", "step_s": "timing_s/step",
             "entropy": "actor/entropy"}


def run_overrides(mode: str, seed: int, steps: int, val_every: int) -> list[str]:
    return [*LEARN_MODES[mode], f"trainer.total_training_steps={steps}", f"trainer.test_freq={val_every}",
            "trainer.val_before_train=true", f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={1000 + seed}",
            "trainer.logger=[console]", f"trainer.experiment_name=learn_{mode}_{seed}"]


def _number(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def step_row(record: dict, wall_s: float) -> dict:
    """One step of a curve from ``PipeSession.step``'s record: what learning and speed look like at that step."""
    m, tm = record["metrics"], record["timeline"]
    row = {"step": record["step"], "wall_s": wall_s, "rollout_to_train_end_s": tm["rollout_to_train_end_s"],
           "trainer_wait_ratio": tm["trainer_wait_ratio"]}
    row.update({k: _number(m.get(key)) for k, key in STEP_KEYS.items()})
    if VAL_KEY in m:
        row["val_acc"] = _number(m[VAL_KEY])
    return row


def run_one(mode: str, seed: int, steps: int, val_every: int, overrides: list[str], log=print) -> dict:
    """One training run on a fresh stack; its curve."""
    from verl_pipe.launch.session import PipeSession, compose

    session = PipeSession(compose(list(overrides) + run_overrides(mode, seed, steps, val_every)))
    try:
        val0 = _number(session.trainer.initial_val_metrics.get(VAL_KEY))
        rows, wall = [], 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            record = session.step()
            # Training wall-clock: the step (rollout, training, weight sync), not the validation that measures it.
            wall += time.perf_counter() - t0 - float(record["metrics"].get("timing_s/testing", 0.0))
            rows.append(step_row(record, wall))
            if "val_acc" in rows[-1]:
                log(f"[learn] {mode} seed {seed} step {rows[-1]['step']}: val acc {rows[-1]['val_acc']:.3f} "
                    f"({wall:.0f} s of training)")
        from verl_pipe.bench.provenance import stack_record

        return {"mode": mode, "seed": seed, "startup_s": session.startup_s, "val_before": val0, "steps": rows,
                "unit_fill": session.knobs.unit_fill,
                "config": stack_record(session.trainer.config, list(overrides) + run_overrides(mode, seed, steps,
                                                                                               val_every))}
    finally:
        session.close()


# ---------------------------------------------------------------------------------------------- pure analysis


def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, float("nan")
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return mean, math.sqrt(var / n)


def final_accuracy(run: dict) -> float:
    vals = [r["val_acc"] for r in run["steps"] if r.get("val_acc") is not None]
    if not vals:
        raise ValueError(f"run {run['mode']} seed {run['seed']} has no validation after training")
    return vals[-1]


def accuracy_curve(run: dict) -> list[tuple[int, float, float]]:
    """(step, wall-clock s, accuracy) at step 0 and every validation."""
    out = [(0, 0.0, run["val_before"])] if run.get("val_before") is not None else []
    return out + [(r["step"], r["wall_s"], r["val_acc"]) for r in run["steps"] if r.get("val_acc") is not None]


def time_to_reach(run: dict, target: float) -> float | None:
    for _, wall, acc in accuracy_curve(run):
        if acc >= target:
            return wall
    return None


def mean_run(runs: list[dict]) -> dict:
    """The seeds' mean curve: accuracy and training wall-clock averaged validation by validation."""
    curves = [accuracy_curve(r) for r in runs]
    n = min(len(c) for c in curves)
    rows = [{"step": curves[0][i][0], "wall_s": sum(c[i][1] for c in curves) / len(curves),
             "val_acc": sum(c[i][2] for c in curves) / len(curves)} for i in range(1, n)]
    before = [r["val_before"] for r in runs if r.get("val_before") is not None]
    return {"val_before": sum(before) / len(before) if len(before) == len(runs) else None, "steps": rows}


def _windows(run: dict, window: int) -> list[float]:
    rewards = [r["reward"] for r in run["steps"]]
    return [sum(rewards[i:i + window]) / len(rewards[i:i + window]) for i in range(0, len(rewards), window)]


def compare(runs: list[dict], window: int = WINDOW) -> dict:
    """The pre-registered test of each pipelined mode against sync (module docstring), and the per-second figures."""
    by_mode: dict[str, list[dict]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], []).append(run)
    if "sync" not in by_mode:
        raise ValueError("the learning comparison needs sync runs (its reference)")
    summary = {}
    for mode, mruns in by_mode.items():
        finals = [final_accuracy(r) for r in mruns]
        starts = [r["val_before"] for r in mruns if r.get("val_before") is not None]
        mean, se = _mean_se(finals)
        summary[mode] = {"seeds": [r["seed"] for r in mruns], "final_val_acc": finals, "final_mean": mean,
                         "final_se": se, "val_before_mean": _mean_se(starts)[0] if starts else None,
                         "train_wall_s": _mean_se([r["steps"][-1]["wall_s"] for r in mruns])[0],
                         "rollout_to_train_end_s": _mean_se([sum(s["rollout_to_train_end_s"] for s in r["steps"])
                                                             / len(r["steps"]) for r in mruns])[0]}
    sync = summary["sync"]
    target = sync["final_mean"] - (sync["final_se"] if math.isfinite(sync["final_se"]) else 0.0)
    sync_windows = [_windows(r, window) for r in by_mode["sync"]]
    tests = {}
    for mode, mruns in by_mode.items():
        s = summary[mode]
        s["time_to_sync_final_s"] = [time_to_reach(r, target) for r in mruns]
        s["time_to_sync_final_mean_s"] = time_to_reach(mean_run(mruns), target)
        if mode == "sync":
            continue
        se_diff = math.sqrt(s["final_se"] ** 2 + sync["final_se"] ** 2)
        diff = s["final_mean"] - sync["final_mean"]
        final_ok = abs(diff) <= 2 * se_diff if math.isfinite(se_diff) and se_diff > 0 else diff == 0
        mode_windows = [_windows(r, window) for r in mruns]
        n_win = min(len(w) for w in sync_windows + mode_windows)
        within = []
        for i in range(n_win):
            a_mean, a_se = _mean_se([w[i] for w in mode_windows])
            b_mean, b_se = _mean_se([w[i] for w in sync_windows])
            se_w = math.sqrt(a_se ** 2 + b_se ** 2)
            within.append(abs(a_mean - b_mean) <= 2 * se_w if math.isfinite(se_w) and se_w > 0 else a_mean == b_mean)
        frac = sum(within) / len(within) if within else float("nan")
        tests[mode] = {"final_diff": diff, "final_se_diff": se_diff, "final_within_2se": bool(final_ok),
                       "windows": n_win, "windows_within_2se": sum(within), "window_fraction": frac,
                       "per_step_ok": bool(frac >= 0.9), "same_learning": bool(final_ok and frac >= 0.9),
                       "train_wall_vs_sync": s["train_wall_s"] / sync["train_wall_s"] - 1.0}
    return {"target_val_acc": target, "summary": summary, "tests": tests, "window": window}


def format_report(result: dict) -> str:
    cmp = result["comparison"]
    lines = [f"Learning curves: {result['steps']} steps x seeds {result['seeds']}, validation every "
             f"{result['val_every']} steps ({result['val_size']} held-out questions, greedy)",
             f"{'mode':<9} {'val before':>10} {'final val (mean ± se)':>22} {'train wall':>11} {'r→t end/step':>13} "
             f"{'to sync final':>14}"]
    for mode, s in cmp["summary"].items():
        reach = s["time_to_sync_final_mean_s"]
        lines.append(f"{mode:<9} {s['val_before_mean'] or float('nan'):>10.3f} "
                     f"{s['final_mean']:>14.3f} ± {s['final_se']:.3f} {s['train_wall_s']:>10.0f}s "
                     f"{s['rollout_to_train_end_s']:>12.2f}s {'-' if reach is None else f'{reach:.0f}s':>14}")
    for mode, t in cmp["tests"].items():
        lines.append(f"{mode} vs sync: final {t['final_diff']:+.3f} (2 se {2 * t['final_se_diff']:.3f}: "
                     f"{'within' if t['final_within_2se'] else 'OUTSIDE'}); reward windows within 2 se "
                     f"{t['windows_within_2se']}/{t['windows']} ({'ok' if t['per_step_ok'] else 'FAILS'}); "
                     f"training wall-clock {t['train_wall_vs_sync']:+.1%} -> "
                     f"{'same learning' if t['same_learning'] else 'DIFFERENT learning'}")
    return "\n".join(lines)


def write_charts(result: dict, out_dir: Path) -> list[Path]:
    """Validation accuracy and training reward against step and against training wall-clock, mean ± one standard
    error over seeds per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    runs = result["runs"]
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    paths = []
    for name, metric in (("learning_val_acc.png", "val"), ("learning_reward.png", "reward")):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for mode in modes:
            mruns = [r for r in runs if r["mode"] == mode]
            if metric == "val":
                curves = [accuracy_curve(r) for r in mruns]
                n = min(len(c) for c in curves)
                xs_step = [curves[0][i][0] for i in range(n)]
                xs_wall = [sum(c[i][1] for c in curves) / len(curves) for i in range(n)]
                stats = [_mean_se([c[i][2] for c in curves]) for i in range(n)]
            else:
                wins = [_windows(r, result["comparison"]["window"]) for r in mruns]
                n = min(len(w) for w in wins)
                w = result["comparison"]["window"]
                xs_step = [(i + 1) * w for i in range(n)]
                xs_wall = [sum(r["steps"][min(len(r["steps"]), (i + 1) * w) - 1]["wall_s"] for r in mruns) / len(mruns)
                           for i in range(n)]
                stats = [_mean_se([x[i] for x in wins]) for i in range(n)]
            mean = [m for m, _ in stats]
            se = [0.0 if not math.isfinite(s) else s for _, s in stats]
            for ax, xs in zip(axes, (xs_step, xs_wall)):
                ax.plot(xs, mean, marker="o", markersize=3, label=mode)
                ax.fill_between(xs, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)], alpha=0.2)
        label = "validation accuracy (greedy)" if metric == "val" else f"training reward (mean of {w} steps)" \
            if metric == "reward" else metric
        for ax, xl in zip(axes, ("GRPO step", "training wall-clock (s)")):
            ax.set_xlabel(xl)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(f"{label}: mean ± 1 se over seeds {result['seeds']}")
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def cli(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m verl_pipe.bench --learn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--learn", action="store_true", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--charts")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--modes", default=",".join(LEARN_MODES))
    ap.add_argument("--val-every", type=int, default=10)
    ap.add_argument("--reanalyze", metavar="JSON", help="no runs: rebuild the comparison and charts from a saved JSON")
    ap.add_argument("--reference", metavar="JSON",
                    help="take the sync runs from this earlier learning JSON (same steps, seeds and validation "
                         "cadence) instead of running them again")
    args, overrides = ap.parse_known_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in LEARN_MODES]
    if unknown or ("sync" not in modes and not args.reference):
        ap.error(f"--modes: {unknown or 'sync is missing'}; allowed: {', '.join(LEARN_MODES)} (sync is the reference; "
                 f"or give --reference)")
    if args.steps < 1 or args.val_every < 1:
        ap.error("--steps and --val-every must be >= 1")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    t0 = time.perf_counter()
    if args.reanalyze:
        with open(args.reanalyze) as f:
            result = json.load(f)
    else:
        from verl_pipe.bench.provenance import env_info

        runs = reference_runs(args.reference, args.steps, seeds, args.val_every) if args.reference else []
        modes = (["sync"] if args.reference else []) + [m for m in modes if not (args.reference and m == "sync")]
        out = Path(args.out)
        for seed in seeds:  # seeds outermost: a slow phase of the machine hits every mode of a seed alike
            for mode in modes:
                if any(r["mode"] == mode and r["seed"] == seed for r in runs):
                    continue  # from --reference
                runs.append(run_one(mode, seed, args.steps, args.val_every, overrides))
                partial = out.with_name(out.stem + "_partial.json")
                partial.write_text(json.dumps({"runs": runs}))  # a crash keeps what ran
        result = {"steps": args.steps, "seeds": seeds, "modes": modes, "val_every": args.val_every,
                  "overrides": overrides, "val_size": _val_size(overrides), "env": env_info(), "runs": runs,
                  "reference": args.reference}
    result["comparison"] = compare(result["runs"])
    print(format_report(result))
    if args.charts:
        result["charts"] = [str(p) for p in write_charts(result, Path(args.charts))]
    result["elapsed_s"] = result.get("elapsed_s") or time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    Path(args.out).with_name(Path(args.out).stem + "_partial.json").unlink(missing_ok=True)  # the whole JSON holds it
    print(f"[learn] wrote {args.out}")
    return 0


def reference_runs(path: str, steps: int, seeds: list[int], val_every: int) -> list[dict]:
    """The sync runs of an earlier learning JSON, checked to be comparable (steps, seeds, validation cadence)."""
    with open(path) as f:
        ref = json.load(f)
    for key, want in (("steps", steps), ("val_every", val_every)):
        if ref.get(key) != want:
            raise SystemExit(f"--reference {path}: its {key} is {ref.get(key)!r}, this run's {want!r}")
    runs = [dict(r, reference=path) for r in ref.get("runs", []) if r["mode"] == "sync" and r["seed"] in seeds]
    missing = sorted(set(seeds) - {r["seed"] for r in runs})
    if missing:
        raise SystemExit(f"--reference {path}: no sync run for seeds {missing}")
    return runs


def _val_size(overrides: list[str]) -> int | None:
    from verl_pipe.launch.session import compose

    try:
        import pyarrow.parquet as pq

        from verl_pipe.main_grpo import prepare_config

        cfg = prepare_config(compose(list(overrides)))
        return pq.read_metadata(cfg.data.val_files).num_rows
    except Exception:  # the size is a label of the report; the runs already ran
        return None
