"""A step's knobs: what one step may run differently from the next, resolved once, frozen, and recorded.

``RolloutPipeTrainer.fit_step`` takes them (default: the run's config, ``step_knobs(config)``), hands them to the
rollout side (admission policy, per-request sampling) and the trainer side (schedule, coalescing, unit order), and
puts ``StepKnobs.record()`` in the step's record (``trainer.last_step_record["knobs"]``, ``steps.jsonl``).
``PipeSession.step`` builds them from its arguments, so a session switches mode, granularity or FGD between steps
without touching the trainer. Pure (OmegaConf only, no verl, Ray or torch).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from verl_pipe.core.admission import DEFAULT_FGD_POLICY, FGD_LENGTHS, REST_ORDER_AUTO, REST_ORDER_CHOICES, load_policy
from verl_pipe.core.frontier import AdaptiveWindow, resolve_window
from verl_pipe.core.minibatch_order import check_order
from verl_pipe.core.release import check_fill
from verl_pipe.core.variants import GRANULARITIES, TRAINER_MODES, name_of, resolve_fgd


@dataclass(frozen=True)
class StepKnobs:
    mode: str = "sync"  # rolloutpipe.mode
    granularity: str = "minibatch"  # rolloutpipe.cgp.granularity
    fgd: bool = False  # rolloutpipe.fgd.enable, resolved (auto: on in cgp)
    # FGD's per-replica admission window, resolved (frontier.resolve_window: an int, or an AdaptiveWindow); the
    # window FGD would use, recorded with FGD off too
    fgd_window: int | AdaptiveWindow | None = None
    fgd_policy: str = DEFAULT_FGD_POLICY  # rolloutpipe.fgd.policy: the FGD admission policy's class path
    # rolloutpipe.fgd.lengths: predicted (FGD orders by the groups' length predictions), shuffled (the control: each
    # group gets another prompt's history), off (rank order only); predictions are recorded in every case
    fgd_lengths: str = "predicted"
    # rolloutpipe.fgd.rest_order: FGD's order beyond the frontier with predictions; auto picks it per step from the
    # trainer's work over the rollout's (core/admission.rest_order), rank/shortest/longest fix it
    fgd_rest_order: str = REST_ORDER_AUTO
    # (prompt, epoch) per group for the length predictor's history, instead of the batch's dataset index and the
    # trainer's epoch (the bench's forced-length workloads draw lengths by their own prompts)
    length_keys: tuple | None = None
    coalesce_log_probs: bool = True  # rolloutpipe.cgp.coalesce_log_probs
    # rolloutpipe.cgp.unit_fill: the order groups reach the trainer's FIFO (verl_pipe/core/release.py): dispatch (units
    # are sync's mini-batches) or completion (the paper's)
    unit_fill: str = "dispatch"
    # rolloutpipe.minibatch_order: which prompts make each mini-batch, decided before the rollout in every mode
    # (verl_pipe/core/minibatch_order.py): length (predicted length, shortest first) or dataloader (verl's)
    minibatch_order: str = "length"
    baseline_order: str = "group_major"  # the dispatch without FGD (rolloutpipe.dispatch.order, resolved)
    baseline_window: int | None = None  # rolloutpipe.dispatch.window
    workload: dict | None = None  # rolloutpipe.workload: a controlled response-length workload
    # (group, index) -> dict of per-request sampling parameters, e.g. the benchmark's fixed lengths; wins over
    # ``workload``
    sampling_overrides: Callable[[int, int], dict] | None = None
    # list[Group] -> list[Group]: the order groups are trained in within what the schedule took (a test hook)
    unit_order: Callable[[list], list] | None = None

    def __post_init__(self):
        if self.mode not in TRAINER_MODES:
            raise ValueError(f"mode: got {self.mode!r}; allowed: {', '.join(TRAINER_MODES)}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity: got {self.granularity!r}; allowed: {', '.join(GRANULARITIES)}")
        check_fill(self.unit_fill)
        check_order(self.minibatch_order)
        if self.fgd_lengths not in FGD_LENGTHS:
            raise ValueError(f"fgd_lengths: got {self.fgd_lengths!r}; allowed: {', '.join(FGD_LENGTHS)}")
        if self.fgd_rest_order not in REST_ORDER_CHOICES:
            raise ValueError(f"fgd_rest_order: got {self.fgd_rest_order!r}; allowed: {', '.join(REST_ORDER_CHOICES)}")
        if self.workload is not None:  # the knobs' own copy: a caller's later edit does not reach a step
            object.__setattr__(self, "workload", copy.deepcopy(dict(self.workload)))

    def replace(self, **changes) -> StepKnobs:
        return dataclasses.replace(self, **changes)

    def record(self) -> dict:
        """The knobs as the step's record keeps them (JSON): functions as whether one was given."""
        return {"variant": name_of(self.mode, self.granularity, self.fgd), "mode": self.mode,
                "granularity": self.granularity, "fgd": self.fgd, "fgd_window": window_label(self.fgd_window),
                "fgd_policy": self.fgd_policy, "fgd_lengths": self.fgd_lengths,
                "fgd_rest_order": self.fgd_rest_order, "length_keys": self.length_keys is not None,
                "coalesce_log_probs": self.coalesce_log_probs, "unit_fill": self.unit_fill,
                "minibatch_order": self.minibatch_order, "baseline_order": self.baseline_order,
                "baseline_window": self.baseline_window, "workload": copy.deepcopy(self.workload),
                "sampling_overrides": self.sampling_overrides is not None, "unit_order": self.unit_order is not None}


KNOB_NAMES = tuple(f.name for f in dataclasses.fields(StepKnobs))


def window_label(resolved) -> int | str | None:
    """FGD's window as records and results keep it: its size, or "adaptive" (it grows during a step; the simulator
    resolves the name against the engine it simulates, ``sim.simulate.rollout_for_mode``)."""
    return "adaptive" if isinstance(resolved, AdaptiveWindow) else resolved


def verl_dispatch_order(config) -> str:
    """How verl's own rollout sends a batch: chunked over rollout.agent.num_workers agent-loop workers that submit
    concurrently, so the engine sees the chunks interleaved ("interleave:k"); all at once, no client window."""
    workers = int(config.actor_rollout_ref.rollout.agent.num_workers)
    return f"interleave:{workers}" if workers > 1 else "group_major"


def configured(config) -> dict:
    """The knobs the run's config sets, unresolved (``fgd_window`` as ``rolloutpipe.fgd.window`` spells it)."""
    from omegaconf import OmegaConf

    rp = config.rolloutpipe
    workload = rp.get("workload")
    return dict(mode=str(rp.mode), granularity=str(rp.cgp.granularity), fgd=rp.fgd.enable,
                fgd_window=rp.fgd.window, fgd_policy=str(rp.fgd.get("policy") or DEFAULT_FGD_POLICY),
                fgd_lengths=str(rp.fgd.get("lengths") or "predicted"),
                fgd_rest_order=str(rp.fgd.get("rest_order") or REST_ORDER_AUTO),
                coalesce_log_probs=bool(rp.cgp.coalesce_log_probs),
                unit_fill=str(rp.cgp.get("unit_fill", "dispatch")),
                minibatch_order=str(rp.get("minibatch_order", "length")),
                baseline_order=rp.dispatch.order or verl_dispatch_order(config), baseline_window=rp.dispatch.window,
                workload=OmegaConf.to_container(workload, resolve=True) if workload else None)


def step_knobs(config, **changes) -> StepKnobs:
    """A step's knobs: the config's, with ``changes`` (StepKnobs fields; ``fgd_window`` as ``rolloutpipe.fgd.window``
    spells it, or already resolved), the FGD window resolved against the config's batch shape and engine."""
    from verl_pipe.config import groups_per_unit

    unknown = sorted(set(changes) - set(KNOB_NAMES))
    if unknown:
        raise TypeError(f"unknown step knobs {unknown}; allowed: {', '.join(KNOB_NAMES)}")
    spec = dict(configured(config), **changes)
    load_policy(spec["fgd_policy"])  # refuses a class path that is not an admission policy, naming the key
    spec["fgd"] = resolve_fgd(spec["fgd"], spec["mode"])  # the config's auto follows the step's mode
    window = spec["fgd_window"]
    if not isinstance(window, AdaptiveWindow):
        spec["fgd_window"] = resolve_window(window, groups_per_unit(config), int(config.actor_rollout_ref.rollout.n),
                                            int(config.actor_rollout_ref.rollout.max_num_seqs))
    return StepKnobs(**spec)
