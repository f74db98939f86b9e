"""A rollout replica that dies mid-way through an NCCL weight sync, as pure logic: no GPU, NCCL or Ray.

The real failure needs GPUs: a peer that dies mid-broadcast leaves every other rank's NCCL kernels waiting for it
for good, verl's ``finalize`` never runs, every rank keeps its group, and the retry's ``init_collective_group``
raises "Trying to initialize a group a second time". Here a stand-in collective (one group table per "process",
like ray.util.collective, and a shared wire on which a collective blocks once a member is dead, until that rank
aborts its group) plays NCCL, and a stand-in engine has the shape of verl's NCCLCheckpointEngine (a group per
sync with rebuild_group, one broadcast per bucket, the group destroyed in finalize). The last tests run verl's
real NCCLCheckpointEngine (``init_process_group`` / ``finalize`` / ``build_topology``) on the stand-in, with a
fake cupy module. What is NOT checked here: real NCCL (that ``ncclCommAbort`` frees a rank stuck in
``torch.cuda.synchronize()``), Ray's GroupManager internals, zmq.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
import time
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_pipe.core.deadline import DeadlineExceeded
from verl_pipe.platform.recoverable_sync import GROUP_PREFIX, RecoverableSync, SyncMetadata
from verl_pipe.platform.sync_guard import SyncAborted, SyncGuard
from verl_pipe.trainer.weight_sync import GIB, WeightSync, bytes_deadline_s, sync_deadline

DEADLINE = 2.0  # seconds: the engines' deadline in these tests (the live ranks move the first buckets within it even
# beside two burning processes: at 0.3 s they had not, `make check BURN=2`)


# ---------------------------------------------------------------- the stand-in collective


class Wire:
    """The interconnect. A collective of a group waits for every member; a member listed in ``dead`` stops taking
    part after its first ``after`` broadcasts, so from then on the collective waits until the waiting rank aborts
    its own group (as ncclCommAbort ends the kernels), which raises like NCCL's error."""

    def __init__(self, dead: dict[int, int] | None = None):
        self.dead = dict(dead or {})
        self.cond = threading.Condition()
        self.sent: dict[str, list] = {}

    def broadcast(self, member, group: str, payload, src: int):
        index = member.count
        member.count += 1
        if any(r < member.world_size and index >= after for r, after in self.dead.items()):
            member.aborted.wait()  # NCCL has no timeout: only an abort of this rank's group ends the wait
            raise RuntimeError(f"NCCL error: communicator of {group} aborted")
        with self.cond:
            if member.rank == src:
                self.sent.setdefault(group, []).append(payload)
                self.cond.notify_all()
                return payload
            while len(self.sent.get(group, ())) <= index:
                if member.aborted.is_set():
                    raise RuntimeError(f"NCCL error: communicator of {group} aborted")
                self.cond.wait(0.01)
            return self.sent[group][index]


class StandInCollective:
    """One process's collective library, like ray.util.collective (a table of groups by name; a second group of
    a name is refused with Ray's message), plus the two operations SyncGuard needs (``exists``, ``abort``)."""

    def __init__(self, wire: Wire):
        self.wire = wire
        self.groups: dict[str, SimpleNamespace] = {}
        self.aborted: list[str] = []
        self.destroyed: list[str] = []

    def init_collective_group(self, world_size, rank, backend="nccl", group_name="default"):
        if group_name in self.groups:
            raise RuntimeError("Trying to initialize a group a second time.")
        self.groups[group_name] = SimpleNamespace(rank=rank, world_size=world_size, count=0,
                                                  aborted=threading.Event())

    def is_group_initialized(self, group_name):
        return group_name in self.groups

    def barrier(self, group_name="default"):
        self._group(group_name)

    def destroy_collective_group(self, group_name="default"):
        if self.groups.pop(group_name, None) is not None:  # Ray only warns about a group it does not hold
            self.destroyed.append(group_name)

    def broadcast(self, payload, src_rank=0, group_name="default"):
        return self.wire.broadcast(self._group(group_name), group_name, payload, src_rank)

    def _group(self, name):
        if name not in self.groups:
            raise RuntimeError(f"The collective group '{name}' is not initialized in the process.")
        return self.groups[name]

    # CollectiveOps
    def exists(self, group):
        return group in self.groups

    def abort(self, group):
        g = self.groups.pop(group, None)
        if g is not None:
            g.aborted.set()
            self.aborted.append(group)


class StandInEngine:
    """The shape of verl's NCCLCheckpointEngine: ``init_process_group`` creates the group (again at every sync with
    rebuild_group) and meets at a barrier; rank 0 broadcasts one weight per bucket, then an end marker; actor ranks
    outside the group (rank -1) only walk the weights; ``finalize`` destroys the group (rebuild_group)."""

    def __init__(self, collective: StandInCollective, is_master=False, group_name="default", rebuild_group=True):
        self.coll, self.is_master = collective, is_master
        self.group_name, self.rebuild_group = group_name, rebuild_group

    def prepare(self):
        return {"master": self.is_master}

    @classmethod
    def build_topology(cls, actor_wg_world_size, rollout_world_size, metadata):
        assert metadata[0]["master"]
        world = 1 + rollout_world_size
        return ({"rank": [0] + [-1] * (actor_wg_world_size - 1), "world_size": [world] * actor_wg_world_size},
                {"rank": list(range(1, world)), "world_size": [world] * rollout_world_size})

    def init_process_group(self, rank, world_size):
        self.rank = rank
        if rank < 0:
            return
        if self.rebuild_group or not self.coll.is_group_initialized(self.group_name):
            self.coll.init_collective_group(world_size, rank, "nccl", self.group_name)
        self.coll.barrier(self.group_name)

    async def send_weights(self, weights, global_steps=None):
        if self.rank < 0:
            for _ in weights:
                pass
            return {}
        for name, tensor in weights:
            self.coll.broadcast((name, tensor.clone()), 0, self.group_name)
        self.coll.broadcast(None, 0, self.group_name)
        return {}

    async def receive_weights(self, global_steps=None):
        while True:
            item = self.coll.broadcast(None, 0, self.group_name)
            if item is None:
                return
            yield item

    def finalize(self):
        if self.rebuild_group and self.rank >= 0:
            self.coll.destroy_collective_group(self.group_name)


class Recoverable(RecoverableSync, StandInEngine):
    def collective_ops(self):
        return self.coll


class Gather:
    """The actor ranks' weight generators: producing weight i is a collective over the actor ranks (FSDP's
    full-tensor gather), so every rank's generator waits at item i until all have asked for it."""

    def __init__(self, names, ranks=2, timeout=5.0):
        self.names, self.barrier, self.timeout = names, threading.Barrier(ranks), timeout
        self.walked = {r: 0 for r in range(ranks)}

    def weights(self, rank, version):
        for i, name in enumerate(self.names):
            self.barrier.wait(self.timeout)  # BrokenBarrierError: a rank stopped walking, the others are stuck
            self.walked[rank] += 1
            yield name, torch.full((3,), float(100 * version + i))


NAMES = [f"w{i}" for i in range(6)]


def run_sync(actor, rollout, gather, version, dead_rollout=(), join_s=5.0):
    """verl's CheckpointEngineManager.update_weights in miniature: prepare, build_topology, init_process_group on
    every rank, then each rank's transfer in its own thread (each is its own process), then finalize when every
    live rank got through. A rank in ``dead_rollout`` dies after creating its group."""
    t0 = time.perf_counter()
    engines = actor + rollout
    akw, rkw = type(actor[0]).build_topology(len(actor), len(rollout), [e.prepare() for e in engines])
    for kwargs, group in ((akw, actor), (rkw, rollout)):
        for i, e in enumerate(group):
            e.init_process_group(**{k: v[i] for k, v in kwargs.items()})
    out = {"errors": {}, "received": {}}

    def actor_rank(i, e):
        try:
            asyncio.run(e.send_weights(gather.weights(i, version)))
        except BaseException as ex:
            out["errors"][f"actor{i}"] = ex

    def rollout_rank(i, e):
        got = out["received"].setdefault(i, [])

        async def consume():
            async for name, tensor in e.receive_weights():
                got.append((name, tensor.clone()))
        try:
            asyncio.run(consume())
        except BaseException as ex:
            out["errors"][f"rollout{i}"] = ex

    threads = [threading.Thread(target=actor_rank, args=(i, e), daemon=True) for i, e in enumerate(actor)]
    threads += [threading.Thread(target=rollout_rank, args=(i, e), daemon=True) for i, e in enumerate(rollout)
                if i not in dead_rollout]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, join_s - (time.perf_counter() - t0)))
    out["elapsed"] = time.perf_counter() - t0
    out["stuck"] = sum(t.is_alive() for t in threads)
    if not out["errors"] and not out["stuck"]:
        for i, e in enumerate(engines):
            if i - len(actor) not in dead_rollout:
                e.finalize()
    return out


def _ranks(cls, wire, n_rollout, **kw):
    actor = [cls(StandInCollective(wire), is_master=True, **kw), cls(StandInCollective(wire), **kw)]
    rollout = [cls(StandInCollective(wire), **kw) for _ in range(n_rollout)]
    return actor, rollout


# ---------------------------------------------------------------- the recovery


def test_a_replica_dying_mid_broadcast_frees_every_rank_within_the_deadline_and_the_next_sync_rebuilds():
    wire = Wire(dead={2: 2})  # rollout rank 2 (the second replica's worker) dies after the first two buckets
    actor, rollout = _ranks(Recoverable, wire, n_rollout=2)
    for e in actor:
        e.set_sync_deadline(DEADLINE)  # the trainer's set_sync_deadline; the master hands it to the others
    gather = Gather(NAMES)

    first = run_sync(actor, rollout, gather, version=1, dead_rollout={1})

    assert first["stuck"] == 0, "a rank still waits for the dead peer"
    assert DEADLINE <= first["elapsed"] < DEADLINE + 2.0  # bounded by the deadline, not by a flat timeout
    assert set(first["errors"]) == {"actor0", "rollout0"}  # the sender and the live receiver gave up
    assert "actor1" not in first["errors"] and gather.walked == {0: 6, 1: 6}  # the sender walked the rest unsent,
    # so the other actor rank's gathers were not left waiting for it
    assert [n for n, _ in first["received"][0]] == ["w0", "w1"]  # nothing of the bucket in flight was handed on
    live = [actor[0], rollout[0]]
    for e in live:
        assert e.coll.groups == {} and len(e.coll.aborted) == 1 and e.guard.aborted  # torn down on its own
    group1 = live[0].coll.aborted[0]
    assert group1.startswith(GROUP_PREFIX) and rollout[0].coll.aborted == [group1]

    # the trainer sets the dead replica aside and syncs again (ReplicaSupervisor.sync_weights); a deadline this
    # healthy sync cannot reach on a loaded machine, so that finalize, not the watchdog, ends its group
    for e in actor:
        e.set_sync_deadline(30)
    second = run_sync(actor, rollout[:1], gather, version=2)

    assert second["errors"] == {} and second["stuck"] == 0
    got = second["received"][0]
    assert [n for n, _ in got] == NAMES
    assert all(torch.equal(t, torch.full((3,), float(200 + i))) for i, (_, t) in enumerate(got))
    group2 = rollout[0].group_name
    assert group2 != group1 and rollout[0].coll.destroyed == [group2]  # finalize destroyed it; nothing aborted
    for e in actor + rollout[:1]:
        assert e.coll.groups == {} and e.guard.aborted is None and len(e.coll.aborted) <= 1


def test_without_the_recovery_the_stand_in_stalls_and_the_retry_cannot_create_its_group():
    """The stand-in reproduces the failure: verl's engine shape alone waits past any deadline, keeps its group,
    and the next sync's init_process_group raises Ray's error (this is what the recovery test must not see)."""
    wire = Wire(dead={2: 2})
    actor, rollout = _ranks(StandInEngine, wire, n_rollout=2)
    gather = Gather(NAMES, timeout=3.0)  # longer than the join below: the other actor rank is still waiting then
    try:
        first = run_sync(actor, rollout, gather, version=1, dead_rollout={1}, join_s=DEADLINE + 0.5)
        # the sender and the live receiver wait for the dead peer, the other actor rank for the sender's next gather
        assert first["stuck"] == 3
        assert actor[0].coll.groups and rollout[0].coll.groups  # finalize never ran: the groups stay
        with pytest.raises(RuntimeError, match="Trying to initialize a group a second time"):
            run_sync(actor, rollout[:1], Gather(NAMES), version=2)
    finally:
        for e in actor + rollout:
            for g in e.coll.groups.values():
                g.aborted.set()  # let the stuck threads go


def test_a_group_left_by_a_sync_cut_short_is_torn_down_before_the_next_one_is_created():
    """A rank whose sync ended without a failure of its own (its finalize never came) still holds the old group;
    the next init_process_group aborts it first."""
    wire = Wire()
    engine = Recoverable(StandInCollective(wire))
    engine.init_process_group(sync_group="g1", deadline_s=None, rank=1, world_size=2)
    assert engine.coll.groups.keys() == {"g1"}
    engine.init_process_group(sync_group="g2", deadline_s=None, rank=1, world_size=2)
    assert engine.coll.groups.keys() == {"g2"} and engine.coll.aborted == ["g1"]


def test_the_trainer_can_tear_a_rank_down_and_a_failed_group_creation_leaves_nothing():
    engine = Recoverable(StandInCollective(Wire()))
    engine.init_process_group(sync_group="g1", deadline_s=60, rank=1, world_size=2)
    engine.send_buf = object()
    assert engine.abort_sync() is True and engine.abort_sync() is False  # idempotent
    assert engine.coll.groups == {} and engine.send_buf is None
    with pytest.raises(SyncAborted, match="the trainer gave the sync up"):
        engine.guard.check()

    failing = Recoverable(StandInCollective(Wire()))

    def barrier(group_name):
        raise RuntimeError("rendezvous failed")

    failing.coll.barrier = barrier
    with pytest.raises(RuntimeError, match="rendezvous failed"):
        failing.init_process_group(sync_group="g", deadline_s=None, rank=1, world_size=2)
    assert failing.coll.groups == {} and "rendezvous failed" in failing.guard.aborted


def test_a_sender_whose_group_was_aborted_under_its_last_bucket_reports_the_sync_failed():
    """The abort ends the collective without an error (the last wait just returns): the sync must not count as
    done."""
    engine = Recoverable(StandInCollective(Wire()), is_master=True)
    engine.init_process_group(sync_group="g", deadline_s=None, rank=0, world_size=1)

    def weights():
        yield "w0", torch.zeros(1)
        engine.abort_sync("watchdog")  # the watchdog fires while the last bucket is in flight
        yield "w1", torch.zeros(1)

    engine.coll.broadcast = lambda payload, src_rank=0, group_name="": payload  # every collective "returns"
    with pytest.raises(SyncAborted, match="watchdog"):
        asyncio.run(engine.send_weights(weights()))


def test_a_receiver_never_hands_on_a_bucket_whose_collective_was_aborted():
    """On a GPU the abort ends the stuck kernel and the wait returns normally, leaving a half-received bucket in
    the buffer: the receiver must fail instead of passing it to vLLM."""
    engine = Recoverable(StandInCollective(Wire()))
    engine.init_process_group(sync_group="g", deadline_s=None, rank=1, world_size=2)
    arriving = iter([("w0", torch.ones(2)), "abort", ("w1", torch.zeros(2)), None])

    def broadcast(payload, src_rank=0, group_name=""):
        item = next(arriving)
        if item == "abort":  # the watchdog fires during this collective, which then "completes"
            engine.abort_sync("watchdog")
            item = next(arriving)
        return item

    engine.coll.broadcast = broadcast
    got = []

    async def consume():
        async for name, _ in engine.receive_weights():
            got.append(name)

    with pytest.raises(SyncAborted, match="watchdog"):
        asyncio.run(consume())
    assert got == ["w0"]


def test_the_master_hands_its_sync_id_and_deadline_to_every_rank():
    actor, rollout = _ranks(Recoverable, Wire(), n_rollout=3)
    actor[0].set_sync_deadline(12.5)
    meta = [e.prepare() for e in actor + rollout]
    assert isinstance(meta[0], SyncMetadata) and meta[0].sync_id and meta[1].sync_id is None
    akw, rkw = Recoverable.build_topology(2, 3, meta)
    assert akw["rank"] == [0, -1] and rkw["rank"] == [1, 2, 3]  # the wrapped engine's own topology
    (group,) = set(akw["sync_group"] + rkw["sync_group"])
    assert group == f"{GROUP_PREFIX}-{meta[0].sync_id}"
    assert set(akw["deadline_s"] + rkw["deadline_s"]) == {12.5}
    assert Recoverable.build_topology(2, 3, [e.prepare() for e in actor + rollout])[0]["sync_group"][0] != group
    with pytest.raises(RuntimeError, match="custom_backend_module"):
        Recoverable.build_topology(2, 1, meta[:2] + [{"master": False}])
    with pytest.raises(ValueError, match="seconds > 0"):
        actor[0].set_sync_deadline(0)


# ---------------------------------------------------------------- the guard alone


class ManualTimer:
    """threading.Timer that fires when the test says so."""
    made: list = []

    def __init__(self, seconds, fn, args=()):
        self.seconds, self.fn, self.args, self.cancelled, self.daemon = seconds, fn, args, False, False
        ManualTimer.made.append(self)

    def start(self):
        pass

    def cancel(self):
        self.cancelled = True

    def fire(self):
        if not self.cancelled:
            self.fn(*self.args)


def test_the_guard_aborts_at_the_deadline_only_while_its_sync_is_open():
    ManualTimer.made = []
    coll = StandInCollective(Wire())
    guard = SyncGuard(coll, timer=ManualTimer)
    coll.init_collective_group(2, 1, group_name="a")
    guard.begin("a", 30)
    guard.end()  # finalize came: the watchdog is off, and the engine destroys the group
    coll.destroy_collective_group("a")
    ManualTimer.made[-1].fire()
    assert coll.aborted == [] and guard.aborted is None
    coll.init_collective_group(2, 1, group_name="b")
    guard.begin("b", 30)
    old = ManualTimer.made[-1]
    assert old.seconds == 30
    old.fire()
    assert coll.aborted == ["b"] and "30s" in guard.aborted
    coll.init_collective_group(2, 1, group_name="c")
    guard.begin("c", 30)
    old.fire()  # a watchdog of an earlier sync never touches the current one
    assert coll.aborted == ["b"] and guard.aborted is None
    guard.begin("d", None)  # no deadline: no watchdog; "c" was left open, so it is torn down
    assert coll.aborted == ["b", "c"] and ManualTimer.made[-1].cancelled


# ---------------------------------------------------------------- the trainer's side


def _rp(**over):
    rp = {"weight_sync_timeout_s": 600, "nccl_sync": {"min_gib_per_s": 1.0, "setup_s": 60}}
    rp.update(over)
    return OmegaConf.create(rp)


def test_the_nccl_deadline_is_sized_to_the_bytes_and_the_flat_timeout_stays_for_other_backends():
    qwen3_1p7b = 1_720_000_000 * 4  # fp32 master weights, as PipeActorWorker.weight_sync_nbytes counts them
    d = sync_deadline(_rp(), bounded=True, nbytes=qwen3_1p7b)
    assert d.seconds == pytest.approx(60 + qwen3_1p7b / GIB) and 60 < d.seconds < 70
    assert "min_gib_per_s" in d.hint and "setup_s" in d.hint
    assert sync_deadline(_rp(), bounded=False, nbytes=None).seconds == 600  # ray_store: as before
    short = sync_deadline(_rp(weight_sync_timeout_s=30), bounded=True, nbytes=qwen3_1p7b)
    assert short.seconds == 30 and "weight_sync_timeout_s" in short.hint  # the shorter bound wins
    off = sync_deadline(_rp(nccl_sync={"min_gib_per_s": None, "setup_s": 60}), bounded=True, nbytes=qwen3_1p7b)
    assert off.seconds == 600
    assert sync_deadline(_rp(weight_sync_timeout_s=None), True, 10 * (1 << 30)).seconds == pytest.approx(70)
    assert bytes_deadline_s(1 << 30, 0.5, 10) == pytest.approx(12)
    with pytest.raises(ValueError, match="rolloutpipe.nccl_sync.min_gib_per_s"):
        bytes_deadline_s(1, 0, 10)
    with pytest.raises(ValueError, match="rolloutpipe.nccl_sync.setup_s"):
        bytes_deadline_s(1, 1.0, None)


class Manager:
    """verl's CheckpointEngineManager as WeightSync sees it: update_weights hangs until torn down, or raises."""

    def __init__(self, hang=False, error=None):
        self.released = threading.Event()
        self.hang, self.error = hang, error

    def update_weights(self, version):
        if self.error:
            raise self.error
        if self.hang:
            self.released.wait(10)
            raise RuntimeError("NCCL error: communicator aborted")
        return {"synced": version}


def test_a_sync_past_its_deadline_has_every_rank_torn_down_then_fails_naming_the_bound():
    calls = []

    def abort(manager):
        calls.append(manager)
        manager.released.set()  # the ranks' teardown ends the stuck transfer
        return ["h1", "h2"]

    waited = []
    sync = WeightSync(sync_deadline(_rp(nccl_sync={"min_gib_per_s": 1.0, "setup_s": 0.2}), True, 0), 5.0,
                      abort=abort, wait=lambda handles, s: waited.append((handles, s)))
    m = Manager(hang=True)
    t0 = time.perf_counter()
    with pytest.raises(DeadlineExceeded, match=r"step 3's weight sync did not finish within 0s .*setup_s"):
        sync.run(m, 3, "step 3's weight sync")
    assert time.perf_counter() - t0 < 2.0
    assert calls == [m] and waited == [(["h1", "h2"], 5.0)] and sync.teardowns == 1
    assert sync.run(Manager(), 4, "step 4's weight sync") == {"synced": 4} and sync.teardowns == 1

    boom = RuntimeError("EngineDeadError")
    with pytest.raises(RuntimeError, match="EngineDeadError"):  # any failure tears down; its error is raised
        sync.run(Manager(error=boom), 5, "x")
    assert sync.teardowns == 2

    def abort_fails(manager):
        raise RuntimeError("worker group")
    with pytest.raises(RuntimeError, match="EngineDeadError"):  # a failed teardown does not hide the sync's error
        WeightSync(sync.deadline, 1.0, abort=abort_fails).run(Manager(error=boom), 6, "x")
    plain = WeightSync(sync_deadline(_rp(), False, None))  # a backend without abort_sync: nothing to tear down
    with pytest.raises(RuntimeError, match="EngineDeadError"):
        plain.run(Manager(error=boom), 7, "x")
    assert plain.teardowns == 0


def test_the_supervisor_retries_on_the_live_replicas_after_the_torn_down_sync():
    """ReplicaSupervisor.sync_weights around WeightSync: the first sync times out with replica 1 dead, every rank
    is torn down, the dead replica is set aside and the retry syncs the other."""
    from tests.test_replica_health import Sup

    sup = Sup(dead=[{}, {1: "engine dead"}])
    attempts, torn = [], []

    class Mgr:
        def update_weights(self, version):
            attempts.append([r.name for r in sup.ckpt.replicas])
            if len(attempts) == 1:
                time.sleep(5)  # the broadcast waits for the dead replica
            return {"v": version}

    sync = WeightSync(sync_deadline(_rp(weight_sync_timeout_s=0.3), True, 0), 1.0,
                      abort=lambda m: torn.append(m) or [], wait=lambda h, s: None)
    assert sup.sync_weights(lambda: sync.run(Mgr(), 7, "step 7's weight sync"), version=7) == {"v": 7}
    assert attempts == [["r0", "r1"], ["r0"]] and len(torn) == 1
    assert sup.log == [("restart", 1, 7, ["r0"])]


# ---------------------------------------------------------------- verl's real NCCL engine on the stand-in


def _import_nccl_engine(monkeypatch, cupy):
    """verl_pipe.platform.nccl_engine imported afresh with ``cupy`` as the cupy module (None: not installed); the
    registry and sys.modules are put back afterwards."""
    from verl.checkpoint_engine import CheckpointEngineRegistry

    monkeypatch.setattr(CheckpointEngineRegistry, "_registry", dict(CheckpointEngineRegistry._registry))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    for name in ("verl.checkpoint_engine.nccl_checkpoint_engine", "verl_pipe.platform.nccl_engine"):
        monkeypatch.setitem(sys.modules, name, None)
        del sys.modules[name]
    return importlib.import_module("verl_pipe.platform.nccl_engine"), CheckpointEngineRegistry


def _fake_cupy():
    cp = types.ModuleType("cupy")
    cp.ndarray, cp.uint8 = np.ndarray, np.uint8
    cp.zeros = lambda n, dtype=None: np.zeros(n, dtype=dtype)
    return cp


def test_without_cupy_nothing_is_registered(monkeypatch):
    module, registry = _import_nccl_engine(monkeypatch, None)
    assert module.NCCLCheckpointEngine is None and not hasattr(module, "RecoverableNCCLCheckpointEngine")


def test_verl_nccl_engine_with_the_recovery_creates_a_new_group_after_a_sync_cut_short(monkeypatch):
    module, registry = _import_nccl_engine(monkeypatch, _fake_cupy())
    engine_cls = module.RecoverableNCCLCheckpointEngine
    assert registry.get("nccl") is engine_cls  # what every worker and the trainer's manager look up
    verl_nccl = sys.modules["verl.checkpoint_engine.nccl_checkpoint_engine"]
    wire = Wire()
    processes = {"master": StandInCollective(wire), "rollout": StandInCollective(wire)}
    current = {"p": None}

    class PerProcess:  # verl's module-level `collective` is per process; here per engine, switched by the test
        def __getattr__(self, name):
            return getattr(processes[current["p"]], name)

    monkeypatch.setattr(verl_nccl, "collective", PerProcess())
    monkeypatch.setattr(engine_cls, "collective_ops", lambda self: PerProcess())
    monkeypatch.setattr(verl_nccl.NCCLCheckpointEngine, "_start_zmq_server",
                        lambda self: setattr(self, "ip", "127.0.0.1") or setattr(self, "listen_port", 1))
    monkeypatch.setattr(verl_nccl.NCCLCheckpointEngine, "_connect_zmq_client", lambda self, m: None)
    monkeypatch.setattr(verl_nccl.NCCLCheckpointEngine, "get_node_id", staticmethod(lambda: "node0"))

    def sync(engines, kwargs_of):
        for name, engine in engines.items():
            current["p"] = name
            engine.init_process_group(**kwargs_of[name])

    current["p"] = "master"
    master = engine_cls(bucket_size=64, is_master=True, rebuild_group=False)  # rebuild is forced per sync
    current["p"] = "rollout"
    receiver = engine_cls(bucket_size=64)
    engines = {"master": master, "rollout": receiver}
    groups = []
    for _ in range(2):  # sync 1 is cut short (no finalize anywhere); sync 2 must still create its group
        current["p"] = "master"
        meta = [master.prepare(), SyncMetadata(verl_nccl.WorkerMetadata(node_id="node1"))]  # verl's receiver
        akw, rkw = engine_cls.build_topology(1, 1, meta)  # prepare allocates CUDA buffers: its metadata by hand
        assert akw["rank"] == [0] and rkw["rank"] == [1] and akw["num_senders"] == [1]  # verl's own topology
        sync(engines, {"master": {k: v[0] for k, v in akw.items()}, "rollout": {k: v[0] for k, v in rkw.items()}})
        groups.append(master.group_name)
        assert all(p.groups.keys() == {master.group_name} for p in processes.values())
    assert groups[0] != groups[1] and all(p.aborted == [groups[0]] for p in processes.values())
    for name, engine in engines.items():  # verl's finalize destroys the group as usual
        current["p"] = name
        engine.finalize()
    assert all(p.groups == {} and p.destroyed == [groups[1]] for p in processes.values())

    # verl's own engine (rebuild_group, the recipes' setting) on the same stand-in: the retry cannot
    plain = verl_nccl.NCCLCheckpointEngine(bucket_size=64, rebuild_group=True)
    meta = verl_nccl.MasterMetadata(zmq_ip="127.0.0.1", zmq_port=1, multi_sender=False)
    current["p"] = "rollout"
    plain.init_process_group(rank=1, world_size=2, master_metadata=meta, num_senders=1)
    with pytest.raises(RuntimeError, match="Trying to initialize a group a second time"):
        plain.init_process_group(rank=1, world_size=2, master_metadata=meta, num_senders=1)
