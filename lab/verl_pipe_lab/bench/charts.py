"""Benchmark charts (matplotlib, Agg): one step's timeline per mode and the group-completion CDFs.

Reads recorded ``StepTimeline`` dicts only, so charts can be redrawn from a saved benchmark JSON.
"""

from __future__ import annotations

from pathlib import Path

from verl_pipe.sim.calib import engine_intervals
from verl_pipe.core.timeline import StepTimeline, _assign_lanes
from verl_pipe.core.variants import PIPELINED_BASE

_KIND_COLORS = {"old_log_prob": "#4c72b0", "update": "#dd8452", "forward_backward": "#dd8452",
                "snapshot_theta_k": "#937860",
                "ref_log_prob": "#8172b3", "optimizer_step": "#c44e52"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_timeline(ax, tl: dict, max_num_seqs: int | None = None, title: str = "") -> None:
    """Rollout requests as bars on engine lanes per replica (from the engine's start of the request, see
    ``calib.engine_intervals``; the grey curve under them counts requests queued before a slot freed),
    group completions as ticks, trainer spans per unit, weight sync; x = seconds since t0."""
    t0 = StepTimeline.from_dict(tl).t0
    yticks: list[float] = []
    ylabels: list[str] = []
    y = _draw_replicas(ax, tl, t0, max_num_seqs, yticks, ylabels)
    gy = y + 0.3  # group completions
    for g in tl["groups"]:
        ax.plot([g["t"] - t0] * 2, [gy - 0.3, gy + 0.3], color=f"C{g['group'] % 10}" if g["trainable"] else "k",
                linewidth=1.5)
    yticks.append(gy)
    ylabels.append("group done")
    _draw_trainer(ax, tl, t0, gy + 1.2, yticks, ylabels)
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels, fontsize=7)
    ax.set_title(title, fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=6, loc="lower right", ncol=3)


def _draw_replicas(ax, tl: dict, t0: float, max_num_seqs: int | None, yticks: list, ylabels: list) -> float:
    """Per replica, from y = 0 up: the queued-before-start curve in its own band (when any request queued) and the
    finished requests' bars on engine lanes. Appends their ticks and labels; returns the next free y."""
    ends = {}
    for r in tl["responses"]:
        ends.setdefault(r["request_id"], r["t"] - t0)
    for r in tl.get("aborts", []):
        ends.setdefault(r["request_id"], r["t"] - t0)
    subs = {}
    for r in sorted(tl["requests"], key=lambda r: r["t"]):
        subs.setdefault(r["request_id"], r)
    starts = {x["request_id"]: x["a"] for x in engine_intervals(tl, max_num_seqs)} if max_num_seqs else {}
    by_rep: dict[int, list[str]] = {}
    for rid, r in subs.items():
        by_rep.setdefault(r.get("replica") or 0, []).append(rid)
    y = 0.0
    for rep in sorted(by_rep):
        rids = [rid for rid in by_rep[rep] if rid in ends]
        # queued-before-start count, as a step curve in its own band
        qev = sorted([(subs[rid]["t"] - t0, 1) for rid in rids] + [(starts.get(rid, subs[rid]["t"] - t0), -1)
                                                                   for rid in rids])
        xs, qs, q = [0.0], [0], 0
        for t, d in qev:
            q += d
            xs.append(t)
            qs.append(q)
        qmax = max(qs) or 1
        if max(qs) > 0:
            ax.fill_between(xs, [y + 0.9 * v / qmax for v in qs], y, step="post", color="#cccccc", linewidth=0)
            yticks.append(y + 0.45)
            ylabels.append(f"queued (max {qmax})")
            y += 1.3
        spans = [(starts.get(rid, subs[rid]["t"] - t0), ends[rid]) for rid in rids]
        lanes = _assign_lanes(spans)
        nl = max(lanes) + 1 if lanes else 1
        h = min(0.8, 8.0 / nl)
        for rid, (a, f), lane in zip(rids, spans, lanes):
            ax.barh(y + lane * h, max(f - a, 1e-3), left=a, height=h * 0.85, color=f"C{subs[rid]['group'] % 10}",
                    linewidth=0)
        yticks.append(y + (nl - 1) * h / 2)
        ylabels.append(f"replica {rep}\n({nl} slots)")
        y += nl * h + 0.6
    return y


def _draw_trainer(ax, tl: dict, t0: float, ty: float, yticks: list, ylabels: list) -> None:
    """The trainer's spans at ``ty`` (coloured by kind, a unit's update labelled with it), the units' ready marks
    above them and the weight syncs one row higher; appends their ticks and labels."""
    seen = set()
    for s in tl["train_spans"]:
        kind = s["kind"]
        lab = kind if kind not in seen else None
        seen.add(kind)
        ax.barh(ty, s["end"] - s["start"], left=s["start"] - t0, height=0.8, color=_KIND_COLORS.get(kind, "#55a868"),
                edgecolor="white", linewidth=0.5, label=lab)
        if s["unit"] is not None and kind in ("update", "forward_backward"):
            ax.text((s["start"] + s["end"]) / 2 - t0, ty, f"u{s['unit']}", ha="center", va="center", fontsize=7,
                    color="white")
    for u in tl["units_ready"]:
        ax.plot(u["t"] - t0, ty + 0.55, marker="v", color="k", markersize=4)
    yticks.append(ty)
    ylabels.append("trainer")
    for w in tl["weight_syncs"]:
        ax.barh(ty + 1.0, w["end"] - w["start"], left=w["start"] - t0, height=0.6, color="#8c8c8c",
                label="weight sync" if "ws" not in seen else None)
        seen.add("ws")
    yticks.append(ty + 1.0)
    ylabels.append("weight sync")


def timeline_charts(steps: dict[str, dict], out_dir: Path, setting: str, max_num_seqs: int | None) -> list[Path]:
    """``steps``: mode -> {"timeline": tl_dict, "metrics": {...}}. One PNG per mode plus all modes stacked."""
    plt = _plt()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    xmax = 0.0
    for st in steps.values():
        xmax = max(xmax, st["metrics"]["step_time_s"])
    for mode, st in steps.items():
        fig, ax = plt.subplots(figsize=(11, 4.5))
        draw_timeline(ax, st["timeline"], max_num_seqs, _title(setting, mode, st["metrics"]))
        ax.set_xlim(0, xmax * 1.02)
        ax.set_xlabel("seconds since the step's first request")
        p = out_dir / f"timeline_{setting}_{mode}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    fig, axes = plt.subplots(len(steps), 1, figsize=(11, 3.2 * len(steps)), sharex=True, squeeze=False)
    for ax, (mode, st) in zip(axes[:, 0], steps.items()):
        draw_timeline(ax, st["timeline"], max_num_seqs, _title(setting, mode, st["metrics"]))
    axes[-1, 0].set_xlim(0, xmax * 1.02)
    axes[-1, 0].set_xlabel("seconds since the step's first request")
    fig.tight_layout()
    p = out_dir / f"timelines_{setting}.png"
    fig.savefig(p, dpi=100)
    plt.close(fig)
    paths.append(p)
    return paths


def _title(setting: str, mode: str, m: dict) -> str:
    return (f"{setting} / {mode}: rollout→train end {m['rollout_to_train_end_s']:.2f}s, "
            f"trainer wait {m['trainer_wait_ratio']:.2f}, rollout {m['rollout_end_s']:.2f}s, "
            f"efficiency {m['pipeline_efficiency']:.2f}")


def cdf_chart(steps: dict[str, dict], out_dir: Path, setting: str) -> Path:
    """Group-completion CDF per mode, with each mode's train end marked."""
    plt = _plt()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (mode, st) in enumerate(steps.items()):
        cdf = StepTimeline.from_dict(st["timeline"]).group_completion_cdf()
        xs = [0.0] + [t for t, _ in cdf]
        ys = [0.0] + [f for _, f in cdf]
        ax.step(xs, ys, where="post", label=mode, color=f"C{i}")
        ax.axvline(st["metrics"]["rollout_to_train_end_s"], color=f"C{i}", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds since the step's first request (dotted: train end)")
    ax.set_ylabel("fraction of groups complete")
    ax.set_title(f"{setting}: group-completion CDF", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    p = out_dir / f"group_cdf_{setting}.png"
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def sweep_chart(result: dict, out_dir: Path) -> Path | None:
    """Reduction of rollout_to_train_end_s vs sync against sync T/R, measured (and simulated if present)."""
    rows = [s for s in result["settings"] if s.get("tr_sweep")]
    if len(rows) < 2:
        return None
    plt = _plt()
    rows.sort(key=lambda s: s["sync_train_to_rollout_ratio"])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, mode in enumerate(("cgp", "cgp_group", "cgp_fgd")):
        pts = [(s["sync_train_to_rollout_ratio"], s["modes"][mode]["reduction_vs_sync_pct"]) for s in rows
               if mode in s["modes"] and "reduction_vs_sync_pct" in s["modes"][mode]]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"{mode} (measured)", color=f"C{i}")
    sim = result.get("sim", {}).get("tr_sweep")
    if sim:
        for i, mode in enumerate(("cgp", "cgp_group", "cgp_fgd", "verl_separate_async")):
            pts = [(p["sync_train_to_rollout_ratio"], p["reduction_vs_sync_pct"][mode]) for p in sim
                   if mode in p["reduction_vs_sync_pct"]]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], linestyle="--", marker=".",
                        label=f"{mode} (sim)", color=f"C{i}", alpha=0.6)
    for s in rows:  # which stack each measured point comes from
        ax.annotate(s.get("model_size", ""), (s["sync_train_to_rollout_ratio"], s["modes"].get(PIPELINED_BASE, {}).get(
            "reduction_vs_sync_pct", 0.0)), fontsize=6, alpha=0.6,
            textcoords="offset points", xytext=(3, -8))
    ax.set_title("measured: one point per setting (model size noted); sim: the balanced setting's workloads "
                 "with the trainer's cost scaled", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("sync T_train / T_rollout")
    ax.set_ylabel("rollout→train end reduction vs sync (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    p = out_dir / "tr_sweep.png"
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
