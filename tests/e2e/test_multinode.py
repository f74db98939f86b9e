"""Beyond one machine: a real multi-node Ray cluster (tools/local_ray_cluster.py: a head, two rollout nodes and a
trainer node, each its own raylet, object store and process group), the stack attached to it with
``ray.init(address=...)`` as a user's cluster run does, each rollout replica on a rollout node and the trainer pool on
the trainer node (verl_pipe/node_roles.py), the weights synced across nodes (``ray_store``: between the object stores
of two nodes), and rollout nodes lost mid-rollout (a node's whole process group SIGKILLed: raylet, object store, vLLM
server and engine at once): the first one with the other rollout node left (the run goes on), then the last one (the
step rolls back and checkpoints). Then the launcher, attached to the same cluster, is stopped by SIGTERM: its actors
end on every node, the cluster stays up. Real Ray, real vLLM, real verl workers.

Bounded: one cluster and one live stack for the module, plus one launcher run (times: docs/reliability.md). About 3.5 min.
"""

from __future__ import annotations

import importlib.util
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

# Part of `make test` (3 min 31-36 s in its two full runs here); VERL_PIPE_MULTINODE=0 skips it.
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.environ.get("VERL_PIPE_MULTINODE") == "0", reason="VERL_PIPE_MULTINODE=0")]

ROOT = Path(__file__).resolve().parents[2]
N, GROUPS = 4, 8
SHORT, LONG = 4, 128  # unit 0's groups short, the others long: still in flight when the node is lost

MN_OVERRIDES = E2E_OVERRIDES + [
    f"data.max_response_length={LONG}",
    "actor_rollout_ref.rollout.max_model_len=256",
    "trainer.save_freq=-1",
]


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
    """A head, two rollout nodes (one replica each) and a trainer node."""
    tool = _load_cluster_tool()
    nodes = (tool.NodeSpec("head", num_cpus=32),
             tool.NodeSpec("rollout_a", num_cpus=16, num_gpus=1, resources={tool.ROLLOUT_RESOURCE: 1}),
             tool.NodeSpec("rollout_b", num_cpus=16, num_gpus=1, resources={tool.ROLLOUT_RESOURCE: 1}),
             tool.NodeSpec("trainer", num_cpus=16, num_gpus=1, resources={tool.TRAINER_RESOURCE: 1}))
    c = tool.LocalRayCluster(port=_free_base_port(int(os.environ.get("VERL_PIPE_MN_PORT", "6390"))), nodes=nodes)
    t0 = time.perf_counter()
    c.start()
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


def test_pools_on_their_nodes_steps_across_nodes_and_rollout_nodes_lost(cluster, tmp_path_factory):
    from verl_pipe.session import PipeSession, compose
    from verl_pipe.trainer import StepFailedError

    ckpt = tmp_path_factory.mktemp("mn_ckpt")
    t0 = time.perf_counter()
    session = PipeSession(compose(MN_OVERRIDES + [
        "actor_rollout_ref.rollout.n_gpus_per_node=2",  # two replicas of TP 1: one per rollout node
        f"+ray_kwargs.ray_init.address={cluster.address}", f"trainer.default_local_dir={ckpt}"]))
    startup_s = time.perf_counter() - t0
    closed = False
    try:
        trainer = session.trainer
        nodes = cluster.node_ids
        name_of = {v: k for k, v in nodes.items()}
        # the driver (this process) attached to the head; the pools sit on their role nodes, a replica per node
        assert ray.get_runtime_context().get_node_id() == nodes["head"]
        assert {_node_of(w) for w in trainer.actor_wg.workers} == {nodes["trainer"]}
        replica_nodes = [_node_of(h) for h in trainer.llm_server_manager.server_handles]
        assert sorted(name_of[n] for n in replica_nodes) == ["rollout_a", "rollout_b"]

        times = {}
        # sync, then CGP + FGD: every step trains each group once at its version, the weights crossing nodes
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
        print(f"[multinode] stack up in {startup_s:.1f}s; steps {times} s")

        # 1. replica 0's node lost mid-rollout: its requests go to the replica on the other rollout node, every group
        # trains once at θ_k, the next step runs on the survivor with θ_{k+1}. Restarts off: a new replica would need
        # a rollout node with a free GPU (none here; with restarts on it would wait fault.replica_restart_timeout_s).
        with open_dict(trainer.config.rolloutpipe.fault):
            trainer.config.rolloutpipe.fault.replica_restart = False
        trainer.rollout.supervisor.restart_enabled = False
        version = trainer.global_steps - 1
        kill = KillNodeAtFirstUnit(trainer, cluster, {i: name_of[n] for i, n in enumerate(replica_nodes)})
        t = time.perf_counter()
        # plain CGP, as tests/e2e/test_faults.py: unit 0's short groups are in while the long ones decode
        rec = session.step(mode="cgp", fgd=False, sampling_overrides=_lengths, backend_cls=kill.backend_cls)
        step_s = time.perf_counter() - t
        m = rec["metrics"]
        lost, kept = kill.replica, 1 - kill.replica
        lost, survivor = name_of[replica_nodes[lost]], name_of[replica_nodes[kept]]
        print(f"[multinode] {lost} lost with {kill.inflight_at_kill} requests in flight: "
              f"{m['rolloutpipe/requeued_requests']} requeued to {survivor}; the step took {step_s:.1f}s "
              f"(normal cgp steps: {times['cgp+fgd']} s)")
        assert kill.inflight_at_kill, "the long groups must still be in flight when the node goes"
        assert m["rolloutpipe/replica_failures"] == 1 and m["rolloutpipe/replica_restarts"] == 0
        assert m["rolloutpipe/requeued_requests"] > 0
        assert_every_group_once_at(rec, trainer.last_outcome.batch, GROUPS, N, version)
        assert m.get("rolloutpipe/replica_deaths_found/weight_sync", 0) == 0, "found by its requests, not a probe"
        assert trainer.rollout.live_replicas() == [kept]
        rec = session.step(mode="cgp", fgd=True, sampling_overrides=_lengths)
        assert rec["metrics"]["rolloutpipe/replica_failures"] == 0
        assert rec["nodes"] == {"trainer": [nodes["trainer"]], "rollout": [replica_nodes[kept]]}
        assert_every_group_once_at(rec, trainer.last_outcome.batch, GROUPS, N, version + 1)
        assert _rollout_gap(trainer.last_outcome.batch) < 1e-3, "the survivor got θ_{k+1} across nodes"

        # 2. the last rollout node lost mid-rollout: the step fails, rolls back to θ_k and checkpoints
        step = trainer.global_steps
        theta_k = session.actor_state()
        kill = KillNodeAtFirstUnit(trainer, cluster, {kept: survivor})
        with pytest.raises(StepFailedError, match="no replica is left") as err:
            session.step(mode="cgp", fgd=False, sampling_overrides=_lengths, backend_cls=kill.backend_cls)
        stop_s = time.perf_counter() - kill.killed_at
        print(f"[multinode] {survivor} (the last rollout node) lost with {kill.inflight_at_kill} requests in flight; "
              f"the step failed {stop_s:.1f}s later: {err.value}")
        assert kill.inflight_at_kill, "the long groups must still be in flight when the node goes"
        assert "resume_mode=auto" in str(err.value)
        after = session.actor_state()
        assert all(torch.equal(theta_k[k], after[k]) for k in theta_k), "rolled back to θ_k"
        assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == str(step - 1)
        assert (ckpt / f"global_step_{step - 1}" / "data.pt").exists()
        assert trainer.global_steps == step, "the failed step does not count"
        t = time.perf_counter()
        session.close()
        closed = True
        print(f"[multinode] session closed in {time.perf_counter() - t:.1f}s")
    finally:
        if not closed:
            session.close()
    # the driver left; the cluster it did not start is still up (the surviving nodes); Ray's GCS marks a lost node
    # dead once its health checks fail
    dead_s = _wait_marked_dead(cluster, survivor, kill.killed_at)
    print(f"[multinode] the GCS marked {survivor} dead {dead_s:.1f}s after the kill")
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


def test_launcher_attached_to_a_cluster_sigterm_stops_the_run_not_the_cluster(cluster, tmp_path):
    """main_grpo attached to a cluster it did not start: SIGTERM after its first step stops the run (exit 143), the
    run's actors and engines end on every node, and every node of the cluster stays up."""
    lost = [n for n in cluster.nodes if n not in cluster.alive_nodes()]
    for name in lost:  # lost in the test above: new rollout nodes join
        cluster.spawn_node(name)
    cluster.wait_alive(lost)
    overrides = [o for o in MN_OVERRIDES if not o.startswith("trainer.total_training_steps")] + [
        "trainer.total_training_steps=50", f"+ray_kwargs.ray_init.address={cluster.address}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}", "--config-name", "tiny_cpu_cgp_fgd"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = tmp_path / "launcher.log"
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "verl_pipe.main_grpo", *overrides], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while "[verl_pipe] step 1 " not in log.read_text(errors="replace"):
                assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
                assert time.monotonic() < deadline, "no first step within 300s"
                time.sleep(0.5)
            first_step_s = time.perf_counter() - t0
            t = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=120)
            stop_s = time.perf_counter() - t
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    print(f"\n[multinode] launcher: first step after {first_step_s:.1f}s; SIGTERM -> exit {rc} in {stop_s:.1f}s")
    assert "attaching to the running Ray cluster" in text
    assert "pools placed by node role" in text
    assert rc == 128 + signal.SIGTERM, text[-4000:]
    # the cluster is still up, every node of it, and nothing of the run is left on any node
    assert set(cluster.alive_nodes()) == set(cluster.nodes)
    _no_run_processes_left(cluster, list(cluster.nodes))
