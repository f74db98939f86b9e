import time

import pytest

from verl_pipe.core.deadline import DeadlineExceeded, call_with_deadline


def test_returns_value_and_reraises_errors():
    assert call_with_deadline(lambda: 7, 1.0, "x", "k") == 7
    assert call_with_deadline(lambda: 7, None, "x", "k") == 7

    def boom():
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        call_with_deadline(boom, 1.0, "x", "k")


def test_a_hang_becomes_an_error_naming_the_setting():
    t0 = time.perf_counter()
    with pytest.raises(DeadlineExceeded, match="rolloutpipe.weight_sync_timeout_s"):
        call_with_deadline(lambda: time.sleep(5), 0.2, "weight sync", "rolloutpipe.weight_sync_timeout_s")
    assert time.perf_counter() - t0 < 2
