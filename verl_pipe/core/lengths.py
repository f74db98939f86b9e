"""Response-length prediction per group: what lets FGD start the groups that will run long early (docs/fgd.md).

Pure (stdlib only), shared by the real trainer and the simulator. GRPO gives length knowledge twice: a prompt comes
back every epoch, and its group's lengths last time predict this time's; within a step, a group's finished responses
tell about its others. So a group's prediction comes from one of three sources (``SOURCES``):

- ``history``: the prompt's latest earlier epoch (``LengthHistory``, run-scoped, keyed by the prompt), shrunk
  toward the pooled mean by the cross-epoch slope the history estimates from its own prompts seen twice;
- ``siblings``: once responses of the group finished in this step (``StepLengths.observe``), their mean
  log-length, weighted with the start-of-step prediction;
- ``prior``: nothing known about the prompt: the pooled mean of the groups seen before (or, in a run's first
  steps, of this step's finished responses), so every such group predicts the same.

Predictions are kept in log space (response lengths are about log-normal: verl_pipe/core/workload.py) as the mean
log-length of the group's responses; ``StepLengths.tokens(g)`` is its exponential. Only the order of the
predictions matters to the admission (frontier.FrontierPolicy with ``lengths``); the step record keeps each group's
predicted and actual lengths (``StepLengths.record``) so prediction quality is measured (``rank_correlation``).

A prompt seen again in the same epoch (the benchmark runs every mode of a round on the same prompts) adds nothing:
history only ever predicts from earlier epochs, so a step never learns the lengths it is about to generate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Hashable, Sequence

SOURCES = ("history", "siblings", "prior")
# How many siblings a start-of-step prediction is worth when the group's own responses come in: history about one
# (a past group of the same prompt), the prior a quarter of one (it says nothing about this prompt).
HISTORY_WEIGHT = 1.0
PRIOR_WEIGHT = 0.25
MIN_PAIRS = 8  # prompts seen in two epochs before the cross-epoch slope is estimated (until then: 1, unshrunk)
EPOCHS_KEPT = 2  # per prompt, the latest epochs kept


@dataclass(frozen=True)
class Prediction:
    """A group's predicted mean log response length, where it came from, and how many siblings it is worth."""

    log_tokens: float | None  # None: nothing known at all (a run's first step): every such group ranks alike
    source: str
    weight: float = 0.0

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")


def _mean_log(lengths: Sequence[int]) -> float:
    if not lengths:
        raise ValueError("a group needs at least one response length")
    return sum(math.log(max(1, int(x))) for x in lengths) / len(lengths)


class LengthHistory:
    """Run-scoped: per prompt key, the mean log-length of its group in the latest epochs it was seen, the pooled
    mean over every recorded group, and the cross-epoch slope (how much of a prompt's deviation from the mean carries
    to its next epoch) estimated from prompts seen in consecutive recorded epochs."""

    def __init__(self):
        self._by_key: dict[Hashable, dict[int, float]] = {}
        self._count, self._sum = 0, 0.0
        self._pairs: list[tuple[float, float]] = []  # (previous, this) epoch's group mean log-length of one prompt

    def __len__(self) -> int:
        return len(self._by_key)

    def record(self, key: Hashable, epoch: int, lengths: Sequence[int]) -> bool:
        """The group of prompt ``key`` in ``epoch`` had these response lengths. False (ignored): that prompt's epoch
        is already recorded (another step of the same epoch), or ``key`` is None (a prompt without identity)."""
        if key is None:
            return False
        seen = self._by_key.setdefault(key, {})
        if epoch in seen:
            return False
        value = _mean_log(lengths)
        earlier = [e for e in seen if e < epoch]
        if earlier:
            self._pairs.append((seen[max(earlier)], value))
        seen[epoch] = value
        for e in sorted(seen)[:-EPOCHS_KEPT]:
            del seen[e]
        self._count += 1
        self._sum += value
        return True

    @property
    def mean(self) -> float | None:
        """The pooled mean log-length of every recorded group (None: nothing recorded)."""
        return self._sum / self._count if self._count else None

    @property
    def slope(self) -> float:
        """The cross-epoch slope in [0, 1]: least squares of a prompt's epoch on its previous one, both centred on the
        pooled mean; 1 until ``MIN_PAIRS`` prompts were seen twice."""
        if len(self._pairs) < MIN_PAIRS:
            return 1.0
        mx = sum(a for a, _ in self._pairs) / len(self._pairs)
        my = sum(b for _, b in self._pairs) / len(self._pairs)
        sxx = sum((a - mx) ** 2 for a, _ in self._pairs)
        sxy = sum((a - mx) * (b - my) for a, b in self._pairs)
        return min(1.0, max(0.0, sxy / sxx)) if sxx > 0 else 0.0

    def predict(self, key: Hashable, epoch: int) -> Prediction:
        """The start-of-step prediction for prompt ``key`` in ``epoch``: from its latest earlier epoch, else the
        prior."""
        seen = self._by_key.get(key) if key is not None else None
        earlier = [e for e in seen if e < epoch] if seen else []
        mean = self.mean
        if not earlier:
            return Prediction(mean, "prior", PRIOR_WEIGHT)
        last = seen[max(earlier)]
        return Prediction(mean + self.slope * (last - mean), "history", HISTORY_WEIGHT)

    def predict_step(self, keys: Sequence[tuple[Hashable, int]], shuffle_seed: int | None = None) -> list[Prediction]:
        """Predictions for a step's groups (group g is prompt ``keys[g][0]`` in epoch ``keys[g][1]``).
        ``shuffle_seed``: the shuffled-history control: each group gets the prediction of another group's prompt (a
        seeded permutation of the step's prompts), so the predictions keep their spread and lose their link to the
        prompt."""
        prompts = [k for k, _ in keys]
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(prompts)
        return [self.predict(k, e) for k, (_, e) in zip(prompts, keys)]


class StepLengths:
    """Step-scoped: each group's prediction, refined by its finished responses (``observe``), and what it really was.

    ``initial``: the start-of-step predictions (``LengthHistory.predict_step``; all priors when the run has no
    history). A group with finished siblings predicts the weighted mean of its start-of-step prediction (worth
    ``Prediction.weight`` siblings) and its siblings' log-lengths. A group with neither history nor siblings predicts
    the prior: the history's pooled mean, or while the run has none, the mean log-length of this step's finished
    responses so far (None before the first: all such groups rank alike)."""

    def __init__(self, initial: Sequence[Prediction], n: int):
        if not initial:
            raise ValueError("initial must have one prediction per group")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.initial, self.n = list(initial), n
        self._logs: list[list[float]] = [[] for _ in self.initial]
        self._tokens: list[list[int]] = [[] for _ in self.initial]
        self._first_sibling: list[float | None] = [None] * len(self.initial)  # the prediction after one sibling
        self._step_sum, self._step_count = 0.0, 0  # this step's finished responses (the prior of a run's start)
        self.version = 0  # bumped by every observation: a policy caching an order by prediction re-sorts

    @property
    def num_groups(self) -> int:
        return len(self.initial)

    def observe(self, group: int, tokens: int) -> None:
        """A response of ``group`` finished with ``tokens`` response tokens."""
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group {group} out of range")
        if len(self._logs[group]) >= self.n:
            raise RuntimeError(f"group {group} observed more than n={self.n} responses")
        x = math.log(max(1, int(tokens)))
        self._logs[group].append(x)
        self._tokens[group].append(int(tokens))
        self._step_sum += x
        self._step_count += 1
        if len(self._logs[group]) == 1:
            self._first_sibling[group] = self.log_mean(group)
        self.version += 1

    def _prior(self) -> float | None:
        for p in self.initial:  # the history's pooled mean, the same in every prior of the step
            if p.source == "prior" and p.log_tokens is not None:
                return p.log_tokens
        return self._step_sum / self._step_count if self._step_count else None

    def log_mean(self, group: int) -> float | None:
        """The group's predicted mean log response length now (None: nothing known yet)."""
        p, logs = self.initial[group], self._logs[group]
        start = p.log_tokens if p.source == "history" else self._prior()
        if not logs:
            return start
        if start is None:
            return sum(logs) / len(logs)
        w = p.weight
        return (w * start + sum(logs)) / (w + len(logs))

    def tokens(self, group: int) -> float | None:
        """The group's predicted mean response length in tokens now (None: nothing known yet)."""
        x = self.log_mean(group)
        return None if x is None else math.exp(x)

    def source(self, group: int) -> str:
        """Where the group's prediction now comes from."""
        return "siblings" if self._logs[group] else self.initial[group].source

    def seen(self, group: int) -> int:
        return len(self._logs[group])

    def lengths(self, group: int) -> list[int] | None:
        """The group's response lengths once all n are observed (None before)."""
        got = self._tokens[group]
        return list(got) if len(got) == self.n else None

    def record(self) -> list[dict]:
        """Per group, what the step record keeps: the start-of-step prediction and its source, the first finished
        response and the prediction after it, and the actual mean and longest response, in tokens (None for a group
        whose responses did not all finish)."""
        out = []
        for g, p in enumerate(self.initial):
            lengths = self._tokens[g]
            complete = len(lengths) == self.n
            start = p.log_tokens if p.source == "history" else None
            first = self._first_sibling[g]
            out.append({"source": p.source, "n": self.n,
                        "predicted_tokens": None if start is None else math.exp(start),
                        "first_tokens": lengths[0] if lengths else None,
                        "first_sibling_tokens": None if first is None else math.exp(first),
                        "actual_mean_tokens": sum(lengths) / len(lengths) if complete else None,
                        "actual_max_tokens": max(lengths) if complete else None})
        return out


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None with fewer than 3 pairs or a constant side."""
    if len(xs) != len(ys):
        raise ValueError("xs and ys differ in length")
    if len(xs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(list(xs)), ranks(list(ys))
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry)) / math.sqrt(sxx * syy)


def prediction_quality(records: Sequence[dict]) -> dict[str, dict]:
    """Rank correlation of predicted vs actual mean length per source, over groups' records (``StepLengths.record``,
    pooled over steps): ``history`` (the start-of-step prediction of groups whose prompt had an earlier epoch) and
    ``siblings`` (the prediction after the group's first finished response, against the mean of its other
    responses: the first is not counted twice); ``prior`` predicts one value for all and has none."""
    hist = [(r["predicted_tokens"], r["actual_mean_tokens"]) for r in records
            if r["source"] == "history" and r["actual_mean_tokens"] is not None]
    sib = []
    for r in records:
        if r["first_sibling_tokens"] is None or r["actual_mean_tokens"] is None or r.get("n", 0) < 2:
            continue
        n = r["n"]
        rest = (n * r["actual_mean_tokens"] - r["first_tokens"]) / (n - 1)
        sib.append((r["first_sibling_tokens"], rest))
    prior = [r for r in records if r["source"] == "prior" and r["actual_mean_tokens"] is not None]
    return {"history": {"groups": len(hist), "rank_correlation": rank_correlation(*zip(*hist)) if hist else None},
            "siblings": {"groups": len(sib), "rank_correlation": rank_correlation(*zip(*sib)) if sib else None},
            "prior": {"groups": len(prior), "rank_correlation": None}}
