"""verl_pipe/teardown.py: a launcher that is a child subreaper finds and ends the orphans its run leaves (a process
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
    from verl_pipe.teardown import become_subreaper, descendants, reap

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
