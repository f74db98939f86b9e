"""Core confinement on a CPU machine (verl_pipe/platform/env.py): the launcher and everything Ray starts
share the rollout cores, and the trainer pool still pins itself to its own cores."""

import os
import subprocess
import sys

import pytest

from verl_pipe.platform.env import system_core_list


def test_system_core_list():
    assert system_core_list("rollout", "0") == [0]
    assert system_core_list("all", "0") is None
    assert system_core_list("2-3", "0") == [2, 3]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_pool_pins_within_the_run_cores_not_the_inherited_set():
    cores = sorted(os.sched_getaffinity(0))
    system, trainer = cores[0], cores[1]
    code = (
        "import os\n"
        "from verl_pipe.platform.env import confine_launcher, pin_current_process\n"
        f"confine_launcher([{system}])\n"
        "assert os.sched_getaffinity(0) == {%d}\n" % system
        + "pid = os.fork()\n"
        "if pid == 0:\n"  # a process started by the confined launcher, as Ray's workers are
        "    got = pin_current_process('VERL_PIPE_TRAINER_CORES')\n"
        "    os._exit(0 if got == [%d] and os.sched_getaffinity(0) == {%d} else 1)\n" % (trainer, trainer)
        + "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, 'the trainer pool did not get its core'\n"
    )
    env = dict(os.environ, VERL_PIPE_ALL_CORES=",".join(map(str, cores)), VERL_PIPE_TRAINER_CORES=str(trainer))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_pinning_covers_every_thread_that_already_exists():
    """os.sched_setaffinity(0, ...) moves the calling thread only; a worker process already has threads (Ray's,
    torch's) when it pins itself, and every one of them must end up on the pool's cores."""
    cores = sorted(os.sched_getaffinity(0))
    trainer = cores[1]
    code = (
        "import os, threading\n"
        "from verl_pipe.platform.env import pin_current_process, thread_affinities\n"
        "stop = threading.Event()\n"
        "threads = [threading.Thread(target=stop.wait) for _ in range(4)]\n"
        "[t.start() for t in threads]\n"
        "got = pin_current_process('VERL_PIPE_TRAINER_CORES')\n"
        "late = threading.Thread(target=stop.wait); late.start()\n"  # created after: inherits the mask
        "aff = thread_affinities(os.getpid())\n"
        "stop.set(); [t.join() for t in threads + [late]]\n"
        "assert len(aff) >= 6, aff\n"
        "assert set(aff.values()) == {'%d'}, aff\n" % trainer
    )
    env = dict(os.environ, VERL_PIPE_ALL_CORES=",".join(map(str, cores)), VERL_PIPE_TRAINER_CORES=str(trainer))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def test_renice_covers_every_thread_that_already_exists():
    """A nice value belongs to a thread on Linux: the trainer's must reach the threads it already has (Ray's,
    torch's) and the ones it creates later."""
    code = (
        "import os, threading\n"
        "from verl_pipe.platform.env import renice_current_process, thread_nice\n"
        "stop = threading.Event()\n"
        "threads = [threading.Thread(target=stop.wait) for _ in range(4)]\n"
        "[t.start() for t in threads]\n"
        "want = int(os.environ['VERL_PIPE_TRAINER_NICE'])\n"
        "assert renice_current_process('VERL_PIPE_TRAINER_NICE') == want\n"
        "late = threading.Thread(target=stop.wait); late.start()\n"
        "nice = thread_nice(os.getpid())\n"
        "stop.set(); [t.join() for t in threads + [late]]\n"
        "assert len(nice) >= 6, nice\n"
        "assert set(nice.values()) == {want}, nice\n"
    )
    want = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 3)  # raising it needs no privilege
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, VERL_PIPE_TRAINER_NICE=str(want)), check=True,
                   timeout=60)


def test_renice_leaves_the_process_alone_without_a_value():
    from verl_pipe.platform.env import renice_current_process

    os.environ.pop("VERL_PIPE_TEST_NICE_UNSET", None)
    assert renice_current_process("VERL_PIPE_TEST_NICE_UNSET") is None
