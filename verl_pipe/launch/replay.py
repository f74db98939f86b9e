"""One step's responses, generated once, trained again in several modes from the same weights: the exactness check.

``train_same_responses`` runs the rollout of one step on a live ``PipeSession``, then trains its groups once per
run (e.g. sync and CGP) from the same θ_k and optimizer state, restored from a checkpoint between runs, and
returns what each run produced (unit gradient norms, parameters after, metrics, the trained batch). The e2e tests
(tests/e2e/) and ``python -m verl_pipe.doctor`` compare them; ``update_deviation`` is the figure they compare the
parameter updates by.
"""

from __future__ import annotations

import os
from collections.abc import Callable


class ReplayError(RuntimeError):
    """A run did not train the step's groups exactly once."""


def prefilled_queue(groups, version: int):
    """A closed queue holding ``groups`` in index order: the whole batch is there before training starts."""
    from verl_pipe.core.group_queue import GroupQueue

    q = GroupQueue(weight_version=version)
    for g in sorted(groups, key=lambda g: g.index):
        q.put(g)
    q.close()
    return q


def trainer_in(trainer, mode: str, granularity: str, **knobs) -> Callable:
    """The trainer's training of one step's queue in ``mode`` / ``granularity`` (and any other StepKnobs field,
    e.g. ``unit_fill``): (queue, timeline) -> StepOutcome."""
    return lambda queue, timeline: trainer.replay(queue, trainer.global_steps, timeline, mode=mode,
                                                  granularity=granularity, **knobs)


def train_same_responses(session, workdir, runs) -> dict:
    """One step's responses, generated once, trained by each of ``runs(groups, version)`` -> [(name, train function
    (queue, timeline) -> StepOutcome, queue)] from the same θ_k and optimizer state (a checkpoint in
    ``workdir``/same_responses, loaded before each run). Returns ``theta_k`` (parameters), the ``groups``, and per run the unit grad norms, the
    parameters after, the step's metrics and the trained batch. Leaves the actor at θ_k, as the vLLM replica has it."""
    from verl_pipe.core.group_queue import GroupQueue
    from verl_pipe.core.timeline import StepTimeline

    trainer = session.trainer
    version = trainer.global_steps - 1
    ckpt = os.path.join(str(workdir), "same_responses")
    trainer.actor_wg.save_checkpoint(ckpt)
    out = {"theta_k": session.actor_state()}
    try:
        batch = trainer._fit_get_batch(next(session._batches))
        queue = GroupQueue(weight_version=version)
        trainer._start_rollout(batch, StepTimeline(0, trainer.groups_per_unit), queue, version,
                               session.knobs).result()
        out["groups"] = groups = queue.drain()
        for name, train, q in runs(groups, version):
            trainer.actor_wg.load_checkpoint(ckpt)
            outcome = train(q, StepTimeline(0, trainer.groups_per_unit))
            trained, expected = [g.index for g in outcome.trained], sorted(g.index for g in groups)
            if trained != expected:
                raise ReplayError(f"{name}: trained groups {trained}, expected each of {expected} once in order")
            out[name] = {"norms": [m["actor/grad_norm"] for m in outcome.unit_metrics],
                         "state": session.actor_state(), "metrics": {**trainer.metrics, **outcome.metrics},
                         "batch": outcome.batch}
    finally:
        trainer.actor_wg.load_checkpoint(ckpt)
    return out


def update_deviation(state, base_state, theta_k) -> float:
    """|Δθ - Δθ_base| / |Δθ_base| over all parameters, Δ from θ_k."""
    num = sum(float(((state[k] - base_state[k]) ** 2).sum()) for k in base_state)
    den = sum(float(((base_state[k] - theta_k[k]) ** 2).sum()) for k in base_state)
    return (num / den) ** 0.5
