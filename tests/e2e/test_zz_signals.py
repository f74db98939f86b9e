"""The real launcher under signals: SIGTERM mid-step stops the run cleanly (nothing it started is left), the
checkpoint holds only completed steps, and a resumed run goes on at the next step with the data order an
uninterrupted run has."""

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
    cmd = [sys.executable, "-m", "verl_pipe.main_grpo", *args]
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


def test_sigterm_mid_step_then_resume(tmp_path):
    from verl_pipe.assets import ensure_assets

    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace"
    common = ["trainer.test_freq=-1", "trainer.save_freq=1", f"trainer.default_local_dir={ckpt}",
              f"rolloutpipe.trace_dir={trace}", "rolloutpipe.mode=cgp", f"data.train_batch_size={BATCH}"]
    run = _launch(common + ["trainer.total_training_steps=50"])
    seen: set[int] = set()
    out = []
    for line in run.stdout:
        out.append(line)
        seen |= _tree(run.pid)
        if "[verl_pipe] step 2 " in line:  # printed by the TaskRunner actor, behind a Ray prefix
            break
    else:
        pytest.fail("the run ended before step 2:\n" + "".join(out[-40:]))
    seen |= _tree(run.pid)
    time.sleep(1.0)  # inside step 3 (a step takes several seconds)
    seen |= _tree(run.pid)
    t0 = time.perf_counter()
    run.send_signal(signal.SIGTERM)
    rest = run.stdout.read()
    rc = run.wait(timeout=120)
    stop_s = time.perf_counter() - t0
    print(f"\n[signals] SIGTERM → exit {rc} in {stop_s:.1f}s; {len(seen)} processes the run had started")
    assert rc == 128 + signal.SIGTERM, rest[-3000:]
    assert "[verl_pipe] stopped" in rest
    deadline = time.time() + 30
    while _alive(seen) and time.time() < deadline:
        time.sleep(0.5)
    left = _alive(seen)
    assert not left, f"left behind: {[(p, psutil.Process(p).name()) for p in left]}"
    # only completed steps are in the checkpoint: the interrupted step 3 left nothing
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert not (ckpt / "global_step_3").exists()
    assert sorted(_steps(trace)) == [1, 2]

    resumed = _launch(common + ["trainer.total_training_steps=3", "trainer.resume_mode=auto"])
    log = resumed.stdout.read()
    assert resumed.wait(timeout=600) == 0, log[-3000:]
    assert "[verl_pipe] step 3 " in log and "[verl_pipe] step 1 " not in log, "it went on at step 3"
    steps = _steps(trace)
    assert sorted(steps) == [1, 2, 3]
    order = _reference_order(str(ensure_assets(None).train_file))
    for k in (1, 2, 3):
        assert steps[k]["data_index"] == order[(k - 1) * BATCH: k * BATCH], f"step {k}'s prompts"
    assert _alive(_tree(resumed.pid)) == []
