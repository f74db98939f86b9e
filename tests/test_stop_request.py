"""The stop request through the Ray cluster (verl_pipe/launch/stop_request.py) and how the run loop reads it, without a
cluster: outside Ray nothing is requested; a bad run id is refused by name. A real cluster's request (another node's
TaskRunner, no shared /tmp) is run in tests/e2e/test_multinode.py."""

import pytest

from verl_pipe.launch import stop_request
from verl_pipe.trainer.run_loop import RunLoop


def test_outside_a_ray_cluster_nothing_is_requested():
    assert not stop_request.requested("host-123")
    assert not stop_request.requested(None)
    stop_request.clear("host-123")  # nothing to clear, no error


def test_a_bad_run_id_is_refused_by_name():
    with pytest.raises(ValueError, match="run id must be a non-empty string"):
        stop_request.request("")


def test_the_loop_reads_the_file_or_the_cluster_key(tmp_path):
    loop = RunLoop()
    loop.stop_file, loop.stop_key = str(tmp_path / "stop"), "host-123"
    assert not loop.stop_requested()
    (tmp_path / "stop").touch()
    assert loop.stop_requested()
