"""A step's actor metrics from its pieces, as verl's synchronous step reports them on the same batch.

verl 0.9.1's step trains the whole batch in one ``_update_actor`` call: the worker (``ActorWorker.train_mini_batch``,
verl/workers/engine_workers.py) turns each PPO mini-batch's metrics into one value per key (``Metric.aggregate_dp``;
``grad_norm``, ``loss``, ``mfu`` are one value per mini-batch already) and appends them into one list per key
(``append_to_dict``), which the trainer reduces with ``reduce_metrics`` (verl/utils/metric/utils.py: the mean, the
max or min where the key's name holds "max" or "min"). Only the last mini-batch steps the LR scheduler and reports
``lr``. The old log-probs of the whole batch are one ``_fit_compute_log_prob`` call, whose ``actor/entropy`` is verl's
``agg_loss`` of the entropies over the response mask with the actor's ``loss_agg_mode``.

Our executor (verl_pipe/trainer/actor_backend.py) calls ``_update_actor`` once per unit (one mini-batch; group
granularity: ``finish_unit``) and, in CGP, ``_fit_compute_log_prob`` once per piece of arrived groups; each call
reports its own values, and the last one would stand for the step. ``unit_lists`` gives back verl's per-mini-batch
lists (for verl's ``reduce_metrics``), ``step_entropy`` the entropy of the whole batch. Pure: no torch, no verl.
"""

from __future__ import annotations

ENTROPY = "actor/entropy"
# reported by verl for the step's last mini-batch only (its LR-scheduler step): the last unit's value stands
LAST_UNIT_KEYS = frozenset({"actor/lr"})


def unit_lists(units: list[dict]) -> dict[str, list]:
    """The step's units' update metrics (each unit's reduced as verl reduces one mini-batch's: one value per key),
    in training order, as the per-mini-batch lists verl's worker returns for the whole batch: a list per key, one
    value per unit that has it, keys in the order they first appear; ``LAST_UNIT_KEYS``: the last unit's value only.
    verl's ``reduce_metrics`` over it gives verl's step value (bit for bit for a step of one unit). A key that one
    mini-batch reports as several values (a per-micro-batch list that is no ``Metric``, e.g. verl's constant
    ``kl_coef``) is the mean of the units' means, not of all their values."""
    lists: dict[str, list] = {}
    for unit in units:
        for key, value in unit.items():
            lists.setdefault(key, []).append(value)
    return {k: v[-1:] if k in LAST_UNIT_KEYS else v for k, v in lists.items()}


def entropy_weight(loss_agg_mode: str, response_tokens: list[int]) -> float | None:
    """What verl's ``agg_loss`` divides a piece's entropy sum by (dp_size 1, no global batch info): its response
    tokens (token-mean), its rows with a response token (the seq-mean modes); None for token-sum (no division: the
    pieces' values add up). seq-mean-token-sum-norm also divides by ``loss_scale_factor`` or the padded response
    length, the same for every piece of a step (its rows are padded to the same width)."""
    if loss_agg_mode == "token-mean":
        return float(sum(response_tokens))
    if loss_agg_mode == "token-sum":
        return None
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        return float(sum(1 for t in response_tokens if t > 0))
    raise ValueError(f"actor_rollout_ref.actor.loss_agg_mode: unknown mode {loss_agg_mode!r}")


def step_entropy(parts: list[tuple[float, list[int]]], loss_agg_mode: str) -> float:
    """The whole batch's ``actor/entropy`` from its old-log-prob calls' ``(value, response tokens of each row)``:
    the values weighted by what each call divided by (``entropy_weight``), which is verl's single call on the same
    rows up to float rounding; one call's value as it is. No response token anywhere: nan (verl's 0/0)."""
    if not parts:
        raise ValueError("step_entropy: no old-log-prob call reported an entropy")
    if len(parts) == 1:
        return parts[0][0]
    weights = [entropy_weight(loss_agg_mode, rows) for _, rows in parts]
    if loss_agg_mode == "token-sum":
        return sum(v for v, _ in parts)
    total = sum(weights)
    if total == 0:
        return float("nan")
    # a call without response tokens (weight 0) reported 0/0: it holds no token of the batch
    return sum(v * w for (v, _), w in zip(parts, weights) if w) / total
