"""The real launcher under signals as a scheduler sends them, to the whole process group (Ray's raylet, GCS and
workers and vLLM's engines get them at the same moment as the launcher): SIGTERM mid-step stops the run within
seconds, nothing it started is left, the checkpoint holds only completed steps; a resumed run goes on at the next
step with the data order an uninterrupted run has; SIGINT followed by a second SIGTERM stops it the same way."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

pytestmark = pytest.mark.e2e

BATCH = 8


def _launch(args: list[str]) -> subprocess.Popen:
    # the base config (digit-math), as every e2e stack composes it; main_grpo's own default is the chain recipe
    cmd = [sys.executable, "-m", "verl_pipe.main_grpo", "--config-name", "rolloutpipe_trainer", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=dict(os.environ))


def _tree(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _alive(pids) -> list[int]:
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _reference_order(train_file: str, seed: int = 0) -> list[int]:
    """The data order of an uninterrupted run: verl's sampler (torchdata RandomSampler, generator seeded
    with data.seed) over the dataset's rows, as the rows' extra_info.index."""
    import torch
    from torchdata.stateful_dataloader.sampler import RandomSampler

    index = [int(e["index"]) for e in pd.read_parquet(train_file)["extra_info"]]
    sampler = RandomSampler(data_source=range(len(index)), generator=torch.Generator().manual_seed(seed))
    return [index[i] for i in sampler]


def _steps(trace: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (trace / "steps.jsonl").read_text().splitlines())}


def _run_until_step(run: subprocess.Popen, step: int) -> tuple[set[int], list[str]]:
    """Reads the run's output until it printed step ``step``; returns the processes it started, its output."""
    seen: set[int] = set()
    out = []
    for line in run.stdout:
        out.append(line)
        seen |= _tree(run.pid)
        if f"[verl_pipe] step {step} " in line:  # printed by the TaskRunner actor, behind a Ray prefix
            break
    else:
        pytest.fail(f"the run ended before step {step}:\n" + "".join(out[-40:]))
    seen |= _tree(run.pid)
    return seen, out


def _checkpointed(ckpt: Path) -> int:
    """The latest step the run has checkpointed (0: none yet), read the moment before a signal: Ray forwards the step
    lines with a delay, so the step a signal lands in is known from the checkpoint, not from the output."""
    path = ckpt / "latest_checkpointed_iteration.txt"
    for _ in range(50):
        try:
            return int(path.read_text())
        except FileNotFoundError:
            return 0
        except ValueError:  # being written
            time.sleep(0.01)
    return int(path.read_text())


def _signal_group_and_wait(run: subprocess.Popen, seen: set[int], signals: list[int]) -> tuple[int, str, float]:
    """Sends ``signals`` (0.5 s apart) to the run's whole process group; returns its exit code, the rest of its
    output and the seconds from the first signal to its exit. Asserts nothing it started is left."""
    t0 = time.perf_counter()
    for i, sig in enumerate(signals):
        if i:
            time.sleep(0.5)
        os.killpg(run.pid, sig)
    rest = run.stdout.read()
    rc = run.wait(timeout=120)
    stop_s = time.perf_counter() - t0
    deadline = time.time() + 30
    while _alive(seen) and time.time() < deadline:
        time.sleep(0.5)
    left = _alive(seen)
    assert not left, f"left behind: {[(p, psutil.Process(p).name()) for p in left]}; exit {rc}:\n{rest[-3000:]}"
    return rc, rest, stop_s


def _stopped_checkpoint(ckpt: Path, trace: Path, at_signal: int, may_lack_trace: frozenset = frozenset()) -> int:
    """The run was signalled when its latest checkpoint was step ``at_signal``: the checkpoint holds only completed
    steps. That is ``at_signal`` (the step in progress was cut short), or ``at_signal + 1`` when the signal landed
    after that step had trained (a sync cut short by the engines' deaths saves the trained step:
    verl_pipe/trainer/rollback.py), never a partial step. ``may_lack_trace``: steps an earlier run saved on its way out (its
    trace line can be cut by the signal). Returns the latest checkpointed step."""
    latest = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert latest in (at_signal, at_signal + 1), f"checkpointed step {at_signal} at the signal, latest {latest}"
    assert (ckpt / f"global_step_{latest}").is_dir()
    assert not (ckpt / f"global_step_{latest + 1}").exists(), "a partial step is in the checkpoint"
    traced = set(_steps(trace))
    # a step's trace line follows its checkpoint by milliseconds: the one before at_signal is certainly traced
    need = max(1, at_signal - 1)
    assert (need in traced or need in may_lack_trace) and traced <= set(range(1, latest + 1)), (latest, sorted(traced))
    return latest


def test_group_signals_stop_the_run_and_resume_goes_on(tmp_path):
    from verl_pipe.assets import ensure_assets

    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace"
    common = ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=1", f"trainer.default_local_dir={ckpt}",
              f"rolloutpipe.trace_dir={trace}", "rolloutpipe.mode=cgp", f"data.train_batch_size={BATCH}"]
    run = _launch(common + ["trainer.total_training_steps=50"])
    seen, _ = _run_until_step(run, 1)
    at_signal = _checkpointed(ckpt)  # signalled inside step at_signal + 1
    rc, rest, stop_s = _signal_group_and_wait(run, seen, [signal.SIGTERM])
    print(f"\n[signals] SIGTERM to the group → exit {rc} in {stop_s:.1f}s; {len(seen)} processes the run had started")
    assert rc == 128 + signal.SIGTERM, rest[-3000:]
    assert "[verl_pipe] stopped" in rest
    assert stop_s < 60, f"the run took {stop_s:.0f}s to stop after SIGTERM"  # a hang bound (Ray shutdown: 20 s)
    first = _stopped_checkpoint(ckpt, trace, at_signal)

    resumed = _launch(common + ["trainer.total_training_steps=50", "trainer.resume_mode=auto"])
    seen, out = _run_until_step(resumed, first + 1)
    log = "".join(out)
    assert f"[verl_pipe] step {first} " not in log, f"it went on at step {first + 1}"
    at_signal = _checkpointed(ckpt)
    assert at_signal > first, "the resumed run checkpointed its own steps"
    rc, rest, stop_s = _signal_group_and_wait(resumed, seen, [signal.SIGINT, signal.SIGTERM])
    print(f"[signals] SIGINT then SIGTERM to the group → exit {rc} in {stop_s:.1f}s; checkpoints at steps "
          f"{first} and then {(ckpt / 'latest_checkpointed_iteration.txt').read_text()}")
    assert rc == 128 + signal.SIGINT, rest[-3000:]
    assert stop_s < 60, f"the run took {stop_s:.0f}s to stop after SIGINT"
    # the first run's last checkpoint may have been saved on its way out, after its step trained (no trace line)
    latest = _stopped_checkpoint(ckpt, trace, at_signal, may_lack_trace=frozenset({first}))
    steps = _steps(trace)
    order = _reference_order(str(ensure_assets(None).train_file))
    for k in sorted(steps):
        assert steps[k]["data_index"] == order[(k - 1) * BATCH: k * BATCH], f"step {k}'s prompts"
    assert latest >= 2
