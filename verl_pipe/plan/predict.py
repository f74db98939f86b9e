"""The planner's core: one run config, its lengths and its costs -> predicted figures per mode and what to run.

Pure (no Hydra, no files): everything is simulated by ``verl_pipe.sim`` — the real admission policies
(``frontier.py``) on the engine model and the real trainer's schedule (``schedule.py``) on the cost model. The only
mode modelled here rather than there is verl's one-step-off (one batch ahead, staleness 1), which needs no
schedule of its own: in steady state its trainer trains the previous batch (verl's separate_async trainer on a
batch that is all there at the start) while the rollout generates the next, so a step lasts the longer of the
two plus the weight sync.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from verl_pipe.sim.calib import PaddedWorkload
from verl_pipe.core.admission import rest_order
from verl_pipe.core.frontier import AdaptiveWindow, resolve_window
from verl_pipe.core.variants import BASE, FGD_VARIANT, of_row, pipelines, variant
from verl_pipe.core.workload import Workload
from verl_pipe.plan.calibrate import KV_UNBOUNDED, RunCalibration
from verl_pipe.plan.hardware import Hardware, ModelShape, weight_sync_s
from verl_pipe.plan.lengths import Lengths
from verl_pipe.plan.runconfig import Shape
from verl_pipe.sim.engine import EngineParams
from verl_pipe.sim.simulate import RolloutResult, rollout_for_mode, timeline_for
from verl_pipe.sim.tail import oracle_lengths
from verl_pipe.sim.trainer import PLACEMENTS, TrainerParams, schedule

ROWS = ("sync", "cgp", "cgp_group", "cgp_fgd", "verl_separate_async", "verl_one_step_off", "verl_colocated")
LABELS = {"sync": "sync (separate pools)", "cgp": "cgp (mini-batch)", "cgp_group": "cgp (group)",
          "cgp_fgd": "cgp + fgd", "verl_separate_async": "verl separate_async on-policy",
          "verl_one_step_off": "verl one-step-off (stale 1)", "verl_colocated": "verl colocated (all GPUs)"}
# the colocated model's expected error where no validation has measured it: the largest step-time error of the
# public colocated check (docs/plan.md, The colocated baseline), or of a planner mode held out, whichever is larger
COLOCATED_ERROR_DEFAULT = 0.2
FIGURES = ("step_time_s", "rollout_to_train_end_s", "trainer_wait_ratio", "rollout_end_s", "trainer_busy_s",
           "first_unit_ready_s", "weight_sync_s")
WINDOWS = ("adaptive", None, "auto")  # rolloutpipe.fgd.window: None = max_num_seqs
NO_HELP_PCT = 5.0  # a predicted saving below this is within the planner's own error: say it will not help


# ------------------------------------------------------------------------------------------------ costs

class ProfileCosts:
    """Costs from a hardware profile and the model's shape (FLOP and bandwidth models, sim_sources.md)."""

    def __init__(self, hw: Hardware, model: ModelShape):
        self.hw, self.model, self.label = hw, model, f"profile {hw.name}"
        self.placements = PLACEMENTS

    def engine(self, shape: Shape, mode: str, resident_bytes: float = 0.0) -> EngineParams:
        """One replica (``shape.tp`` GPUs); ``resident_bytes``: a colocated trainer's states on each GPU."""
        return self.hw.engine(self.model, max_num_seqs=shape.max_num_seqs,
                              max_num_batched_tokens=shape.max_num_batched_tokens,
                              gpu_memory_utilization=shape.gpu_memory_utilization, tp=shape.tp,
                              resident_bytes=resident_bytes)

    def check(self, shape: Shape) -> None:
        """Refuses, naming why, a shape the GPUs cannot hold: the replicas' TP, the trainer's states, a KV cache."""
        self.hw.check_tp(self.model, shape.tp, shape.rollout_gpus)
        self.hw.check_trainer_fits(self.model, shape.train_gpus)
        self.engine(shape, "sync")

    def colocated_engine(self, shape: Shape) -> EngineParams:
        """A colocated replica: the engine beside the trainer's resident states (verl keeps them on the GPUs)."""
        n = shape.rollout_gpus + shape.train_gpus
        return self.engine(shape, "sync", self.hw.colocated_resident_bytes(self.model, n))

    def colocated_params(self, shape: Shape) -> dict:
        """verl's hybrid engine's per-step costs (``sim.colocated.ColocatedParams``) and where each comes from."""
        got = self.hw.colocated(self.model)
        return dict(got, sleep_from=f"{self.hw.name} profile: {self.hw.engine_sleep_s.tag}",
                    update_weights_from=f"{self.hw.name} profile: {2 * self.model.params / 1e9:.1f} GB bf16 at "
                                        f"{self.hw.weight_reload_Bps.v / 1e9:.2f} GB/s "
                                        f"({self.hw.weight_reload_Bps.tag})")

    def trainer(self, shape: Shape, placement: str) -> TrainerParams:
        return self.hw.trainer(self.model, gpus=shape.train_gpus, recompute=shape.recompute,
                               max_tokens_per_microbatch=shape.max_tokens_per_microbatch, use_ref=shape.use_ref,
                               placement=placement)

    def verl_trainer(self, shape: Shape, placement: str) -> TrainerParams:
        """verl's trainer: the same FLOP model (the same worker), its pi_old copies priced as verl makes them
        (pageable ``save_model_to_cpu``, ``Hardware.trainer``'s verl_swap_*)."""
        return self.trainer(shape, placement)

    def weight_sync_s(self, shape: Shape) -> float:
        return weight_sync_s(self.model, shape.one_node)[0]

    def padded(self, shape: Shape) -> bool:
        return shape.padded

    def default_placement(self, shape: Shape) -> str:
        """What ``rolloutpipe.theta_k.store=auto`` would pick on these GPUs (device when it fits, else pinned)."""
        if shape.theta_k_store in ("device", "pinned"):
            return shape.theta_k_store
        return "device" if self.hw.trainer_mem_fits_device_store(self.model, shape.train_gpus) else "pinned"


class CalibratedCosts:
    """Costs fitted on a real run (``--calibrate``): its engine per replica (alone for sync, beside a busy trainer
    for the pipelined modes) and its trainer per padded token, scaled to another trainer pool size by the GPU
    count [assumed: data parallelism scales linearly]."""

    def __init__(self, rc: RunCalibration):
        self.rc, self.label = rc, "calibrated"
        self.placements = ("run's store",)

    def engine(self, shape: Shape, mode: str, resident_bytes: float = 0.0) -> EngineParams:
        e = self.rc.cal.engine_for(mode)
        return e.with_(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                       kv_capacity_tokens=KV_UNBOUNDED)

    def check(self, shape: Shape) -> None:
        return None

    def colocated_engine(self, shape: Shape) -> EngineParams:
        return self.engine(shape, "sync")  # the colocated rollout runs alone, as sync's does

    def colocated_params(self, shape: Shape) -> dict:
        """The calibration run measured no colocated step: no sleep (vLLM on CPU has no sleep mode), the reload
        as the run's own weight sync."""
        return {"sleep_s": 0.0, "update_weights_s": self.rc.weight_sync_s,
                "sleep_from": "none (the calibration run's engine has no sleep mode)",
                "update_weights_from": "the calibration run's weight sync"}

    def trainer(self, shape: Shape, placement: str) -> TrainerParams:
        t = self.rc.cal.trainer.params
        return t.with_(flops_per_s_per_gpu=t.flops_per_s_per_gpu * shape.train_gpus / self.rc.train_gpus)

    def verl_trainer(self, shape: Shape, placement: str) -> TrainerParams:
        """verl's own trainer fitted on verl's spans (``plan.calibrate.fit_verl_trainer``) where the calibration had
        verl's steps; else our trainer's fit (said in the plan's notes)."""
        if self.rc.verl is None:
            return self.trainer(shape, placement)
        t = self.rc.verl.params
        return t.with_(flops_per_s_per_gpu=t.flops_per_s_per_gpu * shape.train_gpus / self.rc.train_gpus)

    def weight_sync_s(self, shape: Shape) -> float:
        return self.rc.weight_sync_s

    def padded(self, shape: Shape) -> bool:
        # the fit is per padded token; a fit that pads each call itself (pad_rows) takes the rows as generated
        return self.rc.cal.trainer.params.pad_rows == 0

    def default_placement(self, shape: Shape) -> str:
        return self.placements[0]


# ------------------------------------------------------------------------------------------- simulation

def one_step_off(rollout: RolloutResult, wl: Workload, trainer: TrainerParams, groups_per_unit: int,
                 sync_s: float) -> dict:
    """verl's default separate_async (one batch ahead) in steady state: the trainer trains a batch that is all
    there at the step's start (verl's own trainer model, ``sim.trainer`` ``verl_separate_async``) while the
    rollout generates the next one; a step is the longer of the two, then the weight sync."""
    ready = [(0.0, g) for _, g in rollout.completions]
    plan = schedule("verl_separate_async", ready, wl.seq_lens, trainer, groups_per_unit, 0.0)
    busy = sum(e - s for _, s, e, *_ in plan.spans)
    cycle = max(rollout.rollout_end, plan.end)
    return {"step_time_s": cycle + sync_s, "rollout_to_train_end_s": cycle, "trainer_wait_ratio": 1 - busy / cycle,
            "rollout_end_s": rollout.rollout_end, "trainer_busy_s": busy, "first_unit_ready_s": 0.0,
            "weight_sync_s": sync_s}


def _pick(m: dict) -> dict:
    return {k: float(m[k]) for k in FIGURES}


def _window_key(w) -> str:
    return "max_num_seqs" if w is None else str(w)


class Rollouts:
    """Rollouts are the costly part and do not depend on the trainer: each (split, seed, dispatch) runs once and
    every trainer mode, θ_k placement and sweep point is scheduled on it."""

    def __init__(self, costs, lengths: Lengths, prompt_len: int, length_error: float | None = None):
        self.costs, self.lengths, self.prompt_len = costs, lengths, prompt_len
        self.length_error = length_error  # FGD's length predictions: None (rank order) or their log-normal error
        self._wl: dict = {}
        self._ro: dict = {}

    def workload(self, shape: Shape, seed: int) -> Workload:
        key = (shape.num_groups, shape.n, seed)
        if key not in self._wl:
            wl = self.lengths.workload(shape.num_groups, shape.n, shape.max_response_length, self.prompt_len, seed)
            if self.costs.padded(shape):
                wl = PaddedWorkload(wl.num_groups, wl.n, wl.lengths, wl.prompt_len, wl.name)
            self._wl[key] = wl
        return self._wl[key]

    def get(self, shape: Shape, seed: int, kind: str, window=None, trainer_to_rollout: float | None = None
            ) -> RolloutResult:
        """``kind``: "alone" (stock dispatch, the engine running alone: sync), "stock" (beside a busy trainer),
        "fgd" (with ``window``; with ``length_error`` set, ordered by the groups' lengths known up to that error, beyond
        the frontier as ``trainer_to_rollout`` decides, or as ``rolloutpipe.fgd.rest_order`` fixes it:
        verl_pipe/core/admission.py ``rest_order``)."""
        engine = self.costs.engine(shape, "sync" if kind == "alone" else "cgp")
        if kind == "stock" and engine == self.costs.engine(shape, "sync"):
            kind = "alone"
        key = (shape.rollout_gpus, seed, kind, window)
        if key not in self._ro:
            wl, R, gpu = self.workload(shape, seed), shape.replicas, shape.groups_per_unit
            if kind == "fgd" and self.length_error is not None:
                self._ro[key] = rollout_for_mode("cgp_fgd", wl, engine, R, gpu, window, unit_fill=shape.unit_fill,
                                                 lengths=oracle_lengths(wl, self.length_error, seed),
                                                 rest_order=rest_order(shape.unit_fill, trainer_to_rollout,
                                                                       configured=shape.fgd_rest_order))
            elif kind == "fgd":
                self._ro[key] = rollout_for_mode("cgp_fgd", wl, engine, R, gpu, window)
            else:
                self._ro[key] = rollout_for_mode("sync", wl, engine, R, gpu, shape.dispatch_window,
                                                 shape.dispatch_order)
        return self._ro[key]


def _window_of(label: str):
    """A window label back to the rolloutpipe.fgd.window value."""
    return None if label == "max_num_seqs" else int(label) if label.isdigit() else label


def _label_for(shape: Shape, window, windows) -> str:
    """The label under which ``resolved_windows`` simulated ``window`` (another label of the same size)."""
    def size(w):
        r = resolve_window(shape.max_num_seqs if w is None else w, shape.groups_per_unit, shape.n, shape.max_num_seqs)
        return "adaptive" if isinstance(r, AdaptiveWindow) else r

    labels = resolved_windows(shape, windows)
    return next(k for k, w in labels.items() if size(w) == size(window))


def resolved_windows(shape: Shape, windows=WINDOWS) -> dict[str, object]:
    """{label: window as the simulator takes it}; windows that resolve to the same size are simulated once.
    null is max_num_seqs, as the trainer resolves it (the simulator's None would be "no window")."""
    out: dict[str, object] = {}
    sizes = set()
    for w in windows:
        sim_w = shape.max_num_seqs if w is None else w
        size = resolve_window(sim_w, shape.groups_per_unit, shape.n, shape.max_num_seqs)
        size = "adaptive" if isinstance(size, AdaptiveWindow) else size
        if size not in sizes:
            sizes.add(size)
            out[_window_key(w)] = sim_w
    return out


def simulate_shape(shape: Shape, ro: Rollouts, seeds, *, windows=WINDOWS, placement: str | None = None,
                   rows=ROWS) -> dict[str, list[dict]]:
    """Per mode key, the figures of each seed: ``sync``, ``cgp``, ``cgp_group``, ``cgp_fgd[<window>][<gran>]``,
    ``verl_separate_async``, ``verl_one_step_off``."""
    out: dict[str, list[dict]] = {}
    gpu, costs = shape.groups_per_unit, ro.costs
    trainer = costs.trainer(shape, placement or costs.default_placement(shape))
    verl = costs.verl_trainer(shape, placement or costs.default_placement(shape))
    ws = costs.weight_sync_s(shape)
    wins = resolved_windows(shape, windows)
    picked = [(r, of_row(r)) for r in ROWS if r in rows]  # in ROWS' order (sync's ratio first), whatever rows' order
    for seed in seeds:
        wl = ro.workload(shape, seed)

        def add(key: str, m: dict) -> None:
            out.setdefault(key, []).append(_pick(m))

        ratio = None  # sync's trainer work over its rollout: FGD's order beyond the frontier with predictions
        if any(v.is_base for _, v in picked):
            m = timeline_for(ro.get(shape, seed, "alone"), wl, trainer, BASE, gpu, ws).metrics()
            ratio = m["trainer_busy_s"] / m["rollout_end_s"] if m["rollout_end_s"] else None
            add(BASE, m)
        fc = ro.get(shape, seed, "stock") if any(not (v.is_base or v.fgd) for _, v in picked) else None
        for row, v in picked:
            if v.is_base or v.colocated:  # sync above; the colocated baseline is colocated_baseline's
                continue
            if v.fgd:
                for label, w in wins.items():
                    fg = ro.get(shape, seed, "fgd", w, ratio)
                    for gran in shape.granularities:
                        add(f"{row}[{label}][{gran}]",
                            timeline_for(fg, wl, trainer, row, gpu, ws, gran, unit_fill=shape.unit_fill).metrics())
            elif v.ours:  # CGP at each granularity the estimator allows
                if v.granularity in shape.granularities:
                    add(row, timeline_for(fc, wl, trainer, row, gpu, ws, v.granularity,
                                          unit_fill=shape.unit_fill).metrics())
            elif v.staleness:
                add(row, one_step_off(fc, wl, verl, gpu, ws))
            else:
                add(row, timeline_for(fc, wl, verl, row, gpu, ws).metrics())
    return out


def _mean(ms: list[dict]) -> dict:
    return {k: sum(m[k] for m in ms) / len(ms) for k in ms[0]}


def colocated_baseline(shape: Shape, ro: Rollouts, seeds) -> dict:
    """verl's default on every GPU of the plan (``sim.colocated``): the step's prompts on all N / TP replicas (the
    engine beside the trainer's resident states), the engines' sleep, verl's trainer on all N GPUs (sync's
    schedule), the weight reload. Means over ``seeds`` of the step's figures, and the parameters with their
    sources."""
    from verl_pipe.sim.colocated import ColocatedParams, colocated_step
    from verl_pipe.sim.simulate import rollout_for_mode

    n = shape.rollout_gpus + shape.train_gpus
    whole = shape.with_split(n, n)
    costs = ro.costs
    engine = costs.colocated_engine(whole)
    trainer = costs.verl_trainer(whole, costs.default_placement(whole))
    info = costs.colocated_params(whole)
    params = ColocatedParams(sleep_s=info["sleep_s"], update_weights_s=info["update_weights_s"])
    out = []
    for seed in seeds:
        wl = ro.workload(shape, seed)
        rollout = rollout_for_mode("sync", wl, engine, whole.replicas, shape.groups_per_unit, shape.dispatch_window,
                                   shape.dispatch_order)
        out.append(colocated_step(rollout, wl, trainer, shape.groups_per_unit, params))
    got = _mean(out)
    got.update(gpus=n, replicas=whole.replicas, kv_capacity_tokens=engine.kv_capacity_tokens,
               sleep_from=info["sleep_from"], update_weights_from=info["update_weights_from"],
               log_step_s=info.get("log_step_s"))
    return got


def _expected(err: dict, mode: str, default: float) -> float:
    e = err.get(mode) or {}
    return float(e.get("held_out_max_rel_error") or e.get("max_rel_error") or default)


def versus_colocated(coloc: dict, splits: list[dict], shape: Shape, configured: dict, err: dict) -> dict:
    """The best split-pool configuration (sync or the recommended mode, at every split the sweep ran, else the
    configured one) against verl's colocated step on the same N GPUs: the gain in step time, its uncertainty (the
    two models' expected errors, combined as independent) and the decision: "split k + (N - k)" where it saves at
    least ``NO_HELP_PCT``, else "stay colocated"."""
    cands = []
    for sp in splits or [configured]:
        cands.append((sp["recommended_step_s"], sp["rollout_gpus"], sp["train_gpus"], "recommended"))
        cands.append((sp["sync_step_s"], sp["rollout_gpus"], sp["train_gpus"], "sync"))
    step, k, rest, which = min(cands)
    mode = configured["mode"] if which == "recommended" else "sync"
    t_c = coloc["step_time_s"]
    gain = 100 * (1 - step / t_c)
    e_split = _expected(err, mode, COLOCATED_ERROR_DEFAULT)
    e_col = _expected(err, "verl_colocated", COLOCATED_ERROR_DEFAULT)
    unc = 100 * (step / t_c) * (e_split ** 2 + e_col ** 2) ** 0.5
    split = gain >= NO_HELP_PCT
    n = k + rest
    head = (f"split {k} + {rest}" if split else "stay colocated")
    label = configured["label"] if which == "recommended" else "sync"
    msg = (f"the best split, {k} rollout + {rest} trainer GPUs running {label}, takes {step:.1f} s per step; verl's "
           f"colocated default on all {n} GPUs {t_c:.1f} s: {gain:+.1f}% ± {unc:.0f} pt"
           + ("" if split else f" (a split must save at least {NO_HELP_PCT:g}%)")
           + (" — inside the planner's uncertainty: measure both before you move" if abs(gain) < unc else ""))
    share = (coloc["sleep_s"] + coloc["update_weights_s"]) / t_c
    if share > 0.15 and "timing_s/update_weights" not in coloc.get("update_weights_from", ""):
        msg += (f"; the colocated step's sleep and weight reload are {100 * share:.0f}% of it and the reload is "
                f"{coloc.get('update_weights_from', 'not measured')}: a verl log's timing_s/update_weights "
                "(--calibrate-verl-log) would settle it")
    return {"decision": head, "split": split, "rollout_gpus": k, "train_gpus": rest, "mode": mode,
            "step_time_s": step, "colocated_step_s": t_c, "gain_pct": gain, "uncertainty_pt": unc,
            "expected_error": {"split": e_split, "colocated": e_col}, "message": msg}


# -------------------------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class PlanInputs:
    shape: Shape
    costs: object  # ProfileCosts | CalibratedCosts
    lengths: Lengths
    prompt_len: int
    seeds: tuple[int, ...] = (0, 1, 2)
    sweep_seeds: tuple[int, ...] = (0,)  # the split sweep's other splits: one draw each (time budget)
    sweep_splits: bool = True
    expected_error: dict | None = None  # validation per mode (plan/validation.json), or None
    # FGD's length predictions (verl_pipe/sim/tail.py): None, rank order; else the log-normal sigma of their error
    length_error: float | None = None


def _fgd_label(key: str) -> tuple[str, str]:
    w, gran = key[len("cgp_fgd["):-1].split("][")
    return w, gran


def plan(inp: PlanInputs) -> dict:
    """The plan for ``inp``: every mode's simulated figures (``modes``), the recommended configuration with its
    overrides, FGD's windows, θ_k's placements, the rollout/trainer splits (``inp.sweep_splits``) and the verdict
    (sync is recommended when the best saving is inside the expected error)."""
    t_start = time.perf_counter()
    shape, costs = inp.shape, inp.costs
    costs.check(shape)
    ro = Rollouts(costs, inp.lengths, inp.prompt_len, inp.length_error)
    windows = WINDOWS + ((shape.fgd_window,) if shape.fgd_window not in WINDOWS else ())
    runs = simulate_shape(shape, ro, inp.seeds, windows=windows)
    means = {k: _mean(v) for k, v in runs.items()}
    coloc = colocated_baseline(shape, ro, inp.seeds)
    means["verl_colocated"] = {k: coloc[k] for k in FIGURES}
    sync = means[BASE]
    fgd_keys = [k for k in means if k.startswith(f"{FGD_VARIANT}[")]
    pipelined = [k for k in ("cgp", "cgp_group") if k in means] + fgd_keys
    best = min(pipelined, key=lambda k: means[k]["rollout_to_train_end_s"])
    modes = _mode_rows(means, shape, _label_for(shape, shape.fgd_window, windows), inp.expected_error or {})
    windows = [{"window": _fgd_label(k)[0], "granularity": _fgd_label(k)[1],
                **{f: means[k][f] for f in ("rollout_to_train_end_s", "step_time_s", "first_unit_ready_s",
                                            "rollout_end_s")}} for k in fgd_keys]
    v = variant(best.split("[", 1)[0])  # cgp_fgd[<window>][<granularity>]: cgp_fgd at one window and granularity
    rec = {"mode": v.mode, "fgd": v.fgd}
    rec["fgd_window"], rec["granularity"] = _fgd_label(best) if v.fgd else (None, v.granularity)
    rec["rollout_to_train_end_s"] = means[best]["rollout_to_train_end_s"]
    rec["saving_vs_sync_pct"] = 100 * (1 - means[best]["rollout_to_train_end_s"] / sync["rollout_to_train_end_s"])
    best_window = _window_of(rec["fgd_window"]) if rec["fgd"] else None

    # θ_k placement: the recommended mode with each store (a profile models all three; a calibration its own)
    placements = {}
    if len(costs.placements) > 1 and shape.units > 1:
        for pl in costs.placements:
            r = simulate_shape(shape, ro, inp.seeds, windows=(best_window,) if rec["fgd"] else (), placement=pl,
                               rows=("cgp_fgd",) if rec["fgd"] else ("cgp", "cgp_group"))
            k = best if best in r else next(iter(r))
            placements[pl] = _mean(r[k])["rollout_to_train_end_s"]
    default_pl = costs.default_placement(shape)
    rec["theta_k_store"] = default_pl if default_pl in costs.placements else costs.placements[0]

    total = shape.rollout_gpus + shape.train_gpus
    splits = _split_sweep(inp, ro, best, best_window, rec) if inp.sweep_splits and total > 2 else []
    configured = {"rollout_gpus": shape.rollout_gpus, "train_gpus": shape.train_gpus,
                  "sync_step_s": sync["step_time_s"], "recommended_step_s": means[best]["step_time_s"],
                  "mode": v.mode, "label": _rec_label(rec)}
    vs_coloc = versus_colocated(coloc, splits, shape, configured, inp.expected_error or {})
    verdict = verdict_for(sync, rec["saving_vs_sync_pct"], inp.lengths, shape)
    if not verdict["helps"]:  # a saving inside the error is no reason to run the more complex schedule
        rec["best_pipelined"] = {k: rec[k] for k in ("granularity", "fgd", "fgd_window", "saving_vs_sync_pct")}
        rec.update(mode="sync", fgd=False, fgd_window=None, rollout_to_train_end_s=sync["rollout_to_train_end_s"],
                   saving_vs_sync_pct=0.0)
    rec["overrides"] = overrides_for(rec, shape)
    return {"modes": modes, "labels": LABELS, "recommendation": rec, "fgd_windows": windows,
            "theta_k_placements": placements, "splits": splits, "verdict": verdict,
            "colocated": coloc, "versus_colocated": vs_coloc,
            "sync_train_to_rollout_ratio": sync["trainer_busy_s"] / sync["rollout_end_s"],
            "seeds": list(inp.seeds), "elapsed_s": time.perf_counter() - t_start}


def _rec_label(rec: dict) -> str:
    """The recommended pipelined configuration in words (before the verdict may turn it into sync)."""
    return (f"cgp ({rec['granularity']}" + (f", FGD window {rec['fgd_window']})" if rec["fgd"] else ")"))


def _mode_rows(means: dict[str, dict], shape: Shape, configured_window: str, err: dict) -> dict[str, dict]:
    """One row per mode of ROWS: its mean figures, its reductions vs sync and the expected error validated for it;
    the cgp + fgd row is the configured window (``configured_window``, rolloutpipe.fgd.window's label) at its
    better granularity; a mode the estimator cannot train says why it was skipped."""
    sync = means[BASE]
    fgd_row = min((k for k in means if k.startswith(f"{FGD_VARIANT}[{configured_window}]")),
                  key=lambda k: means[k]["rollout_to_train_end_s"])
    modes = {}
    for row in ROWS:
        key = fgd_row if of_row(row).fgd else row
        if key not in means:
            modes[row] = {"skipped": f"algorithm.adv_estimator={shape.estimator} trains only at "
                                     f"{', '.join(shape.granularities)} granularity"}
            continue
        m = dict(means[key])
        m["reduction_vs_sync_pct"] = 100 * (1 - m["rollout_to_train_end_s"] / sync["rollout_to_train_end_s"])
        m["step_reduction_vs_sync_pct"] = 100 * (1 - m["step_time_s"] / sync["step_time_s"])
        if of_row(row).fgd:
            m["fgd_window"], m["granularity"] = _fgd_label(key)
        m["expected_error"] = err.get(row, {"note": "not validated" if not of_row(row).colocated else
                                            "not validated on a run (docs/plan.md, The colocated baseline)"})
        modes[row] = m
    return modes


def _split_sweep(inp: PlanInputs, ro: Rollouts, best: str, best_window, rec: dict) -> list[dict]:
    """Sync and the recommended mode (``best``, at ``best_window``) at other rollout/trainer GPU splits of the same
    total (at most ~8 besides the configured one); writes the fastest split (``split``) and sync's
    (``best_sync_split``) into ``rec``. Returns one row per split."""
    shape = inp.shape
    total = shape.rollout_gpus + shape.train_gpus
    splits = []
    step = max(1, total // 8)  # at most ~8 other splits: a 32-GPU plan moves the boundary 4 GPUs at a time
    step = -(-step // shape.tp) * shape.tp  # whole replicas
    for r_gpus in sorted(set(range(step, total, step)) | {shape.rollout_gpus}):
        s = shape.with_split(r_gpus, total - r_gpus)
        try:
            inp.costs.check(s)
        except ValueError as e:  # the trainer's states or a replica do not fit this split's GPUs
            rec.setdefault("splits_skipped", []).append({"rollout_gpus": r_gpus, "train_gpus": total - r_gpus,
                                                        "why": str(e)})
            continue
        r = simulate_shape(s, ro, inp.seeds if r_gpus == shape.rollout_gpus else inp.sweep_seeds,
                           windows=(best_window,) if rec["fgd"] else (),
                           rows=("sync", "cgp_fgd") if rec["fgd"] else ("sync", "cgp", "cgp_group"))
        k = best if best in r else next(k for k in r if k != BASE)
        sm, pm = _mean(r[BASE]), _mean(r[k])
        splits.append({"rollout_gpus": r_gpus, "train_gpus": total - r_gpus,
                       "sync_step_s": sm["step_time_s"], "recommended_step_s": pm["step_time_s"],
                       "recommended_r2t_end_s": pm["rollout_to_train_end_s"],
                       "sync_r2t_end_s": sm["rollout_to_train_end_s"]})
    top = min(splits, key=lambda x: x["recommended_step_s"])
    rec["split"] = {"rollout_gpus": top["rollout_gpus"], "train_gpus": top["train_gpus"],
                    "step_time_s": top["recommended_step_s"],
                    "vs_configured_pct": 100 * (top["recommended_step_s"] / next(
                        x["recommended_step_s"] for x in splits if x["rollout_gpus"] == shape.rollout_gpus) - 1)}
    best_sync = min(splits, key=lambda x: x["sync_step_s"])
    rec["best_sync_split"] = {"rollout_gpus": best_sync["rollout_gpus"], "train_gpus": best_sync["train_gpus"],
                              "step_time_s": best_sync["sync_step_s"]}
    return splits


def overrides_for(rec: dict, shape: Shape) -> list[str]:
    """The command-line overrides that launch the recommendation (beside the user's own)."""
    out = [f"rolloutpipe.mode={rec['mode']}"]
    if pipelines(rec["mode"]):
        out.append(f"rolloutpipe.cgp.granularity={rec['granularity']}")
        out.append(f"rolloutpipe.fgd.enable={str(rec['fgd']).lower()}")
        if rec["fgd"]:
            w = rec["fgd_window"]
            out.append(f"rolloutpipe.fgd.window={'null' if w == 'max_num_seqs' else w}")
        if rec.get("theta_k_store") in ("device", "pinned"):
            out.append(f"rolloutpipe.theta_k.store={rec['theta_k_store']}")
    sp = rec.get("split") if pipelines(rec["mode"]) else rec.get("best_sync_split")
    if sp and sp["rollout_gpus"] != shape.rollout_gpus:
        for key, gpus, nodes in (("actor_rollout_ref.rollout", sp["rollout_gpus"], shape.rollout_nnodes),
                                 ("trainer", sp["train_gpus"], shape.train_nnodes)):
            if gpus % nodes:  # the pool no longer splits evenly over its nodes: say the total on one "node"
                out.append(f"{key}.nnodes=1")
                nodes = 1
            out.append(f"{key}.n_gpus_per_node={gpus // nodes}")
    return out


def verdict_for(sync: dict, saving_pct: float, lengths: Lengths, shape: Shape) -> dict:
    """Whether pipelining helps, and when it does not, why, in words a user can act on."""
    tr = sync["trainer_busy_s"] / sync["rollout_end_s"]
    st = lengths.stats(shape.max_response_length, shape.n)
    no_tail = st["cv"] < 0.1
    reasons = []
    if tr < 0.25:
        reasons.append(f"generation-dominated: the trainer works {tr:.2f}x the rollout's time, so overlapping it "
                       f"can hide at most {100 * tr / (1 + tr):.0f}% of a synchronous step")
    if tr > 4:
        reasons.append(f"trainer-bound: the trainer works {tr:.1f}x the rollout's time; no schedule is shorter than "
                       "the trainer's own work (move GPUs to the trainer)")
    if no_tail:
        reasons.append(f"no tail: response lengths vary little (CV {st['cv']:.2f}), so groups finish together and "
                       "little training can start before the rollout ends")
    helps = saving_pct >= NO_HELP_PCT
    if helps:
        msg = (f"Pipelining helps: {saving_pct:.1f}% shorter rollout→train end than sync"
               + (f" (but: {'; '.join(reasons)})" if reasons else ""))
    else:
        msg = (f"Pipelining will NOT help here: predicted saving {saving_pct:.1f}% (< {NO_HELP_PCT:g}%, within the "
               f"planner's error). " + ("; ".join(reasons) if reasons else "the trainer's work hides little of the "
                                         "rollout on this split") + ". Run sync, or change the split.")
    return {"helps": helps, "message": msg, "train_to_rollout": tr, "length_cv": st["cv"], "reasons": reasons}
