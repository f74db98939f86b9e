"""``--calibrate LOG`` on what a plain verl run leaves: its per-step metrics, not our step records.

verl's trainer logs one dict of metrics per step through ``verl.utils.tracking.Tracking``:

- the console logger (``trainer.logger=['console']``, ``verl.utils.logger.aggregate_logger.LocalLogger``) prints
  ``concat_dict_to_str``: ``step:N - key:value - key:value ...`` with each value ``pprint.pformat``-ed (numpy
  scalars appear as ``np.float64(1.5)``). From a Ray job the line carries the actor's prefix
  (``(TaskRunner pid=123) step:1 - ...``, ANSI-coloured on a terminal);
- the file logger (``trainer.logger=['file']``, ``FileLogger``): one JSON line per step, ``{"step": N, "data":
  {...}}`` (orjson; NaN is written as null), at ``$VERL_FILE_LOGGER_PATH`` or
  ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``.

What a step's metrics say (``verl.trainer.ppo.metric_utils``): ``timing_s/gen`` (the rollout, the engines' sleep
after it included), ``timing_s/old_log_prob`` (one whole-batch call), ``timing_s/update_actor`` (every mini-batch's
forward, backward and optimizer step), ``response_length/{mean,max,clip_ratio}``, ``prompt_length/mean`` and
``perf/{total_num_tokens,time_per_step,throughput}`` (tokens / (step seconds x GPUs): the run's GPU count). No
per-request or per-group lengths and no per-call spans: the fit is a scale on the hardware profile's cost model per
figure the log measures — the engine's decode speed (``timing_s/gen`` against the profile's simulated rollout of
the assumed lengths), the trainer's cost per token (``timing_s/update_actor``) and the old-log-prob to update ratio
(``timing_s/old_log_prob``). What the log cannot tell (the decode step's split between fixed and per-token cost,
the KV capacity, θ_k copies, the weight sync over separate pools, an engine slowed by a busy trainer) stays the
profile's; the plan's notes list both. Lengths are assumed: a log-normal with each step's mean and, pooled over
steps, the σ whose expected batch maximum is the logged ``response_length/max`` (ρ 0.7 assumed, the planner's
default); each step's draws have its logged mean, and none is longer than its logged maximum, one as long.

verl's sync trainer (``main_ppo``) colocates rollout and training on the same GPUs: the run's N GPUs (from
``perf/throughput``, else ``global_seqlen/mean``'s data-parallel ranks) are taken as N / TP rollout replicas and N
trainer GPUs unless ``--calibrated-rollout-gpus`` / ``--calibrated-train-gpus`` say otherwise (a separated-pools
run); such a run's ``timing_s/update_weights`` is the reload into its sleeping engines (verl_pipe/sim/colocated.py),
and the engines' sleep (the profile's) is taken out of ``timing_s/gen`` before the engine's fit.

The same log is a ``--lengths`` source (``lengths_spec``: the fitted log-normal) and gives the plan the run's
prompt length, responses per step and GPU count (``read_run``); what it lacks, a flag supplies (``SUPPLIED_BY``),
and a refusal names both. Logs of verl's asynchronous trainers
(one-step-off, separate_async, fully_async: their ``timing_s/gen`` waits on a rollout that overlapped the last
step) are refused.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

TIMING = ("timing_s/gen", "timing_s/update_actor")  # what the log measures: no flag supplies them
LENGTH_KEYS = ("response_length/mean", "response_length/max")
PROMPT_KEY = "prompt_length/mean"
SUPPLIED_BY = {"response_length/mean": "--lengths SPEC supplies the lengths",
               "response_length/max": "--lengths SPEC supplies the lengths",
               "prompt_length/mean": "--prompt-len N supplies it"}
REQUIRED = TIMING + LENGTH_KEYS + (PROMPT_KEY,)
OPTIONAL = ("timing_s/old_log_prob", "perf/total_num_tokens", "perf/time_per_step", "perf/throughput",
            "response_length/clip_ratio", "timing_s/update_weights", "timing_s/ref", "timing_s/step",
            "global_seqlen/mean")
# keys only verl's asynchronous trainers log: their timing_s/gen is a wait, not a rollout
ASYNC_KEYS = ("timing_s/generate_async", "timing_s/sync_rollout_weights", "timing_s/switch_to_trainer",
              "timing_s/switch_wait", "timing_s/switch_to_rollout", "timing_s/wait_for_enough_samples")
ASSUMED_RHO = 0.7  # within-group correlation of log-lengths: the planner's default (docs/sim_sources.md §1b)
MAX_FIT_STEPS = 8  # evenly spaced over the run; bounds the fit's time (docs/plan.md, "Calibrating on verl's own log")

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LINE = re.compile(r"(?:^|[\s)\]])step:(\d+) - (.*)$")
_NP = re.compile(r"^(?:np|numpy)\.[A-Za-z0-9_]+\((.*)\)$")
_LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".jsonl")


# ------------------------------------------------------------------------------------------------ reading

def parse_value(text: str) -> float | None:
    """One ``pprint.pformat`` number as verl's console logger prints it (``1.5``, ``nan``, ``np.float64(1.5)``,
    ``True``), else None."""
    t = text.strip()
    m = _NP.match(t)
    if m:
        t = m.group(1).strip()
    if t in ("True", "False"):
        return float(t == "True")
    try:
        return float(t)
    except ValueError:
        return None


def parse_line(raw: str) -> tuple[int, dict[str, float]] | None:
    """(step, metrics) of one console line ``step:N - key:value - ...`` (an actor prefix and ANSI colours allowed),
    else None."""
    m = _LINE.search(_ANSI.sub("", raw).rstrip())
    if not m:
        return None
    got: dict[str, float] = {}
    for part in m.group(2).split(" - "):
        key, sep, val = part.rpartition(":")
        if sep and key.strip():
            v = parse_value(val)
            if v is not None:
                got[key.strip()] = v
    return int(m.group(1)), got


def parse_console(text: str) -> dict[int, dict[str, float]]:
    """{step: metrics} from console output; a step logged on several lines (verl logs validation metrics on a line
    of their own) is merged."""
    steps: dict[int, dict[str, float]] = {}
    for raw in text.splitlines():
        parsed = parse_line(raw)
        if parsed is not None:
            steps.setdefault(parsed[0], {}).update(parsed[1])
    return steps


def parse_file_logger(text: str, where: str = "") -> dict[int, dict[str, float]]:
    """{step: metrics} from verl's FileLogger JSONL (``{"step": N, "data": {...}}`` per line)."""
    steps: dict[int, dict[str, float]] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: line {i} is not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or "step" not in rec or not isinstance(rec.get("data"), dict):
            raise ValueError(f"{where}: line {i} is not verl's file logger record ({{\"step\": N, \"data\": {{...}}}})")
        got = steps.setdefault(int(rec["step"]), {})
        for k, v in rec["data"].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                got[str(k)] = float(v)
    return steps


def _is_file_logger(text: str) -> bool:
    for line in text.splitlines():
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                return False
            return isinstance(rec, dict) and "step" in rec and isinstance(rec.get("data"), dict)
    return False


def read_file(path: Path) -> tuple[dict[int, dict[str, float]], str]:
    """(steps, "file logger" | "console") of one file."""
    text = path.read_text(errors="replace")
    if _is_file_logger(text):
        return parse_file_logger(text, str(path)), "file logger"
    return parse_console(text), "console"


def _candidates(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(_LOG_SUFFIXES)
                      and p.name != "steps.jsonl")
    return []


def read_log(path, flag: str = "--calibrate") -> tuple[dict[int, dict[str, float]], str, Path]:
    """(steps, kind, file) of a verl log: a file, or the folder holding one (the file with most training steps,
    the file logger's JSONL preferred on a tie: it keeps full precision). ``flag``: the option that named it, for
    the messages."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ValueError(f"{flag} {path}: no such file or folder")
    best = None
    for f in _candidates(path):
        try:
            steps, kind = read_file(f)
        except (ValueError, UnicodeDecodeError, OSError):
            if path.is_file():
                raise
            continue
        score = (sum(1 for m in steps.values() if any(k.startswith("timing_s/") for k in m)),
                 kind == "file logger", len(steps))
        if best is None or score > best[0]:
            best = (score, steps, kind, f)
    if best is None or not best[1]:
        raise ValueError(f"{flag} {path}: no verl metric lines in it (verl's console logger prints "
                         "'step:N - key:value - ...', trainer.logger=['file'] writes {\"step\": N, \"data\": {...}} "
                         "JSONL)")
    return best[1], best[2], best[3]


def is_verl_log(arg) -> bool:
    """Whether ``--calibrate ARG`` (or ``--lengths ARG``) is a verl log rather than our run (a trace_dir with
    steps.jsonl, a bench steps file): a file or folder holding verl's metric lines (``step:N - key:value``, or the
    file logger's records) with keys of verl's trainer (``timing_s/``, ``response_length/``, ``perf/``,
    ``training/``). A log with none of the keys a fit needs is still verl's: its refusal names them."""
    path = Path(str(arg)).expanduser()
    if not path.exists() or (path.is_dir() and (path / "steps.jsonl").exists()):
        return False
    if path.is_file() and (path.name == "steps.jsonl" or path.name.endswith((".json", ".json.gz"))):
        return False
    try:
        steps, _, _ = read_log(path)
    except (ValueError, OSError):
        return False
    return any(any(k.startswith(("timing_s/", "response_length/", "perf/", "training/")) for k in m)
               for m in steps.values())


# ------------------------------------------------------------------------------------------------ the fit

def scale_engine(e, s: float):
    """The engine with every decode and prefill cost ``s`` times the profile's (its step time is exactly x s)."""
    return e.with_(t0_s=e.t0_s * s, per_seq_s=e.per_seq_s * s, bw_eff_Bps=e.bw_eff_Bps / s,
                   prefill_flops_per_s=e.prefill_flops_per_s / s)


def _draw(num_groups: int, n: int, mean_param: float, sigma: float, cap: int, prompt: int, seed: int):
    from verl_pipe.core.workload import lognormal

    return lognormal(num_groups, n, sigma=sigma, rho=ASSUMED_RHO, cap=cap, prompt_len=prompt, seed=seed,
                     mean=max(mean_param, 1.0))


def matched_draw(target_mean: float, num_groups: int, n: int, sigma: float, cap: int, prompt: int, seed: int):
    """A draw (seed ``seed``) whose capped lengths average ``target_mean``: the log-normal's uncapped mean is
    rescaled until they do (the same seed's lengths all scale together), so a draw's mean is the logged one."""
    mp = float(target_mean)
    for _ in range(8):
        wl = _draw(num_groups, n, mp, sigma, cap, prompt, seed)
        got = float(np.mean(wl.lengths))
        if got <= 0 or abs(got / target_mean - 1) < 2e-3:
            break
        mp *= target_mean / got
    return wl, mp


def pin_max(wl, batch_max: int):
    """The draw with its longest response set to the logged batch maximum (the rollout's tail is its longest
    request; the log measures it)."""
    x = np.asarray(wl.lengths)
    g, i = np.unravel_index(int(np.argmax(x)), x.shape)
    x[g, i] = max(1, batch_max)
    return replace(wl, lengths=x.tolist())


def fit_sigma(mean: float, batch_max: float, num_groups: int, n: int, cap: int, seeds=(0, 1, 2)) -> float:
    """The σ whose draws (each of mean ``mean``, capped at ``cap``) have a batch maximum closest to ``batch_max``."""
    best = None
    for sigma in np.arange(0.05, 2.001, 0.05):
        mx = np.mean([np.max(matched_draw(mean, num_groups, n, float(sigma), cap, 0, s)[0].lengths) for s in seeds])
        err = abs(math.log(mx / batch_max))
        if best is None or err < best[0]:
            best = (err, float(sigma))
    return best[1]


@dataclass
class LogRun:
    """What verl's log says about the run it logged, before any profile: the steps a fit uses and the run's shape
    (``read_run``)."""

    source: str
    kind: str  # console | file logger
    flag: str  # the option that named the log (--calibrate, --calibrate-verl-log, --lengths)
    steps: list[int]  # the steps a fit uses
    steps_in_log: int
    warmup_left_out: bool  # the first training step was left out (False: the log's only one, warm-up included)
    metrics: list[dict]  # the used steps' metrics
    prompt_len: float | None  # prompt_length/mean over the used steps
    rows: int | None  # responses per step (perf/total_num_tokens / (prompt + response mean))
    gpus: int | None  # the run's GPU count
    gpus_from: str
    update_weights_s: float | None  # timing_s/update_weights: a colocated run's reload into the sleeping engines

    @property
    def has_lengths(self) -> bool:
        return all(k in m for m in self.metrics for k in LENGTH_KEYS)


@dataclass
class LogFit:
    """What verl's log fitted, as scales on the hardware profile's cost model."""

    source: str
    kind: str  # console | file logger
    profile: str
    steps: list[int]  # the steps fitted on
    steps_in_log: int
    rows: int  # responses per step
    num_groups: int
    n: int
    rollout_gpus: int
    train_gpus: int
    gpus_from: str
    prompt_len: float
    lengths: dict  # the assumed distribution: {kind, mean (per-step mean of means), sigma, rho, cap, ...}
    engine_scale: float  # decode/prefill step time over the profile's
    trainer_scale: float  # update (forward, backward, optimizer step) time over the profile's
    logprob_ratio: float  # old-log-prob per token over an update's
    logprob_from: str  # "log" | "profile"
    measured: dict  # means over the fitted steps of the log's figures
    profile_predicted: dict  # the same figures by the profile, unscaled
    self_check: dict  # per figure, the fit's error on each fitted step (max, mean abs)
    notes: list[str] = field(default_factory=list)
    warmup_left_out: bool = True
    flag: str = "--calibrate"
    colocated: bool = True  # the logged run took turns on its GPUs (verl's main_ppo default)
    sleep_s: float = 0.0  # the engines' sleep taken out of timing_s/gen before the engine fit (colocated runs)
    update_weights_s: float | None = None  # the log's timing_s/update_weights
    replicas: int = 0  # the logged run's engine replicas (rollout GPUs / TP)

    def summary(self) -> dict:
        out = asdict(self)
        out["from_log"] = ["engine decode speed (timing_s/gen)", "trainer update cost (timing_s/update_actor)"] + (
            ["old log-prob cost (timing_s/old_log_prob)"] if self.logprob_from == "log" else []) + (
            ["colocated weight reload (timing_s/update_weights)"] if self.colocated and self.update_weights_s
            else [])
        out["from_profile"] = (["old log-prob cost"] if self.logprob_from == "profile" else []) + [
            "decode step's fixed vs per-token split and KV capacity", "trainer cost's split over micro-batches, "
            "calls and GPU count (MFU model)", "theta_k / pi_old copies", "weight sync", "engine beside a busy "
            "trainer (same as alone)", "the engines' sleep (colocated)"]
        out["assumed"] = ["response lengths: log-normal fitted to response_length/mean and /max, rho "
                          f"{ASSUMED_RHO} (no per-group lengths in the log)"]
        return out


def _pick_steps(steps: dict[int, dict[str, float]]) -> tuple[list[int], bool]:
    """The training steps a fit uses, evenly spread over the run, and whether the first was left out (the engines'
    warm-up: graph capture, first compile) — not when it is the log's only one."""
    train = sorted(s for s, m in steps.items() if "timing_s/gen" in m or "timing_s/update_actor" in m)
    left_out = len(train) > 1
    if left_out:
        train = train[1:]
    if len(train) > MAX_FIT_STEPS:
        idx = np.linspace(0, len(train) - 1, MAX_FIT_STEPS).round().astype(int)
        train = [train[i] for i in sorted(set(idx))]
    return train, left_out


def _mean(xs) -> float:
    return float(np.mean(list(xs)))


def required_keys(need_lengths: bool = True, need_prompt: bool = True) -> tuple[str, ...]:
    """The keys each fitted step must have: the timings always; the lengths unless ``--lengths`` gives them; the
    prompt length unless ``--prompt-len`` does."""
    return TIMING + (LENGTH_KEYS if need_lengths else ()) + ((PROMPT_KEY,) if need_prompt else ())


def _refuse_missing(steps: dict, kind: str, where: str, need: tuple[str, ...]) -> None:
    train = [s for s, m in steps.items() if any(k.startswith("timing_s/") for k in m)]
    have = set().union(*(steps[s] for s in train)) if train else set().union(*steps.values())
    missing = [k for k in need if k not in have]
    what = ", ".join(f"{k} ({SUPPLIED_BY.get(k, 'no flag supplies it: the log must have it')})" for k in missing)
    if not missing:
        what = "all of " + ", ".join(need) + " on the same step"
    raise ValueError(f"{where}: verl's {kind} log has {len(steps)} step record(s), {len(train)} with timing_s/* "
                     f"keys, but none with {what}; the fit needs {', '.join(need)} on each step (verl's trainer "
                     "logs them every step: pass the console output or trainer.logger=['console','file']'s JSONL)")


def _refuse_async(steps: dict, where: str) -> None:
    present = set().union(*steps.values())
    async_keys = sorted(k for k in present if k in ASYNC_KEYS or k.startswith("fully_async/"))
    if async_keys:
        raise ValueError(f"{where}: a log of verl's asynchronous trainer ({', '.join(async_keys[:3])}): its "
                         "timing_s/gen waits on a rollout that overlapped the previous step, not the rollout's time; "
                         "calibrate on a synchronous run's log (main_ppo, or the separation trainer)")


def _rows(M: list[dict], prompt: float | None) -> int | None:
    """Responses per step: the tokens verl counted over each response's prompt + response mean."""
    if prompt is None or not all("perf/total_num_tokens" in m and "response_length/mean" in m for m in M):
        return None
    return int(round(_mean(m["perf/total_num_tokens"] / (prompt + m["response_length/mean"]) for m in M)))


def _gpus(M: list[dict]) -> tuple[int | None, str]:
    """The run's GPU count: perf/throughput is tokens / (step seconds x GPUs) (``compute_throughout_metrics``);
    else the actor's data-parallel ranks, tokens / global_seqlen/mean (``_balance_batch``'s
    ``log_seqlen_unbalance``: the mean is per DP rank; FSDP without sequence parallelism: one rank per GPU)."""
    per = [m["perf/total_num_tokens"] / (m.get("perf/time_per_step") or m.get("timing_s/step") or math.nan)
           / m["perf/throughput"] for m in M
           if m.get("perf/throughput", 0) > 0 and "perf/total_num_tokens" in m]
    per = [x for x in per if math.isfinite(x)]
    if per:
        return max(1, int(round(float(np.median(per))))), "perf/throughput"
    dp = [m["perf/total_num_tokens"] / m["global_seqlen/mean"] for m in M
          if m.get("global_seqlen/mean", 0) > 0 and "perf/total_num_tokens" in m]
    if dp:
        return max(1, int(round(float(np.median(dp))))), "global_seqlen/mean (the actor's data-parallel ranks)"
    return None, "the config"


def read_run(path, flag: str = "--calibrate", *, need_lengths: bool = True, need_prompt: bool = True) -> LogRun:
    """The log at ``path`` as a run: the steps a fit uses (each with every key ``required_keys`` names) and what the
    log says of the run's shape. Refuses an asynchronous trainer's log, and a log without the keys, naming each
    missing key and the flag that supplies it."""
    steps, kind, file = read_log(path, flag)
    where = f"{flag} {file}"
    _refuse_async(steps, where)
    need = required_keys(need_lengths, need_prompt)
    picked, left_out = _pick_steps(steps)
    used = [s for s in picked if all(k in steps[s] for k in need)]
    if not used:
        _refuse_missing(steps, kind, where, need)
    M = [steps[s] for s in used]
    prompt = _mean(m[PROMPT_KEY] for m in M) if all(PROMPT_KEY in m for m in M) else None
    gpus, gpus_from = _gpus(M)
    uw = _mean(m["timing_s/update_weights"] for m in M) if all("timing_s/update_weights" in m for m in M) else None
    return LogRun(str(file), kind, flag, used, len(steps), left_out, M, prompt, _rows(M, prompt), gpus, gpus_from,
                  uw)


def _run_rows(run: LogRun, shape, notes: list[str]) -> tuple[int, int]:
    """Responses per step (from perf/total_num_tokens, else the config's) and the groups of the config's n."""
    rows = run.rows
    if rows is None:
        rows = shape.num_groups * shape.n
        notes.append(f"no perf/total_num_tokens: the log's run taken to have the config's {rows} responses per step")
    n = shape.n
    num_groups = max(1, int(round(rows / n)))
    if num_groups * n != rows:
        notes.append(f"the log's {rows} responses per step are not a multiple of the config's n={n}: fitted as "
                     f"{num_groups} groups of {n}")
    return rows, num_groups


def _run_gpus(run: LogRun, shape, rollout_gpus: int | None, train_gpus: int | None) -> tuple[int, int, str]:
    """Rollout and trainer GPUs of the logged run: the flags, else its GPU count (colocated: all roll out, all
    train), else the config's; and where they came from."""
    gpus, gpus_from = run.gpus, run.gpus_from + ("; colocated: all roll out" if run.gpus else "")
    r_gpus = rollout_gpus or gpus or shape.rollout_gpus
    t_gpus = train_gpus or gpus or shape.train_gpus
    if rollout_gpus or train_gpus:
        gpus_from = "--calibrated-rollout-gpus / --calibrated-train-gpus" + (f", else {gpus_from}" if gpus else "")
    return r_gpus, t_gpus, gpus_from


def assumed_lengths(M: list[dict], cap_default: int, num_groups: int, n: int) -> dict:
    """The log-normal lengths assumed from the steps' response_length/mean and /max: σ fitted so that a batch of
    ``num_groups`` x ``n`` has the logged maximum, capped at the logged maximum where the log clipped."""
    clipped = any(m.get("response_length/clip_ratio", 0.0) > 0 for m in M)
    top = max(m["response_length/max"] for m in M)
    cap = int(round(top)) if clipped else int(max(cap_default, top))
    sigma = fit_sigma(_mean(m["response_length/mean"] for m in M), _mean(m["response_length/max"] for m in M),
                      num_groups, n, cap, seeds=tuple(range(3)))
    return {"kind": "lognormal", "mean_of_step_means": _mean(m["response_length/mean"] for m in M),
            "mean_of_step_max": _mean(m["response_length/max"] for m in M), "sigma": sigma, "rho": ASSUMED_RHO,
            "cap": cap, "cap_from": "response_length/max (clip_ratio > 0)" if clipped else
            "max(data.max_response_length, the logged max)"}


def _assumed_lengths(M: list[dict], shape, num_groups: int, n: int) -> dict:
    return assumed_lengths(M, shape.max_response_length, num_groups, n)


def uncapped_mean(lengths: dict, num_groups: int, n: int) -> float:
    """The log-normal's mean parameter whose capped draws average the logged mean (a ``--lengths`` spec's mean)."""
    return float(np.mean([matched_draw(lengths["mean_of_step_means"], num_groups, n, lengths["sigma"],
                                       lengths["cap"], 0, s)[1] for s in range(3)]))


def lengths_spec(path, n: int, cap_default: int, flag: str = "--lengths") -> tuple[dict, float | None, str]:
    """``--lengths LOG``: the length distribution a verl log implies (``assumed_lengths``) as a spec the planner
    draws from, the log's mean prompt length, and a description."""
    run = read_run(path, flag, need_prompt=False)
    rows = run.rows or 0
    num_groups = max(1, int(round(rows / n))) if rows else 128
    L = assumed_lengths(run.metrics, cap_default, num_groups, n)
    mean = uncapped_mean(L, num_groups, n)
    spec = {"kind": "lognormal", "mean": mean, "sigma": L["sigma"], "rho": L["rho"], "cap": L["cap"],
            "rho_assumed": True}
    desc = (f"verl log {run.source} (log-normal fitted to response_length/mean {L['mean_of_step_means']:.0f} and "
            f"/max {L['mean_of_step_max']:.0f} over {len(run.steps)} step(s): "
            f"lognormal:mean={mean:.0f},sigma={L['sigma']:.2f},rho={L['rho']},cap={L['cap']})")
    return spec, run.prompt_len, desc


def _simulated_step(m: dict, j: int, ctx: dict, seed: int) -> tuple[float, float, float]:
    """One draw of fitted step ``j``'s assumed workload on the profile: (rollout end, update seconds, old-log-prob
    seconds at ratio 1)."""
    from verl_pipe.sim.calib import PaddedWorkload
    from verl_pipe.sim.simulate import rollout_for_mode, timeline_for

    shape, lengths, trainer = ctx["shape"], ctx["lengths"], ctx["trainer"]
    prompt = int(round(m.get(PROMPT_KEY) or ctx["prompt_len"]))
    if "response_length/mean" in m and lengths is not None:
        top = int(round(m["response_length/max"]))  # no response of the step was longer, one was as long
        wl, _ = matched_draw(m["response_length/mean"], ctx["num_groups"], shape.n, lengths["sigma"],
                             min(lengths["cap"], top), prompt, 1000 + 101 * j + seed)
        wl = pin_max(wl, top)
    else:  # the log has no lengths: drawn from --lengths
        wl = ctx["user_lengths"].workload(ctx["num_groups"], shape.n, shape.max_response_length, prompt,
                                          1000 + 101 * j + seed)
    if shape.padded:
        wl = PaddedWorkload(wl.num_groups, wl.n, wl.lengths, wl.prompt_len, wl.name)
    ro = rollout_for_mode("sync", wl, ctx["engine"], ctx["replicas"], ctx["gpu"], shape.dispatch_window,
                          shape.dispatch_order)
    spans = timeline_for(ro, wl, trainer, "sync", ctx["gpu"], 0.0).to_dict()["train_spans"]
    return (ro.rollout_end,
            sum(sp["end"] - sp["start"] for sp in spans if sp["kind"] in ("update", "optimizer_step")),
            sum(sp["end"] - sp["start"] for sp in spans if sp["kind"] == "old_log_prob") / trainer.logprob_ratio)


def _simulated_steps(M: list[dict], ctx: dict, seeds) -> np.ndarray:
    """Per fitted step, the profile's (gen, update, logprob at ratio 1), means over ``seeds``: other draws for each
    step, so the draws' own noise averages out over the steps."""
    sim = []
    for j, m in enumerate(M):
        g = u = lp = 0.0
        for seed in seeds:
            dg, du, dlp = _simulated_step(m, j, ctx, seed)
            g += dg
            u += du
            lp += dlp
        k = len(seeds)
        sim.append((g / k, u / k, lp / k))
    return np.asarray(sim)


def _errs(meas, pred) -> dict:
    e = (np.asarray(pred) - np.asarray(meas)) / np.asarray(meas)
    return {"max_abs_rel_error": float(np.max(np.abs(e))), "mean_abs_rel_error": float(np.mean(np.abs(e)))}


def _scales(M: list[dict], S: np.ndarray, r0: float, notes: list[str], sleep_s: float = 0.0
            ) -> tuple[float, float, float, str, dict]:
    """The engine and trainer scales and the old-log-prob ratio (the log's, else the profile's ``r0``) fitted on
    the simulated steps ``S``, and the fit's error per figure on each step. ``sleep_s``: the part of each
    timing_s/gen that is the engines' sleep, not the rollout (a colocated run)."""
    gen = np.asarray([m["timing_s/gen"] for m in M]) - sleep_s
    upd = np.asarray([m["timing_s/update_actor"] for m in M])
    s_eng = float(gen.sum() / S[:, 0].sum())
    s_tr = float(upd.sum() / S[:, 1].sum())
    has_lp = all("timing_s/old_log_prob" in m for m in M)
    if has_lp:
        lpm = np.asarray([m["timing_s/old_log_prob"] for m in M])
        ratio, lp_from = float(lpm.sum() / (s_tr * S[:, 2].sum())), "log"
    else:
        ratio, lp_from = r0, "profile"
        notes.append("no timing_s/old_log_prob (bypass mode, or not logged): the old-log-prob cost is the profile's "
                     f"ratio {r0:.2f} of an update")
    check = {"timing_s/gen": _errs(gen + sleep_s, s_eng * S[:, 0] + sleep_s),
             "timing_s/update_actor": _errs(upd, s_tr * S[:, 1])}
    if has_lp:
        check["timing_s/old_log_prob"] = _errs(lpm, ratio * s_tr * S[:, 2])
    return s_eng, s_tr, ratio, lp_from, check


def _unused_notes(shape, measured: dict, colocated: bool, notes: list[str]) -> None:
    """What the log has but the plan does not take from it."""
    if shape.use_ref and "timing_s/ref" not in measured:
        notes.append("the config computes a reference log-prob (KL loss), the log's run did not (no timing_s/ref): "
                     "it is costed as an old-log-prob call")
    if "timing_s/update_weights" in measured and not colocated:
        notes.append(f"the log's timing_s/update_weights ({measured['timing_s/update_weights']:.2f} s) is not used: "
                     "the weight sync between separate pools is the profile's")


def fit_log(path, shape, hw, model, *, rollout_gpus: int | None = None, train_gpus: int | None = None,
            seeds=(0, 1), flag: str = "--calibrate", run: LogRun | None = None, user_lengths=None,
            prompt_len: float | None = None) -> LogFit:
    """Fit the engine and trainer scales on verl's log at ``path`` (or its ``run``, read already). ``shape``: the
    planned config's shape, whose n, mini-batch, engine slots and trainer settings the log's run is taken to share
    (the log does not say them); ``hw``/``model``: the profile the scales apply to. ``user_lengths`` (``--lengths``)
    and ``prompt_len`` (``--prompt-len``) stand in for what the log lacks. A run on verl's colocated hybrid engine
    (unless ``rollout_gpus``/``train_gpus`` say separate pools): the profile's sleep is taken out of
    ``timing_s/gen`` before the engine's fit, and ``timing_s/update_weights`` is its weight reload."""
    if run is None:
        run = read_run(path, flag, need_lengths=user_lengths is None, need_prompt=prompt_len is None)
    M = run.metrics
    notes: list[str] = []
    colocated = not (rollout_gpus or train_gpus)
    prompt = run.prompt_len if run.prompt_len is not None else float(prompt_len)
    rows, num_groups = _run_rows(run, shape, notes)
    r_gpus, t_gpus, gpus_from = _run_gpus(run, shape, rollout_gpus, train_gpus)
    lengths = _assumed_lengths(M, shape, num_groups, shape.n) if run.has_lengths else None
    # the profile's figures for each fitted step's assumed workload
    resident = hw.colocated_resident_bytes(model, t_gpus) if colocated else 0.0  # the trainer's states beside it
    engine = hw.engine(model, max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                       gpu_memory_utilization=shape.gpu_memory_utilization, tp=shape.tp, resident_bytes=resident)
    trainer = hw.trainer(model, gpus=t_gpus, recompute=shape.recompute,
                         max_tokens_per_microbatch=shape.max_tokens_per_microbatch, use_ref=shape.use_ref,
                         placement="device")
    r0 = trainer.logprob_ratio
    ctx = {"shape": shape, "lengths": lengths, "engine": engine, "trainer": trainer, "num_groups": num_groups,
           "replicas": max(1, r_gpus // shape.tp), "gpu": min(shape.groups_per_unit, num_groups),
           "user_lengths": user_lengths, "prompt_len": prompt}
    S = _simulated_steps(M, ctx, seeds)
    sleep_s = hw.engine_sleep_s.v if colocated else 0.0
    sleep_s = min(sleep_s, 0.5 * min(m["timing_s/gen"] for m in M))
    s_eng, s_tr, ratio, lp_from, check = _scales(M, S, r0, notes, sleep_s)
    keys = TIMING + LENGTH_KEYS + (PROMPT_KEY,) + OPTIONAL
    measured = {k: _mean(m[k] for m in M) for k in keys if all(k in m for m in M)}
    predicted = {"timing_s/gen": float(S[:, 0].mean()), "timing_s/update_actor": float(S[:, 1].mean()),
                 "timing_s/old_log_prob": float(r0 * S[:, 2].mean()), "logprob_ratio": r0}
    _unused_notes(shape, measured, colocated, notes)
    if lengths is None:
        lengths = {"kind": "from --lengths", "sigma": float("nan"), "rho": float("nan"),
                   "cap": shape.max_response_length, "mean_of_step_means": float("nan"),
                   "mean_of_step_max": float("nan")}
    return LogFit(run.source, run.kind, hw.name, run.steps, run.steps_in_log, rows, num_groups, shape.n, r_gpus,
                  t_gpus, gpus_from, prompt, lengths, s_eng, s_tr, ratio, lp_from, measured, predicted, check, notes,
                  warmup_left_out=run.warmup_left_out, flag=run.flag, colocated=colocated, sleep_s=sleep_s,
                  update_weights_s=run.update_weights_s, replicas=max(1, r_gpus // shape.tp))


# ------------------------------------------------------------------------------------------------ the costs

def log_notes(fit: LogFit) -> list[str]:
    """What the plan prints about a log calibration: which costs came from the log, which from the profile, what
    was assumed."""
    L, chk = fit.lengths, fit.self_check
    lp = (f"old log-prob {fit.logprob_ratio:.2f}x an update's cost per token (timing_s/old_log_prob; the profile's "
          f"{fit.profile_predicted['logprob_ratio']:.2f})" if fit.logprob_from == "log"
          else "old log-prob: the profile's ratio (not in the log)")
    err = ", ".join(f"{k} {100 * v['max_abs_rel_error']:.0f}%" for k, v in chk.items())
    n_steps = len(fit.steps)
    which = (f"{n_steps} of its {fit.steps_in_log} steps, the first left out as warm-up" if fit.warmup_left_out
             else f"its only training step, fitted with the engines' warm-up in it (a one-step log has no other; "
                  "a longer log fits without it)")
    gen = fit.measured["timing_s/gen"]
    sleep = (f", less the engines' sleep {fit.sleep_s:.1f} s (the profile's; colocated)" if fit.sleep_s else "")
    out = [
        f"costs from verl's {fit.kind} log {fit.source} ({which}): engine decode {fit.engine_scale:.2f}x the "
        f"{fit.profile} profile's step time (timing_s/gen {gen:.1f} s{sleep} vs "
        f"{fit.profile_predicted['timing_s/gen']:.1f} s simulated); trainer update {fit.trainer_scale:.2f}x the "
        f"profile's (timing_s/update_actor {fit.measured['timing_s/update_actor']:.1f} s vs "
        f"{fit.profile_predicted['timing_s/update_actor']:.1f} s); " + lp,
        f"costs from the {fit.profile} profile, not in verl's log: the decode step's split between fixed and "
        "per-token cost and the KV capacity, the trainer's split over micro-batches, calls and GPUs, theta_k / pi_old "
        "copies, the weight sync between pools; the engine beside a busy trainer is taken as fast as alone",
        f"the log's run: {fit.rows} responses per step as {fit.num_groups} prompts x {fit.n} (n from the config), "
        f"{fit.replicas or fit.rollout_gpus} rollout replicas"
        + (f" ({fit.rollout_gpus} GPUs)" if fit.replicas and fit.replicas != fit.rollout_gpus else "")
        + f" and {fit.train_gpus} trainer GPUs ({fit.gpus_from}); verl's trainer and ours are costed with the same fit "
        "(the same FSDP worker)",
    ]
    if fit.colocated and fit.update_weights_s:
        out.append(f"verl colocated: the weight reload into the sleeping engines is the log's timing_s/update_weights "
                   f"({fit.update_weights_s:.2f} s)")
    if L.get("kind") == "lognormal":
        out.append(
            f"lengths ASSUMED for the fit (verl's log has no per-group lengths): log-normal with each step's "
            f"response_length/mean (mean {L['mean_of_step_means']:.0f}), sigma {L['sigma']:.2f} fitted to "
            f"response_length/max (mean {L['mean_of_step_max']:.0f}), rho {L['rho']} assumed, cap {L['cap']}; to plan "
            f"with them: --lengths lognormal:mean={_uncapped_mean(fit):.0f},sigma={L['sigma']:.2f},rho={L['rho']},"
            f"cap={L['cap']} (or --lengths {fit.source})")
    else:
        out.append("lengths for the fit: drawn from --lengths (the log has no response_length/*)")
    out.append(f"the fit re-simulates the log's steps within {err} (in-sample; not validated against a held-out "
               "verl run)" + (" — one step: the fit reproduces it by construction" if n_steps == 1 else ""))
    return out + fit.notes


def _uncapped_mean(fit: LogFit) -> float:
    return uncapped_mean(fit.lengths, fit.num_groups, fit.n)
