"""The length predictor in the simulator: what FGD knows about a step's lengths, with a prediction-error knob.

Pure (the simulator's own inputs). ``Knowledge`` names what a simulated step's FGD orders by (``KNOWLEDGE``):

- ``off``: nothing (rank order: FGD before length prediction);
- ``perfect``: each group's true mean log-length, plus a log-normal error of ``error`` (the knob: 0 is perfect
  knowledge, the bound; 0.5 a prediction off by a factor e^0.5 ~ 1.6 one time in three);
- ``predicted``: the real predictor (verl_pipe/core/lengths.py), its history built from the earlier steps of the
  same run (prompts repeat when the workload's spec has ``prompts``), refined by each group's finished responses;
- ``siblings``: the real predictor with no history (every prompt new): the group's finished responses only;
- ``shuffled``: the real predictor with each group given another prompt's history (the control).

``RunPredictor`` carries a run's history from step to step: ``lengths(workload, step)`` gives a fresh
``StepLengths`` for the step (the simulated rollout feeds it the responses as they finish), ``learn`` records the
step's groups afterwards. Pass the ``StepLengths`` to ``sim.simulate.simulate_step(..., lengths=)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from verl_pipe.core.lengths import LengthHistory, Prediction, StepLengths
from verl_pipe.core.workload import Workload, length_keys

KNOWLEDGE = ("off", "perfect", "predicted", "siblings", "shuffled")
PERFECT_WEIGHT = 1e9  # a perfect prediction is worth any number of siblings


@dataclass(frozen=True)
class Knowledge:
    kind: str = "predicted"
    error: float = 0.0  # perfect: the log-normal error's sigma
    order: str | None = None  # FGD's order beyond the frontier, fixed (None: as the trainer decides it, rest_order)

    def __post_init__(self):
        if self.kind not in KNOWLEDGE:
            raise ValueError(f"knowledge must be one of {KNOWLEDGE}, got {self.kind!r}")
        if self.error < 0:
            raise ValueError("error must be >= 0")
        if self.order not in (None, "rank", "shortest", "longest"):
            raise ValueError(f"order must be rank, shortest or longest, got {self.order!r}")

    @property
    def label(self) -> str:
        base = f"perfect~{self.error:g}" if self.kind == "perfect" and self.error else self.kind
        return base + (f"@{self.order}" if self.order else "")

    @classmethod
    def parse(cls, text: str) -> "Knowledge":
        """``off``, ``perfect``, ``perfect~0.5`` (error 0.5), ``predicted``, ``siblings``, ``shuffled``; ``@shortest``
        (or ``@longest``, ``@rank``) fixes the order beyond the frontier."""
        text, _, order = text.partition("@")
        kind, _, err = text.partition("~")
        return cls(kind, float(err) if err else 0.0, order or None)


def oracle_lengths(workload: Workload, error: float = 0.0, seed: int = 0) -> StepLengths:
    """Each group's true mean log response length as its start-of-step prediction, off by N(0, ``error``)."""
    rng = np.random.default_rng([seed, 7])
    initial = []
    for g in range(workload.num_groups):
        true = sum(math.log(max(1, x)) for x in workload.lengths[g]) / workload.n
        noisy = true + (float(rng.normal(0.0, error)) if error else 0.0)
        initial.append(Prediction(noisy, "history", PERFECT_WEIGHT if not error else 1.0))
    return StepLengths(initial, workload.n)


def recorded_lengths(records: list[dict] | None, n: int) -> StepLengths | None:
    """A step's start-of-step predictions as its record kept them (``StepLengths.record``): the simulator replays
    the measured step with the predictions it had (its rollout refines them from the responses again)."""
    if not records:
        return None
    initial = [Prediction(math.log(r["predicted_tokens"]), "history", 1.0) if r.get("predicted_tokens")
               else Prediction(None, "prior", 0.25) for r in records]
    return StepLengths(initial, n)


class RunPredictor:
    """A simulated run's length knowledge, step after step (see the module docstring)."""

    def __init__(self, knowledge: Knowledge | str = "predicted"):
        self.knowledge = Knowledge.parse(knowledge) if isinstance(knowledge, str) else knowledge
        self.history = LengthHistory()

    def lengths(self, workload: Workload, step: int) -> StepLengths | None:
        k = self.knowledge
        if k.kind == "off":
            return None
        if k.kind == "perfect":
            return oracle_lengths(workload, k.error, seed=step)
        keys = self._keys(workload, step)
        shuffle = step if k.kind == "shuffled" else None
        return StepLengths(self.history.predict_step(keys, shuffle_seed=shuffle), workload.n)

    def learn(self, workload: Workload, step: int) -> None:
        """The step's groups, as they came out, into the history."""
        for g, (key, epoch) in enumerate(self._keys(workload, step)):
            self.history.record(key, epoch, workload.lengths[g])

    def _keys(self, workload: Workload, step: int) -> list[tuple]:
        keys = length_keys(workload)
        if keys is None or self.knowledge.kind == "siblings":  # every prompt new: no history, ever
            return [((step, g), step) for g in range(workload.num_groups)]
        return list(keys)
