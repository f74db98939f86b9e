"""verl_pipe/launch/teardown.py: a launcher that is a child subreaper finds and ends the orphans its run leaves (a process
whose parent died first, like vLLM's EngineCore when a group signal kills its server actor), in a subprocess so the
test process's own children are not touched."""

import json
import subprocess
import sys
import textwrap

import psutil
import pytest

SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from verl_pipe.launch.teardown import become_subreaper, descendants, reap

    adopt = sys.argv[1] == "subreaper"
    if adopt:
        assert become_subreaper()
    # a child that starts a grandchild (which ignores SIGTERM) and exits at once: the grandchild is orphaned
    child = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"],
        stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    child.wait()
    time.sleep(0.5)
    seen = [p.pid for p in descendants()]
    killed = reap(grace_s=1.0) if adopt else []
    print(json.dumps({"grandchild": grandchild, "seen": seen, "killed": killed}))
""")


def _run(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_CHILD_SUBREAPER) is Linux's")
def test_a_subreaper_launcher_adopts_and_ends_an_orphan_that_ignores_sigterm():
    r = _run("subreaper")
    assert r["grandchild"] in r["seen"], "the orphan was reparented to the launcher"
    assert r["killed"] == [r["grandchild"]], "SIGTERM ignored: killed after the grace period"
    assert not psutil.pid_exists(r["grandchild"]) or psutil.Process(r["grandchild"]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_CHILD_SUBREAPER) is Linux's")
def test_without_the_subreaper_the_orphan_is_out_of_reach():
    r = _run("plain")
    try:
        assert r["grandchild"] not in r["seen"], "reparented to init: what the subreaper is for"
    finally:
        psutil.Process(r["grandchild"]).kill()


RESET_SCRIPT = textwrap.dedent("""
    import ctypes, os, signal, sys, threading, time
    from verl_pipe.launch.teardown import run_ignoring

    def ray_like_shutdown():
        # what ray.shutdown does from C++ (RayLog::UninstallSignalAction): SIGTERM back to SIG_DFL, under Python
        ctypes.CDLL(None).signal(signal.SIGTERM, ctypes.c_void_p(0))
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's second SIGTERM, during the shutdown
        time.sleep(0.2)

    if sys.argv[1] == "held":
        assert run_ignoring(ray_like_shutdown, 10.0)
    else:  # SIG_IGN set once, as before
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        t = threading.Thread(target=ray_like_shutdown); t.start(); t.join()
    print("survived")
""")


@pytest.mark.parametrize("mode", ["held", "once"])
def test_a_second_sigterm_during_a_shutdown_that_resets_the_handler(mode):
    out = subprocess.run([sys.executable, "-c", RESET_SCRIPT, mode], capture_output=True, text=True, timeout=60)
    if mode == "held":
        assert out.returncode == 0 and "survived" in out.stdout, out.stderr
    else:  # what the launcher did before run_ignoring: killed mid-teardown
        assert out.returncode == -15, (out.returncode, out.stdout, out.stderr)


def test_only_the_first_signal_interrupts_the_launcher(monkeypatch):
    """SIGINT then SIGTERM: both handlers may run back to back (the main thread runs them late, in ray.get); the
    second must not raise inside the teardown the first one started."""
    import signal

    from verl_pipe.launch import launcher

    monkeypatch.setattr(launcher, "_SIGNALS", [])
    with pytest.raises(KeyboardInterrupt):
        launcher._stop_on(signal.SIGINT, None)
    launcher._stop_on(signal.SIGTERM, None)  # recorded, not raised
    assert launcher._SIGNALS == [signal.SIGINT, signal.SIGTERM]


def test_an_actor_death_that_surfaces_before_the_signal_handler_is_still_the_signals_stop(monkeypatch):
    """A group SIGTERM kills the TaskRunner actor as it reaches the launcher: ray.get may raise the actor's death
    before the launcher's handler ran. ``_signalled`` gives the pending handler the time to run, and says so; with no
    signal it says no after its wait (a real failure is re-raised)."""
    import os
    import signal
    import threading

    from verl_pipe.launch import launcher

    monkeypatch.setattr(launcher, "_SIGNALS", [])
    assert launcher._signalled(wait_s=0.1) is False
    before = signal.signal(signal.SIGUSR1, launcher._stop_on)
    try:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()  # arrives while _signalled waits
        assert launcher._signalled(wait_s=5.0) is True
        assert launcher._SIGNALS == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, before)
