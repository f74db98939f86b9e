"""Which prompts make each PPO mini-batch of a step: ``rolloutpipe.minibatch_order``, decided before the rollout.

Pure (stdlib only), shared by the real trainer (``RolloutPipeTrainer.order_minibatches``) and its tests.

verl's trainer splits a step's batch into PPO mini-batches by position: the first ``ppo_mini_batch_size`` prompts
(with their n responses) make the first optimizer step, and so on. Our sync mode does the same, and with
``rolloutpipe.cgp.unit_fill=dispatch`` the pipelined modes train exactly those mini-batches (verl_pipe/core/release.py).
This module decides the position of each prompt before anything is generated, from what the run already knows,
so every mode — sync included — trains the same partition:

- ``dataloader``: the dataloader's order, as verl's own trainer (our sync is then verl's stock step).
- ``length`` (the default): the prompts ordered by their predicted response length (the length history of their
  earlier epochs, verl_pipe/core/lengths.py), shortest first; ties and prompts with nothing known keep the dataloader's
  order, so a run's first epoch trains exactly as ``dataloader``. The pipelined modes' frontier-group dispatch admits
  in this order, so the groups of the first mini-batch are the ones predicted to finish first: the units complete
  roughly shortest-first, as with completion fill, while each one is still the mini-batch sync trains. Within a step
  it is also a curriculum (short responses' updates first) that sync gets too.
"""

from __future__ import annotations

from collections.abc import Sequence

MINIBATCH_ORDERS = ("length", "dataloader")


def check_order(order: str) -> str:
    if order not in MINIBATCH_ORDERS:
        raise ValueError(f"rolloutpipe.minibatch_order: got {order!r}; allowed: {', '.join(MINIBATCH_ORDERS)}")
    return order


def length_permutation(predicted: Sequence[float | None]) -> list[int]:
    """The dataloader positions in training order: by predicted (log-)length, shortest first; equal predictions
    keep the dataloader's order (a stable sort), and groups with no prediction (None) follow the predicted ones in
    the dataloader's order. All None (nothing known yet): the identity."""
    known = sorted((p, i) for i, p in enumerate(predicted) if p is not None)
    return [i for _, i in known] + [i for i, p in enumerate(predicted) if p is None]


def step_permutation(order: str, predicted: Sequence[float | None]) -> list[int]:
    """The step's training order of its prompts under ``rolloutpipe.minibatch_order`` (``check_order``)."""
    if check_order(order) == "dataloader":
        return list(range(len(predicted)))
    return length_permutation(predicted)
