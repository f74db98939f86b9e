"""The uncontended bound: the ideal step rebuilt with the sync run's own per-token trainer costs.

``pipeline_efficiency`` (docs/metrics.md) compares a step with a bound made of that step's own trainer time. Where the
trainer shares the host with the rollout's processes, overlapped work costs more per token than the same work after
the rollout (calib.trainer_cost_split), so a pipelined step can sit at its own bound while still paying that
contention. This bound charges all of a mode's trainer work at what sync pays after the rollout, where nothing runs
beside the trainer:

    bound = max(rollout_end + last unit's tokens x cost, first work + all tokens x cost)
    uncontended_efficiency = bound / rollout_to_train_end

Tokens are padded tokens (calib.padded_tokens) per cost family: an update (or group granularity's
forward_backward) costs sync's update rate, an old-log-prob call sync's old-log-prob rate. Spans without tokens (the
θ_k snapshot, an optimizer step recorded apart) are not charged: sync's update rate already carries its optimizer
steps, and sync takes no snapshot. Pure Python: it reads recorded step dicts only.
"""

from __future__ import annotations

import math

from verl_pipe.sim.calib import trainer_cost_split, trainer_span_records

# cost family of each calib span key: the family's rate is what sync paid for it after the rollout
FAMILY = {"update": "update", "forward_backward": "update", "old_log_prob": "old_log_prob",
          "old_log_prob_swapped": "old_log_prob"}


def uncontended_bound_s(rollout_end_s: float, first_work_s: float, last_unit_tokens: dict[str, float],
                        all_tokens: dict[str, float], s_per_1k_tokens: dict[str, float]) -> float:
    """max(rollout_end_s + last unit's work, first_work_s + all work), work = tokens x seconds per 1k tokens, per
    cost family. A family with tokens but no rate gives NaN: the bound would be too low, not just imprecise."""
    def work(tokens: dict[str, float]) -> float:
        total = 0.0
        for family, tok in tokens.items():
            if tok <= 0:
                continue
            rate = s_per_1k_tokens.get(family)
            if rate is None or math.isnan(rate):
                return math.nan
            total += tok * rate / 1000.0
        return total

    last, every = rollout_end_s + work(last_unit_tokens), first_work_s + work(all_tokens)
    if math.isnan(last) or math.isnan(every):  # max() would quietly keep the other path
        return math.nan
    return max(last, every)


def sync_after_rates(sync_steps: list[dict], micro_rows: int) -> dict[str, float]:
    """Sync's seconds per 1k padded tokens after the rollout, per cost family (calib.trainer_cost_split, pooled over
    its steps); a family sync never ran after the rollout is left out."""
    split = trainer_cost_split(sync_steps, micro_rows)
    rates: dict[str, float] = {}
    for kind, phases in split.items():
        family = FAMILY.get(kind)
        if family and "after_rollout" in phases:
            # sync with its optimizer step recorded apart (the simulator's timelines) has forward_backward,
            # the real trainer's sync has update: either is sync's update rate
            rates.setdefault(family, phases["after_rollout"])
    return rates


def step_tokens(step: dict, micro_rows: int) -> tuple[dict[str, float], dict[str, float]]:
    """(last unit's tokens, all tokens) per cost family of one step. The last unit's spans are picked as the
    timeline picks ``last_unit_cost_s``: those tagged with the highest unit, and with per-group work only the last
    group's (or burst's) spans and the unit's group-less ones."""
    recs = trainer_span_records(step, micro_rows)
    all_tok: dict[str, float] = {}
    for r in recs:
        if r["key"] in FAMILY:
            all_tok[FAMILY[r["key"]]] = all_tok.get(FAMILY[r["key"]], 0.0) + r["tokens"]
    units = [r["unit"] for r in recs if r["unit"] is not None]
    last_tok: dict[str, float] = {}
    if units:
        tail = [r for r in recs if r["unit"] == max(units)]
        groups = [r["group"] for r in tail if r["group"] is not None]
        if groups:
            tail = [r for r in tail if r["group"] in (None, groups[-1])]
        for r in tail:
            if r["key"] in FAMILY:
                last_tok[FAMILY[r["key"]]] = last_tok.get(FAMILY[r["key"]], 0.0) + r["tokens"]
    return last_tok, all_tok


def first_work_s(step: dict) -> float:
    """When the trainer could first work, as ``ideal_lower_bound_s`` has it: the first unit ready, or, when the
    trainer works per group (a span tagged with a group), the first trainable group's completion."""
    tl, m = step["timeline"], step["metrics"]
    if any(s.get("group") is not None for s in tl["train_spans"]) and tl.get("requests"):
        t0 = min(r["t"] for r in tl["requests"])
        trainable = [g["t"] for g in tl.get("groups", []) if g.get("trainable")]
        if trainable:
            return min(trainable) - t0
    return float(m["first_unit_ready_s"])


def step_uncontended(step: dict, rates: dict[str, float], micro_rows: int) -> dict[str, float]:
    """One step's ``uncontended_lower_bound_s`` and ``uncontended_efficiency``."""
    last_tok, all_tok = step_tokens(step, micro_rows)
    m = step["metrics"]
    bound = uncontended_bound_s(float(m["rollout_end_s"]), first_work_s(step), last_tok, all_tok, rates)
    return {"uncontended_lower_bound_s": bound, "uncontended_efficiency": bound / float(m["rollout_to_train_end_s"])}


def mode_uncontended(steps: list[dict], sync_steps: list[dict], micro_rows: int) -> dict:
    """A mode's mean bound and efficiency over its steps, against sync's rates from ``sync_steps`` (the same
    setting's sync runs), and the rates used; {} when sync has no rate to charge with."""
    rates = sync_after_rates(sync_steps, micro_rows)
    if not rates or not steps:
        return {}
    per = [step_uncontended(st, rates, micro_rows) for st in steps]
    return {"uncontended_lower_bound_s": sum(p["uncontended_lower_bound_s"] for p in per) / len(per),
            "uncontended_efficiency": sum(p["uncontended_efficiency"] for p in per) / len(per),
            "uncontended_s_per_1k_padded_tokens": rates}
