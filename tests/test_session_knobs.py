"""PipeSession's sticky knobs (verl_pipe/launch/session.py), without a stack: a knob set by one step and set again by the
next must replace the earlier value (the bench changes the mode every step)."""

from types import SimpleNamespace

from verl_pipe.launch.session import PipeSession, compose


def _session():
    s = PipeSession.__new__(PipeSession)  # no Ray, no workers: only the knob bookkeeping
    s.trainer = SimpleNamespace(config=compose())
    s._changes = {}
    return s


def test_a_knob_set_again_replaces_the_earlier_value():
    s = _session()
    assert s.change(mode="cgp", fgd=True).mode == "cgp"
    k = s.change(mode="sync", fgd=False)
    assert (k.mode, k.fgd) == ("sync", False)
    assert s.change(granularity="group").mode == "sync"  # unset knobs stay as the last step left them
