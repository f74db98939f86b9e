"""A multi-node Ray cluster on this one machine: a head and worker nodes, each a real Ray node (its own raylet, object
store, temp dir and ports), each ``ray start --block`` in its own session (process group), each with its own CPU
share and a custom resource naming its role. What a user's cluster looks like to the launcher, so the launcher can
attach with ``ray.init(address=...)`` and a node can be lost for real (its raylet, object store and every worker and
vLLM process on it at once): ``kill_node`` SIGKILLs the node's whole session.

    python tools/local_ray_cluster.py up [--port 6390] [--root /tmp/mn_cluster]   # until Ctrl-C / SIGTERM
    RAY_ADDRESS=127.0.0.1:6390 python -m verl_pipe.main_grpo \\
        ray_kwargs.ray_init.address=127.0.0.1:6390      # pools on the role nodes (verl_pipe/platform/node_roles.py)

The default layout (``DEFAULT_NODES``): a head with CPUs for the driver-side actors (task runner, reward and
agent-loop workers) and no GPU; a ``rollout`` node with one logical GPU and the ``verl_pipe_rollout`` resource; a
``trainer`` node with one logical GPU and ``verl_pipe_trainer``. Every port a node opens is its own (base port +
offsets), so clusters of other users on the machine are not touched; ``stop`` ends each node's session (SIGTERM,
then SIGKILL) and removes the temp dirs: nothing is left behind. Used by ``tests/e2e/test_multinode.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from verl_pipe.platform.node_roles import ROLLOUT_RESOURCE, TRAINER_RESOURCE


@dataclass
class NodeSpec:
    name: str
    num_cpus: int
    num_gpus: int = 0
    resources: dict = field(default_factory=dict)


# Logical CPUs, not cores: every node runs on the machine's cores (the pools are pinned to theirs by the CPU
# platform). verl's trainer pool asks 3 CPUs per bundle, a rollout replica 2, plus 1 for its vLLM server and 1 for
# its checkpoint-engine worker; with 4 per role node one run waited for good in its first weight sync (presumably an
# actor pending for a CPU there), so the role nodes get 16. The head's 32 take the actors verl_pipe.platform.node_roles keeps
# off the role nodes (agent-loop and reward workers) and what Ray places anywhere.
DEFAULT_NODES = (
    NodeSpec("head", num_cpus=32),
    NodeSpec("rollout", num_cpus=16, num_gpus=1, resources={ROLLOUT_RESOURCE: 1}),
    NodeSpec("trainer", num_cpus=16, num_gpus=1, resources={TRAINER_RESOURCE: 1}),
)


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def session_pids(sid: int) -> list[int]:
    """Every live process of session ``sid`` (a node: ``ray start`` and all it started, however deep)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == sid:
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        pids.append(int(entry))
        except (OSError, IndexError):
            continue
    return pids


class LocalRayCluster:
    def __init__(self, port: int = 6390, root: str | os.PathLike | None = None, nodes=DEFAULT_NODES,
                 env: dict | None = None, object_store_mb: int = 400):
        self.port = port
        self.root = Path(root or tempfile.mkdtemp(prefix="mn_", dir="/tmp"))
        self.nodes = {n.name: n for n in nodes}
        self.env = dict(env or {})
        self.object_store_mb = object_store_mb
        self.procs: dict[str, subprocess.Popen] = {}
        self.node_ids: dict[str, str] = {}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ports(self, i: int) -> list[str]:
        b = self.port + 10 + 10 * i
        worker_lo = 30000 + (self.port % 1000) * 20 + 300 * i
        return ["--node-manager-port", str(b), "--object-manager-port", str(b + 1),
                "--dashboard-agent-listen-port", str(b + 2), "--dashboard-agent-grpc-port", str(b + 3),
                "--metrics-export-port", str(b + 4), "--runtime-env-agent-port", str(b + 5),
                "--min-worker-port", str(worker_lo), "--max-worker-port", str(worker_lo + 299)]

    def _command(self, i: int, spec: NodeSpec) -> list[str]:
        cmd = [_ray_bin(), "start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
               f"--num-cpus={spec.num_cpus}", f"--num-gpus={spec.num_gpus}",
               f"--resources={json.dumps({f'mn_node_{spec.name}': 1, **spec.resources})}",
               f"--object-store-memory={self.object_store_mb * 1024 * 1024}", *self._ports(i)]
        if i == 0:
            cmd += ["--head", f"--port={self.port}", "--ray-client-server-port", str(self.port + 1),
                    "--include-dashboard=false", f"--temp-dir={self.root / 'head'}"]
        else:
            cmd += [f"--address={self.address}", f"--temp-dir={self.root / spec.name}"]
        return cmd

    def start_node(self, name: str, timeout_s: float = 90.0) -> str:
        """Starts node ``name`` in its own session; returns its Ray node id once the GCS lists it alive."""
        self.spawn_node(name)
        return self.wait_alive([name], timeout_s)[name]

    def spawn_node(self, name: str) -> None:
        i = list(self.nodes).index(name)
        spec = self.nodes[name]
        log = open(self.root / f"{name}.log", "ab")
        env = {**os.environ, "RAY_enable_metrics_collection": "0", "RAY_task_events_max_num_task_in_gcs": "10000",
               **self.env}
        env.pop("RAY_ADDRESS", None)
        self.procs[name] = subprocess.Popen(self._command(i, spec), stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True, cwd=self.root)

    def wait_alive(self, names, timeout_s: float = 90.0) -> dict[str, str]:
        """Waits until the GCS lists nodes ``names`` alive; returns their Ray node ids."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in names:
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"ray node {name} exited with {self.procs[name].returncode}: "
                                       f"{(self.root / f'{name}.log').read_text()[-3000:]}")
            alive = self.alive_nodes(timeout_s=5)
            if all(n in alive for n in names):
                self.node_ids.update({n: alive[n] for n in names})
                return {n: alive[n] for n in names}
            time.sleep(0.5)
        raise TimeoutError(f"ray nodes {names} not alive within {timeout_s:.0f}s (logs in {self.root})")

    def start(self, names=None) -> "LocalRayCluster":
        """The head, then the other nodes together: all of them, or those of ``names`` (the others are spares, for
        ``start_node`` later: a node that joins a running cluster)."""
        self.root.mkdir(parents=True, exist_ok=True)
        head = list(self.nodes)[0]
        names = [n for n in (names or self.nodes) if n != head]
        try:
            self.start_node(head)
            for name in names:
                self.spawn_node(name)
            self.wait_alive(names)
        except BaseException:
            self.stop()
            raise
        return self

    def alive_nodes(self, timeout_s: float = 5.0) -> dict[str, str]:
        """{node name: Ray node id} of the nodes the GCS lists alive (by their ``mn_node_<name>`` resource)."""
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
        from ray._raylet import GcsClient

        # Ray >= 2.52 enables token auth when ~/.ray/auth_token exists (what `ray start` did for the nodes): this
        # process must then send the token too, as ray.init does.
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        try:
            infos = GcsClient(address=self.address).get_all_node_info(timeout=timeout_s)
        except Exception:
            return {}
        alive = {}
        for node_id, info in infos.items():
            if info.state != 0:  # GcsNodeInfo.ALIVE
                continue
            for res in info.resources_total:
                if res.startswith("mn_node_"):
                    alive[res[len("mn_node_"):]] = node_id.hex() if hasattr(node_id, "hex") else str(node_id)
        return alive

    def pids(self, name: str) -> list[int]:
        proc = self.procs.get(name)
        return session_pids(proc.pid) if proc else []

    def kill_node(self, name: str, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> float:
        """Sends ``sig`` to every process of node ``name`` at once (its whole session); returns when none is left
        (seconds taken). SIGKILL: the node is lost, as a machine that goes away."""
        proc = self.procs[name]
        t0 = time.monotonic()
        for pid in self.pids(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        while self.pids(name) and time.monotonic() - t0 < timeout_s:
            time.sleep(0.1)
        try:
            proc.wait(timeout=max(0.1, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            pass
        left = self.pids(name)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        if left:
            time.sleep(0.5)
        return time.monotonic() - t0

    def stop(self, grace_s: float = 15.0) -> list[int]:
        """Ends every node (workers first, the head last): SIGTERM to each session, SIGKILL after ``grace_s``.
        Returns the pids still alive afterwards (none expected); removes the temp dir."""
        for name in reversed(list(self.procs)):
            if self.procs[name].poll() is None or self.pids(name):
                self.kill_node(name, signal.SIGTERM, timeout_s=grace_s)
        left = [p for name in self.procs for p in self.pids(name)]
        shutil.rmtree(self.root, ignore_errors=True)
        return left

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up"])
    ap.add_argument("--port", type=int, default=6390)
    ap.add_argument("--root", default=None, help="temp dir of the nodes (default: a new /tmp/mn_*)")
    args = ap.parse_args()
    cluster = LocalRayCluster(args.port, args.root)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    try:
        cluster.start()
        print(f"ray cluster up at {cluster.address}: {cluster.node_ids} (temp dir {cluster.root}); Ctrl-C ends it",
              flush=True)
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        left = cluster.stop()
        print(f"ray cluster stopped; {len(left)} process(es) left", flush=True)


if __name__ == "__main__":
    main()
