"""The two-core contention probe's arithmetic (verl_pipe.platform.core_pair), and one short real probe."""

import os

import pytest

from verl_pipe.platform.core_pair import overlap_capacity, probe_pair


def test_independent_cores_have_capacity_two():
    assert overlap_capacity({0: 100.0, 1: 80.0}, {0: 100.0, 1: 80.0}) == pytest.approx(2.0)


def test_one_shared_core_has_capacity_one():
    assert overlap_capacity({0: 100.0, 1: 100.0}, {0: 50.0, 1: 50.0}) == pytest.approx(1.0)


def test_uneven_slowdowns_add_per_core():
    assert overlap_capacity({0: 100.0, 1: 50.0}, {0: 25.0, 1: 40.0}) == pytest.approx(0.25 + 0.8)


def test_mismatched_cores_are_refused():
    with pytest.raises(ValueError, match="same cores"):
        overlap_capacity({0: 1.0, 1: 1.0}, {0: 1.0, 2: 1.0})
    with pytest.raises(ValueError, match="not positive"):
        overlap_capacity({0: 0.0, 1: 1.0}, {0: 1.0, 1: 1.0})


def test_probe_refuses_one_core_twice():
    with pytest.raises(ValueError, match="two distinct usable cores"):
        probe_pair((0, 0), 0.1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
def test_probe_runs_on_two_cores():
    cores = sorted(os.sched_getaffinity(0))[:2]
    r = probe_pair(tuple(cores), 0.2)
    for kind in ("compute", "memory"):
        assert set(r[kind]["alone"]) == set(r[kind]["together"]) == {str(c) for c in cores}
        assert all(v > 0 for v in r[kind]["alone"].values())
        assert r[kind]["overlap_capacity"] > 0
