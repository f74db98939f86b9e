"""Faults injected for real on the live CPU stack: a rollout replica killed by pid mid-step, requests that
vLLM rejects, a reward that raises or hangs (the user's reward function in verl's reward worker), a record that fails
in verl's dataset mid-run, a disk that fills during verl's checkpoint (a size-limited tmpfs) and a truncated latest
checkpoint, no replica left (rollback + checkpoint), and resuming from that checkpoint.

The tests share one stack; each reads the weight version and step it starts from off the trainer. The last test
takes the stack down on purpose (no replica left), then resumes from the checkpoint it wrote, in one test: the
resume needs that failure, so the two are not separate tests that would depend on running in file order.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray
import torch
from omegaconf import open_dict

from tests.e2e.conftest import E2E_OVERRIDES, KillAtFirstUnit, assert_every_group_once_at

pytestmark = pytest.mark.e2e

N = 4
GROUPS = 8
OVERSAMPLE = 2
SHORT, LONG = 4, 128  # response lengths: the first unit's groups, and the rest (still running at the kill)

FAULTY_REWARD = ["reward.custom_reward_function.path=" + str(Path(__file__).with_name("faulty_reward.py")),
                 "reward.custom_reward_function.name=compute_score"]
FAULT_OVERRIDES = E2E_OVERRIDES + FAULTY_REWARD + [
    "rolloutpipe.mode=cgp",
    "rolloutpipe.fgd.enable=false",  # FCFS admission, as these cases were sized (mode=cgp alone now means FGD on)
    f"rolloutpipe.oversample={OVERSAMPLE}",
    f"data.max_response_length={LONG}",
    "actor_rollout_ref.rollout.max_model_len=256",
    "trainer.save_freq=-1",
]


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fault_ckpt")


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory):
    """The tiny training set with one record of each bad kind mixed in: the run must skip and count them."""
    from verl_pipe.assets import ensure_assets
    from verl_pipe.data_check import write_bad_records_parquet

    path = tmp_path_factory.mktemp("bad_data") / "train_with_bad_records.parquet"
    expected = write_bad_records_parquet(path, ensure_assets(None).train_file, max_prompt_length=64)
    return [f"data.train_files={path}"], expected


@pytest.fixture(scope="module")
def reward_control(tmp_path_factory):
    """The control file of tests/e2e/faulty_reward.py (its path reaches the reward worker through the environment
    Ray's processes inherit); write(**control) arms it, write() disarms it."""
    path = tmp_path_factory.mktemp("reward") / "control.json"
    os.environ["VERL_PIPE_FAULTY_REWARD"] = str(path)

    def write(**control):
        path.write_text(json.dumps(control))
        return path.parent

    write()
    yield write
    os.environ.pop("VERL_PIPE_FAULTY_REWARD", None)


@pytest.fixture(scope="module")
def stack(ckpt_dir, bad_data, reward_control):
    from verl_pipe.launch.session import PipeSession, compose

    overrides, expected = bad_data
    session = PipeSession(compose(FAULT_OVERRIDES + overrides + [f"trainer.default_local_dir={ckpt_dir}"]))
    session.overrides = overrides
    session.expected_skips = expected
    session.closed = False
    yield session
    if not session.closed:
        session.close()


def _lengths(group: int, index: int) -> dict:
    # Groups 0-3 (the first unit) are short; the others are long, so they are still being generated
    # when the first unit has trained and the replica is killed.
    return {"max_tokens": SHORT if group < 4 else LONG, "ignore_eos": True}


def _server_pid(trainer, replica: int = 0) -> int:
    handle = trainer.llm_server_manager.server_handles[replica]
    return ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))


def _descendants(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


def _gone(pids, timeout=30.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.5)
    return False


def test_replica_killed_mid_step_restarts_with_theta_k(stack):
    trainer = stack.trainer
    stack.step(sampling_overrides=_lengths)  # a normal step first (vLLM warm, version 1 in the replica)
    version = trainer.global_steps - 1
    pid = _server_pid(trainer)
    engine_pids = _descendants(pid)
    assert engine_pids, "the vLLM engine runs in child processes of the server actor"
    kill = KillAtFirstUnit(trainer, pid)

    supervisor = trainer.rollout.supervisor
    supervisor.push_weights = kill.pushed  # records, then pushes as the trainer does
    t0 = time.perf_counter()
    try:
        rec = stack.step(sampling_overrides=_lengths, backend_cls=kill.backend_cls)  # this step's executor only
    finally:
        supervisor.push_weights = trainer._push_weights
    took = time.perf_counter() - t0
    m = rec["metrics"]
    # the bad records were skipped and counted, and the run went on with the good ones
    for reason, n in stack.expected_skips.items():
        assert m[f"data/skipped_records/train/{reason}"] == n, reason
    assert kill.killed_at is not None
    assert kill.inflight_at_kill, "the long groups must still be in flight at the kill (raise LONG)"
    assert kill.pushes == [True], "one push into the restarted replica, after the actor stepped past θ_k"
    print(f"\n[fault] replica killed when unit 0 was in, {kill.inflight_at_kill} requests in flight; "
          f"recovered in {m['rolloutpipe/replica_recovery_s']:.1f}s, step {took:.1f}s")
    assert m["rolloutpipe/replica_failures"] == 1
    assert m["rolloutpipe/replica_restarts"] == 1
    assert m["rolloutpipe/requeued_requests"] > 0
    # every trainable group trained once, nothing lost or twice
    batch = trainer.last_outcome.batch
    assert_every_group_once_at(rec, batch, GROUPS, N, version)
    # The restarted replica generated with θ_k (not with the actor's state after unit 0): its samples'
    # vLLM log-probs match the trainer's θ_k old log-probs as closely as the other replica's did.
    mask = batch.batch["response_mask"].float()
    gap = ((batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs() * mask).sum(-1) / mask.sum(-1)
    before, after = gap[: 4 * N].mean().item(), gap[4 * N:].mean().item()  # unit 0: old replica; unit 1: new
    print(f"[fault] mean |vLLM - θ_k| log-prob gap: first replica {before:.4f}, restarted replica {after:.4f}")
    assert after < 0.04 and after < 3 * before + 0.01, (before, after)
    # the old server and its engine processes are gone, a new one serves
    assert _gone([pid, *engine_pids]), "the dead replica's processes must not linger"
    assert _server_pid(trainer) != pid
    # the next step syncs θ_{k+1} into the restarted replica and runs normally
    rec2 = stack.step(sampling_overrides=_lengths)
    assert rec2["metrics"]["rolloutpipe/replica_failures"] == 0
    assert set(trainer.last_outcome.batch.non_tensor_batch["min_global_steps"]) == {version + 1}


def _engine_pid(trainer, replica: int = 0) -> int:
    """The replica's vLLM engine process (``VLLM::EngineCore``, a child of the server actor's process)."""
    for p in psutil.Process(_server_pid(trainer, replica)).children(recursive=True):
        if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name():
            return p.pid
    raise AssertionError("no VLLM::EngineCore process under the server actor")


def _kill_engine(trainer) -> list[int]:
    """SIGKILLs the replica's engine process and waits until its server reports the engine dead; returns the old
    server's engine-side processes (they must all be gone once the replica is replaced)."""
    from verl_pipe.rollout.replicas import probe_server

    server = _server_pid(trainer)
    old = [server, *_descendants(server)]
    os.kill(_engine_pid(trainer), signal.SIGKILL)
    deadline = time.time() + 30
    while probe_server(trainer.llm_server_manager.server_handles[0], 10) is None:
        assert time.time() < deadline, "the server never noticed its engine died"
        time.sleep(0.2)
    return old


def _rollout_gap(batch) -> float:
    """Largest |vLLM log-prob - trainer's θ_k old log-prob| over the step's response tokens: ~1e-6 in fp32 when the
    replica generated with the weights the step trains from (θ_k), ~1e-2 when it held other weights."""
    mask = batch.batch["response_mask"].bool()
    return float((batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs()[mask].max())


class _KillBeforeLastUnit:
    """The trainer's executor for one step: SIGKILLs the engine before the step's last unit trains (the rollout of
    the step is complete by then: the unit needs all its groups), so no request is in flight."""

    def __init__(self, trainer):
        self.old, kill = None, self
        units = trainer._units_per_step()

        class Backend(type(trainer).backend_cls):
            def update_unit(self, unit_batch, **kwargs):
                if len(self.unit_metrics) == units - 1 and kill.old is None:
                    kill.old = _kill_engine(trainer)
                return super().update_unit(unit_batch, **kwargs)

        self.backend_cls = Backend


def test_engine_killed_at_every_phase_of_a_step_the_run_goes_on(stack):
    """The vLLM engine process (not its server) dies while the trainer trains, during the weight sync,
    and between steps; each time the replica is found dead, restarted with the weights it should hold, and the
    run goes on with every group trained once at its version."""
    trainer = stack.trainer
    recovery = {}

    def check(rec, version, phase, label):
        m = rec["metrics"]
        assert_every_group_once_at(rec, trainer.last_outcome.batch, GROUPS, N, version)
        assert m["rolloutpipe/replica_failures"] == 1 and m["rolloutpipe/replica_restarts"] == 1, phase
        assert m[f"rolloutpipe/replica_deaths_found/{phase}"] == 1
        recovery[label] = round(m["rolloutpipe/replica_recovery_s"], 1)

    # 1. while the trainer trains (the step's rollout done): found before the weight sync, synced apart, θ_{k+1}
    version = trainer.global_steps - 1
    kill = _KillBeforeLastUnit(trainer)
    rec = stack.step(sampling_overrides=_lengths, backend_cls=kill.backend_cls)  # this step's executor only
    assert kill.old is not None
    check(rec, version, "weight_sync", "died while training")
    assert _gone(kill.old), "the dead replica's processes must not linger"

    # 2. during the weight sync (after its health probe): verl's sync fails on the dead engine, the replica is set
    # aside, the sync retried on the others (none here), the replica restarted with θ_{k+1}. This step's samples
    # came from the replica restarted in 1.
    sync = trainer.checkpoint_manager.update_weights
    killed = []

    def sync_with_a_death(*args, **kwargs):
        del trainer.checkpoint_manager.update_weights  # once
        killed.extend(_kill_engine(trainer))
        return sync(*args, **kwargs)

    trainer.checkpoint_manager.update_weights = sync_with_a_death
    rec = stack.step(sampling_overrides=_lengths)
    assert killed
    check(rec, version + 1, "weight_sync", "died during the sync")
    gaps = {"restarted after training (1)": _rollout_gap(trainer.last_outcome.batch)}
    rec = stack.step(sampling_overrides=_lengths)  # generated by the replica restarted in 2
    assert rec["metrics"]["rolloutpipe/replica_failures"] == 0
    gaps["restarted during the sync (2)"] = _rollout_gap(trainer.last_outcome.batch)

    # 3. between steps (idle): found when the next step starts, restarted with that step's θ_k
    _kill_engine(trainer)
    rec = stack.step(sampling_overrides=_lengths)
    check(rec, version + 3, "step_start", "died between steps")
    gaps["restarted at step start (3)"] = _rollout_gap(trainer.last_outcome.batch)
    print(f"\n[fault] engine deaths by phase: recovery {recovery} s; max |vLLM - θ_k| log-prob gap {gaps}")
    assert all(g < 1e-3 for g in gaps.values()), gaps
    assert _server_pid(trainer) not in killed


def test_rejected_requests_drop_their_group_or_fail_the_step(stack):
    from verl_pipe.trainer import StepFailedError

    trainer = stack.trainer
    fault = trainer.config.rolloutpipe.fault

    def reject_group_1(group: int, index: int) -> dict:
        # vLLM refuses a negative temperature: a real per-request error from the engine.
        return {"temperature": -1.0} if group == 1 else _lengths(group, index)

    with open_dict(fault):
        fault.on_request_failure, fault.max_request_retries = "drop_group", 1
    rec = stack.step(sampling_overrides=reject_group_1)
    m = rec["metrics"]
    assert m["rolloutpipe/failed_groups_dropped"] == 1
    assert m["rolloutpipe/failed_request_attempts"] >= 2  # one retry, then the group is given up
    assert 1 not in rec["trained_groups"]
    assert len(rec["trained_groups"]) == GROUPS, "an oversampled group took the dropped group's place"
    assert max(rec["trained_groups"]) >= GROUPS

    with open_dict(fault):
        fault.on_request_failure = "fail"
    step = trainer.global_steps
    with pytest.raises(StepFailedError, match="max_request_retries=1") as err:
        stack.step(sampling_overrides=reject_group_1)
    assert f"global_step_{step - 1}" in str(err.value)
    assert trainer.global_steps == step, "a failed step does not count"
    # the stack goes on: the same step number runs again with good requests
    rec = stack.step(sampling_overrides=_lengths)
    assert rec["step"] == step and len(rec["trained_groups"]) == GROUPS


def test_a_reward_that_raises_or_hangs(stack, reward_control):
    """The user's reward function raises on one record: with rolloutpipe.reward.on_failure=fail the step fails naming
    the record and is not retried; re-run on the same prompts (what trainer.resume_mode=auto does after that failure)
    with drop_group, the record's group is dropped and an oversampled one takes its place. Then it hangs on one record
    (one response's call) in each of oversample + 1 groups: with timeout_s=3 the step goes on, on both the group call
    (score_by_group) and verl's per-response call, each trained hung group's failure counted and the group trained
    with reward 0 (zero_reward)."""
    from verl_pipe.trainer import StepFailedError

    trainer = stack.trainer
    reward = trainer.config.rolloutpipe.reward
    before = (reward.on_failure, reward.timeout_s)
    try:
        batch_dict = next(stack._batches)
        victim = int(batch_dict["index"][1])  # group 1's record
        reward_control(**{"raise": [victim]})
        with open_dict(reward):
            reward.on_failure = "fail"
        step = trainer.global_steps
        with pytest.raises(StepFailedError, match=rf"(?s)record index {victim}.*faulty reward: record {victim} "
                                                  "raises.*Not retried") as err:
            stack.step(batch_dict=batch_dict, sampling_overrides=_lengths)
        print(f"\n[fault] reward raised: {str(err.value)[:300]}")
        assert trainer.global_steps == step
        with open_dict(reward):
            reward.on_failure = "drop_group"
        rec = stack.step(batch_dict=batch_dict, sampling_overrides=_lengths)
        m = rec["metrics"]
        assert rec["step"] == step and m["rolloutpipe/reward_failures"] == 1
        assert m["rolloutpipe/failed_groups_dropped"] == 1 and 1 not in rec["trained_groups"]
        assert len(rec["trained_groups"]) == GROUPS, "an oversampled group took the dropped group's place"

        # The reward hangs on one record in each of OVERSAMPLE + 1 groups: the batch cannot fill without one of them,
        # so at least one hung group is trained after its timeout, however fast the other groups finish (the ones
        # still hung when the batch fills end late, never counted).
        hung = list(range(1, OVERSAMPLE + 2))
        for by_group in (True, False):
            batch_dict = next(stack._batches)
            victims = {g: int(batch_dict["index"][g]) for g in hung}
            where = reward_control()
            markers = {g: where / f"hang-{v}-{by_group}" for g, v in victims.items()}
            reward_control(hang={str(victims[g]): str(markers[g]) for g in hung}, hang_s=30)
            with open_dict(reward):
                reward.on_failure, reward.timeout_s = "zero_reward", 3
            trainer.rollout.worker.score_by_group = by_group
            t0 = time.perf_counter()
            try:
                rec = stack.step(batch_dict=batch_dict, sampling_overrides=_lengths)
            finally:
                trainer.rollout.worker.score_by_group = True
                reward_control()  # disarmed: the hung calls still sleeping return, freeing the reward's threads
            took, m = time.perf_counter() - t0, rec["metrics"]
            trained_hung = [g for g in hung if g in rec["trained_groups"]]
            print(f"[fault] reward hung on records {sorted(victims.values())} "
                  f"({'group call' if by_group else 'per response'}): step {took:.1f}s, "
                  f"reward_failures {m['rolloutpipe/reward_failures']}, hung groups trained {trained_hung}")
            assert trained_hung, "the batch could not fill without a hung group"
            assert all(markers[g].exists() for g in trained_hung), "the reward did hang"
            assert len(trained_hung) <= m["rolloutpipe/reward_failures"] <= len(hung)
            assert m["rolloutpipe/failed_groups_dropped"] == 0 and len(rec["trained_groups"]) == GROUPS
            assert took < 30, "the hang did not hold the step"
            batch = trainer.last_outcome.batch
            for g in trained_hung:
                rows = [i for i, e in enumerate(batch.non_tensor_batch["extra_info"]) if e.get("index") == victims[g]]
                assert len(rows) == N
                if by_group:  # the group's one call timed out: each of its responses scores 0
                    assert float(batch.batch["token_level_scores"][rows].abs().sum()) == 0.0
    finally:
        reward_control()
        with open_dict(reward):
            reward.on_failure, reward.timeout_s = before


def test_a_bad_record_mid_run_is_named_then_fails_or_is_skipped(stack, ckpt_dir):
    """A record that became bad after the data check (its prompt null: verl's dataset raises TypeError on it):
    on_bad_record=fail stops the run naming the file, the row and the record, with the last completed step
    checkpointed; skip leaves it out of its batch (named, counted) and the step trains the batch's other records."""
    from verl_pipe.data_check import BadRecordError
    from verl_pipe.trainer import checkpoints

    trainer = stack.trainer
    guard = trainer.train_dataset
    verl_dataset = guard.dataset
    frame = verl_dataset.dataframe

    def bad(i: int) -> bool:
        return i % 7 == 3

    verl_dataset.dataframe = frame.map(lambda ex, i: {"prompt": None if bad(i) else ex["prompt"]}, with_indices=True)
    try:
        guard.policy = "fail"
        step = trainer.global_steps
        with pytest.raises(BadRecordError) as err:
            for _ in range(40):
                next(stack._batches)
        msg = str(err.value)
        print(f"\n[fault] bad record: {msg[:400]}")
        assert re.search(r"data.train_files \(.*\) row \d+ \(record index \d+\) failed in verl's dataset: "
                         r"TypeError: 'NoneType' object is not iterable", msg), msg
        assert f"global_step_{step - 1}" in msg and "resume_mode=auto" in msg
        assert checkpoints.problem(str(ckpt_dir / f"global_step_{step - 1}")) is None
        stack._batches = stack._batch_iter()  # the generator ended with the error

        guard.policy = "skip"
        for _ in range(40):
            batch_dict = next(stack._batches)
            if len(batch_dict["index"]) < GROUPS + OVERSAMPLE:
                break
        skipped = GROUPS + OVERSAMPLE - len(batch_dict["index"])
        assert skipped >= 1
        rec = stack.step(batch_dict=batch_dict, sampling_overrides=_lengths)
        assert rec["metrics"]["data/bad_records_skipped"] == skipped
        assert rec["data_index"] == [int(i) for i in batch_dict["index"]], "every other record of the batch drawn"
        assert len(rec["trained_groups"]) == min(GROUPS, len(batch_dict["index"]))
    finally:
        verl_dataset.dataframe = frame
        guard.policy = "fail"


def _mount_tmpfs(path: Path, size: int, remount: bool = False) -> bool:
    opts = f"{'remount,' if remount else ''}size={size}"
    cmd = ["mount", "-o", opts, str(path)] if remount else ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)]
    return shutil.which("mount") is not None and subprocess.run(cmd, capture_output=True).returncode == 0


def _used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _fill_next_save_in_the_workers(trainer) -> None:
    """Where no file system can be mounted (not root): the next torch.save in the actor workers raises the OS error
    a full disk raises (ENOSPC), once."""
    def arm(self):
        import errno

        import torch

        save = torch.save

        def full(*args, **kwargs):
            torch.save = save
            raise OSError(errno.ENOSPC, "No space left on device")

        torch.save = full

    ray.get([w.__ray_call__.remote(arm) for w in trainer.actor_wg.workers])


def _resume_in_place(stack) -> None:
    """What a resumed run does before its first step (RunLoop.begin): verl's resume (resume_mode=auto, from the
    newest complete checkpoint), its weights into the rollout, the next step after it, its batches from the loader's
    restored state."""
    trainer = stack.trainer
    tr = trainer.config.trainer
    with open_dict(tr):
        before, tr.resume_mode = tr.resume_mode, "auto"
    try:
        trainer._load_checkpoint()
    finally:
        with open_dict(tr):
            tr.resume_mode = before
    trainer._data_state = trainer.train_dataloader.state_dict()
    trainer.checkpoint_manager.update_weights(trainer.global_steps)
    trainer.global_steps += 1
    stack._batches = stack._batch_iter()


def test_a_disk_that_fills_during_a_checkpoint_then_a_truncated_latest(stack, tmp_path, capsys):
    """verl's checkpoint on a size-limited tmpfs: a complete one, then the file system has room for half a checkpoint
    and the next save fills it: the run stops naming the folder, the full disk and the previous checkpoint, which is
    intact (its files as recorded, the tracker on it) and resumes. Then a later checkpoint truncated: a resume passes
    over it to the last complete one; with that one truncated too it refuses, naming both."""
    from verl_pipe.trainer.checkpoints import CheckpointError, CheckpointSaveError, problem

    trainer = stack.trainer
    tr = trainer.config.trainer
    disk = tmp_path / "small_disk"
    disk.mkdir()
    mounted = _mount_tmpfs(disk, 512 << 20)
    print(f"\n[fault] checkpoint disk: {'a tmpfs of 512 MiB' if mounted else 'not mountable here: ENOSPC raised at the write'}")
    before = (tr.default_local_dir, tr.save_freq)
    with open_dict(tr):
        tr.default_local_dir, tr.save_freq = str(disk), 1
    try:
        rec = stack.step(sampling_overrides=_lengths)
        a = rec["step"]
        folder_a = disk / f"global_step_{a}"
        assert problem(str(folder_a)) is None
        theta_a = stack.actor_state()
        size = sum(f.stat().st_size for f in folder_a.rglob("*") if f.is_file())
        if mounted:
            room = _used(disk) + size // 2
            assert _mount_tmpfs(disk, room, remount=True)
        else:
            _fill_next_save_in_the_workers(trainer)
        with pytest.raises(CheckpointSaveError) as err:
            stack.step(sampling_overrides=_lengths)
        msg = str(err.value)
        print(f"[fault] disk full ({size} bytes per checkpoint, room for half of one): {msg[:500]}")
        assert f"saving the checkpoint of step {a + 1} to {disk}/global_step_{a + 1} failed: the disk is full" in msg
        assert f"latest complete checkpoint is {folder_a} (left as it was)" in msg
        assert not (disk / f"global_step_{a + 1}").exists(), "the partial checkpoint is gone"
        assert (disk / "latest_checkpointed_iteration.txt").read_text() == str(a)
        assert problem(str(folder_a)) is None
        if mounted:
            assert _mount_tmpfs(disk, 512 << 20, remount=True)
        _resume_in_place(stack)  # the previous checkpoint resumes
        assert trainer.global_steps == a + 1
        after = stack.actor_state()
        assert all(torch.equal(theta_a[k], after[k]) for k in theta_a)

        rec = stack.step(sampling_overrides=_lengths)
        b = rec["step"]
        folder_b = disk / f"global_step_{b}"
        assert b == a + 1 and problem(str(folder_b)) is None
        largest = max((f for f in folder_b.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
        with open(largest, "r+b") as f:
            f.truncate(largest.stat().st_size // 2)
        earlier = capsys.readouterr().out  # this test's own lines so far, kept in the run's log
        with capsys.disabled():
            print("".join(line + "\n" for line in earlier.splitlines() if line.startswith("[fault]")), end="")
        _resume_in_place(stack)
        out = capsys.readouterr().out
        print(f"[fault] {largest.relative_to(disk)} truncated: {out.strip().splitlines()[0] if out.strip() else ''}")
        assert f"checkpoint {folder_b} is not complete ({largest.relative_to(folder_b)} has" in out
        assert trainer.global_steps == a + 1, "resumed from the last complete checkpoint"
        after = stack.actor_state()
        assert all(torch.equal(theta_a[k], after[k]) for k in theta_a)

        data = folder_a / "data.pt"
        with open(data, "r+b") as f:
            f.truncate(1)
        with pytest.raises(CheckpointError, match=rf"no complete checkpoint to resume from in {disk} "
                                                  rf"\({folder_b}: .*; {folder_a}: data.pt has 1 bytes"):
            _resume_in_place(stack)
        assert trainer.global_steps == a + 1, "refused before loading anything"
    finally:
        with open_dict(tr):
            tr.default_local_dir, tr.save_freq = before
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_no_replica_left_rolls_back_checkpoints_and_resumes(stack, ckpt_dir):
    _no_replica_left_rolls_back_and_checkpoints(stack, ckpt_dir)
    _resume_from_the_rolled_back_checkpoint(stack, ckpt_dir)


def _no_replica_left_rolls_back_and_checkpoints(stack, ckpt_dir):
    from verl_pipe.trainer import StepFailedError

    trainer = stack.trainer
    with open_dict(trainer.config.rolloutpipe.fault):
        trainer.config.rolloutpipe.fault.replica_restart = False
    trainer.rollout.supervisor.restart_enabled = False
    step = trainer.global_steps
    theta_k = stack.actor_state()
    batch_dict = next(stack._batches)
    stack.failed_batch = batch_dict
    stack.theta_k = theta_k
    kill = KillAtFirstUnit(trainer, _server_pid(trainer))
    with pytest.raises(StepFailedError, match="no replica is left") as err:
        stack.step(batch_dict=batch_dict, sampling_overrides=_lengths, backend_cls=kill.backend_cls)
    print(f"\n[fault] {err.value}")
    assert kill.killed_at is not None and kill.inflight_at_kill
    assert kill.updates == 1, "unit 0 (taken before the failure surfaced) trained; the failure stopped unit 1"
    assert "resume_mode=auto" in str(err.value)
    # rolled back: the actor is θ_k again although unit 0 had trained
    after = stack.actor_state()
    assert all(torch.equal(theta_k[k], after[k]) for k in theta_k), "θ_k restored from the CPU snapshot"
    assert (ckpt_dir / "latest_checkpointed_iteration.txt").read_text() == str(step - 1)
    assert (ckpt_dir / f"global_step_{step - 1}" / "data.pt").exists()
    stack.failed_step = step
    stack.close()
    stack.closed = True


def _resume_from_the_rolled_back_checkpoint(stack, ckpt_dir):
    from verl_pipe.launch.session import PipeSession, compose

    assert stack.closed
    resumed = PipeSession(compose(FAULT_OVERRIDES + stack.overrides + [f"trainer.default_local_dir={ckpt_dir}",
                                                                        "trainer.resume_mode=auto"]))
    try:
        trainer = resumed.trainer
        assert trainer.global_steps == stack.failed_step, "resumes at the failed step"
        theta = resumed.actor_state()
        assert all(torch.equal(stack.theta_k[k], theta[k]) for k in theta), "with the weights it failed from"
        first = next(resumed._batches)
        assert np.array_equal(first["index"], stack.failed_batch["index"]), "with the same prompts"
        rec = resumed.step(batch_dict=first, sampling_overrides=_lengths)
        m = rec["metrics"]
        assert rec["step"] == stack.failed_step and len(rec["trained_groups"]) == GROUPS
        assert set(trainer.last_outcome.batch.non_tensor_batch["min_global_steps"]) == {stack.failed_step - 1}
        assert np.isfinite(m["actor/pg_loss"]) and np.isfinite(m["actor/grad_norm"])
    finally:
        resumed.close()
