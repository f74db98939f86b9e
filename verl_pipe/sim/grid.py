"""The cluster-scale grid (conf/sim/cluster_grid.yaml): every setting x every mode, plus a T/R sweep.

A setting's rollout depends only on the dispatch (stock FCFS or FGD), not on the trainer mode, so each seed
runs two rollouts and every trainer mode and sweep point is scheduled on them.
"""

from __future__ import annotations

from dataclasses import fields

import yaml

from verl_pipe.core.timeline import summarize
from verl_pipe.core.variants import BASE, variant
from verl_pipe.core.workload import from_spec
from verl_pipe.sim.engine import EngineParams
from verl_pipe.sim.simulate import rollout_for_mode, timeline_for
from verl_pipe.sim.trainer import TrainerParams, placement_costs


def _strip(x):
    """{v: value, src: tag} -> value, recursively: the YAML states a source for every number."""
    if isinstance(x, dict):
        if "v" in x and set(x) <= {"v", "src"}:
            return _strip(x["v"])
        return {k: _strip(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def load(path) -> dict:
    with open(path) as f:
        return _strip(yaml.safe_load(f))


def settings(cfg: dict) -> list[dict]:
    out = []
    for did, dist in cfg["distributions"].items():
        for sid, split in cfg["splits"].items():
            name = f"longtail-{did}-{dist.get('name', did)}-{split['rollout_gpus']}R{split['train_gpus']}T"
            out.append(dict(name=name, distribution=dict(dist), split=sid, **split))
    for c in cfg.get("controls", []):
        split = cfg["splits"][c["split"]]
        out.append(dict(name=f"{c['name']}-{split['rollout_gpus']}R{split['train_gpus']}T",
                        distribution=dict(c["distribution"]), split=c["split"], **split))
    return out


def _typed(cls, d: dict) -> dict:
    """Coerce YAML scalars to the dataclass defaults' types (PyYAML reads 4.06e9 as a string)."""
    types = {f.name: type(f.default) for f in fields(cls)}
    unknown = set(d) - set(types)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {sorted(unknown)}")
    return {k: (v.lower() in ("1", "true", "yes") if types[k] is bool and isinstance(v, str) else types[k](v))
            for k, v in d.items()}


def _trainer(cfg: dict, gpus: int, time_scale: float = 1.0, placement: str | None = None) -> TrainerParams:
    """The trainer's parameters for ``gpus`` trainer GPUs; model copies per theta_k placement (default: the
    grid's ``theta_k.placement``) from the grid's measured figures, verl separate_async's always pageable."""
    t = _typed(TrainerParams, dict(cfg["trainer"], num_gpus=gpus, time_scale=time_scale))
    f = cfg["theta_k"]
    verl = placement_costs("pageable", gpus, f)
    return TrainerParams(**t, **placement_costs(placement or f["placement"], gpus, f),
                         verl_swap_save_s=verl["swap_save_s"], verl_swap_restore_s=verl["swap_restore_s"])


def _derived(m: dict, sync: dict, rollout_gpus: int, train_gpus: int) -> dict:
    """Per-run figures the report needs beyond the timeline's own metrics."""
    out = dict(m)
    out["reduction_vs_sync_pct"] = 100 * (1 - m["rollout_to_train_end_s"] / sync["rollout_to_train_end_s"])
    out["step_reduction_vs_sync_pct"] = 100 * (1 - m["step_time_s"] / sync["step_time_s"])
    out["gap_to_ideal_pct"] = 100 * (m["rollout_to_train_end_s"] / m["ideal_lower_bound_s"] - 1)
    out["rollout_tok_per_gpu_s"] = m["response_tokens"] / m["rollout_end_s"] / rollout_gpus
    out["step_tok_per_gpu_s"] = m["response_tokens"] / m["rollout_to_train_end_s"] / (rollout_gpus + train_gpus)
    return out


class _Setting:
    """One setting's workloads (one per seed) and their two rollouts, stock FCFS and FGD, which every trainer mode
    and sweep point is scheduled on."""

    def __init__(self, cfg: dict, s: dict):
        self.cfg, b = cfg, cfg["batch"]
        self.gpu_unit, self.modes = b["groups_per_unit"], cfg["modes"]
        self.engine = EngineParams(**_typed(EngineParams, cfg["engine"]))
        self.R, self.G = s["rollout_gpus"], s["train_gpus"]
        self.wls = [from_spec(s["distribution"], b["num_groups"], b["n"], b["prompt_len"], seed)
                    for seed in cfg["seeds"]]
        d = cfg["dispatch"]
        self.fcfs = [rollout_for_mode("cgp", wl, self.engine, self.R, self.gpu_unit, d["baseline_window"],
                                      d["baseline_order"]) for wl in self.wls]
        self.fgd = self.fgd_rollouts(d["fgd_window"], d["fgd_affinity"])

    def fgd_rollouts(self, window, affinity) -> list:
        d = self.cfg["dispatch"]
        kw = dict(frontier_groups=d["fgd_frontier_groups"], slack=d["fgd_slack"], affinity=affinity)
        return [rollout_for_mode("cgp_fgd", wl, self.engine, self.R, self.gpu_unit, window, frontier=kw)
                for wl in self.wls]

    def evaluate(self, time_scale: float, fgd: list | None = None, modes: list | None = None,
                 placement: str | None = None) -> dict[str, list[dict]]:
        """Per mode (``mode[granularity]`` for a mode that runs at either), its derived figures per seed, the
        trainer's time scaled by ``time_scale``; ``fgd``: other FGD rollouts than the setting's."""
        fgd, modes, cfg = self.fgd if fgd is None else fgd, self.modes if modes is None else modes, self.cfg
        trainer = _trainer(cfg, self.G, time_scale, placement)
        per_mode: dict[str, list[dict]] = {}
        for wl, fc, fg in zip(self.wls, self.fcfs, fgd):
            ms = {BASE: timeline_for(fc, wl, trainer, BASE, self.gpu_unit, cfg["weight_sync_s"]).metrics()}
            for mode in (m for m in modes if m != BASE):
                v = variant(mode)
                for gran in v.granularities:
                    key = f"{mode}[{gran}]" if v.granularity is None else mode
                    tl = timeline_for(fg if v.fgd else fc, wl, trainer, mode, self.gpu_unit, cfg["weight_sync_s"],
                                      gran)
                    ms[key] = tl.metrics()
            for key, m in ms.items():
                per_mode.setdefault(key, []).append(_derived(m, ms[BASE], self.R, self.G))
        for mode in (m for m in modes if variant(m).granularity is None):  # docs/metrics.md: cgp_fgd is FGD
            v = variant(mode)  # with its best granularity
            best = min(v.granularities, key=lambda g: sum(
                m["rollout_to_train_end_s"] for m in per_mode[f"{mode}[{g}]"]))
            per_mode[mode] = [dict(m, granularity=best) for m in per_mode[f"{mode}[{best}]"]]
        return per_mode


def run_setting(cfg: dict, s: dict, placements: list[str] | None = None, sweeps: bool = True) -> dict:
    """One setting: per-mode metrics, the T/R and FGD sweeps (``sweeps``), and with ``placements`` the
    reductions vs sync at T/R as is for each theta_k placement, on the same rollouts."""
    st = _Setting(cfg, s)
    modes, wls = st.modes, st.wls
    base = st.evaluate(1.0)
    tr = _mean(m["trainer_busy_s"] / m["rollout_end_s"] for m in base[BASE])
    cap = s["distribution"].get("cap", 1 << 30)
    result = {
        "name": s["name"], "split": s["split"], "rollout_gpus": st.R, "train_gpus": st.G,
        "distribution": s["distribution"],
        "sync_train_to_rollout_ratio": tr,
        # the configured modes first, then cgp_fgd's per-granularity variants
        "modes": {k: _summary(base[k]) for k in [m for m in modes if m in base] + sorted(set(base) - set(modes))},
        "rollout": {
            "mean_response_len": _mean(wl.response_tokens / (wl.num_groups * wl.n) for wl in wls),
            "truncated_fraction": _mean(wl.truncated_fraction(cap) for wl in wls),
            "fcfs_rollout_end_s": _mean(r.rollout_end for r in st.fcfs),
            "fgd_rollout_end_s": _mean(r.rollout_end for r in st.fgd),
            "fcfs_preemptions": _mean(r.stats["preemptions"] for r in st.fcfs),
            "fgd_preemptions": _mean(r.stats["preemptions"] for r in st.fgd),
        },
        "tr_sweep": [],
        "fgd_sweep": [],
    }
    for pl in placements or []:
        pm = st.evaluate(1.0, placement=pl)
        result.setdefault("placements", {})[pl] = {k: _pick(v, _SWEEP_KEYS) for k, v in pm.items()}
    for target in cfg.get("tr_sweep", []) if sweeps else []:
        scale = target / tr
        pm = st.evaluate(scale)
        result["tr_sweep"].append({
            "target_train_to_rollout": target, "time_scale": scale,
            "sync_train_to_rollout_ratio": _mean(m["trainer_busy_s"] / m["rollout_end_s"] for m in pm[BASE]),
            "modes": {k: _pick(v, _SWEEP_KEYS) for k, v in pm.items()},
        })
    for point in cfg.get("fgd_sweep", []) if sweeps else []:  # FGD's sensitivity to its window and to group affinity
        pm = st.evaluate(1.0, fgd=st.fgd_rollouts(point["window"], point["affinity"]), modes=["cgp_fgd"])
        result["fgd_sweep"].append(dict(point, **_pick(pm["cgp_fgd"], _SWEEP_KEYS + (
            "first_unit_ready_s", "rollout_end_s"))))
    return result


_SWEEP_KEYS = ("rollout_to_train_end_s", "reduction_vs_sync_pct", "trainer_wait_ratio", "pipeline_efficiency",
               "gap_to_ideal_pct")


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def _pick(ms: list[dict], keys) -> dict:
    out = {k: _mean(m[k] for m in ms) for k in keys}
    if "granularity" in ms[0]:
        out["granularity"] = ms[0]["granularity"]
    return out


def _summary(ms: list[dict]) -> dict:
    out = summarize([{k: v for k, v in m.items() if k != "granularity"} for m in ms])
    if "granularity" in ms[0]:
        out["granularity"] = ms[0]["granularity"]
    return out


def run_grid(path, placement: str | None = None) -> list[dict]:
    """Per setting: per-mode metrics (mean over seeds, with spread), reductions vs sync in %, gap to the
    ideal bound in %, rollout figures, and the T/R sweep."""
    cfg = load(path)
    if placement is not None:
        cfg["theta_k"]["placement"] = placement
    return [dict(run_setting(cfg, s), theta_k_placement=cfg["theta_k"]["placement"]) for s in settings(cfg)]


def compare_placements(path, placements) -> list[dict]:
    """Per setting, the reductions vs sync for each theta_k placement (no sweeps)."""
    cfg = load(path)
    return [run_setting(cfg, s, placements=list(placements), sweeps=False) for s in settings(cfg)]


def format_placements(results: list[dict]) -> str:
    """Reduction of rollout-to-train-end vs sync, per setting and mode, one column per placement."""
    pls = list(results[0]["placements"])
    modes = [k for k in results[0]["placements"][pls[0]] if k != BASE and "[" not in k] + ["cgp_fgd[group]"]
    rows = []
    for r in results:
        for mode in modes:
            rows.append([r["name"], mode] + [f"{r['placements'][pl][mode]['reduction_vs_sync_pct']:+.1f}" for pl in pls]
                        + [f"{r['placements'][pls[0]][BASE]['rollout_to_train_end_s']:.1f}"])
    return _table(["setting", "mode"] + [f"{pl} vs_sync%" for pl in pls] + ["sync_s"], rows)


# ---- plain-text report ----------------------------------------------------------------------------------
_COLS = [("rollout_to_train_end_s", "r2t_end_s", "{:.1f}"), ("reduction_vs_sync_pct", "vs_sync%", "{:+.1f}"),
         ("trainer_wait_ratio", "wait", "{:.3f}"), ("first_unit_ready_s", "1st_ready", "{:.1f}"),
         ("first_unit_start_s", "1st_start", "{:.1f}"), ("rollout_end_s", "roll_end", "{:.1f}"),
         ("ideal_lower_bound_s", "ideal_s", "{:.1f}"), ("pipeline_efficiency", "eff", "{:.3f}"),
         ("gap_to_ideal_pct", "gap%", "{:+.1f}"), ("step_time_s", "step_s", "{:.1f}"),
         ("rollout_tok_per_gpu_s", "roll_tok/gpu/s", "{:.0f}")]


def _table(header: list[str], rows: list[list[str]]) -> str:
    w = [max(len(x) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(x.ljust(w[0]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(r))  # noqa: E731
    return "\n".join([fmt(header), "  ".join("-" * x for x in w)] + [fmt(r) for r in rows])


def format_setting(r: dict) -> str:
    ro = r["rollout"]
    lines = [f"== {r['name']} (theta_k {r.get('theta_k_placement', '?')}): sync T/R = {r['sync_train_to_rollout_ratio']:.2f}; mean len "
             f"{ro['mean_response_len']:.0f}, truncated {100 * ro['truncated_fraction']:.1f}%; rollout end "
             f"FCFS {ro['fcfs_rollout_end_s']:.1f} s / FGD {ro['fgd_rollout_end_s']:.1f} s; preemptions "
             f"{ro['fcfs_preemptions']:.0f} / {ro['fgd_preemptions']:.0f}"]
    rows = []
    for mode, m in r["modes"].items():
        label = mode + (f" ({m['granularity']})" if "granularity" in m else "")
        rows.append([label] + [f.format(m[k]) for k, _, f in _COLS])
    lines.append(_table(["mode"] + [h for _, h, _ in _COLS], rows))
    if r["tr_sweep"]:
        modes = [k for k in r["tr_sweep"][0]["modes"] if "[" not in k]
        rows = [[f"{p['target_train_to_rollout']:g}", f"{p['time_scale']:.2f}",
                 f"{p['modes'][BASE]['rollout_to_train_end_s']:.1f}"]
                + [f"{p['modes'][k]['reduction_vs_sync_pct']:+.1f}% e{p['modes'][k]['pipeline_efficiency']:.2f}"
                   for k in modes if k != BASE] for p in r["tr_sweep"]]
        lines.append("T/R sweep: reduction of rollout-to-train-end vs sync, and pipeline efficiency")
        lines.append(_table(["T/R", "scale", "sync_s"] + [k for k in modes if k != BASE], rows))
    if r["fgd_sweep"]:
        rows = [[str(v["window"]), str(v["affinity"]), f"{v['first_unit_ready_s']:.1f}", f"{v['rollout_end_s']:.1f}",
                 f"{v['rollout_to_train_end_s']:.1f}", f"{v['reduction_vs_sync_pct']:+.1f}", v["granularity"]]
                for v in r["fgd_sweep"]]
        lines.append("FGD sensitivity (cgp_fgd, best granularity)")
        lines.append(_table(["window", "affinity", "1st_ready", "roll_end", "r2t_end_s", "vs_sync%", "gran"], rows))
    return "\n".join(lines)
