"""The learning comparison: do the pipelined modes and verl's own separate_async learn like sync, and sooner in
wall-clock?

    python -m verl_pipe_lab.bench --learn --out learn.json [--charts DIR] [--steps 40] [--seeds 0,1,2,3,4]
                              [--modes sync,cgp_group,cgp_fgd,...] [--val-every 5] [--no-aa] [--base MODE]
                              [--recipe NAME] [--task NAME] [hydra overrides ...]
    python -m verl_pipe_lab.bench --learn --merge part1.json part2.json ... --out learn.json [--charts DIR]
    python -m verl_pipe_lab.bench --learn --reanalyze learn.json --out learn.json [--charts DIR]
    python -m verl_pipe_lab.bench --learn --dry-run ...      (the schedule, the task's validation size; no runs)
    python -m verl_pipe_lab.bench --learn --seeds 3 --slice 0:3 --out part.json   (a part: runs 0-2 of seed 3's block)

The task is a parameter: ``--recipe`` (the Hydra config every run composes, ours and the peer's; default
``rolloutpipe_trainer``, main_grpo's), ``--task`` (one of the embedded tiny tasks, ``rolloutpipe.tiny_assets.task``)
and any Hydra override (e.g. ``data.train_files=... data.val_files=... actor_rollout_ref.model.path=...`` for your
own data and model). The bench refuses a task whose lengths are forced (``rolloutpipe.workload``): the model must
decide them, or the rewards and the wall-clock mean nothing.

Each (mode, seed) trains the task from its SFT warm-start on a fresh stack (ours: a ``PipeSession``, Ray,
vLLM, verl's workers; verl's peer: its V1 separate_async trainer in its own subprocess and Ray cluster,
lab/verl_pipe_lab/bench/peer/learn.py) for ``--steps`` GRPO steps, validating on the held-out questions before training and
every ``--val-every`` steps (greedy, verl's ``val-core`` accuracy). A seed sets the data order and vLLM's sampling
seed; every mode of one seed starts from the same weights and sees the same prompts in the same order. The A/A runs
(sync at seed s + 100 for each main seed s) run in the same blocks. Within a block (one main seed) the arms run in the
seed's row of a Williams design (``--design``, learn_stats.schedule: every arm in every position and after every other
arm equally often; ``cyclic``, the earlier comparisons' rotation, is kept for their parts). Every step's reward,
response length, step time, rollout->train end and (when validated) accuracy and validation time go into the JSON,
each run with its composed config and provenance.

The analysis is fixed before any run (lab/verl_pipe_lab/bench/learn_stats.py, docs/learning.md "Pre-registration") and
reported whichever way it comes out: final-accuracy equivalence (TOST paired by seed, margin 0.05), the A/A through
the same test, time to sync's final accuracy and step time (paired differences with standard errors). A benchmark:
it prints figures and asserts nothing. It may be run in parts (``--seeds``/``--modes``) and merged (``--merge``).
``--base MODE`` pairs every mode with another reference than sync (e.g. ``cgp_group``: FGD against FIFO admission,
docs/fgd.md); such a comparison has no A/A arm.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from verl_pipe_lab.bench import learn_stats as st
from verl_pipe_lab.bench.provenance import git_state
from verl_pipe_lab.bench.learn_charts import write_charts
from verl_pipe_lab.bench.peer.learn import LEARN_MODE as PEER_MODE
from verl_pipe_lab.bench.variants import peer_config
from verl_pipe.core.variants import BASE, FGD_VARIANT, GRANULARITIES, fifo_variant, variant
from verl_pipe.launch.prepare import DEFAULT_RECIPE  # main_grpo's config: its default task (the comparison's)

# The modes a comparison may run: ours (RolloutPipeTrainer) and verl's on-policy separate_async. By default it runs
# default_modes(the recipe's granularity): cgp_fgd and the FIFO arm at the granularity the recipe trains at.
FIFO_MODES = tuple(fifo_variant(g) for g in GRANULARITIES)  # cgp, cgp_group
LEARN_MODES = (BASE, *FIFO_MODES, FGD_VARIANT, PEER_MODE)
# Descriptive pairings beside the pre-registered tests (each mode vs sync): FGD's own gain over FIFO admission
# (issue 41 on a task whose model decides the lengths), paired by seed through the same block.
# cgp_fgd runs the recipe's granularity, so the pair that isolates FGD is the one whose FIFO arm ran the same.
SECONDARY_PAIRS = tuple((FGD_VARIANT, fifo) for fifo in FIFO_MODES)
VAL_KEY = "val-core/verl_pipe/digit_math/acc/mean@1"  # the task's data source (math_data.DATA_SOURCE), greedy @1
STEP_KEYS = {"reward": "critic/score/mean", "response_length": "response_length/mean", "step_s": "timing_s/step",
             "entropy": "actor/entropy"}
# the step's timeline figures a row keeps besides (docs/metrics.md), where the step has them (verl's peer does not):
# what bounds a pipelined step (lab/verl_pipe_lab/bench/learn_budget.py reads the same figures back from older parts' logs)
TIMELINE_KEYS = ("rollout_end_s", "trainer_busy_s", "trainer_busy_in_rollout_s", "first_unit_ready_s",
                 "last_unit_cost_s", "ideal_lower_bound_s", "response_tokens")
WINDOW = 10  # steps per window of the reward chart
TASK_KEY = "rolloutpipe.tiny_assets.task"  # the embedded tiny task a run trains on (where the config has tasks)


def val_key(metrics: dict) -> str | None:
    """The validation accuracy's key: VAL_KEY, else the one ``val-core/<data source>/acc/mean@1`` there is."""
    if VAL_KEY in metrics:
        return VAL_KEY
    keys = sorted(k for k in metrics if k.startswith("val-core/") and k.endswith("/acc/mean@1"))
    if len(keys) > 1:
        raise ValueError(f"several validation accuracies ({keys}): the learning bench compares one task")
    return keys[0] if keys else None


def default_modes(granularity: str) -> tuple[str, ...]:
    """The modes a comparison runs when ``--modes`` is not given: sync, the FIFO pipelined arm at the recipe's
    ``rolloutpipe.cgp.granularity`` (so that cgp_fgd against it measures FGD alone), cgp_fgd and verl's peer."""
    return (BASE, fifo_variant(granularity), FGD_VARIANT, PEER_MODE)


def run_keys(mode: str, seed: int, steps: int, val_every: int) -> list[str]:
    """The per-run Hydra keys every mode gets: steps, validation cadence, seeds, logger, name."""
    return [f"trainer.total_training_steps={steps}", f"trainer.test_freq={val_every}",
            "trainer.val_before_train=true", f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={1000 + seed}",
            "trainer.logger=[console]", f"trainer.experiment_name=learn_{mode}_{seed}"]


def run_overrides(mode: str, seed: int, steps: int, val_every: int) -> list[str]:
    """Our modes' overrides of one run: the variant's (its mode, and FGD on or off whatever the recipe or the
    default says), then run_keys."""
    return [*variant(mode).overrides(), *run_keys(mode, seed, steps, val_every)]


def task_overrides(task: str | None) -> list[str]:
    """The overrides that select an embedded tiny task (none: the recipe's own)."""
    return [f"{TASK_KEY}={task}"] if task else []


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
    row.update({k: _number(tm.get(k)) for k in TIMELINE_KEYS if k in tm})
    row.update({k: _number(m.get(key)) for k, key in STEP_KEYS.items()})
    key = val_key(m)
    if key:
        row["val_acc"] = _number(m[key])
        row["val_s"] = _number(m.get("timing_s/testing"))
    return row


# ------------------------------------------------------------------------------------------------------- runs


def run_context() -> dict:
    """What the machine was doing when a run started: load average and whether it held the quiet file."""
    return {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_avg": list(os.getloadavg()),
            "quiet_file": os.path.exists("/tmp/verl_pipe_quiet")}


def length_prediction(records: list[dict]) -> dict | None:
    """The run's length predictions against what came out (issue 41 on a task whose model decides the lengths): rank
    correlation per source over every step's group records (``core.lengths.prediction_quality``; every mode of ours
    records them, only cgp_fgd orders by them); None where a run has none (verl's peer)."""
    from verl_pipe.core.lengths import prediction_quality

    return prediction_quality(records) if records else None


def _run_ours(mode: str, seed: int, steps: int, val_every: int, overrides: list[str], log, recipe: str) -> dict:
    from verl_pipe_lab.bench.provenance import stack_record
    from verl_pipe.launch.session import PipeSession, compose

    all_overrides = list(overrides) + run_overrides(mode, seed, steps, val_every)
    session = PipeSession(compose(all_overrides, config_name=recipe))
    try:
        key = val_key(session.trainer.initial_val_metrics)
        val0 = _number(session.trainer.initial_val_metrics.get(key)) if key else None
        rows, wall, lengths = [], 0.0, []
        for _ in range(steps):
            t0 = time.perf_counter()
            record = session.step()
            lengths += record.get("lengths") or []  # per group, predicted vs actual
            # Training wall-clock: the step (rollout, training, weight sync), not the validation that measures it.
            wall += time.perf_counter() - t0 - float(record["metrics"].get("timing_s/testing", 0.0))
            rows.append(step_row(record, wall))
            if rows[-1].get("val_acc") is not None:
                log(f"[learn] {mode} seed {seed} step {rows[-1]['step']}: val acc {rows[-1]['val_acc']:.3f} "
                    f"({wall:.0f} s of training)")
        return {"startup_s": session.startup_s, "val_before": val0, "steps": rows,
                "unit_fill": session.knobs.unit_fill, "length_prediction": length_prediction(lengths),
                "config": stack_record(session.trainer.config, all_overrides)}
    finally:
        session.close()


def _run_peer(mode: str, seed: int, steps: int, val_every: int, overrides: list[str], log,
              timeout_s: float | None, recipe: str) -> dict:
    from verl_pipe_lab.bench.peer.learn import learn_rows, learn_spec, run_learning
    from verl_pipe_lab.bench.peer.runner import compose_spec
    from verl_pipe_lab.bench.provenance import stack_record
    from verl_pipe.launch.prepare import prepare_config

    spec = learn_spec(list(overrides), run_keys(mode, seed, steps, val_every), steps, seed,
                      config=peer_config(mode), config_name=recipe)
    result = run_learning(spec, timeout_s=timeout_s, log=log)
    before, rows = learn_rows(result["steps"], val_key, STEP_KEYS)
    for r in rows:
        if r.get("val_acc") is not None:
            log(f"[learn] {mode} seed {seed} step {r['step']}: val acc {r['val_acc']:.3f} "
                f"({r['wall_s']:.0f} s of training)")
    versions = [s.get("weight_versions", {}) for s in result["steps"]]
    return {"startup_s": result["startup_s"], "val_before": before, "steps": rows,
            "config": stack_record(prepare_config(compose_spec(spec, result["overrides"])), result["overrides"]),
            "peer": {"config": result["config"], "ray_start_s": result.get("ray_start_s"),
                     "run_s": result.get("run_s"), "on_policy_steps": sum(1 for v in versions if v.get("on_policy")),
                     "max_staleness": max((v.get("max_staleness") or 0 for v in versions), default=None)}}


def run_one(mode: str, seed: int, steps: int, val_every: int, overrides: list[str], arm: str = "main", log=print,
            timeout_s: float | None = 3600, recipe: str = DEFAULT_RECIPE) -> dict:
    """One training run of ``recipe`` + ``overrides`` (the task) on a fresh stack; its curve, config, provenance."""
    context = run_context()
    t0 = time.perf_counter()
    if variant(mode).ours:
        out = _run_ours(mode, seed, steps, val_every, overrides, log, recipe)
    else:
        out = _run_peer(mode, seed, steps, val_every, overrides, log, timeout_s, recipe)
    return {"mode": mode, "seed": seed, "arm": arm, **out, "elapsed_s": time.perf_counter() - t0,
            "provenance": {**context, "git": git_state(), "load_avg_end": list(os.getloadavg())}}


# ----------------------------------------------------------------------------------------------------- analysis


def _val_steps(run: dict) -> list[int]:
    return [v["step"] for v in st.validations(run)]


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _run_times(run: dict, target: float, f_base: float) -> dict:
    """A run's time (and steps) to the target T, and to sync's final accuracy itself (descriptive)."""
    curve = st.accuracy_curve(run)
    t, ok = st.crossing(curve, target)
    steps, _ = st.crossing(curve, target, x=0)
    t_final, ok_final = st.crossing(curve, f_base)
    return {"time_to_target_s": t, "reached": ok, "steps_to_target": steps, "time_to_final_s": t_final,
            "reached_final": ok_final}


def _mode_summary(mruns: list[dict], times: list[dict]) -> dict:
    """One mode's figures over its main seeds (runs and their _run_times in seed order)."""
    finals = [st.final_accuracy(r) for r in mruns]
    mean, sd = st.mean_sd(finals)
    return {"seeds": [r["seed"] for r in mruns], "final_val_acc": finals, "final_mean": mean,
            "final_se": sd / math.sqrt(len(finals)) if len(finals) > 1 else float("nan"),
            "val_before_mean": _mean([r.get("val_before") for r in mruns]),
            "train_wall_s": _mean([st.train_wall_s(r) for r in mruns]),
            "step_time_s": _mean([st.step_time_s(r) for r in mruns]),
            "startup_s": _mean([r.get("startup_s") for r in mruns]),
            "val_s_mean": _mean([v.get("val_s") for r in mruns for v in st.validations(r)]),
            "rollout_to_train_end_s": _mean([_mean([s.get("rollout_to_train_end_s") for s in r["steps"]])
                                             for r in mruns]),
            **{k: [t[k] for t in times] for k in ("time_to_target_s", "steps_to_target", "time_to_final_s",
                                                   "reached_final")},
            "reached_target": [t["reached"] for t in times], "curve": mean_curve(mruns),
            "length_prediction": [r.get("length_prediction") for r in mruns]}


def _paired_block(pairs: list[tuple[dict, dict]], times_a: list[dict], times_b: list[dict], margin: float,
                  alpha: float) -> dict:
    """(a, b) run pairs: the TOST on final accuracy, and paired time to target, steps to target and step time.
    "sooner_shown": no censored run of a (a censored time is a lower bound that would favour it) and the one-sided
    95% upper bound of the relative time difference below 0."""
    out = {"seeds": [[a["seed"], b["seed"]] for a, b in pairs], "n": len(pairs)}
    if len(pairs) >= 2:
        diffs = [st.final_accuracy(a) - st.final_accuracy(b) for a, b in pairs]
        out["tost"] = st.tost(diffs, margin, alpha)
        sd = out["tost"]["sd"]
        out["detectable_margin_80"] = st.detectable_margin(len(pairs), sd, st.POWER, alpha) if sd > 0 else 0.0
    out["time_to_target"] = st.paired([t["time_to_target_s"] for t in times_a],
                                      [t["time_to_target_s"] for t in times_b])
    out["censored"] = [sum(not t["reached"] for t in times_a), sum(not t["reached"] for t in times_b)]
    out["steps_to_target"] = st.paired([t["steps_to_target"] for t in times_a], [t["steps_to_target"] for t in times_b])
    out["step_time"] = st.paired([st.step_time_s(a) for a, _ in pairs], [st.step_time_s(b) for _, b in pairs])
    tt = out["time_to_target"]
    if len(pairs) >= 2 and math.isfinite(tt.get("relative_se", float("nan"))):
        tt["relative_upper_95"] = tt["relative"] + st.t_ppf(1 - alpha, len(pairs) - 1) * tt["relative_se"]
        out["sooner_shown"] = bool(out["censored"][0] == 0 and tt["relative_upper_95"] < 0)
    return out


def compare(runs: list[dict], margin: float = st.MARGIN, alpha: float = st.ALPHA, base: str = BASE) -> dict:
    """The pre-registered analysis (learn_stats' docstring) of ``runs`` (each with "arm": main or aa; runs without
    one are main). Needs the base mode's main runs; every run must validate at the same steps."""
    for r in runs:
        r.setdefault("arm", "main")
    by_mode: dict[str, list[dict]] = {}
    for r in sorted((r for r in runs if r["arm"] == "main"), key=lambda r: r["seed"]):
        by_mode.setdefault(r["mode"], []).append(r)
    aa = [r for r in runs if r["arm"] == "aa" and r["mode"] == base]
    if base not in by_mode:
        raise ValueError(f"the learning comparison needs {base} runs (its reference)")
    cadence = {tuple(_val_steps(r)) for r in runs}
    if len(cadence) != 1:
        raise ValueError(f"the runs validate at different steps ({sorted(cadence)}): not comparable")
    for r in runs:
        st.final_accuracy(r)  # every run has its final points
    base_runs = by_mode[base]
    f_base = sum(st.final_accuracy(r) for r in base_runs) / len(base_runs)
    target = f_base - margin  # time target: sync's final accuracy, up to the equivalence margin
    times = {(r["mode"], r["arm"], r["seed"]): _run_times(r, target, f_base) for r in runs}

    def block(pairs):
        return _paired_block(pairs, [times[(a["mode"], a["arm"], a["seed"])] for a, _ in pairs],
                             [times[(b["mode"], b["arm"], b["seed"])] for _, b in pairs], margin, alpha)

    summary = {m: _mode_summary(mr, [times[(m, "main", r["seed"])] for r in mr]) for m, mr in by_mode.items()}
    tests = {m: block(st.pair_by_seed(mr, base_runs)) for m, mr in by_mode.items() if m != base}
    secondary = {f"{a} vs {b}": block(st.pair_by_seed(by_mode[a], by_mode[b])) for a, b in SECONDARY_PAIRS
                 if a in by_mode and b in by_mode}
    aa_pairs = st.pair_by_seed(base_runs, aa, offset=st.AA_SEED_OFFSET)
    aa_result = block(aa_pairs) if aa_pairs else None
    if aa_result is not None:
        aa_result["passes"] = aa_result["tost"]["equivalent"] if "tost" in aa_result else None  # None: < 2 pairs
    notes = []
    n_min = min(len(v) for v in by_mode.values())
    if n_min < st.MIN_SEEDS:
        notes.append(f"{n_min} seeds in a mode: the pre-registration asks >= {st.MIN_SEEDS}")
    if aa_result is None:
        notes.append(f"no A/A runs ({base} at seed + {st.AA_SEED_OFFSET}): the A/A test is missing" if base == BASE
                     else f"no A/A arm against the base {base} (only {BASE} has one)")
    return {"preregistered": dict(st.PREREGISTERED, margin=margin, alpha=alpha), "base": base,
            "sync_final_mean": f_base, "target_val_acc": target, "summary": summary,
            "runs": {f"{m}/{a}/{sd}": v for (m, a, sd), v in times.items()}, "tests": tests, "aa": aa_result,
            "secondary": secondary, "notes": notes}


def mean_curve(runs: list[dict]) -> list[dict]:
    """The seeds' mean curve: at step 0 and each validated step, mean accuracy (± se over seeds) and mean training
    wall-clock."""
    curves = [st.accuracy_curve(r) for r in runs]
    n = min(len(c) for c in curves)
    out = []
    for i in range(n):
        accs = [c[i][2] for c in curves]
        m, sd = st.mean_sd(accs)
        out.append({"step": curves[0][i][0], "wall_s": sum(c[i][1] for c in curves) / len(curves), "val_acc": m,
                    "se": sd / math.sqrt(len(accs)) if len(accs) > 1 else 0.0})
    return out


def sd_estimates(runs: list[dict], val_size: int, design_val_size: int = st.MIN_VAL_SIZE) -> dict:
    """Estimates of the paired sd of final accuracy (one mode minus another, same seed) from earlier runs, for the
    power statement (docs/learning.md, "Pre-registration"):

    - ``between_run``: the pooled sd of final accuracy between seeds within each (mode, arm), ``df`` its degrees of
      freedom (modes assumed to learn alike, as the old comparisons found); paired sd = sqrt(2) x it (no credit for
      a positive correlation between the modes of one seed: conservative);
    - ``aa``: the sd of A/A differences (sync at s against sync at s + 100, or one seed run twice when ``runs`` hold
      two sync runs of a seed), where there are >= 2;
    - ``binomial``: the validation set's own noise at the runs' mean final accuracy p, sqrt(2 p (1 - p) / n);
    - ``projected``: between-run variance less the binomial part at ``val_size`` (the training's own spread,
      >= 0) plus the binomial part at ``design_val_size``: the paired sd expected with that many questions."""
    groups: dict[tuple, list[float]] = {}
    for r in runs:
        groups.setdefault((r["mode"], r.get("arm", "main"), r.get("source")), []).append(st.final_accuracy(r))
    ss = sum(sum((x - sum(v) / len(v)) ** 2 for x in v) for v in groups.values())
    df = sum(len(v) - 1 for v in groups.values())
    finals = [x for v in groups.values() for x in v]
    p = sum(finals) / len(finals)
    out = {"runs": len(finals), "mean_final": p, "val_size": val_size, "design_val_size": design_val_size}
    if df > 0:
        s_run = math.sqrt(ss / df)
        binom_old = p * (1 - p) / val_size
        train_var = max(0.0, s_run ** 2 - binom_old)
        out.update(between_run={"sd_run": s_run, "df": df, "paired_sd": math.sqrt(2) * s_run},
                   projected={"train_sd": math.sqrt(train_var),
                              "paired_sd": math.sqrt(2 * (train_var + p * (1 - p) / design_val_size))})
    out["binomial"] = {"paired_sd": math.sqrt(2 * p * (1 - p) / val_size),
                       "paired_sd_at_design": math.sqrt(2 * p * (1 - p) / design_val_size)}
    sync = [r for r in runs if r["mode"] == BASE]
    by_seed: dict[int, list[dict]] = {}
    for r in sync:
        by_seed.setdefault(r["seed"] % st.AA_SEED_OFFSET, []).append(r)
    # main seed minus its A/A partner (s against s + 100), whatever order the parts listed them in: a sign that
    # flips with the order would inflate the sd
    by_seed = {k: sorted(v, key=lambda r: r["seed"]) for k, v in by_seed.items()}
    diffs = [st.final_accuracy(v[0]) - st.final_accuracy(v[1]) for v in by_seed.values() if len(v) >= 2]
    if len(diffs) >= 2:
        out["aa"] = {"paired_sd": st.mean_sd(diffs)[1], "df": len(diffs) - 1, "diffs": diffs}
    return out


def power_plan(sd: float, margin: float = st.MARGIN) -> dict:
    """The design figures for a paired sd: seeds needed for ``margin`` at 80% power, and the margin shown with
    80% power at 5, 6, 8 and 10 seeds."""
    return {"paired_sd": sd, "seeds_for_margin": st.seeds_needed(sd, margin),
            "margin_80_at": {n: st.detectable_margin(n, sd) for n in (5, 6, 8, 10)}}


def _fmt_p(p: dict, scale: str = "s") -> str:
    rel = p.get("relative")
    rel_s = "" if rel is None or not math.isfinite(rel) else f" ({rel:+.1%} ± {p['relative_se']:.1%})"
    return f"{p['diff']:+.1f}{scale} ± {p['diff_se']:.1f}{rel_s}"


def format_report(result: dict) -> str:
    cmp = result["comparison"]
    lines = [f"Learning comparison: {result['steps']} steps, seeds {result['seeds']}, validation every "
             f"{result['val_every']} steps on {result.get('val_size')} held-out questions (greedy); target for time "
             f"to accuracy {cmp['target_val_acc']:.3f} ({cmp.get('base', BASE)}'s final {cmp['sync_final_mean']:.3f} "
             f"- margin {cmp['preregistered']['margin']})",
             f"{'mode':<20} {'val before':>10} {'final (mean ± se)':>18} {'train wall':>10} {'s/step':>7} "
             f"{'r→t end':>8} {'val s':>6} {'reached':>8}"]
    for mode, s in cmp["summary"].items():
        reached = f"{sum(s['reached_target'])}/{len(s['reached_target'])}"
        vb = s["val_before_mean"]
        lines.append(f"{mode:<20} {'-' if vb is None else f'{vb:.3f}':>10} {s['final_mean']:>10.3f} ± "
                     f"{s['final_se']:.3f} {s['train_wall_s']:>9.0f}s {s['step_time_s']:>6.2f}s "
                     f"{s['rollout_to_train_end_s'] or float('nan'):>7.2f}s {s['val_s_mean'] or float('nan'):>5.0f}s "
                     f"{reached:>8}")
    for mode, s in cmp["summary"].items():
        lp = [x for x in s.get("length_prediction") or [] if x]
        hist = [x["history"] for x in lp if x["history"]["groups"]]
        if lp:
            sib = [x["siblings"]["rank_correlation"] for x in lp if x["siblings"]["rank_correlation"] is not None]
            lines.append(f"{mode:<20} length prediction, rank corr per run: history "
                         + (", ".join(f"{h['rank_correlation']:.2f} ({h['groups']} groups)" for h in hist) or "none")
                         + "; siblings " + (", ".join(f"{x:.2f}" for x in sib) or "none"))
    base = cmp.get("base", BASE)
    blocks = [(f"{m} vs {base}", t) for m, t in cmp["tests"].items()]
    if cmp.get("aa"):
        blocks.append((f"A/A {base} vs {base}", cmp["aa"]))
    blocks += [(f"{n} (descriptive)", t) for n, t in (cmp.get("secondary") or {}).items()]
    for name, t in blocks:
        if "tost" in t:
            tt = t["tost"]
            verdict = "EQUIVALENT" if tt["equivalent"] else "not shown equivalent"
            head = (f"{name} (n={t['n']}): final {tt['mean']:+.3f} ± {tt['se']:.3f}, 90% CI "
                    f"[{tt['ci'][0]:+.3f}, {tt['ci'][1]:+.3f}] vs ±{tt['margin']} -> {verdict} (p {tt['p']:.3f}; "
                    f"margin shown with 80% power at this sd: {t['detectable_margin_80']:.3f})")
        else:
            head = f"{name} (n={t['n']}): too few pairs for the TOST"
        lines.append(head)
        lines.append(f"    time to target {_fmt_p(t['time_to_target'])} (censored {t['censored'][0]} vs "
                     f"{t['censored'][1]}; sooner shown: {t.get('sooner_shown')}); step time "
                     f"{_fmt_p(t['step_time'])}; steps to target {t['steps_to_target']['diff']:+.1f}")
    if cmp.get("aa"):
        passes = cmp["aa"]["passes"]
        lines.append("A/A: too few pairs to test" if passes is None
                     else f"A/A {'PASSES' if passes else 'FAILS'} the equivalence test")
    lines += [f"note: {n}" for n in cmp.get("notes", [])]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------- CLI


def _digest(path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def compose_task(overrides: list[str], recipe: str = DEFAULT_RECIPE):
    """The config the runs compose (before their per-run keys), checked for a learning run: a task whose lengths
    the model decides (no ``rolloutpipe.workload``), and the tiny-task key when ``overrides`` select one."""
    from omegaconf import OmegaConf

    from verl_pipe.launch.session import compose

    if any(o.startswith(TASK_KEY + "=") for o in overrides):
        base = compose([], config_name=recipe)
        if OmegaConf.select(base, TASK_KEY) is None:
            raise ValueError(f"--task: recipe {recipe!r} has no {TASK_KEY} (no embedded tiny tasks in this "
                             "checkout); give the data as data.train_files=... data.val_files=... instead")
    cfg = compose(list(overrides), config_name=recipe)
    if OmegaConf.select(cfg, "rolloutpipe.workload") is not None:
        raise ValueError(f"recipe {recipe!r} forces response lengths (rolloutpipe.workload): the learning bench "
                         "needs the model to decide them; add rolloutpipe.workload=null")
    return cfg


def task_info(overrides: list[str], recipe: str = DEFAULT_RECIPE) -> dict:
    """The task the runs train on: recipe, data files (and digests), model, held-out size (prepares the assets,
    cached after the first)."""
    import pyarrow.parquet as pq

    from verl_pipe.launch.prepare import prepare_config

    cfg = prepare_config(compose_task(overrides, recipe))
    return {"recipe": recipe, "train_files": str(cfg.data.train_files), "val_files": str(cfg.data.val_files),
            "train_sha256_16": _digest(cfg.data.train_files), "val_sha256_16": _digest(cfg.data.val_files),
            "model": str(cfg.actor_rollout_ref.model.path), "task": cfg.rolloutpipe.tiny_assets.get("task"),
            "val_size": pq.read_metadata(cfg.data.val_files).num_rows,
            "max_response_length": int(cfg.data.max_response_length),
            "granularity": str(cfg.rolloutpipe.cgp.granularity)}


def parse_supersede(spec: str | None, reason: str | None) -> dict:
    """``--supersede "cgp_fgd@0,cgp_fgd@1"`` with its ``--supersede-reason``: {(mode, seed): reason}."""
    if not spec:
        if reason:
            raise ValueError("--supersede-reason without --supersede")
        return {}
    if not (reason or "").strip():
        raise ValueError("--supersede needs --supersede-reason: why the earlier runs no longer count")
    out = {}
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        mode, sep, seed = item.partition("@")
        if not sep or mode not in LEARN_MODES or not seed.strip().isdigit():
            raise ValueError(f"--supersede {item!r}: expected MODE@SEED with MODE one of {', '.join(LEARN_MODES)}")
        out[(mode, int(seed))] = reason.strip()
    return out


# Task keys the bench records since a later version: a part written before lacks them, so a merge compares them only
# where both parts have them and keeps the value the newer parts recorded.
TASK_KEYS_ADDED = ("granularity",)


def merged_task(tasks: list[dict | None]) -> dict | None:
    """The one task every part ran: equal on every key, except a key of ``TASK_KEYS_ADDED`` that an older part lacks."""
    out = tasks[0]
    for t in tasks[1:]:
        a, b = out or {}, t or {}
        keys = (set(a) | set(b)) - {k for k in TASK_KEYS_ADDED if (k in a) != (k in b)}
        if (out is None) != (t is None) or any(a.get(k) != b.get(k) for k in keys):
            raise ValueError(f"cannot merge: task {t!r} != {tasks[0]!r}")
        out = None if out is None else {**a, **{k: b[k] for k in TASK_KEYS_ADDED if k in b}}
    return out


def design_of(part: dict) -> str:
    """A part's schedule design; a part written before the bench recorded it ran the cyclic one."""
    return part.get("design", "cyclic")


def merge(results: list[dict], supersede: dict | None = None) -> dict:
    """Parts of one comparison merged: the same steps, validation cadence and task; no (mode, arm, seed) twice,
    except a main-arm (mode, seed) named in ``supersede`` ({(mode, seed): reason}): a later part's run (in the order
    given) replaces the earlier one, which is kept whole under "superseded" with the reason and the part it came from."""
    if not results:
        raise ValueError("nothing to merge")
    supersede = supersede or {}
    first = results[0]
    for key in ("steps", "val_every"):
        for r in results[1:]:
            if r.get(key) != first.get(key):
                raise ValueError(f"cannot merge: {key} {r.get(key)!r} != {first.get(key)!r}")
    designs = sorted({design_of(r) for r in results})
    if len(designs) > 1:
        raise ValueError(f"cannot merge: the parts ran different schedule designs {designs}")
    bases = sorted({r.get("base", BASE) for r in results})  # a part written before --base compared with sync
    if len(bases) > 1:
        raise ValueError(f"cannot merge: the parts compare with different bases {bases}")
    task = merged_task([r.get("task") for r in results])
    kept, superseded = {}, []
    for r in results:
        for run in r["runs"]:
            arm = run.get("arm", "main")
            k = (run["mode"], arm, run["seed"])
            if k in kept:
                reason = supersede.get((run["mode"], run["seed"])) if arm == "main" else None
                if reason is None:
                    raise ValueError(f"cannot merge: {k} appears twice (--supersede MODE@SEED to replace the earlier)")
                old, old_part = kept.pop(k)
                superseded.append({"mode": old["mode"], "seed": old["seed"], "part": old_part, "reason": reason,
                                   "by_part": r.get("out"), "run": old})
            kept[k] = (run, r.get("out"))
    named = {(s["mode"], s["seed"]) for s in superseded}
    unused = sorted(set(supersede) - named)
    if unused:
        raise ValueError(f"--supersede {', '.join(f'{m}@{s}' for m, s in unused)}: no later part reruns it")
    runs = [run for run, _ in kept.values()]
    return {**{k: first.get(k) for k in ("steps", "val_every", "recipe", "overrides", "val_size", "env")}, "task": task,
            "design": design_of(first), "base": bases[0],
            "seeds": sorted({r["seed"] for r in runs if r.get("arm", "main") == "main"}),
            "modes": list(dict.fromkeys(r["mode"] for r in runs)), "runs": runs, "superseded": superseded,
            "parts": [r.get("out") for r in results], "elapsed_s": sum(r.get("elapsed_s") or 0 for r in results)}


def slice_plan(plan: list, spec: str) -> list:
    """``plan[START:END]`` from "START:END" (either may be empty); a slice with no run is an error."""
    start, sep, end = spec.partition(":")
    try:
        if not sep:
            raise ValueError
        out = plan[slice(int(start) if start.strip() else None, int(end) if end.strip() else None)]
    except ValueError:
        raise ValueError(f"--slice {spec!r}: expected START:END") from None
    if not out:
        raise ValueError(f"--slice {spec!r}: no run of the schedule ({len(plan)} runs)")
    return out


def _parser():
    import argparse

    ap = argparse.ArgumentParser(prog="python -m verl_pipe_lab.bench --learn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--learn", action="store_true", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--charts")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--modes", help=f"of {', '.join(LEARN_MODES)}; default: sync, the FIFO arm at the recipe's "
                    "rolloutpipe.cgp.granularity (cgp or cgp_group), cgp_fgd and verl's peer")
    ap.add_argument("--design", choices=st.DESIGNS, default="williams",
                    help="the order of a block's arms: williams (balances position and the arm run just before; "
                         "the default) or cyclic (the rotation the earlier comparisons, v1 and v2, ran)")
    ap.add_argument("--val-every", type=int, default=5)
    ap.add_argument("--base", choices=LEARN_MODES,
                    help=f"the comparison's reference, every other mode paired against it (default {BASE}; with "
                         "--reanalyze/--merge, the one the runs recorded); another base has no A/A arm")
    ap.add_argument("--no-aa", action="store_true", help="leave out the A/A runs (sync at seed + 100)")
    ap.add_argument("--recipe", default=DEFAULT_RECIPE,
                    help="the Hydra config (recipe) every run composes, ours and the peer's: the task")
    ap.add_argument("--task", help=f"an embedded tiny task ({TASK_KEY}), where the config has them")
    ap.add_argument("--min-val-size", type=int, default=st.MIN_VAL_SIZE,
                    help="refuse a task with fewer held-out questions (the pre-registration's)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per peer run")
    ap.add_argument("--slice", metavar="START:END", help="run only these runs of the schedule (Python slice of "
                    "the list --dry-run prints): a part of a block, in the block's order")
    ap.add_argument("--dry-run", action="store_true", help="print the schedule and the task; run nothing")
    ap.add_argument("--reanalyze", metavar="JSON", help="no runs: rebuild the comparison and charts from a saved JSON")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="no runs: merge parts (run with --seeds/--modes)")
    ap.add_argument("--supersede", metavar="MODE@SEED,...", help="with --merge: these runs of an earlier part are "
                    "replaced by a later part's rerun (kept under \"superseded\" in the JSON)")
    ap.add_argument("--supersede-reason", metavar="TEXT", help="why the superseded runs no longer count (required)")
    ap.add_argument("--power", nargs="+", metavar="JSON",
                    help="no runs: the paired-sd estimates of these learning JSONs and the seeds they call for")
    return ap


def _power_cli(paths: list[str], out: str) -> int:
    report = {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        runs = [dict(r, source=r.get("reference") or p) for r in d["runs"]]
        est = sd_estimates(runs, int(d.get("val_size") or 0) or st.MIN_VAL_SIZE)
        for k in ("between_run", "aa", "projected"):
            if k in est:
                est[k]["plan"] = power_plan(est[k]["paired_sd"])
        est["binomial"]["plan"] = power_plan(est["binomial"]["paired_sd_at_design"])
        report[p] = est
        print(f"[learn] {p}: {json.dumps(est, indent=1)}")
    Path(out).write_text(json.dumps(report, indent=1))
    return 0


def _run_cli(args, ap, overrides: list[str], seeds: list[int], modes: list[str] | None) -> dict | None:
    """The runs of this invocation (its schedule, or the --slice of it); None after --dry-run."""
    t0 = time.perf_counter()
    base = args.base or BASE

    def check_base(run_modes: list[str]) -> None:
        if base not in run_modes:
            ap.error(f"--base {base}: not among the modes run ({', '.join(run_modes)})")

    if modes is not None:  # given: checked before the task is composed (which may build its assets)
        check_base(modes)
    try:
        task = task_info(overrides, args.recipe)
    except ValueError as e:
        ap.error(str(e))
    if modes is None:  # the defaults follow the task's granularity
        modes = list(default_modes(task["granularity"]))
        check_base(modes)
    if task["val_size"] < args.min_val_size:
        raise SystemExit(f"the task's validation set has {task['val_size']} questions ({task['val_files']}); the "
                         f"comparison needs >= {args.min_val_size} (--min-val-size to run it anyway)")
    aa = not args.no_aa and base == BASE  # the A/A arm is sync's (sync at seed + 100)
    plan = list(enumerate(st.schedule(seeds, modes, base, aa=aa, design=args.design)))
    if args.slice:
        try:
            plan = slice_plan(plan, args.slice)
        except ValueError as e:
            ap.error(str(e))
    print(f"[learn] task {task}\n[learn] schedule ({len(plan)} runs): "
          + ", ".join(f"#{i} {m}@{s}" + ("(A/A)" if a == "aa" else "") for i, (s, m, a) in plan), flush=True)
    if args.dry_run:
        return None
    from verl_pipe_lab.bench.provenance import env_info

    result = {"steps": args.steps, "seeds": seeds, "modes": modes, "val_every": args.val_every,
              "recipe": args.recipe, "overrides": overrides, "val_size": task["val_size"], "task": task, "env": env_info(),
              "design": args.design, "base": base, "schedule": [[i, *p] for i, p in plan], "slice": args.slice,
              "runs": []}
    out = Path(args.out)
    partial = out.with_name(out.stem + "_partial.json")
    for i, (seed, mode, arm) in plan:
        run = run_one(mode, seed, args.steps, args.val_every, overrides, arm=arm, timeout_s=args.timeout,
                      recipe=args.recipe)
        run["order"] = i  # its place in the whole schedule of these seeds and modes
        result["runs"].append(run)
        partial.write_text(json.dumps(result))  # a crash keeps what ran
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def cli(argv: list[str]) -> int:
    ap = _parser()
    args, overrides = ap.parse_known_args(argv)
    if args.power:
        return _power_cli(args.power, args.out)
    modes = [m.strip() for m in (args.modes or "").split(",") if m.strip()] or None  # None: default_modes
    unknown = [m for m in modes or () if m not in LEARN_MODES]
    if unknown:
        ap.error(f"--modes: {unknown}; allowed: {', '.join(LEARN_MODES)}")
    if args.steps < 1 or args.val_every < 1:
        ap.error("--steps and --val-every must be >= 1")
    if args.steps // args.val_every < st.FINAL_POINTS:
        ap.error(f"--steps {args.steps} / --val-every {args.val_every}: a run's final accuracy needs "
                 f"{st.FINAL_POINTS} validations after training")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    overrides = task_overrides(args.task) + overrides
    if args.reanalyze:
        result = json.loads(Path(args.reanalyze).read_text())
    elif args.merge:
        try:
            supersede = parse_supersede(args.supersede, args.supersede_reason)
            result = merge([dict(json.loads(Path(p).read_text()), out=p) for p in args.merge], supersede)
        except ValueError as e:
            ap.error(str(e))
    else:
        result = _run_cli(args, ap, overrides, seeds, modes)
        if result is None:
            return 0
    if args.base:
        result["base"] = args.base
    analyze_and_write(result, Path(args.out), Path(args.charts) if args.charts else None)
    return 0


def analyze_and_write(result: dict, out: Path, charts: Path | None = None) -> dict:
    """The pipeline after the runs: the pre-registered comparison, the report, the charts, the JSON at ``out``
    (a part without sync, or too little to compare, keeps its runs with the reason in "comparison")."""
    try:
        result["comparison"] = compare(result["runs"], base=result.get("base", BASE))
        print(format_report(result))
        if charts is not None:
            result["charts"] = [str(p) for p in write_charts(result, charts)]
    except ValueError as e:
        result["comparison"] = {"skipped": str(e)}
        print(f"[learn] no comparison: {e}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_name(out.stem + "_partial.json").unlink(missing_ok=True)  # the whole JSON holds it
    print(f"[learn] wrote {out}")
    return result
