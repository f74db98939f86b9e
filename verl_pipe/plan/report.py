"""The plan as text (what ``python -m verl_pipe.plan`` prints), as JSON (``--out``) and as a chart (``--chart``)."""

from __future__ import annotations

import json
import math

from verl_pipe.core.variants import of_row, pipelines
from verl_pipe.plan.predict import LABELS, ROWS


def _err(e: dict) -> str:
    """Absolute seconds in-run (calibrated on the run predicted) and held out (a round or a config the calibration
    did not see), and the saving vs sync across runs (points)."""
    if "max_rel_error" not in e:
        return e.get("note", "not validated")
    pp, held = e.get("vs_sync_max_err_pp"), e.get("held_out_max_rel_error")
    return (f"±{100 * e['max_rel_error']:.0f}% s" + (f" (held out ±{100 * held:.0f}%)" if held is not None else "")
            + (f", ±{pp:.0f} pt vs sync" if pp is not None else ""))


def _table(header: list[str], rows: list[list[str]]) -> str:
    w = [max(len(x) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(x.ljust(w[0]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(r))  # noqa: E731
    return "\n".join([fmt(header), "  ".join("-" * x for x in w)] + [fmt(r) for r in rows])


def _colocated_lines(p: dict) -> list[str]:
    """The recommendation against verl's colocated default, and the colocated step's phases."""
    if "versus_colocated" not in p:
        return []
    c, vc = p["colocated"], p["versus_colocated"]
    lines = ["", f"Recommendation vs colocated: {vc['decision']}: {vc['message']}",
             f"  colocated step: rollout {c['rollout_end_s']:.1f} s on {c['replicas']} replicas + sleep "
             f"{c['sleep_s']:.1f} s + training {c['train_s']:.1f} s on {c['gpus']} GPUs + weight reload "
             f"{c['update_weights_s']:.1f} s (sleep: {c['sleep_from']}; reload: {c['update_weights_from']})"]
    if c.get("log_step_s"):
        lines.append(f"  the verl log's own step (timing_s/step, its reward and advantages included): "
                     f"{c['log_step_s']:.1f} s measured, {c['step_time_s']:.1f} s modelled "
                     f"({100 * (c['step_time_s'] / c['log_step_s'] - 1):+.1f}%, the planned config's trainer)")
    return lines


def format_plan(result: dict) -> str:
    p, inp = result["plan"], result["inputs"]
    sh = inp["shape"]
    lines = [f"== plan: {inp['config']} | {sh['num_groups']} prompts x {sh['n']}, units of {sh['groups_per_unit']} "
             f"prompts | {sh['rollout_gpus']} rollout + {sh['train_gpus']} trainer GPUs | costs: {inp['costs']}",
             f"   lengths: {inp['lengths']['source']}; mean {inp['lengths']['stats']['mean']:.0f}, p90 "
             f"{inp['lengths']['stats']['p90']:.0f}, p99 {inp['lengths']['stats']['p99']:.0f}, at cap "
             f"{100 * inp['lengths']['stats']['at_cap']:.1f}%, within-group log ICC "
             f"{inp['lengths']['stats']['icc_log']:.2f}; prompt {inp['prompt_len']} tokens ({inp['prompt_len_src']})",
             f"   sync T/R = {p['sync_train_to_rollout_ratio']:.2f}; means over seeds {p['seeds']}", ""]
    rows = []
    for k in ROWS:
        m = p["modes"][k]
        if "skipped" in m:
            rows.append([LABELS[k], "-", "-", "-", "-", m["skipped"]])
            continue
        label = LABELS[k] + (f" [{m['fgd_window']}, {m['granularity']}]" if of_row(k).fgd else "")
        if of_row(k).colocated and "colocated" in p:
            label = f"verl colocated ({p['colocated']['gpus']} GPUs take turns)"
        rows.append([label, f"{m['step_time_s']:.1f}", f"{m['rollout_to_train_end_s']:.1f}",
                     f"{m['reduction_vs_sync_pct']:+.1f}%", f"{m['trainer_wait_ratio']:.3f}",
                     _err(m["expected_error"])])
    lines.append(_table(["mode", "step_s", "r2t_end_s", "vs_sync", "wait", "expected error"], rows))
    rec = p["recommendation"]
    lines += ["", "FGD window (cgp + fgd): " + ", ".join(
        f"{w['window']}/{w['granularity']} {w['rollout_to_train_end_s']:.1f} s" for w in p["fgd_windows"])]
    if p["theta_k_placements"]:
        lines.append("theta_k store (recommended mode): " + ", ".join(
            f"{k} {v:.1f} s" for k, v in p["theta_k_placements"].items()))
    for sk in p["recommendation"].get("splits_skipped", []):
        lines.append(f"split {sk['rollout_gpus']} + {sk['train_gpus']} not planned: {sk['why']}")
    if p["splits"]:
        lines.append("split (rollout+trainer GPUs): step s sync / recommended: " + ", ".join(
            f"{s['rollout_gpus']}+{s['train_gpus']} {s['sync_step_s']:.1f}/{s['recommended_step_s']:.1f}"
            for s in p["splits"]))
    lines += ["", "Recommendation: " + (
        f"mode cgp, granularity {rec['granularity']}, FGD " + (f"on (window {rec['fgd_window']})" if rec["fgd"]
                                                                 else "off")
        + f", theta_k store {rec['theta_k_store']}" if pipelines(rec["mode"]) else f"mode {rec['mode']}")
        + f": {rec['rollout_to_train_end_s']:.1f} s rollout→train end, {rec['saving_vs_sync_pct']:+.1f}% vs sync"]
    if "split" in rec:
        sp = rec["split"]
        lines.append(f"  best split: {sp['rollout_gpus']} rollout + {sp['train_gpus']} trainer GPUs, step "
                     f"{sp['step_time_s']:.1f} s ({sp['vs_configured_pct']:+.1f}% vs the configured split); sync's "
                     f"best split is {rec['best_sync_split']['rollout_gpus']}+{rec['best_sync_split']['train_gpus']} "
                     f"({rec['best_sync_split']['step_time_s']:.1f} s)")
    lines.append("  overrides: " + " ".join(rec["overrides"]))
    lines += ["", p["verdict"]["message"]]
    lines += _colocated_lines(p)
    for note in inp.get("notes", []):
        lines.append(f"note: {note}")
    lines.append(f"(planned in {result['elapsed_s']:.1f} s)")
    return "\n".join(lines)


def write_json(result: dict, path) -> None:
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    with open(path, "w") as f:
        json.dump(clean(result), f, indent=1)


def write_chart(result: dict, path) -> None:
    """Per mode, step time split into rollout→train end and the rest (weight sync); beside it, the split sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = result["plan"]
    rows = [k for k in ROWS if "skipped" not in p["modes"][k]]
    fig, axes = plt.subplots(1, 2 if p["splits"] else 1, figsize=(12 if p["splits"] else 7, 4), squeeze=False)
    ax = axes[0][0]
    r2t = [p["modes"][k]["rollout_to_train_end_s"] for k in rows]
    rest = [p["modes"][k]["step_time_s"] - p["modes"][k]["rollout_to_train_end_s"] for k in rows]
    y = range(len(rows))
    ax.barh(y, r2t, label="rollout→train end")
    ax.barh(y, rest, left=r2t, label="weight sync", color="0.7")
    ax.set_yticks(list(y), [LABELS[k] for k in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step (predicted)")
    ax.legend(loc="lower right", fontsize=8)
    if p["splits"]:
        ax2 = axes[0][1]
        xs = [f"{s['rollout_gpus']}+{s['train_gpus']}" for s in p["splits"]]
        ax2.plot(xs, [s["sync_step_s"] for s in p["splits"]], "o-", label="sync")
        ax2.plot(xs, [s["recommended_step_s"] for s in p["splits"]], "o-", label="recommended")
        ax2.set_xlabel("rollout + trainer GPUs")
        ax2.set_ylabel("step s")
        ax2.legend(fontsize=8)
    fig.suptitle(result["inputs"]["config"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
