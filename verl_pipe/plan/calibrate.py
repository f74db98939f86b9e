"""``--calibrate RUN``: the engine and trainer costs fitted on a short real run's step records.

``RUN`` is one of:

- a run's ``rolloutpipe.trace_dir`` (``python -m verl_pipe.main_grpo``): ``steps.jsonl`` (one record per step: its
  metrics) and, beside it, ``step_NNNNN.json`` (the step's Chrome trace: every request's submit and finish with its
  tokens and replica, every trainer call with its kind and unit, the units' groups). The events come from the
  trace, the step list and measured figures from steps.jsonl;
- a bench's per-step file (``python -m verl_pipe_lab.bench``: ``*_steps_*.json[.gz]``, e.g. the ones kept in
  docs/bench): our modes' step timelines and, where the bench ran it, verl's peer steps (``train_spans``, lengths);
  ``FILE:SIZE`` picks one model size when the file holds several.

The fit of our side is the bench's (``verl_pipe.sim.calib``: engine decode cost alone and beside a busy trainer,
trainer cost per padded token and per call), so a planner calibration and a bench calibration are the same
numbers. verl's own trainer is fitted on verl's own spans (``fit_verl_trainer``), never costed with ours when its
steps are there: from the same source, or from ``--calibrate-verl FILE`` (a bench steps file, or the output of
``python -m verl_pipe_lab.bench.peer --out``).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from verl_pipe.sim.calib import (Calibration, StepShape, TrainerFit, _validation_table, calibrate,
                                   calibration_summary, nonneg_lstsq, rel_error, simulate_like)
from verl_pipe.core.variants import ON_POLICY_PEER, OURS, name_of
from verl_pipe.sim.trainer import TrainerParams

KV_UNBOUNDED = 1 << 40  # the fit assumes the run's KV cache never bound (the bench's assumption too)


def timeline_from_chrome(trace: dict, stride: int = 1000) -> dict:
    """A ``StepTimeline.to_dict()``-shaped event dict rebuilt from one step's Chrome trace (``to_chrome_trace``).

    Lost in the trace and not needed by the fit: the groups a span covered (a span covers its unit's groups, or
    all groups without a unit, as ``calib._trainer_spans`` reads it)."""
    ev = {k: [] for k in ("requests", "responses", "aborts", "groups", "units_ready", "train_spans", "weight_syncs")}
    s = 1e-6
    for e in trace.get("traceEvents", []):
        a, ph, pid = e.get("args") or {}, e.get("ph"), e.get("pid")
        if ph == "X" and pid == 1:
            t0, t1 = e["ts"] * s, (e["ts"] + e["dur"]) * s
            ev["requests"].append({"t": t0, "request_id": e["name"], "group": a["group"], "replica": e["tid"] // stride})
            if a.get("aborted"):
                ev["aborts"].append({"t": t1, "request_id": e["name"], "group": a["group"]})
            elif not a.get("unfinished"):
                ev["responses"].append({"t": t1, "request_id": e["name"], "group": a["group"],
                                        "num_tokens": int(a["tokens"])})
        elif ph == "i" and pid == 1 and "group" in a:
            ev["groups"].append({"t": e["ts"] * s, "group": a["group"], "trainable": a.get("trainable", True)})
        elif ph == "i" and pid == 2 and "unit" in a:
            ev["units_ready"].append({"t": e["ts"] * s, "unit": a["unit"], "groups": list(a["groups"])})
        elif ph == "X" and pid == 2:
            ev["train_spans"].append({"kind": e["name"], "start": e["ts"] * s, "end": (e["ts"] + e["dur"]) * s,
                                      "unit": a.get("unit"), "group": None})
        elif ph == "X" and pid == 3:
            ev["weight_syncs"].append({"start": e["ts"] * s, "end": (e["ts"] + e["dur"]) * s})
    return ev


def _index(request_id, default: int) -> int:
    """A response's index in its group: the "<group>-<index>" ids the driver gives, else arrival order."""
    tail = str(request_id).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else default


def mode_of(tl: dict) -> tuple[str, str]:
    """(mode, granularity) from the spans the trainer recorded: sync computes one whole-batch log-prob call (no
    unit), group granularity calls forward_backward per burst. FGD is not visible in the spans; it only changes
    the admission, which the engine fit does not model, so FGD steps fit as cgp."""
    kinds = {(sp["kind"], sp["unit"] is None) for sp in tl["train_spans"]}
    if ("old_log_prob", True) in kinds:
        mode, granularity = "sync", "minibatch"
    else:
        mode, granularity = "cgp", "group" if any(k == "forward_backward" for k, _ in kinds) else "minibatch"
    return name_of(mode, granularity), granularity


def load_run(run_dir, prompt_len: float | None = None) -> list[dict]:
    """The run's measured steps in ``bench.calib``'s form: mode, timeline, lengths by group, prompt length."""
    run = Path(run_dir)
    path = run / "steps.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise ValueError(f"--calibrate {run_dir}: no steps.jsonl (a run's rolloutpipe.trace_dir holds one), and not "
                         "a verl log with timing_s/* metrics (a plain verl run's log: --calibrate-verl-log LOG)")
    steps = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--calibrate {path}: line {i} is not JSON ({e.msg})") from None
        if "step" not in rec or "timeline" not in rec:
            raise ValueError(f"--calibrate {path}: record {i} has no 'step'/'timeline' (not a rolloutpipe steps.jsonl)")
        trace = path.parent / f"step_{int(rec['step']):05d}.json"
        if not trace.is_file():
            raise ValueError(f"--calibrate {path}: record {i} (step {rec['step']}): its Chrome trace {trace.name} is "
                             "not beside it; the fit needs the per-request and per-call events it holds")
        tl = timeline_from_chrome(json.loads(trace.read_text()))
        if not tl["responses"] or not tl["train_spans"]:
            raise ValueError(f"--calibrate {trace}: no finished responses or no trainer spans")
        mode, gran = mode_of(tl)
        by: dict[int, dict[int, int]] = {}
        for r in tl["responses"]:
            got = by.setdefault(int(r["group"]), {})
            got[_index(r["request_id"], len(got))] = int(r["num_tokens"])
        lengths = [[v for _, v in sorted(by.get(g, {}).items())] or [1] for g in range(max(by) + 1)]
        metrics = rec.get("metrics") or {}
        p = prompt_len or metrics.get("prompt_length/mean")
        if not p:
            raise ValueError(f"--calibrate {path}: record {i} has no prompt_length/mean metric; pass --prompt-len")
        tm = rec["timeline"]
        steps.append({"setting": "run", "mode": mode, "granularity": gran, "timeline": tl, "lengths": lengths,
                      "prompt_len": float(p), "weight_sync_s": float(tm.get("weight_sync_s", 0.0)),
                      "metrics": tm, "step": rec["step"]})
    if not steps:
        raise ValueError(f"--calibrate {path}: no step records")
    # A run's first step pays the engines' warm-up (on the tiny default two to three times a later step: docs/plan.md's
    # fresh-run pair), as the bench's discarded warm-up step does: left out when the run has others to fit on.
    return steps[1:] if len(steps) > 1 else steps


# ------------------------------------------------------------------------------ a bench's per-step file

def split_source(arg) -> tuple[Path, str | None]:
    """``PATH`` or ``PATH:SIZE`` (a model size of a bench steps file) -> (path, size)."""
    text = str(arg)
    path = Path(text).expanduser()
    if not path.exists() and ":" in text:
        head, size = text.rsplit(":", 1)
        if Path(head).expanduser().exists() and "/" not in size:
            return Path(head).expanduser(), size
    return path, None


def is_steps_file(path: Path) -> bool:
    """A bench's per-step file or a peer's output (JSON, gzipped or not, with a ``steps`` list), not a trace."""
    if not path.is_file() or not path.name.endswith((".json", ".json.gz")):
        return False
    return isinstance(read_json(path), dict) and isinstance(read_json(path).get("steps"), list)


_JSON_CACHE: dict = {}


def read_json(path: Path):
    key = (str(path), path.stat().st_mtime)
    if key not in _JSON_CACHE:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as f:
            try:
                _JSON_CACHE[key] = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not JSON ({e.msg})") from None
    return _JSON_CACHE[key]


def _size(rec: dict) -> str:
    return rec.get("model_size", "bench")


def _prompt_len(rec: dict, where: str, prompt_len: float | None) -> float:
    p = prompt_len or rec.get("prompt_len") or (rec.get("verl_metrics") or {}).get("prompt_length/mean")
    if not p:
        raise ValueError(f"{where}: no prompt length (prompt_len / verl_metrics prompt_length/mean); pass --prompt-len")
    return float(p)


def steps_file(path: Path, size: str | None = None, prompt_len: float | None = None, data: dict | None = None) -> dict:
    """A bench steps file (or a peer's ``--out`` JSON) -> {"ours": [...], "peer": [...], "shape": StepShape | None,
    "size": the model size read}. ``ours`` in ``bench.calib``'s step form; ``peer``: verl's on-policy steps
    {"train_spans", "lengths", "prompt_len", "metrics", "weight_sync_s", "setting", "step"}. Warm-up steps (a peer
    output marks them) are left out, as the bench leaves them out. ``data``: the file's contents, when already read."""
    d = read_json(path) if data is None else data
    recs = [r for r in d["steps"] if not r.get("warmup")]
    shapes = d.get("shapes") or {}
    sizes = sorted({_size(r) for r in recs})
    if size is not None:
        if size not in sizes:
            raise ValueError(f"--calibrate {path}:{size}: no steps of model size {size!r}; the file has "
                             f"{', '.join(sizes)}")
        sizes = [size]
    # stacks of one model differ by name only (e.g. a bench's A/B stack): the same shape fits together
    distinct = {json.dumps(shapes.get(z, {}), sort_keys=True) for z in sizes}
    if len(distinct) > 1:
        raise ValueError(f"--calibrate {path}: steps of model sizes {', '.join(sizes)} with different shapes; "
                         f"name one as {path}:SIZE")
    recs = [r for r in recs if _size(r) in sizes]
    ours, peer = [], []
    for i, r in enumerate(recs):
        where = f"--calibrate {path}: step record {i + 1} ({r.get('setting', '?')} {r.get('mode', '?')})"
        mode = r.get("mode", ON_POLICY_PEER if "train_spans" in r else None)
        if mode in OURS and r.get("timeline") and r.get("lengths"):
            ours.append({"setting": r.get("setting", "run"), "mode": mode, "granularity": r.get("granularity") or
                         "minibatch", "timeline": r["timeline"], "lengths": r["lengths"],
                         "prompt_len": _prompt_len(r, where, prompt_len),
                         "weight_sync_s": float(r.get("weight_sync_s", 0.0)), "metrics": r["metrics"],
                         "fgd_window": r.get("fgd_window"), "step": r.get("round", i), "round": r.get("round", 0)})
        elif mode == ON_POLICY_PEER and "train_spans" in r:
            if not r.get("lengths"):
                raise ValueError(f"{where}: verl's step has no lengths")
            peer.append({"setting": r.get("setting", "peer"), "mode": mode, "train_spans": r["train_spans"],
                         "lengths": r["lengths"], "prompt_len": _prompt_len(r, where, prompt_len),
                         "weight_sync_s": float(r.get("weight_sync_s", r["metrics"].get("weight_sync_s", 0.0))),
                         "metrics": r["metrics"], "step": r.get("step", i), "round": r.get("round", i)})
    if not ours and not peer:
        raise ValueError(f"--calibrate {path}: no step with our timeline or verl's train_spans")
    raw = shapes.get(sizes[0]) if sizes else None
    out = {"ours": ours, "peer": peer, "shape": StepShape(**raw) if raw else None, "size": sizes[0]}
    return _with_capped_kv(out, path, d, size)


def _with_capped_kv(got: dict, path: Path, d: dict, size: str | None) -> dict:
    """A stack whose KV pool was capped (vLLM's ``num_gpu_blocks_override`` in its recorded overrides): its shape
    gets the capped pool, and ``engine_donor`` the steps of the uncapped stack of the same model whose engine fit it
    borrows (``bench.run.engine_donors``: the KV-bound runs' own request timings cannot calibrate an engine)."""
    from verl_pipe.sim.records import capped_kv_tokens, engine_donors, recorded_shape

    stacks = d.get("stacks") or {}
    if got["shape"] is not None:  # the pool in blocks and the update's row order, as the stack ran
        got["shape"] = recorded_shape(got["shape"], stacks.get(got["size"]))
    capped = capped_kv_tokens((stacks.get(got["size"]) or {}).get("overrides") or [])
    if not capped or got["shape"] is None:
        return got
    shapes = {k: StepShape(**v) for k, v in (d.get("shapes") or {}).items()}
    donor = engine_donors(shapes, stacks).get(got["size"])
    if donor is not None and size is not None:
        got["engine_donor"] = steps_file(path, donor, data=d)
    return got


def calibrate_steps(got: dict, ours: list[dict] | None = None):
    """``bench.calib.calibrate`` on ``ours`` (default: all of ``got``'s), with the engine of ``got``'s
    ``engine_donor`` where it has one."""
    from verl_pipe.sim.calib import with_engine_of

    cal = calibrate(got["ours"] if ours is None else ours, got["shape"])
    donor = got.get("engine_donor")
    if donor is not None:
        cal = with_engine_of(cal, calibrate(donor["ours"], donor["shape"]), got["shape"])
    return cal


# ------------------------------------------------------------------------------------- verl's own trainer

@dataclass
class VerlFit:
    """verl's V1 separate_async trainer, fitted on its own spans: per mini-batch, an update call (its optimizer step
    in it) of ``update_line`` = (s per call, s per padded token), and an old-log-prob call (its pi_old CPU copies
    in it) of ``logprob_line``. Tokens are the simulator's (each group's rows padded to its longest, as
    ``calib.PaddedWorkload`` prices every mode), so what the planner charges is what verl measured."""

    params: TrainerParams
    update_line: tuple[float, float]
    logprob_line: tuple[float, float]
    intercepts: str  # "fitted" (several mini-batch counts) | "ours" (our fit's, same run) | "none"
    steps: int
    source: str = ""

    def summary(self, ours: TrainerFit | None = None) -> dict:
        out = {"source": self.source, "steps": self.steps, "intercepts": self.intercepts,
               "update_s_per_call": self.update_line[0], "update_s_per_1k_padded_tokens": 1e3 * self.update_line[1],
               "logprob_s_per_call": self.logprob_line[0],
               "logprob_s_per_1k_padded_tokens": 1e3 * self.logprob_line[1]}
        if ours is not None:
            out["ours_update_s_per_1k_padded_tokens"] = 1e3 * ours.update_line[1]
            out["ours_logprob_s_per_1k_padded_tokens"] = 1e3 * ours.logprob_line[1]
        return out


def peer_totals(step: dict) -> tuple[int, float, float, float]:
    """(mini-batches, padded tokens, update seconds, old-log-prob seconds) of one verl step."""
    spans = step["train_spans"]
    units = sum(1 for sp in spans if sp["kind"] == "update")
    upd = sum(sp["end"] - sp["start"] for sp in spans if sp["kind"] == "update")
    lp = sum(sp["end"] - sp["start"] for sp in spans if sp["kind"] in ("old_log_prob", "ref_log_prob"))
    p = int(round(step["prompt_len"]))
    tokens = float(sum(len(g) * (p + max(g)) for g in step["lengths"] if g))
    return units, tokens, upd, lp


def fit_verl_trainer(peer: list[dict], ours: TrainerFit | None = None, source: str = "") -> VerlFit:
    """Least squares of verl's per-step span totals: T = a * mini-batches + b * padded tokens, for the update and
    the old-log-prob calls. The per-step totals do not depend on which groups made which mini-batch (verl's
    TransferQueue order, not recorded). With one mini-batch count among the steps, a (per call) and b (per token)
    are not separable: a is then our trainer's per-call cost fitted on the same run (same host, same worker), b
    verl's own."""
    rows = []
    for s in peer:
        u, tok, upd, lp = peer_totals(s)
        if u == 0 or tok <= 0:
            raise ValueError(f"verl step {s.get('step')} ({s.get('setting')}): no update span or no tokens")
        rows.append((u, tok, upd, lp))
    if not rows:
        raise ValueError("no verl steps to fit verl's trainer on")
    R = np.asarray(rows, dtype=float)
    U, TOK = R[:, 0], R[:, 1]
    if len(set(U)) >= 2:
        X = np.stack([U, TOK], axis=1)
        (a_u, b_u), (a_l, b_l) = nonneg_lstsq(X, R[:, 2]), nonneg_lstsq(X, R[:, 3])
        how = "fitted"
    else:
        a_u, a_l = (ours.update_line[0], ours.logprob_line[0]) if ours is not None else (0.0, 0.0)
        how = "ours" if ours is not None else "none"
        b_u, b_l = (np.sum(R[:, 2] - a_u * U) / np.sum(TOK), np.sum(R[:, 3] - a_l * U) / np.sum(TOK))
        if b_u <= 0 or b_l <= 0:  # our per-call cost exceeds verl's whole call: verl's calls are all per token
            a_u, a_l, how = 0.0, 0.0, "none"
            b_u, b_l = np.sum(R[:, 2]) / np.sum(TOK), np.sum(R[:, 3]) / np.sum(TOK)
    b_u, b_l = max(float(b_u), 1e-12), max(float(b_l), 0.0)
    # the simulator's verl trainer per mini-batch: cpu_swap (= the old-log-prob call's fixed part), old_log_prob
    # (lambda x update per token), update (per token), optimizer_step (= the update call's fixed part)
    params = TrainerParams(
        num_gpus=1, flops_per_s_per_gpu=1.0 / b_u, efficiency=1.0, linear_flops_per_token=1.0, attn_flops_coef=0.0,
        microbatch_overhead_s=0.0, max_tokens_per_microbatch=1 << 40, call_overhead_s=0.0, logprob_ratio=b_l / b_u,
        use_ref=False, optimizer_step_s=float(a_u), time_scale=1.0, swap_save_s=0.0, swap_restore_s=0.0,
        swap_cycle_s=0.0, opt_snapshot_s=0.0, verl_swap_save_s=float(a_l), verl_swap_restore_s=0.0,
        # each group's rows padded to its longest, as its tokens were counted (peer_totals)
        pad_rows=max(len(g) for s in peer for g in s["lengths"]), update_order="arrival")
    return VerlFit(params, (float(a_u), b_u), (float(a_l), b_l), how, len(rows), source)


def verl_check(peer: list[dict], engine, verl: VerlFit, shape: StepShape) -> dict:
    """verl's steps re-simulated with a fit (its trainer, our overlapped engine): measured vs predicted mean
    rollout→train end, and the relative error."""
    meas = [float(s["metrics"]["rollout_to_train_end_s"]) for s in peer]
    pred = [simulate_like(s, "verl_separate_async", "minibatch", engine, verl.params, shape)["rollout_to_train_end_s"]
            for s in peer]
    m, p = float(np.mean(meas)), float(np.mean(pred))
    return {"measured_s": m, "predicted_s": p, "rel_error": rel_error(p, m), "steps": len(peer)}


# ------------------------------------------------------------------------------------------- the calibration

@dataclass
class RunCalibration:
    cal: Calibration
    shape: StepShape
    train_gpus: int
    prompt_len: float
    weight_sync_s: float
    modes: dict[str, int]  # steps per mode
    self_check: dict  # re-simulating the run's own steps with the fit (in-sample error per mode)
    verl: VerlFit | None = None  # verl's own trainer, where verl's steps were given
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"calibration": calibration_summary(self.cal), "train_gpus": self.train_gpus,
                "prompt_len": self.prompt_len, "weight_sync_s": self.weight_sync_s, "steps_per_mode": self.modes,
                "num_replicas": self.shape.num_replicas, "self_check": self.self_check,
                "verl_trainer": self.verl.summary(self.cal.trainer) if self.verl else None}


def calibrate_run(run_dir, *, micro_rows: int, max_num_seqs: int, max_num_batched_tokens: int, train_gpus: int,
                  prompt_len: float | None = None, verl_source=None) -> RunCalibration:
    """Fit on the run's steps. A main_grpo run's shape is read from its events (n, unit size, replicas) and the
    config (micro-batch rows, engine slots, trainer GPUs: what the events cannot tell); a bench steps file carries
    the run's own shape. verl's trainer: fitted on the verl steps of ``run_dir``, else of ``verl_source``."""
    path, size = split_source(run_dir)
    peer: list[dict] = []
    if is_steps_file(path):
        got = steps_file(path, size, prompt_len)
        steps, peer, shape = got["ours"], got["peer"], got["shape"]
        if not steps:
            raise ValueError(f"--calibrate {run_dir}: verl's steps only; the engine and our trainer are fitted on our "
                             "modes' steps (a main_grpo run's trace_dir or a bench steps file); pass verl's file "
                             "as --calibrate-verl beside it")
    else:
        steps, shape = load_run(run_dir, prompt_len), None
    if shape is None:
        s0 = steps[0]["timeline"]
        n = max(len(g) for g in steps[0]["lengths"])
        units = sorted(s0["units_ready"], key=lambda u: u["unit"])
        if not units:
            raise ValueError(f"--calibrate {run_dir}: step {steps[0]['step']} recorded no training unit")
        shape = StepShape(n=n, groups_per_unit=len(units[0]["groups"]), micro_rows=micro_rows,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          kv_capacity_tokens=KV_UNBOUNDED,
                          num_replicas=1 + max(r["replica"] for s in steps for r in s["timeline"]["requests"]))
    try:
        cal = calibrate(steps, shape)
    except ValueError as e:
        raise ValueError(f"--calibrate {run_dir}: {e}") from None
    check = _validation_table(steps, lambda s: cal, shape)
    modes: dict[str, int] = {}
    for s in steps:
        modes[s["mode"]] = modes.get(s["mode"], 0) + 1
    src = str(run_dir)
    if not peer and verl_source is not None:
        vpath, vsize = split_source(verl_source)
        if not is_steps_file(vpath):
            raise ValueError(f"--calibrate-verl {verl_source}: not a bench steps file or a verl peer output "
                             "(JSON with a 'steps' list)")
        peer, src = steps_file(vpath, vsize, prompt_len)["peer"], str(verl_source)
        if not peer:
            raise ValueError(f"--calibrate-verl {verl_source}: no verl_separate_async step with train_spans")
    verl = None
    per_mode = dict(check["per_mode"])
    max_err = check["max_rel_error"]
    if peer:
        try:
            verl = fit_verl_trainer(peer, cal.trainer, src)
        except ValueError as e:
            raise ValueError(f"--calibrate {src}: {e}") from None
        modes["verl_separate_async"] = len(peer)
        vc = verl_check(peer, cal.engine_for("verl_separate_async"), verl, shape)
        per_mode["verl_separate_async"] = {"mean_rel_error": vc["rel_error"], "max_rel_error": vc["rel_error"],
                                           "settings": 1, **vc}
        max_err = max(max_err, vc["rel_error"])
    return RunCalibration(cal, shape, train_gpus, sum(s["prompt_len"] for s in steps) / len(steps),
                          sum(s["weight_sync_s"] for s in steps) / len(steps), modes,
                          {"per_mode": per_mode, "max_rel_error": max_err}, verl)
