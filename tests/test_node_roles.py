"""Pure logic of running on a Ray cluster: which pool asks for which node-role resource, when the launcher attaches to
a running cluster, and the local test cluster's commands (ports of their own per node). The real cluster is
exercised by tests/e2e/test_multinode.py."""

import importlib.util
import re
import sys
from pathlib import Path

from verl_pipe.launch.ray_start import attaches
from verl_pipe.platform.node_roles import ROLLOUT_RESOURCE, TRAINER_RESOURCE, pool_resource

ROOT = Path(__file__).resolve().parents[1]
BOTH = {"CPU", "GPU", ROLLOUT_RESOURCE, TRAINER_RESOURCE}


def test_each_pool_asks_for_its_role_resource_when_the_cluster_has_it():
    assert pool_resource("trainer_pool", BOTH) == TRAINER_RESOURCE
    assert pool_resource("rollout_pool_0", BOTH) == ROLLOUT_RESOURCE
    assert pool_resource("rollout_pool_3", BOTH) == ROLLOUT_RESOURCE
    # reward-model and teacher replicas are not the rollout pool
    assert pool_resource("rollout_pool_reward_0", BOTH) is None
    assert pool_resource("rollout_pool_teacher_0", BOTH) is None
    # a cluster without the resource: placed as verl places it
    assert pool_resource("trainer_pool", {"CPU", "GPU", ROLLOUT_RESOURCE}) is None
    assert pool_resource("rollout_pool_0", {"CPU", "GPU", TRAINER_RESOURCE}) is None


def test_attaches_to_a_running_cluster_only_with_an_address():
    assert attaches({"address": "auto"}, environ={})
    assert attaches({"address": "10.0.0.1:6379"}, environ={})
    assert attaches({}, environ={"RAY_ADDRESS": "10.0.0.1:6379"})
    assert not attaches({}, environ={})
    assert not attaches({"address": "local"}, environ={})
    assert not attaches({"num_cpus": 32}, environ={})


def _tool():
    spec = importlib.util.spec_from_file_location("local_ray_cluster", ROOT / "tools" / "local_ray_cluster.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_local_cluster_nodes_have_their_own_ports_temp_dirs_and_roles(tmp_path):
    tool = _tool()
    cluster = tool.LocalRayCluster(port=6490, root=tmp_path)
    cmds = [cluster._command(i, spec) for i, spec in enumerate(cluster.nodes.values())]
    ports = []
    for cmd in cmds:
        text = " ".join(cmd)
        ports += [int(p) for p in re.findall(r"--(?:node-manager|object-manager|dashboard-agent-listen|"
                                             r"dashboard-agent-grpc|metrics-export|runtime-env-agent)-port (\d+)", text)]
        assert "--block" in cmd and f"--temp-dir={tmp_path}" in text
    assert len(ports) == len(set(ports)) == 6 * len(cmds)
    assert "--head" in cmds[0] and "--port=6490" in cmds[0]
    assert all(f"--address=127.0.0.1:6490" in c for c in cmds[1:])
    assert ROLLOUT_RESOURCE in " ".join(cmds[1]) and TRAINER_RESOURCE in " ".join(cmds[2])
    worker_ranges = [(int(c[c.index("--min-worker-port") + 1]), int(c[c.index("--max-worker-port") + 1]))
                     for c in cmds]
    for (lo1, hi1), (lo2, hi2) in zip(worker_ranges, worker_ranges[1:]):
        assert hi1 < lo2
