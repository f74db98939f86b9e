"""The step's actor metrics from its pieces (verl_pipe/trainer/step_metrics.py): the units' update metrics as verl's
per-mini-batch lists, and the entropy of several old-log-prob calls as verl's one call over the same rows. Pure but
for one check against verl's own ``reduce_metrics`` (imported there). No Ray, no model."""

import math

import pytest

from verl_pipe.trainer.step_metrics import LAST_UNIT_KEYS, entropy_weight, step_entropy, unit_lists

# three PPO mini-batches of one step, each as verl's worker reduces it (one value per key; lr: each unit's own
# optimizer step steps the scheduler in ours, the last mini-batch only in verl's)
MINI_BATCHES = [
    {"actor/pg_loss": -0.02, "actor/ppo_kl": 1e-4, "actor/grad_norm": 0.7, "perf/max_memory_allocated_gb": 3.0,
     "perf/min_thing": 2.0, "actor/lr": 1e-6},
    {"actor/pg_loss": 0.05, "actor/ppo_kl": 3e-4, "actor/grad_norm": 0.4, "perf/max_memory_allocated_gb": 5.0,
     "perf/min_thing": 1.0, "actor/lr": 2e-6},
    {"actor/pg_loss": 0.01, "actor/ppo_kl": 2e-4, "actor/grad_norm": 0.9, "perf/max_memory_allocated_gb": 4.0,
     "perf/min_thing": 3.0, "actor/lr": 3e-6},
]


def test_unit_lists_are_one_value_per_unit_in_training_order():
    lists = unit_lists(MINI_BATCHES)
    assert list(lists) == list(MINI_BATCHES[0]), "keys in the order they first appear"
    assert lists["actor/pg_loss"] == [-0.02, 0.05, 0.01]
    assert lists["actor/grad_norm"] == [0.7, 0.4, 0.9]
    assert lists["actor/lr"] == [3e-6], "verl reports the LR of the step's last mini-batch only"
    assert "actor/lr" in LAST_UNIT_KEYS


def test_unit_lists_skip_a_key_a_unit_does_not_have():
    lists = unit_lists([{"actor/grad_norm": 1.0}, {"actor/grad_norm": 3.0, "actor/pg_loss": 0.5}])
    assert lists == {"actor/grad_norm": [1.0, 3.0], "actor/pg_loss": [0.5]}
    assert unit_lists([]) == {}


def test_unit_lists_do_not_touch_the_units():
    units = [{"actor/grad_norm": 1.0, "actor/lr": 1.0}, {"actor/grad_norm": 2.0, "actor/lr": 2.0}]
    unit_lists(units)
    assert units == [{"actor/grad_norm": 1.0, "actor/lr": 1.0}, {"actor/grad_norm": 2.0, "actor/lr": 2.0}]


def test_reduced_like_verls_sync_step_on_the_same_mini_batches():
    """verl's reduce_metrics over our units' lists is verl's over its whole batch's per-mini-batch lists, bit for bit:
    the mean, the max or min by the key's name, the last LR; one unit's values come back as they are."""
    from verl.utils.metric import reduce_metrics

    def verl_step():  # one _update_actor call over the batch: a value per mini-batch, lr from the last one
        lists = {k: [m[k] for m in MINI_BATCHES] for k in MINI_BATCHES[0] if k != "actor/lr"}
        return reduce_metrics({**lists, "actor/lr": [MINI_BATCHES[-1]["actor/lr"]]})

    units = [reduce_metrics({k: [v] for k, v in m.items()}) for m in MINI_BATCHES]  # one _update_actor call each
    ours = reduce_metrics(unit_lists(units))
    assert ours == verl_step()
    assert ours["perf/max_memory_allocated_gb"] == 5.0 and ours["perf/min_thing"] == 1.0
    assert ours["actor/pg_loss"] != units[-1]["actor/pg_loss"], "not the last unit's"
    assert reduce_metrics(unit_lists(units[:1])) == units[0]


# ---------------------------------------------------------------------------------------------- entropy

WIDTH = 5  # every row padded to the same response width (seq-mean-token-sum-norm divides by it)
# each row's entropies on its response tokens; one row has none (fully masked)
ROWS = [[0.5, 0.25, 1.0], [2.0], [], [0.125, 0.75, 0.5, 1.5, 0.25], [1.25, 0.0], [3.0, 0.5, 0.5, 0.5]]
MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]


def agg(rows: list[list[float]], mode: str) -> float:
    """verl's agg_loss of the entropies over the response mask (dp_size 1, loss_scale_factor None), as
    _fit_compute_log_prob computes actor/entropy for the rows of one call."""
    tokens = [e for r in rows for e in r]
    seqs = [r for r in rows if r]
    if mode == "token-mean":
        return sum(tokens) / len(tokens) if tokens else float("nan")
    if mode == "token-sum":
        return sum(tokens)
    if not seqs:
        return float("nan")
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in seqs) / len(seqs)
    value = sum(sum(r) for r in seqs) / len(seqs)
    return value / WIDTH if mode == "seq-mean-token-sum-norm" else value


def calls(pieces: list[list[list[float]]], mode: str) -> list[tuple[float, list[int]]]:
    return [(agg(p, mode), [len(r) for r in p]) for p in pieces]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cuts", [(1, 3), (2, 4, 5), (3,)])
def test_entropy_of_several_calls_is_one_call_over_their_rows(mode, cuts):
    """CGP computes the old log-probs of the groups as they arrive (several calls, the longest last); the step's
    entropy is verl's sync call over all of them, not the last call's."""
    bounds = [0, *cuts, len(ROWS)]
    pieces = [ROWS[a:b] for a, b in zip(bounds, bounds[1:])]
    got = step_entropy(calls(pieces, mode), mode)
    assert got == pytest.approx(agg(ROWS, mode), rel=1e-12)
    assert got != pytest.approx(agg(pieces[-1], mode), rel=1e-6), "not the last call's"


@pytest.mark.parametrize("mode", MODES)
def test_one_call_is_its_own_value(mode):
    """Sync: one call over the batch; its value stands as verl reported it, bit for bit."""
    value = 0.1 + 0.2  # a float that a weighted mean would not give back exactly
    assert step_entropy([(value, [3, 0, 7])], mode) == value


def test_a_call_without_response_tokens_counts_for_nothing():
    """A call's 0/0 (no response token, e.g. a group of empty responses) does not make the step's entropy nan."""
    parts = [(float("nan"), [0, 0]), (0.5, [2, 2]), (1.0, [4])]
    assert step_entropy(parts, "token-mean") == pytest.approx((0.5 * 4 + 1.0 * 4) / 8)
    assert step_entropy(parts, "seq-mean-token-mean") == pytest.approx((0.5 * 2 + 1.0 * 1) / 3)
    assert math.isnan(step_entropy([(float("nan"), [0]), (float("nan"), [0, 0])], "token-mean"))


def test_entropy_weight_is_what_verls_agg_loss_divides_by():
    assert entropy_weight("token-mean", [3, 0, 2]) == 5
    assert entropy_weight("token-sum", [3, 0, 2]) is None
    for mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        assert entropy_weight(mode, [3, 0, 2]) == 2, mode
    with pytest.raises(ValueError, match="loss_agg_mode"):
        entropy_weight("sum", [1])
    with pytest.raises(ValueError, match="no old-log-prob call"):
        step_entropy([], "token-mean")
