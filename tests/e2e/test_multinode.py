"""Beyond one machine: a real multi-node Ray cluster (tools/local_ray_cluster.py: a head, rollout nodes and a trainer
node, each its own raylet, object store and process group), the stack attached to it with ``ray.init(address=...)``
as a user's cluster run does, each rollout replica on a rollout node and the trainer pool on the trainer node
(verl_pipe/platform/node_roles.py), the weights synced across nodes (``ray_store``: between the object stores of two nodes,
through a channel pinned to the trainer's node), and nodes lost (a node's whole process group SIGKILLed: raylet,
object store, vLLM server and engine at once):

1. one live stack (``PipeSession``): a rollout node lost mid-rollout with restarts on and a spare rollout node (the
   replica comes back there), one lost between steps with restarts on and no node that can take its replica (the
   restart gives up, the next step runs on the survivor), the last one lost mid-rollout (its restart gives up, the
   step rolls back and checkpoints);
2. a launcher (``python -m verl_pipe.main_grpo``) attached to the cluster resumes that checkpoint and loses the
   trainer's node: it stops with the error, the last checkpoint intact, nothing of the run left on the other nodes;
3. a second launcher resumes that one and is stopped from another process through the cluster (``python -m
   verl_pipe.launch.stop_request``, no stop file; an id no run has is refused first): it ends after its step, the
   cluster stays up, its stop key and its private stop directory gone;
4. a third resumes that one and gets SIGTERM: exit 143, none of the run's actors left on any node, the cluster up;
5. a fourth resumes that one and loses the head (the module's last test: the cluster ends with it); a new cluster
   then resumes its last checkpoint, no step lost or repeated (opt-in: VERL_PIPE_MULTINODE_HEAD=1).

Every case asserts its groups trained once (or, across the launchers, that no step was lost or trained twice).
Real Ray, real vLLM, real verl workers. Bounded: one cluster for the module, one session, four launchers (times in
docs/reliability.md).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch
from omegaconf import open_dict

from tests.e2e.conftest import E2E_OVERRIDES, KillAtFirstUnit, assert_every_group_once_at

# Part of `make test`; VERL_PIPE_MULTINODE=0 skips it.
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.environ.get("VERL_PIPE_MULTINODE") == "0", reason="VERL_PIPE_MULTINODE=0")]

ROOT = Path(__file__).resolve().parents[2]
N, GROUPS = 4, 8
SHORT, LONG = 4, 128  # unit 0's groups short, the others long: still in flight when the node is lost
SPARE = "rollout_c"  # joins the running cluster before the restart case

MN_OVERRIDES = E2E_OVERRIDES + [
    f"data.max_response_length={LONG}",
    "actor_rollout_ref.rollout.max_model_len=256",
    "trainer.save_freq=-1",
]
STATE: dict = {}  # what a later test of the module goes on from: the checkpoint dir, the failed step and its data


def _load_cluster_tool():
    spec = importlib.util.spec_from_file_location("local_ray_cluster", ROOT / "tools" / "local_ray_cluster.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _free_base_port(start: int = 6390) -> int:
    """A base port whose GCS port is free (other users may run Ray clusters on this machine)."""
    for port in range(start, start + 1000, 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free base port for the test cluster")


@pytest.fixture(scope="module")
def cluster():
    """A head, two rollout nodes (one replica each), a trainer node; a third rollout node is a spare that joins
    later."""
    tool = _load_cluster_tool()
    rollout = dict(num_cpus=16, num_gpus=1, resources={tool.ROLLOUT_RESOURCE: 1})
    nodes = (tool.NodeSpec("head", num_cpus=32), tool.NodeSpec("rollout_a", **rollout),
             tool.NodeSpec("rollout_b", **rollout), tool.NodeSpec(SPARE, **rollout),
             tool.NodeSpec("trainer", num_cpus=16, num_gpus=1, resources={tool.TRAINER_RESOURCE: 1}))
    c = tool.LocalRayCluster(port=_free_base_port(int(os.environ.get("VERL_PIPE_MN_PORT", "6390"))), nodes=nodes)
    t0 = time.perf_counter()
    c.start([n.name for n in nodes if n.name != SPARE])
    c.start_s = time.perf_counter() - t0
    print(f"\n[multinode] cluster up at {c.address} in {c.start_s:.1f}s: {c.node_ids}")
    yield c
    if ray.is_initialized():
        ray.shutdown()
    left = c.stop()
    assert not left, f"processes left after the cluster's teardown: {left}"


def _lengths(group: int, index: int) -> dict:
    return {"max_tokens": SHORT if group < 4 else LONG, "ignore_eos": True}


def _node_of(handle) -> str:
    return ray.get(handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=60)


def _channel_node() -> str:
    """The node of the run's ray_store weight channel (verl_pipe/platform/ray_store_engine.py)."""
    from verl_pipe.platform.ray_store_engine import _CHANNEL_NAMESPACE

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == _CHANNEL_NAMESPACE and a["name"].startswith("weights-")]
    assert len(names) == 1, names
    return ray.get(ray.get_actor(names[0], namespace=_CHANNEL_NAMESPACE).node_id.remote(), timeout=60)


def _rollout_gap(batch) -> float:
    mask = batch.batch["response_mask"].bool()
    return float((batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs()[mask].max())


class KillNodeAtFirstUnit(KillAtFirstUnit):
    """KillAtFirstUnit, but a whole rollout node goes (its process group SIGKILLed), not one server process: of
    ``nodes`` ({replica: node name}), the node of the replica with the most requests in flight at that moment."""

    def __init__(self, trainer, cluster, nodes: dict[int, str]):
        super().__init__(trainer, pid=None)
        self.cluster, self.nodes = cluster, nodes
        self.replica = self.node = None

    def now(self):
        if self.killed_at is None:
            inflight = [adm.replica for adm in list(self.trainer.rollout._tasks.values())]
            self.inflight_at_kill = sum(1 for r in inflight if r in self.nodes)
            self.replica = max(self.nodes, key=inflight.count)
            self.node = self.nodes[self.replica]
            self.cluster.kill_node(self.node)
            self.killed_at = time.perf_counter()


def _wait_marked_dead(cluster, name: str, since: float, timeout_s: float = 60.0) -> float:
    """Waits until Ray's GCS lists node ``name`` dead (its health checks failed); seconds since ``since``."""
    deadline = time.monotonic() + timeout_s
    while name in cluster.alive_nodes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert name not in cluster.alive_nodes(), f"the GCS still lists {name} alive"
    return time.perf_counter() - since


def _set_restarts(trainer, on: bool) -> None:
    with open_dict(trainer.config.rolloutpipe.fault):
        trainer.config.rolloutpipe.fault.replica_restart = on
    trainer.rollout.supervisor.restart_enabled = on


def _replica_nodes(trainer, name_of) -> dict[int, str]:
    """{live replica: the name of its server's node}."""
    handles = trainer.llm_server_manager.server_handles
    return {i: name_of[_node_of(handles[i])] for i in trainer.rollout.live_replicas()}


def _steps_across_nodes(session, cluster, name_of) -> dict:
    """sync, then CGP + FGD twice: every step trains each group once at its version, the weights crossing nodes
    through a channel on the trainer's node."""
    trainer, nodes = session.trainer, cluster.node_ids
    replica_nodes = [_node_of(h) for h in trainer.llm_server_manager.server_handles]
    assert sorted(name_of[n] for n in replica_nodes) == ["rollout_a", "rollout_b"]
    times = {}
    for mode, fgd in (("sync", False), ("cgp", True), ("cgp", True)):
        version = trainer.global_steps - 1
        t = time.perf_counter()
        rec = session.step(mode=mode, fgd=fgd, sampling_overrides=_lengths)
        times.setdefault(f"{mode}{'+fgd' if fgd else ''}", []).append(round(time.perf_counter() - t, 1))
        assert rec["nodes"] == {"trainer": [nodes["trainer"]], "rollout": replica_nodes}, rec.get("nodes")
        assert_every_group_once_at(rec, trainer.last_outcome.batch, GROUPS, N, version)
        sync_s = rec["timeline"]["weight_sync_s"]
        assert sync_s > 0
        times.setdefault("weight_sync", []).append(round(sync_s, 2))
        if version >= 1:  # the replicas generated with θ_k that came across from the trainer's node
            gap = _rollout_gap(trainer.last_outcome.batch)
            assert gap < 1e-3, f"vLLM's log-probs differ from the trainer's θ_k by {gap}"
    channel = name_of[_channel_node()]
    print(f"[multinode] steps {times} s; the weight channel on the {channel} node")
    assert channel == "trainer", "the ray_store channel is pinned to the trainer's node"
    return times


def _timed(obj, name: str, took: dict):
    """Wraps method ``name`` of ``obj`` (on the instance) to add its seconds to ``took[name]``; returns the undo."""
    method = getattr(obj, name)
    own = name in vars(obj)  # an instance attribute (a callable given to the constructor), not a method

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            took[name] = took.get(name, 0.0) + time.perf_counter() - t

    setattr(obj, name, timed)
    return lambda: setattr(obj, name, method) if own else delattr(obj, name)


def _restart_onto_spare(session, cluster, name_of, times) -> None:
    """Restarts on, a spare rollout node joined: a rollout node lost mid-rollout. Its requests go to the other
    replica at once; the replica is restarted on the spare node (the only rollout node with a free GPU) with θ_k
    while the step goes on, and the next step runs on both with θ_{k+1}."""
    trainer = session.trainer
    t = time.perf_counter()
    name_of[cluster.start_node(SPARE)] = SPARE
    print(f"[multinode] spare node {SPARE} joined in {time.perf_counter() - t:.1f}s")
    _set_restarts(trainer, True)
    sup = trainer.rollout.supervisor
    sup.timeout_s = 300
    took: dict = {}  # the restart's parts: the dead replica's teardown (and wait for its GPU), the new one's weights
    undo = [_timed(sup, name, took) for name in ("restart", "_tear_down", "push_weights")]
    version = trainer.global_steps - 1
    kill = KillNodeAtFirstUnit(trainer, cluster, _replica_nodes(trainer, name_of))
    t = time.perf_counter()
    rec = session.step(mode="cgp", fgd=False, sampling_overrides=_lengths, backend_cls=kill.backend_cls)
    step_s, m = time.perf_counter() - t, rec["metrics"]
    where = _replica_nodes(trainer, name_of)
    print(f"[multinode] {kill.node} lost with {kill.inflight_at_kill} requests in flight, restarts on: "
          f"{m['rolloutpipe/requeued_requests']} requeued, replica {kill.replica} back on {where[kill.replica]} "
          f"{m.get('rolloutpipe/replica_recovery_s', float('nan')):.1f}s after its death was noticed; the step took "
          f"{step_s:.1f}s (normal cgp steps: {times['cgp+fgd']} s)")
    for u in undo:
        u()
    new_s = took.get("restart", 0) - took.get("_tear_down", 0) - took.get("push_weights", 0)
    print(f"[multinode] the restart {took.get('restart', 0):.1f}s: the dead replica's teardown "
          f"{took.get('_tear_down', 0):.1f}s, the new replica's start {new_s:.1f}s, θ_k into it "
          f"{took.get('push_weights', 0):.1f}s")
    assert kill.inflight_at_kill, "the long groups must still be in flight when the node goes"
    assert m["rolloutpipe/replica_failures"] == 1 and m["rolloutpipe/replica_restarts"] == 1
    assert m["rolloutpipe/requeued_requests"] > 0
    assert_every_group_once_at(rec, trainer.last_outcome.batch, GROUPS, N, version)
    assert where[kill.replica] == SPARE and sorted(where.values()) == sorted({*where.values()}), where
    rec = session.step(mode="cgp", fgd=True, sampling_overrides=_lengths)
    assert rec["metrics"]["rolloutpipe/replica_failures"] == 0
    assert sorted(name_of[n] for n in rec["nodes"]["rollout"]) == sorted(where.values())
    assert_every_group_once_at(rec, trainer.last_outcome.batch, GROUPS, N, version + 1)
    assert _rollout_gap(trainer.last_outcome.batch) < 1e-3, "both replicas got θ_{k+1}, the restarted one too"


def _failures_of(obj, name: str, out: list):
    """Wraps method ``name`` of ``obj`` (on the instance) to record (when, error) of each call that raises; returns
    the undo."""
    method = getattr(obj, name)

    def recorded(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception as e:
            out.append((time.perf_counter(), e))
            raise

    setattr(obj, name, recorded)
    return lambda: delattr(obj, name)


def _lost_between_steps_nowhere_to_restart(session, cluster, name_of, caplog) -> int:
    """Restarts on, but no node can take a replica (the spare is in use, the lost nodes gone): a rollout node lost
    between steps. The next step's health probe finds its replica dead before admitting anything; its restart asks
    for a placement group no live node can hold, gives up (rollout/placement.py), and retires it with a log line
    that says why; the step runs on the survivor. Returns the survivor."""
    from verl_pipe.rollout.placement import ReplicaUnplaceableError

    trainer = session.trainer
    _set_restarts(trainer, True)
    sup = trainer.rollout.supervisor
    where = _replica_nodes(trainer, name_of)
    lost, survivor = sorted(where)
    failed: list = []
    undo = _failures_of(sup, "restart", failed)
    t_kill = time.perf_counter()
    cluster.kill_node(where[lost])
    version = trainer.global_steps - 1
    t = time.perf_counter()
    with caplog.at_level(logging.ERROR, logger="verl_pipe.rollout.replicas"):
        rec = session.step(mode="cgp", fgd=True, sampling_overrides=_lengths)
    step_s, m = time.perf_counter() - t, rec["metrics"]
    undo()
    assert len(failed) == 1 and isinstance(failed[0][1], ReplicaUnplaceableError), failed
    print(f"[multinode] {where[lost]} lost between steps ({t - t_kill:.1f}s to kill), restarts on and no node free: "
          f"the restart gave up {failed[0][0] - t_kill:.1f}s after the kill ({failed[0][1]}); the step ran on "
          f"{where[survivor]} in {step_s:.1f}s")
    assert any("cannot be restarted" in r.getMessage() and "retired" in r.getMessage() for r in caplog.records)
    assert m["rolloutpipe/replica_deaths_found/step_start"] == 1 and m["rolloutpipe/replica_failures"] == 1
    assert m["rolloutpipe/replica_restarts"] == 0
    assert m["rolloutpipe/requeued_requests"] == 0, "found before any request went to it"
    assert trainer.rollout.live_replicas() == [survivor] and lost in sup.retired
    assert [name_of[n] for n in rec["nodes"]["rollout"]] == [where[survivor]]
    assert_every_group_once_at(rec, trainer.last_outcome.batch, GROUPS, N, version)
    return survivor


def _last_rollout_node_lost(session, cluster, name_of, survivor: int, ckpt: Path) -> str:
    """The last rollout node lost mid-rollout, restarts on: its restart finds no node that can take the replica and
    gives up, so no replica is left: the step fails, rolls back to θ_k and checkpoints (its data too: the launcher
    below resumes it). Returns the node's name."""
    from verl_pipe.rollout.placement import ReplicaUnplaceableError
    from verl_pipe.trainer import StepFailedError

    trainer = session.trainer
    step = trainer.global_steps
    theta_k = session.actor_state()
    batch_dict = next(session._batches)
    node = _replica_nodes(trainer, name_of)[survivor]
    failed: list = []
    undo = _failures_of(trainer.rollout.supervisor, "restart", failed)
    kill = KillNodeAtFirstUnit(trainer, cluster, {survivor: node})
    with pytest.raises(StepFailedError, match="could not be restarted .*no replica is left") as err:
        session.step(mode="cgp", fgd=False, batch_dict=batch_dict, sampling_overrides=_lengths,
                     backend_cls=kill.backend_cls)
    stop_s = time.perf_counter() - kill.killed_at
    undo()
    print(f"[multinode] {node} (the last rollout node) lost with {kill.inflight_at_kill} requests in flight, "
          f"restarts on: the restart gave up {failed[0][0] - kill.killed_at:.1f}s after the kill, the step failed "
          f"{stop_s:.1f}s after it: {err.value}")
    assert len(failed) == 1 and isinstance(failed[0][1], ReplicaUnplaceableError), failed
    assert kill.inflight_at_kill, "the long groups must still be in flight when the node goes"
    assert "resume_mode=auto" in str(err.value)
    after = session.actor_state()
    assert all(torch.equal(theta_k[k], after[k]) for k in theta_k), "rolled back to θ_k"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == str(step - 1)
    assert (ckpt / f"global_step_{step - 1}" / "data.pt").exists()
    assert trainer.global_steps == step, "the failed step does not count"
    STATE.update(ckpt=ckpt, failed_step=step, failed_data=sorted(int(i) for i in batch_dict["index"]),
                 killed_at=kill.killed_at)
    return node


def test_pools_on_their_nodes_and_rollout_nodes_lost(cluster, tmp_path_factory, caplog):
    from verl_pipe.launch.session import PipeSession, compose

    ckpt = tmp_path_factory.mktemp("mn_ckpt")
    t0 = time.perf_counter()
    session = PipeSession(compose(MN_OVERRIDES + [
        "actor_rollout_ref.rollout.n_gpus_per_node=2",  # two replicas of TP 1: one per rollout node
        f"+ray_kwargs.ray_init.address={cluster.address}", f"trainer.default_local_dir={ckpt}"]))
    print(f"[multinode] stack up in {time.perf_counter() - t0:.1f}s")
    closed = False
    try:
        trainer = session.trainer
        nodes = cluster.node_ids
        name_of = {v: k for k, v in nodes.items()}
        # the driver (this process) attached to the head; the pools sit on their role nodes, a replica per node
        assert ray.get_runtime_context().get_node_id() == nodes["head"]
        assert {_node_of(w) for w in trainer.actor_wg.workers} == {nodes["trainer"]}
        times = _steps_across_nodes(session, cluster, name_of)
        _restart_onto_spare(session, cluster, name_of, times)
        survivor = _lost_between_steps_nowhere_to_restart(session, cluster, name_of, caplog)
        last = _last_rollout_node_lost(session, cluster, name_of, survivor, ckpt)
        t = time.perf_counter()
        session.close()
        closed = True
        print(f"[multinode] session closed in {time.perf_counter() - t:.1f}s")
    finally:
        if not closed:
            session.close()
    # the driver left; the cluster it did not start is still up (the surviving nodes); Ray's GCS marks a lost node
    # dead once its health checks fail
    dead_s = _wait_marked_dead(cluster, last, STATE["killed_at"])
    print(f"[multinode] the GCS marked {last} dead {dead_s:.1f}s after the kill")
    alive = cluster.alive_nodes()
    assert set(alive) == {"head", "trainer"}, alive
    _no_run_processes_left(cluster, ["head", "trainer"])


_RUN_PROCESS = re.compile(r"EngineCore|ray::(?!IDLE|DashboardAgent|RuntimeEnvAgent)")


def _run_processes(cluster, names) -> dict[str, list[str]]:
    """The run's processes still alive on nodes ``names``: actors (``ray::<Class>``) and vLLM engines; idle pooled
    workers (``ray::IDLE``) and the nodes' own daemons (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are not
    the run's."""
    import psutil

    found = {}
    for name in names:
        for pid in cluster.pids(name):
            try:
                cmd = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if _RUN_PROCESS.search(cmd):
                found.setdefault(name, []).append(f"{pid}: {cmd[:80]}")
    return found


def _no_run_processes_left(cluster, names, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := _run_processes(cluster, names)) and time.monotonic() < deadline:
        time.sleep(1.0)
    assert not left, f"the run's processes still alive on the cluster: {left}"


def _launch(cluster, log: Path, ckpt: Path, trace: Path, env_extra: dict | None = None) -> subprocess.Popen:
    """``python -m verl_pipe.main_grpo`` attached to the cluster, in its own session, resuming from ``ckpt``."""
    overrides = [o for o in MN_OVERRIDES if not o.startswith(("trainer.total_training_steps", "trainer.save_freq"))]
    overrides += ["trainer.total_training_steps=50", "trainer.save_freq=1", "trainer.resume_mode=auto",
                  "rolloutpipe.mode=cgp", f"+ray_kwargs.ray_init.address={cluster.address}",
                  f"trainer.default_local_dir={ckpt}", f"rolloutpipe.trace_dir={trace}"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | (env_extra or {})
    # the base config (MN_OVERRIDES are its digit-math shape); main_grpo's own default is the chain recipe
    return subprocess.Popen([sys.executable, "-m", "verl_pipe.main_grpo", "--config-name", "rolloutpipe_trainer",
                             *overrides], stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)


def _wait_for(proc, log: Path, pattern: str, timeout_s: float = 300.0) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while not (found := re.search(pattern, log.read_text(errors="replace"))):
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        assert time.monotonic() < deadline, f"no {pattern!r} within {timeout_s:.0f}s"
        time.sleep(0.5)
    return found


def _latest(ckpt: Path) -> int:
    return int((ckpt / "latest_checkpointed_iteration.txt").read_text())


def _records(trace: Path) -> list[dict]:
    return [json.loads(line) for line in (trace / "steps.jsonl").read_text().splitlines() if line.strip()]


def _respawn(cluster, names) -> None:
    for name in names:
        cluster.spawn_node(name)
    cluster.wait_alive(names)


def test_launcher_resumes_after_node_loss_then_loses_the_trainer_node(cluster, tmp_path):
    """main_grpo attached to the cluster resumes the rollback checkpoint of the test above (the failed step on the
    same prompts), checkpoints each step, then loses the trainer's node: it stops with the error naming the latest
    checkpoint, which stays intact; nothing of the run is left on the surviving nodes, which stay up."""
    if "failed_step" not in STATE:
        pytest.skip("needs the rollback checkpoint of test_pools_on_their_nodes_and_rollout_nodes_lost")
    _respawn(cluster, ["rollout_a"])
    ckpt, step, log, trace = STATE["ckpt"], STATE["failed_step"], tmp_path / "launcher.log", tmp_path / "trace"
    t0 = time.perf_counter()
    proc = _launch(cluster, log, ckpt, trace)
    try:
        _wait_for(proc, log, rf"\[verl_pipe\] step {step} ")
        first_s = time.perf_counter() - t0
        deadline = time.monotonic() + 60
        while _latest(ckpt) < step:  # the resumed step, checkpointed
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text(errors="replace")[-4000:]
            time.sleep(0.2)
        latest = _latest(ckpt)
        t_kill = time.perf_counter()
        cluster.kill_node("trainer")
        rc = proc.wait(timeout=180)
        stop_s = time.perf_counter() - t_kill
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    error = next((line for line in text.splitlines() if "StepFailedError:" in line), "")
    print(f"\n[multinode] launcher resumed step {step} {first_s:.1f}s after start; trainer node lost after step "
          f"{latest}'s checkpoint: exit {rc} {stop_s:.1f}s later: {error[:400]}")
    assert rc not in (0, None), text[-4000:]
    assert "resume from the latest checkpoint in" in error, text[-4000:]
    assert _latest(ckpt) == latest and (ckpt / f"global_step_{latest}" / "data.pt").exists()
    assert (ckpt / f"global_step_{latest}" / "actor").is_dir()
    recs = _records(trace)
    assert recs[0]["step"] == step and sorted(recs[0]["data_index"]) == STATE["failed_data"], \
        "the resumed run re-ran the failed step on the same prompts"
    assert [r["step"] for r in recs] == list(range(step, latest + 1))
    assert all(len(set(r["trained_groups"])) == GROUPS == len(r["trained_groups"]) for r in recs)
    dead_s = _wait_marked_dead(cluster, "trainer", t_kill)
    print(f"[multinode] the GCS marked the trainer node dead {dead_s:.1f}s after the kill")
    assert set(cluster.alive_nodes()) == {"head", "rollout_a"}
    _no_run_processes_left(cluster, ["head", "rollout_a"])
    STATE.update(latest=latest, seen_data={i for r in recs for i in r["data_index"]})


def test_stop_request_through_the_cluster_no_shared_tmp(cluster, tmp_path):
    """A new launcher resumes the checkpoint the lost trainer node left (the step after it, so none lost) and is
    stopped from another process through the cluster (``python -m verl_pipe.launch.stop_request <run id>``; the launcher's
    /tmp is its own and no stop file is made): the step in progress completes, no new one starts, exit 0, every
    node still up and nothing of the run left. Run alone (``-k``), its launcher starts a fresh run instead."""
    resumed = "latest" in STATE
    if resumed:
        _respawn(cluster, ["trainer"])
    ckpt, log, trace = STATE["ckpt"] if resumed else tmp_path / "ckpt", tmp_path / "launcher.log", tmp_path / "trace"
    latest, seen = (STATE["latest"], STATE["seen_data"]) if resumed else (0, set())
    nodes = set(cluster.alive_nodes())
    private_tmp = tmp_path / "launcher_tmp"  # the launcher's /tmp: not the TaskRunner's on a real cluster
    private_tmp.mkdir()
    proc = _launch(cluster, log, ckpt, trace, env_extra={"TMPDIR": str(private_tmp)})
    try:
        run_id = _wait_for(proc, log, r"\[verl_pipe\] run id (\S+):").group(1)
        assert re.fullmatch(r"[0-9a-f]{32}", run_id), f"a run id nobody can guess: {run_id}"
        (stop_dir,) = private_tmp.glob("verl_pipe_run_*")
        assert stop_dir.stat().st_mode & 0o777 == 0o700, "the stop file's directory is the user's alone"
        _wait_for(proc, log, rf"\[verl_pipe\] step {latest + 1} ")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        other = "0" * 32 if run_id != "0" * 32 else "1" * 32  # an id no run has (a typo, or a run that ended)
        for bad in (other, "host-1234"):
            out = subprocess.run([sys.executable, "-m", "verl_pipe.launch.stop_request", bad, "--address",
                                  cluster.address], cwd=ROOT, timeout=120, env=env, capture_output=True, text=True)
            assert out.returncode == 2 and "stop requested" not in out.stdout, (bad, out.stdout, out.stderr[-2000:])
            assert ("no run with id" if bad == other else "is not a run id") in out.stderr, out.stderr[-2000:]
        assert proc.poll() is None, "a refused request stops nothing"
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "verl_pipe.launch.stop_request", run_id, "--address", cluster.address],
                       check=True, cwd=ROOT, timeout=120, env=env)
        request_s = time.perf_counter() - t
        rc = proc.wait(timeout=180)
        stop_s = time.perf_counter() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    stopped = re.search(r"stop requested: no step after (\d+)", text)
    print(f"\n[multinode] stop request for run {run_id} (the request itself {request_s:.1f}s): exit {rc} "
          f"{stop_s:.1f}s after it; {stopped and stopped.group(0)}")
    assert rc == 0, text[-4000:]
    assert stopped, text[-4000:]
    assert not list(private_tmp.glob("verl_pipe_*")), "no stop file, and the run's stop directory is gone"
    assert not _stop_key_left(cluster, run_id), "the run's stop request is cleared from the cluster"
    recs = _records(trace)
    last = int(stopped.group(1))
    assert recs[0]["step"] == latest + 1 and [r["step"] for r in recs] == list(range(latest + 1, last + 1))
    assert not seen & {i for r in recs for i in r["data_index"]}, "no prompt trained twice"
    assert _latest(ckpt) == last, "the last step before the stop is checkpointed"
    assert set(cluster.alive_nodes()) == ({"head", "rollout_a", "trainer"} if resumed else nodes)
    _no_run_processes_left(cluster, list(cluster.alive_nodes()))
    if resumed:
        STATE.update(last=last, seen_data=seen | {i for r in recs for i in r["data_index"]})


def _stop_key_left(cluster, run_id: str) -> bool:
    """Whether the cluster's GCS still holds a stop request for ``run_id`` (a new driver attaches to read it)."""
    from verl_pipe.launch import stop_request

    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        return stop_request.requested(run_id)
    finally:
        ray.shutdown()


def _live_actors() -> list[str]:
    """Every actor the cluster's GCS lists alive, of any job: a new driver attaches to read them (it creates none)."""
    import ray._private.state as state

    return [f"{a['ActorClassName']} {a['Name']}".strip() for a in state.actors().values() if a["State"] == "ALIVE"]


def test_sigterm_to_an_attached_launcher(cluster, tmp_path):
    """SIGTERM to a launcher attached to a cluster it did not start (to the launcher alone, as ``kill <pid>`` sends
    it): the step in progress is cut, the launcher exits 143, none of the run's actors is left alive on any node (the
    GCS's actor table, read by a new driver that attaches, and every node's process list), and the cluster is left
    running: the same nodes alive, their raylets up. Its checkpoint is a completed step of it (none partial); a run
    resuming after the earlier launcher's stop starts at the step after it (no prompt trained twice)."""
    resumed = "last" in STATE
    ckpt = STATE["ckpt"] if resumed else tmp_path / "ckpt"
    log, trace = tmp_path / "launcher.log", tmp_path / "trace"
    nodes = set(cluster.alive_nodes())
    proc = _launch(cluster, log, ckpt, trace)
    try:
        run_id = _wait_for(proc, log, r"\[verl_pipe\] run id (\S+):").group(1)
        first = _wait_for(proc, log, r"\[verl_pipe\] step (\d+) ")
        t = time.perf_counter()
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=180)
        stop_s = time.perf_counter() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    print(f"\n[multinode] SIGTERM to the attached launcher after its step {first.group(1)}: exit {rc} {stop_s:.1f}s "
          "later")
    assert rc == 128 + signal.SIGTERM, text[-4000:]
    assert "[verl_pipe] stopping (SIGTERM)" in text, text[-4000:]
    assert set(cluster.alive_nodes()) == nodes, "the cluster it did not start keeps every node"
    assert all(cluster.procs[n].poll() is None for n in nodes), "every node's `ray start` (its raylet) still runs"
    _no_run_processes_left(cluster, list(nodes))
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        assert ray.get(ray.remote(lambda: 1).remote(), timeout=60) == 1, "a new driver attaches and runs a task"
        left = _live_actors()
        from verl_pipe.launch import stop_request

        key_left = stop_request.requested(run_id)
    finally:
        ray.shutdown()
    assert not left, f"actors of the run still alive: {left}"
    assert not key_left, "the stop request the signalled launcher put in the cluster is cleared"
    recs = _records(trace) if (trace / "steps.jsonl").exists() else []
    if recs:
        assert _latest(ckpt) in [r["step"] for r in recs], "the checkpoint is one of the steps it completed"
        assert (ckpt / f"global_step_{_latest(ckpt)}" / "actor").is_dir()
    if resumed:
        assert int(first.group(1)) == STATE["last"] + 1, "resumed at the step after the earlier launcher's last"
        assert not STATE["seen_data"] & {i for r in recs for i in r["data_index"]}, "no prompt trained twice"


def _wait_exit(procs: dict, since: float, timeout_s: float) -> dict[str, float | None]:
    """{name: seconds from ``since`` until process ``procs[name]`` exited, None if it still runs after timeout_s}."""
    took: dict[str, float | None] = {name: None for name in procs}
    deadline = time.monotonic() + timeout_s
    while any(v is None for v in took.values()) and time.monotonic() < deadline:
        for name, p in procs.items():
            if took[name] is None and p.poll() is not None:
                took[name] = round(time.perf_counter() - since, 1)
        time.sleep(0.5)
    return took


def _cmdlines(pids) -> dict[int, str]:
    import psutil

    out = {}
    for pid in pids:
        try:
            out[pid] = " ".join(psutil.Process(pid).cmdline())[:100]
        except psutil.Error:
            continue
    return out


# Opt-in (VERL_PIPE_MULTINODE_HEAD=1): it takes the module's cluster down and adds a launcher start-up (~80-200 s),
# which would put `make test` over its time bound on the slowest CPUs; its runs are kept in docs/bench/logs.
@pytest.mark.skipif(os.environ.get("VERL_PIPE_MULTINODE_HEAD") != "1", reason="opt-in: VERL_PIPE_MULTINODE_HEAD=1")
def test_zz_the_head_lost(cluster, tmp_path):
    """The head node lost (its whole session SIGKILLed: the GCS with it) under a launcher attached to the cluster,
    mid-run; the module's last test, as the cluster does not survive it. Ray has no GCS fault tolerance here: every
    worker node's raylet gives up on the GCS and exits; the launcher's TaskRunner, on the head, goes with it. Asserted:
    the launcher exits with an error (it does not hang), every other node's ``ray start`` exits, nothing of the run is
    left in the launcher's session, and the checkpoint is a completed step of the run (a new cluster resumes from it);
    what is left in the worker nodes' sessions after their ``ray start`` exited is printed.
    The times are printed (Ray's reconnect timeout decides them: gcs_rpc_server_reconnect_timeout_s)."""
    resumed = "last" in STATE
    ckpt = STATE["ckpt"] if resumed else tmp_path / "ckpt"
    log, trace = tmp_path / "launcher.log", tmp_path / "trace"
    workers = [n for n in cluster.alive_nodes() if n != "head"]
    proc = _launch(cluster, log, ckpt, trace)
    try:
        first = _wait_for(proc, log, r"\[verl_pipe\] step (\d+) ")
        before = _latest(ckpt) if (ckpt / "latest_checkpointed_iteration.txt").exists() else None
        t_kill = time.perf_counter()
        cluster.kill_node("head")
        took = _wait_exit({"launcher": proc, **{n: cluster.procs[n] for n in workers}}, t_kill, timeout_s=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    tail = [ln for ln in text.splitlines() if ln.strip()][-3:]
    print(f"\n[multinode] the head lost after the launcher's step {first.group(1)}: exit {proc.returncode}; seconds "
          f"from the kill to each exit: {took}; the launcher's last lines: {tail}")
    assert took["launcher"] is not None and proc.returncode != 0, text[-4000:]
    assert all(took[n] is not None for n in workers), f"worker nodes still running after the head's loss: {took}"
    left = sys.modules["local_ray_cluster"].session_pids(proc.pid)
    assert not left, f"processes left in the launcher's session: {left}"
    # Not asserted (run 4 found 4 processes of the worker nodes' sessions still there when their `ray start` had
    # exited, not identified; the fixture's teardown ends whatever is left): listed, 15 s later again.
    lingering = _cmdlines([p for n in workers for p in cluster.pids(n)])
    t_end = time.monotonic() + 15
    while [p for n in workers for p in cluster.pids(n)] and time.monotonic() < t_end:
        time.sleep(0.5)
    still = _cmdlines([p for n in workers for p in cluster.pids(n)])
    print(f"[multinode] on the worker nodes when their `ray start` had exited: {lingering}; "
          f"{time.perf_counter() - t_kill:.1f}s after the kill: {still}")
    latest = _latest(ckpt) if (ckpt / "latest_checkpointed_iteration.txt").exists() else None
    print(f"[multinode] latest checkpoint: {before} at the kill, {latest} after")
    assert latest is not None, "the launcher checkpointed a step before the head was lost"
    done = ckpt / f"global_step_{latest}"
    assert (done / "actor").is_dir() and (done / "data.pt").exists(), "the latest checkpoint is complete"
    from verl_pipe.trainer.checkpoints import problem

    assert problem(str(done)) is None, "and recorded complete"
    _a_new_cluster_resumes(cluster, ckpt, trace, tmp_path, latest)


def _a_new_cluster_resumes(old, ckpt: Path, trace: Path, tmp_path: Path, latest: int) -> None:
    """After the head's loss: the old cluster's nodes ended (its teardown), a new cluster on other ports, a launcher
    attached to it resumes ``ckpt`` at the step after ``latest`` (none lost, none repeated: its steps follow the old
    run's in the trace, no prompt drawn twice), is stopped through the new cluster after a step and exits 0."""
    tool = sys.modules["local_ray_cluster"]
    left = old.stop()
    assert not left, f"processes of the lost cluster left: {left}"
    before = _records(trace)
    # its last recorded step is the checkpoint's (or the one before: the kill fell between the save and the record)
    assert before and latest - 1 <= before[-1]["step"] <= latest
    rollout = dict(num_cpus=16, num_gpus=1, resources={tool.ROLLOUT_RESOURCE: 1})
    nodes = (tool.NodeSpec("head", num_cpus=32), tool.NodeSpec("rollout_a", **rollout),
             tool.NodeSpec("trainer", num_cpus=16, num_gpus=1, resources={tool.TRAINER_RESOURCE: 1}))
    new = tool.LocalRayCluster(port=_free_base_port(int(os.environ.get("VERL_PIPE_MN_PORT", "6390")) + 500),
                               nodes=nodes)
    t0 = time.perf_counter()
    new.start()
    up_s = time.perf_counter() - t0
    log = tmp_path / "resumed.log"
    proc = _launch(new, log, ckpt, trace)
    try:
        run_id = _wait_for(proc, log, r"\[verl_pipe\] run id (\S+):").group(1)
        first = int(_wait_for(proc, log, r"\[verl_pipe\] step (\d+) ").group(1))
        first_s = time.perf_counter() - t0
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        subprocess.run([sys.executable, "-m", "verl_pipe.launch.stop_request", run_id, "--address", new.address],
                       check=True, cwd=ROOT, timeout=120, env=env)
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        left = new.stop()
    text = log.read_text(errors="replace")
    recs = _records(trace)[len(before):]
    print(f"[multinode] a new cluster up in {up_s:.1f}s; its launcher resumed at step {first} ({first_s:.1f}s after "
          f"the cluster's start; the lost run's last checkpoint {latest}), ran steps {[r['step'] for r in recs]}, "
          f"exit {rc}")
    assert rc == 0, text[-4000:]
    assert first == latest + 1, "no step lost or repeated"
    assert recs and [r["step"] for r in recs] == list(range(latest + 1, latest + 1 + len(recs)))
    seen = {i for r in before for i in r["data_index"]}
    epoch = len(before) + len(recs)  # the tiny set's epoch is longer than these runs: no prompt comes back
    assert epoch < 50 and not seen & {i for r in recs for i in r["data_index"]}, "no prompt trained twice"
    assert not left, f"processes left after the new cluster's teardown: {left}"
