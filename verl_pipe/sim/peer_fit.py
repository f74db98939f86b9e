"""verl's on-policy separate_async peer in the simulator: what its own measured steps say that our runs cannot.

Pure (no Ray, no verl): reads the peer's recorded steps (``bench/peer``: metrics and trainer spans per step; its
requests' timings are not kept). Two mechanisms of verl's stack are calibrated on them, each from its own measured
quantity, never from the validated rollout→train end:

- **its rollout's speed.** verl's agent loop (one worker process: each request's chat template, tokenization,
  reward and TransferQueue hand-off) and its TransferQueue actors share the host with vLLM, so verl's rollout runs
  slower than ours on the same engine (its last response after cgp's on the same workloads: docs/peer.md).
  ``engine_scale`` multiplies the engine's step and prefill costs (our engine
  fitted beside a busy trainer) so that the simulated peer's rollout figures (first unit ready, group completion
  p50 and p90, last response) match the measured ones in the log least-squares sense;
- **the gap inside a mini-step**: verl computes advantages and hands the batch over between a mini-step's
  old-log-prob and update calls; ``ministep_gap_s`` is the mean gap in the peer's recorded spans.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from verl_pipe.sim.engine import EngineParams

ROLLOUT_FIGURES = ("first_unit_ready_s", "group_done_p50_s", "group_done_p90_s", "rollout_end_s")
SCALE_RANGE = (0.5, 4.0)


@dataclass(frozen=True)
class PeerFit:
    engine_scale: float  # the peer's engine step and prefill costs over our overlapped engine's
    ministep_gap_s: float  # between a mini-step's old-log-prob end and its update start
    steps: int  # peer steps fitted on

    def summary(self) -> dict:
        return {"engine_scale": self.engine_scale, "ministep_gap_s": self.ministep_gap_s, "steps": self.steps}


def ministep_gap(peer_steps: list[dict]) -> float:
    """Mean gap between each mini-step's old-log-prob end and the same mini-step's update start (0 without any)."""
    gaps = []
    for st in peer_steps:
        ends = {sp["unit"]: sp["end"] for sp in st.get("train_spans") or [] if sp["kind"] == "old_log_prob"}
        gaps += [sp["start"] - ends[sp["unit"]] for sp in st.get("train_spans") or []
                 if sp["kind"] == "update" and sp["unit"] in ends and sp["start"] >= ends[sp["unit"]]]
    return sum(gaps) / len(gaps) if gaps else 0.0


def scaled(engine: EngineParams, scale: float) -> EngineParams:
    """``engine`` with its step and prefill costs ``scale`` times as long."""
    if scale <= 0:
        raise ValueError(f"engine scale must be > 0, got {scale}")
    return engine.with_(t0_s=engine.t0_s * scale, per_seq_s=engine.per_seq_s * scale,
                        bw_eff_Bps=engine.bw_eff_Bps / scale, prefill_flops_per_s=engine.prefill_flops_per_s / scale)


def rollout_misfit(peer_steps: list[dict], simulate: Callable[[dict, EngineParams], dict],
                   engine: EngineParams) -> float:
    """Sum over the steps and ``ROLLOUT_FIGURES`` of log(simulated / measured)^2 (figures > 0 on both sides)."""
    err = 0.0
    for st in peer_steps:
        sim = simulate(st, engine)
        for k in ROLLOUT_FIGURES:
            m, p = float(st["metrics"].get(k) or 0.0), float(sim.get(k) or 0.0)
            if m > 0 and p > 0:
                err += math.log(p / m) ** 2
    return err


def fit_engine_scale(peer_steps: list[dict], simulate: Callable[[dict, EngineParams], dict], engine: EngineParams,
                     tol: float = 0.005) -> float:
    """The scale in ``SCALE_RANGE`` that minimizes ``rollout_misfit`` (golden-section search on log scale)."""
    lo, hi = math.log(SCALE_RANGE[0]), math.log(SCALE_RANGE[1])
    f = lambda x: rollout_misfit(peer_steps, simulate, scaled(engine, math.exp(x)))  # noqa: E731
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    while hi - lo > tol:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
    return math.exp((lo + hi) / 2)


def fit_peer(peer_steps: list[dict], simulate: Callable[[dict, EngineParams], dict],
             engine: EngineParams) -> PeerFit | None:
    """The peer's mechanisms from its steps (None without any). ``simulate(step, engine)``: the simulated metrics of
    a peer step on ``engine`` (with the gap already in the trainer it uses)."""
    if not peer_steps:
        return None
    return PeerFit(fit_engine_scale(peer_steps, simulate, engine), ministep_gap(peer_steps), len(peer_steps))
