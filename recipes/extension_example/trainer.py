"""ExampleTrainer: a RolloutPipeTrainer subclass with a custom filter and a custom admission priority.

Select it with ``rolloutpipe.trainer_class=verl_pipe.recipes.extension_example.trainer.ExampleTrainer`` (the recipe
``tiny_cpu_extension_example`` does). Everything else -- the CGP/sync step loop, FGD, materialization,
weight-version checks, verl's actor -- is inherited unchanged; each override calls ``super()``.

1. **Trainability filter** (``group_is_trainable``): the default (zero-variance filter when
   ``rolloutpipe.filter_zero_variance`` is on) *and* a minimum reward spread within the group. GRPO divides
   by the group's reward std, so a group whose rewards differ only by a small shaping term gets advantages
   as large as a group with a right and a wrong answer; ``min_reward_spread`` drops such groups (0.1 keeps
   every group with variance under the example reward's 0 / 0.25 / 1 levels; 0.5 would train only groups
   with a right answer). It also records, per prompt, whether its group was trainable (``prompt_history``).
2. **Admission priority** (the recipe's ``rolloutpipe.fgd.policy`` names ``DeferringFrontierPolicy``;
   ``admission_kwargs``): prompts whose previous group
   was untrainable (all answers equally good or bad last time) are admitted last, and sent with a lower vLLM
   priority. With oversampling, the step fills its batch from the other prompts first, and the deferred
   ones are the leftovers that get aborted: less rollout work spent on groups likely to be dropped.
3. **Reward**: not a trainer hook; verl's ``reward.custom_reward_function`` (``reward.py`` next to this file).
4. **Estimator**: not a trainer hook either; ``estimator.py`` next to this file registers ``grpo_median`` with verl
   and with ``verl_pipe.estimators.register_streaming``; importing it here makes both registrations run wherever
   this class is loaded (``algorithm.adv_estimator=grpo_median``).

The pure logic (``reward_spread``, ``prompt_key``, ``deferred_groups``, ``DeferringFrontierPolicy``) is
tested without Ray in tests/test_extension_example.py; tests/e2e/test_zz_dapo.py runs a step with it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from verl import DataProto

from verl_pipe.core.frontier import FrontierPolicy, Request
from verl_pipe.trainer.knobs import StepKnobs
from verl_pipe.recipes.extension_example import estimator  # noqa: F401 -- registers grpo_median
from verl_pipe.rollout.materialize import sequence_scores
from verl_pipe.trainer import RolloutPipeTrainer


# ---------------------------------------------------------------------------------------------- pure logic

def reward_spread(piece: DataProto) -> float:
    """max - min of the group's per-response rewards."""
    scores = sequence_scores(piece)
    return float(scores.max() - scores.min())


def prompt_key(extra_info) -> object | None:
    """A prompt's identity across steps and epochs: the dataset's ``extra_info.index`` (verl's data
    preprocessing scripts and the tiny digit-math set write it); None if the record has none."""
    if isinstance(extra_info, Mapping):
        return extra_info.get("index")
    return None


def deferred_groups(keys: list, history: Mapping) -> list[int]:
    """Groups (rows of the step's batch) whose prompt's previous group was untrainable."""
    return [g for g, key in enumerate(keys) if key is not None and history.get(key) is False]


class DeferringFrontierPolicy(FrontierPolicy):
    """FGD, except that the requests of ``deferred`` groups are admitted only when no other request is
    pending, and go to vLLM with priority ``rank + num_groups`` (after every other group).

    Built only from AdmissionPolicy's subclass hooks (``_init_queue``, ``_queue_push``, ``_queue_pop``,
    ``_priority``, ``_on_admitted``): deferred requests wait in a list of their own and join FGD's queue when
    it runs dry, so admission stays work-conserving and FGD's affinity and windows apply unchanged. Among
    themselves (and once released) deferred groups keep rank order. ``frontier()`` still names groups by rank.
    """

    def __init__(self, *args, deferred: Iterable[int] = (), **kwargs):
        self.deferred = frozenset(deferred)
        super().__init__(*args, **kwargs)
        bad = sorted(g for g in self.deferred if not 0 <= g < self.num_groups)
        if bad:
            raise ValueError(f"deferred groups {bad} out of range (num_groups={self.num_groups})")

    def _init_queue(self) -> None:
        super()._init_queue()
        self._held: list[Request] = []  # pending requests of deferred groups, not yet in FGD's queue
        self.admission_order: list[int] = []  # groups in order of their first admission
        self._admitted_groups: set[int] = set()

    def _queue_push(self, req: Request) -> None:
        if req.group in self.deferred:
            self._held.append(req)
        else:
            super()._queue_push(req)

    def _queue_pop(self, open_replicas):
        pick = super()._queue_pop(open_replicas)
        if pick is None and self._held:
            held, self._held = self._held, []
            for req in held:
                if req in self._pending:  # not closed meanwhile (batch full, group dropped)
                    super()._queue_push(req)
            pick = super()._queue_pop(open_replicas)
        return pick

    def _priority(self, req: Request) -> int:
        return super()._priority(req) + (self.num_groups if req.group in self.deferred else 0)

    def _on_admitted(self, req: Request, replica: int) -> None:
        super()._on_admitted(req, replica)
        if req.group not in self._admitted_groups:
            self._admitted_groups.add(req.group)
            self.admission_order.append(req.group)

    def stats(self) -> dict:
        return dict(super().stats(), deferred_groups=len(self.deferred),
                    deferred_admitted=len(self.deferred & self._admitted_groups))


# ---------------------------------------------------------------------------------------------- the trainer

class ExampleTrainer(RolloutPipeTrainer):
    # A group is trained only if its rewards span at least this much (0 disables the check).
    min_reward_spread: float = 0.1
    # (2) admission priority: FGD as configured (rolloutpipe.fgd.*), plus deferral (the recipe's rolloutpipe.fgd.policy
    # names DeferringFrontierPolicy; admission_kwargs below gives it the deferred groups); FCFS stays as it is.

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prompt_history: dict = {}  # prompt key -> whether its latest group was trainable
        self.last_policy = None  # the admission policy of the latest step (for inspection)

    # (1) which groups are trained
    def group_is_trainable(self, group: int, piece: DataProto) -> bool:
        trainable = super().group_is_trainable(group, piece) and reward_spread(piece) >= self.min_reward_spread
        extra = piece.non_tensor_batch.get("extra_info")
        key = prompt_key(extra[0]) if extra is not None and len(extra) else None
        if key is not None:
            self.prompt_history[key] = trainable  # called in the rollout thread; a dict store is atomic
        return trainable

    # (2) which groups the deferring FGD policy admits last: from the step's batch (group g = row g)
    def admission_kwargs(self, batch: DataProto | None, knobs: StepKnobs) -> dict:
        if not knobs.fgd:  # the step admits with baseline_policy_cls, which takes no deferral
            return {}
        extra = batch.non_tensor_batch.get("extra_info") if batch is not None else None
        keys = [prompt_key(e) for e in extra] if extra is not None else []
        return {"deferred": deferred_groups(keys, self.prompt_history)}

    def _make_policy(self, num_groups: int, batch: DataProto | None, knobs: StepKnobs):
        self.last_policy = super()._make_policy(num_groups, batch, knobs)
        return self.last_policy
