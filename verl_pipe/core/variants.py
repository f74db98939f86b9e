"""The variants a step can run as, by name: the one place mode names are decoded.

Pure Python (no verl, Ray or torch). A variant name (``sync``, ``cgp``, ``cgp_group``, ``cgp_fgd``, and verl's own
trainer as a peer: ``verl_separate_async``, ``verl_separate_async_1off``, ``verl_separate_async_tuned``,
``verl_separate_sync``, ``verl_colocated``) stands for a trainer mode
(``rolloutpipe.mode``), a granularity (``rolloutpipe.cgp.granularity``) and whether FGD admits the rollout
(``rolloutpipe.fgd.enable``). The config's validation, the trainer, the simulator and the planner (and the lab
beside the runtime, whose own columns of this table it keys by these names) read names through this table; none of
them decodes a name by itself. They ask it instead:
``pipelines(mode)`` of a trainer mode, a variant's attributes (``is_base``, ``fgd``, ``colocated``, ``staleness``,
``row``), ``of_row`` of one of the planner's rows (``verl_one_step_off`` is its row of ``verl_separate_async_1off``),
and the names of the roles some variants play (``BASE``, ``PIPELINED_BASE``, ``FGD_VARIANT``, ``ON_POLICY_PEER``).
tests/test_layout.py fails on a comparison with a name literal anywhere else in verl_pipe.

Old log-prob coalescing (``rolloutpipe.cgp.coalesce_log_probs``) is not part of a name: every variant runs it as
the run's config sets it (a step's knobs, verl_pipe/trainer/knobs.py, record what it was).
"""

from __future__ import annotations

from dataclasses import dataclass

TRAINER_MODES = ("sync", "cgp")  # rolloutpipe.mode: the trainer's schedule (verl_pipe/core/schedule.py)
GRANULARITIES = ("minibatch", "group")  # rolloutpipe.cgp.granularity: a unit trained at once, or group by group
BASE = "sync"  # the variant every other is compared against
# the pipelined variant without FGD (mini-batch units, verl's FCFS dispatch): what FGD's gain is measured against
PIPELINED_BASE = "cgp"
FGD_VARIANT = "cgp_fgd"  # FGD admitting a pipelined rollout at a free granularity (the bench's and planner's cgp + fgd)
# verl's separate_async generating nothing ahead: the peer our modes are compared against
# (reduction_vs_verl_separate_async_pct), and the one whose steps fit verl's own trainer for the planner (its per-step
# trainer spans, else its trainer busy total; the other peers borrow that fit: verl_pipe/plan/calibrate.py, validate.py)
ON_POLICY_PEER = "verl_separate_async"


def pipelines(mode: str) -> bool:
    """Whether the trainer mode (``rolloutpipe.mode``) trains units while the rollout runs (cgp); sync trains the
    whole batch after it."""
    return mode == "cgp"


@dataclass(frozen=True)
class Variant:
    name: str
    mode: str | None  # rolloutpipe.mode on RolloutPipeTrainer; None: verl's own trainer (a peer)
    granularity: str | None  # fixed granularity (verl's own trains mini-batches); None: the run picks one (cgp_fgd)
    fgd: bool = False  # frontier-group dispatch admits the rollout
    simulated: bool = True  # the simulator's step models it on two pools (verl_pipe/sim/trainer.py, simulate.py)
    # rollout and training take turns on the same devices (verl's hybrid engine), not two pools: not a mode of the
    # two-pool step (simulated=False); verl_pipe/sim/colocated.py models it, its trainer on ``schedule_as``'s schedule
    colocated: bool = False
    schedule_as: str | None = None  # a variant of ours whose trainer schedule this one's trainer follows
    # a peer the two-pool simulator models as another (simulated) variant: the planner's validation predicts it as
    # that one, with verl's trainer costs (verl_pipe/plan/validate.py)
    simulate_as: str | None = None
    # versions the trained samples lag the weights that generated them (verl's default separate_async generates one
    # batch ahead): 0 for on-policy
    staleness: int = 0
    plan_row: str | None = None  # the planner's row of it when that is not its name (verl_pipe/plan/predict.py ROWS)

    @property
    def is_base(self) -> bool:
        """The variant every other is compared against (``BASE``)."""
        return self.name == BASE

    @property
    def row(self) -> str:
        """Its row in the planner's tables (verl_pipe/plan/predict.py ROWS) and expected errors
        (verl_pipe/plan/validation.json)."""
        return self.plan_row or self.name

    @property
    def ours(self) -> bool:
        """Runs on RolloutPipeTrainer (a PipeSession step), not on verl's own trainer."""
        return self.mode is not None

    @property
    def overlapped(self) -> bool:
        """The rollout shares the machine with a busy trainer (every variant but sync and the colocated one, whose
        rollout runs while its trainer waits): the calibration fits its engine apart from sync's
        (verl_pipe/sim/calib.py)."""
        return pipelines(self.mode) if self.ours else not self.colocated

    @property
    def granularities(self) -> tuple[str, ...]:
        """The granularities a run of it can use: its own, or every one when it is free."""
        return GRANULARITIES if self.granularity is None else (self.granularity,)

    def trainer_schedule(self, granularity: str | None = None) -> tuple[str, str]:
        """(rolloutpipe.mode, granularity) of the trainer's schedule: a fixed granularity wins over ``granularity``,
        which a free one takes (default minibatch)."""
        self._require_ours()
        return self.mode, self.granularity or granularity or "minibatch"

    def step_args(self, granularity: str | None = None) -> dict:
        """``PipeSession.step`` arguments of this variant (``granularity``: a free granularity's choice)."""
        mode, gran = self.trainer_schedule(granularity)
        return dict(mode=mode, granularity=gran, fgd=self.fgd)

    def overrides(self) -> list[str]:
        """Hydra overrides that configure a run as this variant (a fixed granularity, FGD when on)."""
        self._require_ours()
        out = [f"rolloutpipe.mode={self.mode}"]
        if pipelines(self.mode) and self.granularity:
            out.append(f"rolloutpipe.cgp.granularity={self.granularity}")
        # explicit either way: the config's default (auto) turns FGD on wherever the mode pipelines
        return out + [f"rolloutpipe.fgd.enable={str(self.fgd).lower()}"]

    def _require_ours(self) -> None:
        if not self.ours:
            raise ValueError(f"mode {self.name!r} is verl's own trainer (a peer), not a RolloutPipeTrainer step")


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("sync", "sync", "minibatch"),
    Variant("cgp", "cgp", "minibatch"),
    Variant("cgp_group", "cgp", "group"),
    Variant("cgp_fgd", "cgp", None, fgd=True),
    # verl 0.9.1's V1 separate_async trainer: on-policy, and verl's default (one batch ahead, which the simulator does
    # not model)
    Variant("verl_separate_async", None, "minibatch"),
    Variant("verl_separate_async_1off", None, "minibatch", simulated=False, staleness=1,
            plan_row="verl_one_step_off"),
    # verl's trainers at their best (docs/peer.md): separate_async on-policy tuned for this work; verl's own
    # synchronous trainers, on separate pools (the experimental SeparateRayPPOTrainer) and colocated (V1 sync, verl's
    # main_ppo default: rollout and training take turns on every core). Not in the two-pool simulator; the colocated one
    # (rollout on every device, engines put to sleep, old log-prob and update on sync's schedule, weights reloaded
    # into the sleeping engines) is modelled in verl_pipe/sim/colocated.py.
    Variant("verl_separate_async_tuned", None, "minibatch", simulated=False, simulate_as="verl_separate_async"),
    Variant("verl_separate_sync", None, "minibatch", simulated=False, simulate_as="sync"),
    Variant("verl_colocated", None, "minibatch", simulated=False, colocated=True, schedule_as="sync"),
)}

OURS = tuple(k for k, v in VARIANTS.items() if v.ours)  # the variants of RolloutPipeTrainer
PEERS = tuple(k for k, v in VARIANTS.items() if not v.ours)  # verl's own trainer, in each configuration compared
SIMULATED = tuple(k for k, v in VARIANTS.items() if v.simulated)  # the simulator's modes
PLAN_ROWS = {v.row: v for v in VARIANTS.values()}  # the planner's row name -> its variant


def of_row(row: str) -> Variant:
    """The variant of one of the planner's rows (``Variant.row``: its name, or e.g. ``verl_one_step_off`` for
    ``verl_separate_async_1off``)."""
    try:
        return PLAN_ROWS[row]
    except KeyError:
        raise ValueError(f"unknown planner row {row!r}; choose from {', '.join(PLAN_ROWS)}") from None


def fifo_variant(granularity: str) -> str:
    """The variant of CGP with FIFO admission (no FGD) at ``granularity``: ``cgp`` (mini-batch units) or
    ``cgp_group``."""
    for name, v in VARIANTS.items():
        if v.ours and pipelines(v.mode) and not v.fgd and v.granularity == granularity:
            return name
    raise ValueError(f"granularity {granularity!r}; allowed: {', '.join(GRANULARITIES)}")


def modelled_as(name: str) -> Variant:
    """The variant the two-pool simulator models ``name`` as: itself, or its ``simulate_as`` (a tuned or synchronous
    peer as the simulated schedule it follows)."""
    v = variant(name)
    return variant(v.simulate_as) if v.simulate_as else v


FGD_AUTO = "auto"  # rolloutpipe.fgd.enable's default: frontier-group dispatch wherever the mode pipelines


def resolve_fgd(enable, mode: str) -> bool:
    """Whether FGD admits a step's rollout: ``rolloutpipe.fgd.enable`` as set (true / false), or for ``auto`` on in a
    pipelined mode (cgp) and off in sync, which takes no admission policy."""
    if enable == FGD_AUTO:
        return pipelines(mode)
    if not isinstance(enable, bool):
        raise ValueError(f"rolloutpipe.fgd.enable: {enable!r}; allowed: true, false or {FGD_AUTO!r}")
    return enable


def variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; choose from {', '.join(VARIANTS)}") from None


def name_of(mode: str, granularity: str, fgd: bool = False) -> str | None:
    """The variant name of a step trained in ``mode`` at ``granularity`` with FGD on or off (sync has no
    granularity: it trains whole mini-batches after the rollout); None: no variant is that (sync with FGD)."""
    if mode not in TRAINER_MODES or granularity not in GRANULARITIES:
        raise ValueError(f"mode {mode!r}, granularity {granularity!r}: allowed {TRAINER_MODES} x {GRANULARITIES}")
    for v in VARIANTS.values():
        if v.mode == mode and v.fgd == fgd and (not pipelines(mode) or v.granularity in (None, granularity)):
            return v.name
    return None
