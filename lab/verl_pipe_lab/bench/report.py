"""Benchmark results: per-mode summaries, the JSON of docs/metrics.md ("Benchmark output"), plain-text tables.

Pure Python (no Ray, vLLM or torch), so the shape of the output is tested without running anything.
"""

from __future__ import annotations

import math

from verl_pipe.core.timeline import summarize
from verl_pipe.core.variants import BASE, OURS as MODES, PEERS  # the bench's mode names (verl_pipe/core/variants.py)

# The per-mode figures docs/metrics.md's schema names; every mode entry has them (plus runs and spread).
REPORTED = ("rollout_to_train_end_s", "trainer_wait_ratio", "first_unit_ready_s", "rollout_end_s",
            "first_unit_start_s", "ideal_lower_bound_s", "pipeline_efficiency", "step_time_s")
SETTING_PREFIXES = ("longtail-", "notail-")


def mode_entry(metrics_list: list[dict], sync_list: list[dict] | None = None, **extra) -> dict:
    """One mode's entry: mean of every metric over its runs, ``runs``, ``spread`` (max - min), and the
    reduction vs sync in % for rollout_to_train_end_s and trainer_wait_ratio (of the means; the per-round
    paired reductions go to ``spread``)."""
    entry = summarize(metrics_list)
    entry["per_run"] = [{k: float(m[k]) for k in REPORTED if k in m} for m in metrics_list]
    if sync_list:
        base = summarize(sync_list)
        for key, name in (("rollout_to_train_end_s", "reduction_vs_sync_pct"),
                          ("trainer_wait_ratio", "wait_reduction_vs_sync_pct")):
            entry[name] = _reduction(entry[key], base[key])
            paired = [_reduction(m[key], s[key]) for m, s in zip(metrics_list, sync_list)]
            if paired:
                entry["spread"][name] = max(paired) - min(paired)
    entry.update(extra)
    return entry


def _reduction(x: float, base: float) -> float:
    return 100.0 * (1.0 - x / base) if base else math.nan


def skipped(reason: str) -> dict:
    return {"skipped": str(reason)}


def train_to_rollout_ratio(sync_list: list[dict]) -> float:
    """T_train / T_rollout of the sync runs: trainer busy time over rollout makespan, averaged over runs."""
    xs = [m["trainer_busy_s"] / m["rollout_end_s"] for m in sync_list if m.get("rollout_end_s")]
    return sum(xs) / len(xs) if xs else math.nan


def setting_entry(name: str, per_mode: dict[str, list[dict]], skipped_modes: dict[str, str] | None = None,
                  **extra) -> dict:
    """``per_mode``: mode -> list of metric dicts (one per run, rounds in the same order for every mode)."""
    if not name.startswith(SETTING_PREFIXES):
        raise ValueError(f"setting name {name!r} must start with one of {SETTING_PREFIXES}")
    sync = per_mode.get(BASE)
    if not sync:
        raise ValueError(f"setting {name!r}: no {BASE} runs, nothing to compare against")
    modes: dict[str, dict] = {}
    for mode in list(MODES) + [m for m in per_mode if m not in MODES]:
        if mode in per_mode and per_mode[mode]:
            modes[mode] = mode_entry(per_mode[mode], None if mode == BASE else sync)
        elif skipped_modes and mode in skipped_modes:
            modes[mode] = skipped(skipped_modes[mode])
    for mode, reason in (skipped_modes or {}).items():
        modes.setdefault(mode, skipped(reason))
    return {"name": name, "sync_train_to_rollout_ratio": train_to_rollout_ratio(sync), "modes": modes, **extra}


# ---------------------------------------------------------------------------------------------- schema


def check_schema(result: dict) -> list[str]:
    """Problems with a benchmark result against docs/metrics.md's schema; empty when it conforms.

    Every setting must have an entry (figures or ``skipped``) for each mode the bench config listed
    (``config.modes``; all of MODES when the result does not say): a config may run a subset of the modes."""
    errs = []
    for key in ("settings", "sim_validation", "env"):
        if key not in result:
            errs.append(f"missing top-level key {key!r}")
    if errs:
        return errs
    if not isinstance(result["settings"], list) or not result["settings"]:
        errs.append("settings must be a non-empty list")
        return errs
    asked = (result.get("config") or {}).get("modes") or MODES
    for s in result["settings"]:
        errs += _setting_errors(s, asked)
    sv = result["sim_validation"]
    if not isinstance(sv, dict) or not isinstance(sv.get("max_rel_error"), (int, float)):
        errs.append("sim_validation.max_rel_error missing or not a number")
    return errs + _env_errors(result["env"])


def _setting_errors(s: dict, asked) -> list[str]:
    """One setting's problems: its name, its T/R, an entry for each mode ``asked`` and each entry's figures (or a
    reason it was skipped; never the sync baseline)."""
    errs = []
    name = s.get("name", "?")
    if not isinstance(name, str) or not name.startswith(SETTING_PREFIXES):
        errs.append(f"setting name {name!r} must start with longtail- or notail-")
    if not isinstance(s.get("sync_train_to_rollout_ratio"), (int, float)):
        errs.append(f"{name}: sync_train_to_rollout_ratio missing or not a number")
    modes = s.get("modes")
    if not isinstance(modes, dict):
        errs.append(f"{name}: modes missing")
        return errs
    for mode in asked:
        if mode not in modes:
            errs.append(f"{name}: mode {mode!r} missing")
    for mode, entry in modes.items():
        if mode not in MODES + PEERS:
            errs.append(f"{name}: unknown mode name {mode!r}")
        if "skipped" in entry:
            if not isinstance(entry["skipped"], str) or not entry["skipped"]:
                errs.append(f"{name}/{mode}: skipped needs a reason")
            continue
        for k in REPORTED:
            if not isinstance(entry.get(k), (int, float)):
                errs.append(f"{name}/{mode}: {k} missing or not a number")
        if not isinstance(entry.get("runs"), int) or entry["runs"] < 1:
            errs.append(f"{name}/{mode}: runs must be an int >= 1")
        if not isinstance(entry.get("spread"), dict):
            errs.append(f"{name}/{mode}: spread missing")
    if BASE in modes and "skipped" in modes[BASE]:
        errs.append(f"{name}: the sync baseline cannot be skipped")
    return errs


def _env_errors(env) -> list[str]:
    """The environment record's problems: the CPU, the stack's versions, the CPU's flags and matmul probe."""
    if not isinstance(env, dict) or not isinstance(env.get("cpu"), str):
        return ["env.cpu missing"]
    errs = []
    versions = env.get("versions", {})
    for k in ("verl", "vllm", "torch", "ray"):
        if k not in versions:
            errs.append(f"env.versions.{k} missing")
    info = env.get("cpu_info")
    probe = info.get("matmul_1thread") if isinstance(info, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("flags"), dict):
        errs.append("env.cpu_info.flags missing (verl_pipe.platform.cpu_info.report)")
    elif not isinstance(probe, dict) or not all(isinstance(probe.get(k), (int, float))
                                                for k in ("fp32_gflops", "bf16_gflops")):
        errs.append("env.cpu_info.matmul_1thread: fp32_gflops / bf16_gflops missing")
    return errs


# ---------------------------------------------------------------------------------------------- tables


def _fmt(x, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def format_setting(s: dict) -> str:
    """One plain-text table: a row per mode, means with (spread) where it matters."""
    cols = [("mode", 20), ("r2t_end s", 14), ("vs sync", 8), ("wait", 12), ("wait vs", 8), ("1st ready", 9),
            ("1st start", 9), ("rollout", 8), ("ideal", 8), ("eff", 6), ("unc eff", 7), ("step s", 8),
            ("runs", 4)]
    head = " ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(cols))
    size = f", model {s['model_size']}" if s.get("model_size") else ""
    lines = [f"== {s['name']}  (sync T/R = {_fmt(s.get('sync_train_to_rollout_ratio'), '.2f')}{size})",
             head, "-" * len(head)]
    for mode, e in s["modes"].items():
        label = mode + (f"[{e['granularity']}]" if e.get("granularity") else "")
        if "skipped" in e:
            lines.append(f"{label:<20} skipped: {e['skipped']}")
            continue
        sp = e.get("spread", {})
        r2t = f"{_fmt(e['rollout_to_train_end_s'], '.2f')}±{_fmt(sp.get('rollout_to_train_end_s', 0) / 2, '.2f')}"
        wait = f"{_fmt(e['trainer_wait_ratio'], '.3f')}±{_fmt(sp.get('trainer_wait_ratio', 0) / 2, '.2f')}"
        red = _fmt(e.get("reduction_vs_sync_pct"), "+.1f") + ("%" if "reduction_vs_sync_pct" in e else "")
        wred = _fmt(e.get("wait_reduction_vs_sync_pct"), "+.1f") + ("%" if "wait_reduction_vs_sync_pct" in e else "")
        vals = [label, r2t, red, wait, wred, _fmt(e["first_unit_ready_s"], ".2f"), _fmt(e["first_unit_start_s"], ".2f"),
                _fmt(e["rollout_end_s"], ".2f"), _fmt(e["ideal_lower_bound_s"], ".2f"),
                _fmt(e["pipeline_efficiency"], ".3f"), _fmt(e.get("uncontended_efficiency"), ".3f"),
                _fmt(e["step_time_s"], ".2f"), str(e["runs"])]
        lines.append(" ".join(f"{v:>{w}}" if i else f"{v:<{w}}" for i, (v, (_, w)) in enumerate(zip(vals, cols))))
    for mode, e in s["modes"].items():
        if mode in PEERS and "skipped" not in e:
            lines.append(f"{mode}: verl's V1 separate_async, {'exactly on-policy' if e.get('on_policy') else 'off-policy'}"
                         f" (max staleness {e.get('max_staleness', '?')} weight versions), step wall "
                         f"{_fmt(e.get('step_wall_s'), '.2f')}s")
    costs = {m: e["trainer_s_per_1k_padded_tokens"] for m, e in s["modes"].items()
             if e.get("trainer_s_per_1k_padded_tokens")}
    if costs:
        lines.append("trainer s per 1k padded tokens, calls that ended before / started after the rollout's end:")
        for m, kinds in costs.items():
            lines.append(f"  {m:<10} " + ", ".join(
                f"{k} {_fmt(ph.get('during_rollout'), '.3f')} / {_fmt(ph.get('after_rollout'), '.3f')}"
                for k, ph in sorted(kinds.items())))
    preempted = {m: e["vllm_preemptions"] for m, e in s["modes"].items() if "vllm_preemptions" in e}
    if preempted:  # the bench config turned vLLM's stats on (bench/preemptions.py)
        lines.append("vLLM preemptions per step (mean): " + ", ".join(f"{m} {v:.1f}" for m, v in preempted.items()))
    vs_peer = {m: e["reduction_vs_verl_separate_async_pct"] for m, e in s["modes"].items()
               if "reduction_vs_verl_separate_async_pct" in e}
    if vs_peer:
        lines.append("vs verl_separate_async (on-policy): " + ", ".join(f"{m} {v:+.1f}%" for m, v in vs_peer.items()))
    lines.append("(± = half the max-min spread over runs; vs sync = reduction of the mean, positive is better; "
                 "unc eff = against the bound with sync's per-token trainer costs after the rollout)")
    return "\n".join(lines)


def format_sweep(result: dict) -> str:
    rows = [s for s in result["settings"] if s.get("tr_sweep")]
    if not rows:
        return ""
    rows.sort(key=lambda s: s["sync_train_to_rollout_ratio"])
    lines = ["== T/R sweep (measured): reduction of rollout_to_train_end_s vs sync",
             f"{'setting':<40} {'sync T/R':>8} " + " ".join(f"{m:>10}" for m in MODES[1:])]
    for s in rows:
        cells = []
        for m in MODES[1:]:
            e = s["modes"].get(m, {})
            cells.append("skipped" if "skipped" in e else _fmt(e.get("reduction_vs_sync_pct"), "+.1f") + "%")
        lines.append(f"{s['name']:<40} {s['sync_train_to_rollout_ratio']:>8.2f} " + " ".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)


def format_sim_validation(sv: dict) -> str:
    lines = [f"== sim validation ({sv.get('metric', 'rollout_to_train_end_s')}): max rel error "
             f"{_fmt(sv.get('max_rel_error'), '.1%')} (target {_fmt(sv.get('target_rel_error'), '.0%')})"
             + (f", leave-one-setting-out max {_fmt(sv['holdout_max_rel_error'], '.1%')}"
                if "holdout_max_rel_error" in sv else "")]
    for mode, pm in sv.get("per_mode", {}).items():
        lines.append(f"  {mode:<12} mean {pm['mean_rel_error']:.1%}  max {pm['max_rel_error']:.1%}")
    for r in sv.get("rows", []):
        lines.append(f"  {r['setting']:<40} {r['mode']:<10} measured {r['measured_s']:7.2f}s  "
                     f"predicted {r['predicted_s']:7.2f}s  ({r['predicted_s'] / r['measured_s'] - 1:+.1%})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- targets

# The targets in the many-groups regime (settings with role "paper" / "paper-control"; docs/sim_sources.md §9):
# the paper's figures vs Slime (-42.3% rollout->train end, -76% trainer wait), and the project's own: >= 0.95 of
# the ideal bound, >= 15% shorter than verl's own separate_async on-policy, and no tail: pipelining costs <= 3% of
# the step time vs sync.
TARGETS = {"reduction_vs_sync_pct": 42.3, "wait_reduction_vs_sync_pct": 76.0, "pipeline_efficiency": 0.95,
           "reduction_vs_verl_separate_async_pct": 15.0, "notail_step_time_cost_pct": 3.0}


def paper_targets(result: dict, mode: str = "cgp_fgd") -> dict:
    """``mode``'s figures against TARGETS on the paper-regime settings: {check: {"value", "target", "met"}}; a
    check whose figures are missing is left out (e.g. the peer did not run)."""
    out: dict[str, dict] = {}

    def check(name, value, target, higher_is_better=True):
        if isinstance(value, (int, float)) and not math.isnan(value):
            out[name] = {"value": float(value), "target": target,
                         "met": bool(value > target if higher_is_better else value <= target)}

    for s in result.get("settings", []):
        e = s.get("modes", {}).get(mode, {})
        if "skipped" in e or not e:
            continue
        if s.get("role") == "paper":
            check("reduction_vs_sync_pct", e.get("reduction_vs_sync_pct"), TARGETS["reduction_vs_sync_pct"])
            check("wait_reduction_vs_sync_pct", e.get("wait_reduction_vs_sync_pct"),
                  TARGETS["wait_reduction_vs_sync_pct"])
            check("pipeline_efficiency", e.get("pipeline_efficiency"), TARGETS["pipeline_efficiency"])
            check("reduction_vs_verl_separate_async_pct", e.get("reduction_vs_verl_separate_async_pct"),
                  TARGETS["reduction_vs_verl_separate_async_pct"])
            out["sync_train_to_rollout_ratio"] = {"value": s.get("sync_train_to_rollout_ratio"),
                                                  "target": "0.8-1.25 (balanced)", "met": bool(
                                                      0.8 <= (s.get("sync_train_to_rollout_ratio") or 0) <= 1.25)}
        elif s.get("role") == "paper-control":
            sync = s["modes"].get(BASE, {})
            if sync.get("step_time_s"):
                check("notail_step_time_cost_pct", 100.0 * (e["step_time_s"] / sync["step_time_s"] - 1.0),
                      TARGETS["notail_step_time_cost_pct"], higher_is_better=False)
    return out


def format_targets(targets: dict, mode: str = "cgp_fgd") -> str:
    if not targets:
        return ""
    lines = [f"== the paper regime's targets ({mode})"]
    for name, t in targets.items():
        v = t["value"]
        shown = f"{v:.3f}" if isinstance(v, float) else str(v)
        lines.append(f"  {name:<40} {shown:>9}  target {t['target']}  {'met' if t['met'] else 'NOT met'}")
    return "\n".join(lines)
