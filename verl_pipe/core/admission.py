"""The admission policy as a plug-in: ``rolloutpipe.fgd.policy: package.module:Class`` (docs/extending.md).

Pure (stdlib). The real rollout (``RolloutPipeTrainer._make_policy``) and the simulator (``sim.simulate``) both build
a step's policy the same way: ``policy_cls.for_step(StepAdmission(...))``. ``StepAdmission`` is everything a policy
may use about the step: its shape, the replicas, the configured windows and dispatch order, the unit fill, the
frontier's size, the groups' length predictions (``verl_pipe.core.lengths.StepLengths``, or None) and the extra
keyword arguments a trainer subclass gives (``admission_kwargs``). A policy is a subclass of
``verl_pipe.core.frontier.AdmissionPolicy``; its ``for_step`` picks what it takes (FrontierPolicy: the FGD window and
the length predictions; FCFSPolicy: the baseline's window and order).

``load_policy`` resolves and checks a class path at launch (the config check) and when a step's knobs name one, with
an error naming the key: not importable, no such class, or not an admission policy.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

DEFAULT_FGD_POLICY = "verl_pipe.core.frontier:FrontierPolicy"
POLICY_KEY = "rolloutpipe.fgd.policy"
# rolloutpipe.fgd.lengths: whether FGD orders by the groups' length predictions (predicted), by predictions from a
# shuffled history (the control), or by rank only (off); every step records its predictions whichever it is
FGD_LENGTHS = ("predicted", "shuffled", "off")
_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class StepAdmission:
    """What a step tells its admission policy (``AdmissionPolicy.for_step``)."""

    num_groups: int
    n: int
    groups_per_unit: int
    target_groups: int
    replicas: Sequence[int]
    fgd_window: Any = None  # rolloutpipe.fgd.window, resolved (frontier.resolve_window)
    frontier_groups: int | str = "auto"  # rolloutpipe.fgd.frontier_groups
    slack: int = 0  # rolloutpipe.fgd.slack
    baseline_window: int | None = None  # rolloutpipe.dispatch.window
    baseline_order: str = "group_major"  # rolloutpipe.dispatch.order, resolved
    unit_fill: str = "completion"  # rolloutpipe.cgp.unit_fill: which groups the next training unit takes
    lengths: Any = None  # verl_pipe.core.lengths.StepLengths: per-group length predictions, or None
    order_by_length: bool = True  # False: a policy keeps (and records) the predictions without ordering by them
    rest_order: str = "rank"  # beyond the frontier, with predictions: rank, shortest or longest first (rest_order())
    extra: dict = field(default_factory=dict)  # a trainer subclass's admission_kwargs


REST_ORDERS = ("rank", "shortest", "longest")
# rolloutpipe.fgd.rest_order: auto (rest_order() picks from the trainer's work over the rollout's) or one of REST_ORDERS
# for every step (a user who knows which pool is the bottleneck, or a study that fixes the order)
REST_ORDER_AUTO = "auto"
REST_ORDER_CHOICES = (REST_ORDER_AUTO,) + REST_ORDERS


# rest_order's thresholds on the trainer's work over the rollout's duration (the run's recent steps): at or above
# TRAINER_BOUND[granularity] the trainer is the bottleneck, at or below ROLLOUT_BOUND the rollout is, in between
# neither clearly. Per granularity: the simulator puts group granularity's crossover near 1.0 (the trainer takes each
# group as it completes), but the real-stack run did not bear it out, so both stay at 1.5 until one does
# (docs/fgd.md, "At group granularity: shortest first from a ratio of 1?").
TRAINER_BOUND = {"minibatch": 1.5, "group": 1.5}
ROLLOUT_BOUND = 0.5
RATIO_SMOOTHING = 0.5  # the weight of the latest step in the ratio's running mean (TrainerRatio)


def rest_order(unit_fill: str, trainer_to_rollout: float | None, granularity: str = "minibatch",
               configured: str = REST_ORDER_AUTO) -> str:
    """How FGD orders the groups beyond the frontier by their predicted lengths, from the trainer's work over the
    rollout's duration in the run's recent steps (``TrainerRatio``).

    Where the trainer is the bottleneck, the step ends when the trainer has worked through every unit, so it must
    never wait: complete as many groups as early as possible, shortest first. Where the rollout is (the trainer waits
    for it anyway), the step ends with the rollout's last group: start the long groups first (longest first: the
    makespan). In between, or where nothing was measured yet, rank (FGD's order before predictions). With
    ``unit_fill=dispatch`` the units are fixed (sync's mini-batches) and complete in rank order: rank. The trainer
    counts as the bottleneck from ``TRAINER_BOUND[granularity]`` on (CGP's ``rolloutpipe.cgp.granularity``). The
    simulator's study behind the thresholds: docs/fgd.md, "Length-aware order". ``configured`` other than ``auto``
    (``rolloutpipe.fgd.rest_order``) is the order for every step, whatever the fill and the ratio."""
    if granularity not in TRAINER_BOUND:
        raise ValueError(f"granularity: got {granularity!r}; allowed: {', '.join(TRAINER_BOUND)}")
    if configured not in REST_ORDER_CHOICES:
        raise ValueError(f"rolloutpipe.fgd.rest_order: got {configured!r}; allowed: {', '.join(REST_ORDER_CHOICES)}")
    if configured != REST_ORDER_AUTO:
        return configured
    if unit_fill == "dispatch" or trainer_to_rollout is None:
        return "rank"
    if trainer_to_rollout >= TRAINER_BOUND[granularity]:
        return "shortest"
    return "longest" if trainer_to_rollout <= ROLLOUT_BOUND else "rank"


class TrainerRatio:
    """The running mean of a run's trainer work over its rollout's duration, step by step (``update``)."""

    def __init__(self):
        self.value: float | None = None

    def update(self, trainer_busy_s: float | None, rollout_s: float | None) -> float | None:
        if trainer_busy_s and rollout_s and rollout_s > 0:
            x = trainer_busy_s / rollout_s
            self.value = x if self.value is None else (1 - RATIO_SMOOTHING) * self.value + RATIO_SMOOTHING * x
        return self.value


class PolicyPathError(ValueError):
    """A policy path that does not name an admission policy; the message names the key."""


def load_policy(path: str, key: str = POLICY_KEY) -> type:
    """The admission policy class ``path`` ('package.module:Class') names; PolicyPathError (naming ``key``) when it
    is malformed, not importable, not there, or not a subclass of AdmissionPolicy."""
    from verl_pipe.core.frontier import AdmissionPolicy

    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise PolicyPathError(f"{key}: got {path!r}; allowed: a class path 'package.module:Class' "
                              f"(default {DEFAULT_FGD_POLICY})")
    module_name, cls_name = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 -- any import failure is the config's problem, reported with the key
        raise PolicyPathError(f"{key}: module {module_name!r} is not importable ({type(e).__name__}: {e})") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise PolicyPathError(f"{key}: module {module_name!r} has no {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, AdmissionPolicy)):
        raise PolicyPathError(f"{key}: {path} is not an admission policy (a subclass of "
                              "verl_pipe.core.frontier.AdmissionPolicy: docs/extending.md)")
    return cls
