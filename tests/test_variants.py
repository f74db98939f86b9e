"""The variant table (verl_pipe/core/variants.py): the one place mode names are decoded. Pure (no verl, Ray or torch):
what each name means, the predicates callers ask instead of comparing names, and the planner's row names."""

import json
from pathlib import Path

import pytest

from verl_pipe.core.variants import (BASE, FGD_VARIANT, ON_POLICY_PEER, OURS, PEERS, PIPELINED_BASE, PLAN_ROWS,
                                     TRAINER_MODES, VARIANTS, name_of, of_row, pipelines, resolve_fgd, variant)
from verl_pipe_lab.bench.variants import PEER_CONFIGS, PEER_MODE_NAMES, V1_SYNC_TRAINER_MODE, peer_config

ROOT = Path(__file__).resolve().parent.parent


def test_pipelines_is_cgp_among_the_trainer_modes():
    assert {m: pipelines(m) for m in TRAINER_MODES} == {"sync": False, "cgp": True}
    # auto FGD follows it: on wherever the mode pipelines
    assert all(resolve_fgd("auto", m) == pipelines(m) for m in TRAINER_MODES)
    # every variant of ours with a pipelined trainer overlaps the rollout; sync does not
    assert {k for k in OURS if pipelines(variant(k).mode)} == {k for k in OURS if variant(k).overlapped}


def test_the_base_is_sync_alone():
    assert [k for k, v in VARIANTS.items() if v.is_base] == [BASE] == ["sync"]
    assert not pipelines(variant(BASE).mode) and not variant(BASE).fgd


def test_named_roles_are_variants_that_fit_them():
    cgp, fgd = variant(PIPELINED_BASE), variant(FGD_VARIANT)
    assert cgp.ours and pipelines(cgp.mode) and not cgp.fgd and cgp.granularity == "minibatch"
    assert fgd.ours and pipelines(fgd.mode) and fgd.fgd
    peer = variant(ON_POLICY_PEER)
    assert ON_POLICY_PEER in PEERS and PEER_MODE_NAMES["onpolicy"] == ON_POLICY_PEER
    assert peer.staleness == 0 and peer.simulated and not peer.colocated
    # verl's own value, not one of our trainer modes by meaning, though it is spelled like BASE
    assert V1_SYNC_TRAINER_MODE == "sync"


def test_staleness_only_for_verls_default_one_batch_ahead():
    assert {k: v.staleness for k, v in VARIANTS.items() if v.staleness} == {"verl_separate_async_1off": 1}
    assert peer_config("verl_separate_async_1off") == "default"


def test_the_labs_peer_configurations_are_keyed_by_the_runtimes_peers():
    """The lab's column of the table (verl_pipe_lab/bench/variants.py): one peer configuration per variant of verl's
    trainers, none for ours; the runtime's table names no configuration."""
    assert list(PEER_CONFIGS) == list(PEERS) and set(PEERS) == set(VARIANTS) - set(OURS)
    assert len(PEER_MODE_NAMES) == len(PEER_CONFIGS)
    with pytest.raises(ValueError, match="'sync' is not one of verl's trainers"):
        peer_config(BASE)
    with pytest.raises(ValueError, match="unknown mode 'nope'"):
        peer_config("nope")
    assert not hasattr(variant(ON_POLICY_PEER), "peer_config")


def test_planner_rows_map_to_variants_one_to_one():
    assert variant("verl_separate_async_1off").row == "verl_one_step_off"
    assert all(v.row == k for k, v in VARIANTS.items() if k != "verl_separate_async_1off")
    assert len(PLAN_ROWS) == len(VARIANTS)  # no two variants share a row
    assert all(of_row(v.row) is v for v in VARIANTS.values())
    assert of_row("verl_one_step_off") is variant("verl_separate_async_1off")
    with pytest.raises(ValueError, match="unknown planner row 'verl_separate_async_1off'"):
        of_row("verl_separate_async_1off")  # the variant's name is not its row
    with pytest.raises(ValueError, match="unknown planner row 'nope'"):
        of_row("nope")


def test_the_planners_rows_and_expected_errors_are_table_rows():
    from verl_pipe.plan.predict import LABELS, ROWS

    assert set(ROWS) <= set(PLAN_ROWS) and set(LABELS) == set(ROWS)
    expected = json.loads((ROOT / "verl_pipe" / "plan" / "validation.json").read_text())["expected_error"]
    assert set(expected) <= set(PLAN_ROWS), sorted(set(expected) - set(PLAN_ROWS))
    assert [r for r in ROWS if of_row(r).fgd] == [FGD_VARIANT]
    assert [r for r in ROWS if of_row(r).colocated] == ["verl_colocated"]


def test_name_of_decodes_through_pipelines():
    assert name_of("sync", "group") == name_of("sync", "minibatch") == BASE
    assert name_of("cgp", "minibatch") == PIPELINED_BASE
    assert name_of("cgp", "group", fgd=True) == FGD_VARIANT
    assert name_of("sync", "minibatch", fgd=True) is None


def test_fifo_variant_is_cgp_without_fgd_at_each_granularity():
    from verl_pipe.core.variants import fifo_variant

    assert fifo_variant("minibatch") == "cgp" and fifo_variant("group") == "cgp_group"
    with pytest.raises(ValueError, match="granularity"):
        fifo_variant("unit")
