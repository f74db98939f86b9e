"""The trainer's run-time group filter (verl_pipe/core/group_filter.py): ``with trainer.filtering_groups(keep):`` adds a
filter beside the ``group_is_trainable`` hook for the block's steps, and ``keeps_group`` (what the rollout asks of each
materialized group) needs both. Pure: the mixin on a small class, then on a RolloutPipeTrainer built without workers."""

import numpy as np
import pytest
import torch

from verl_pipe.core.group_filter import GroupFilters


class _Hooked(GroupFilters):
    """A hook that drops group 1."""

    def group_is_trainable(self, group, piece):
        return group != 1


def test_without_a_filter_the_hook_decides():
    t = _Hooked()
    assert [t.keeps_group(g, None) for g in range(4)] == [True, False, True, True]


def test_a_filter_applies_inside_its_block_only_and_nests():
    t, other = _Hooked(), _Hooked()
    with t.filtering_groups(lambda g, piece: g != 0):
        assert [t.keeps_group(g, None) for g in range(4)] == [False, False, True, True]
        with t.filtering_groups(lambda g, piece: g != 3):
            assert [t.keeps_group(g, None) for g in range(4)] == [False, False, True, False]
        assert [t.keeps_group(g, None) for g in range(4)] == [False, False, True, True]
        assert [other.keeps_group(g, None) for g in range(4)] == [True, False, True, True]  # per trainer
    assert [t.keeps_group(g, None) for g in range(4)] == [True, False, True, True]


def test_an_error_in_the_block_still_removes_the_filter():
    t = _Hooked()
    with pytest.raises(RuntimeError, match="step failed"):
        with t.filtering_groups(lambda g, piece: False):
            assert not t.keeps_group(0, None)
            raise RuntimeError("step failed")
    assert t.keeps_group(0, None)


def test_the_filter_sees_the_group_and_its_piece_and_is_not_asked_when_the_hook_says_no():
    t, seen = _Hooked(), []
    with t.filtering_groups(lambda g, piece: seen.append((g, piece)) or True):
        t.keeps_group(0, "piece 0")
        t.keeps_group(1, "piece 1")
    assert seen == [(0, "piece 0")]


def test_a_filter_that_is_not_a_function_is_refused():
    with pytest.raises(TypeError, match="filtering_groups needs a function"):
        with _Hooked().filtering_groups(True):
            pass


def _piece(scores):
    from verl import DataProto

    tls = torch.zeros(len(scores), 4)
    tls[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return DataProto.from_dict(tensors={"token_level_scores": tls},
                               non_tensors={"extra_info": np.array([{"index": 0}] * len(scores), dtype=object)})


def test_the_trainer_asks_its_default_hook_and_the_filter():
    from verl_pipe.trainer import RolloutPipeTrainer

    t = RolloutPipeTrainer.__new__(RolloutPipeTrainer)  # no workers: only what the hook reads
    t.filter_zero_variance = True
    flat, spread = _piece([0.5, 0.5]), _piece([0.0, 1.0])
    assert not t.keeps_group(0, flat) and t.keeps_group(0, spread)  # zero variance: the hook says no
    with t.filtering_groups(lambda g, piece: g != 0):
        assert not t.keeps_group(0, spread) and t.keeps_group(2, spread) and not t.keeps_group(2, flat)
    assert t.keeps_group(0, spread)
