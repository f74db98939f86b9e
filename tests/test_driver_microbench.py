"""``python -m verl_pipe_lab.bench driver_microbench`` (lab/verl_pipe_lab/bench/tools/driver_microbench.py) runs the real rollout
driver (stream._StepRun over RolloutCore and the admission policy) on a fake engine, every layer to the step's end: a
small run of each, no Ray, no vLLM."""

import argparse
import asyncio
import importlib
import random

import pytest

@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("verl_pipe_lab.bench.tools.driver_microbench")


def _args(**kw):
    a = dict(groups=6, n=2, unit=2, replicas=2, slots=4, window="adaptive", burst=3)
    a.update(kw)
    return argparse.Namespace(**a)


@pytest.mark.parametrize("window", ["adaptive", "auto", "null", "3"])
def test_every_layer_runs_a_whole_step(bench, window):
    a = _args(window=window)
    peak = []
    bench.policy_only(a, random.Random(1), peak)
    assert 0 < peak[0] <= a.groups * a.n
    bench.core_loop(a, random.Random(1))
    bench.core_loop(a, random.Random(1), timeline=True)
    for completions in (True, False):  # real_driver asserts every group reached the trainer's queue
        asyncio.run(bench.real_driver(a, random.Random(1), completions=completions))


def test_the_driver_it_times_is_stream_py_s(bench):
    """No copy of the rollout loop: the timed driver is StreamingRollout._run_step over a RolloutCore."""
    import inspect

    src = inspect.getsource(bench.real_driver)
    assert "rollout._run_step(req)" in src and "stream._StepRun(rollout, req)" in src
    assert "on_response_done" not in src and "on_group_done" not in src


def test_main_prints_a_figure_per_layer(bench, capsys):
    assert bench.main(["--groups", "4", "--n", "2", "--unit", "2", "--slots", "4", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for layer in ("policy", "policy + core", "+ timeline", "driver (asyncio.wait)", "driver (Completions)"):
        assert f"  {layer} " in out


def test_the_peak_in_flight_is_what_the_window_admits(bench):
    """The header's "(N in flight at most)": a per-replica window of w requests keeps w x replicas in flight."""
    for replicas, window in ((1, "2"), (2, "3"), (2, "4")):
        peak = []
        bench.policy_only(_args(replicas=replicas, window=window), random.Random(0), peak)
        assert peak == [replicas * int(window)]
