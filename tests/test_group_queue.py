"""The FIFO between rollout and trainer: order, weight versions, exactly once, end of step, errors."""

import threading
import time

import pytest

from verl_pipe.core.group_queue import Group, GroupQueue, WrongWeightVersion


def _g(i, version=3):
    return Group(index=i, data=f"piece{i}", weight_version=version, ready_time=float(i))


def test_fifo_units_and_short_last_unit():
    q = GroupQueue(weight_version=3)
    for i in (5, 2, 7):
        q.put(_g(i))
    assert [g.index for g in q.take(2)] == [5, 2]
    q.close()
    assert [g.index for g in q.take(2)] == [7]  # short last unit at the end of the step
    assert q.take(2) == []
    assert q.taken == [5, 2, 7]


def test_refuses_other_weight_versions_duplicates_and_late_groups():
    q = GroupQueue(weight_version=3)
    with pytest.raises(WrongWeightVersion, match="version 2"):
        q.put(_g(1, version=2))
    q.put(_g(1))
    with pytest.raises(RuntimeError, match="twice"):
        q.put(_g(1))
    q.close()
    with pytest.raises(RuntimeError, match="after the step's queue was closed"):
        q.put(_g(2))


def test_take_blocks_until_the_unit_is_complete():
    q = GroupQueue(weight_version=0)
    got = []
    t = threading.Thread(target=lambda: got.extend(q.take(2)))
    t.start()
    q.put(_g(0, 0))
    time.sleep(0.05)
    assert not got, "a unit is not trained before all its groups are in"
    q.put(_g(1, 0))
    t.join(timeout=5)
    assert [g.index for g in got] == [0, 1]


def test_take_with_need_returns_what_arrived():
    q = GroupQueue(weight_version=0)
    q.put(_g(0, 0))
    q.put(_g(1, 0))
    q.put(_g(2, 0))
    assert [g.index for g in q.take(2, need=1)] == [0, 1]  # up to k, as soon as `need` are in
    assert [g.index for g in q.take(5, need=1)] == [2]
    with pytest.raises(TimeoutError):
        q.take(3, need=1, timeout=0.01)
    q.put(_g(3, 0))
    with pytest.raises(TimeoutError, match="fewer than 2"):
        q.take(3, need=2, timeout=0.01)


def test_rollout_failure_reaches_the_trainer():
    q = GroupQueue(weight_version=0)
    q.fail(ValueError("replica died"))
    with pytest.raises(RuntimeError, match="rollout failed") as e:
        q.take(1)
    assert isinstance(e.value.__cause__, ValueError)
    with pytest.raises(RuntimeError):
        q.drain()


def test_bad_arguments():
    q = GroupQueue(weight_version=0)
    with pytest.raises(ValueError, match="need 1 <= need <= k"):
        q.take(0)
    with pytest.raises(ValueError, match="need 1 <= need <= k"):
        q.take(2, need=3)


def test_end_with_closes_or_fails_the_queue_when_the_producer_ends():
    from concurrent.futures import Future

    ok, bad = GroupQueue(weight_version=0), GroupQueue(weight_version=0)
    f_ok, f_bad = Future(), Future()
    ok.end_with(f_ok)
    bad.end_with(f_bad)
    assert not ok.closed and not bad.closed
    f_ok.set_result(None)
    f_bad.set_exception(RuntimeError("rollout died"))
    assert ok.closed and ok.take(2) == []
    with pytest.raises(RuntimeError, match="the rollout failed") as err:
        bad.take(2)
    assert str(err.value.__cause__) == "rollout died"
