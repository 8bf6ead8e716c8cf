"""simulation.py without starting a cluster: what each simulated node's
environment is (the fake GPUs, the plugin registered or not), the demo's
mixed nodes and the node facts they stand for, the agents' ports, and
finding the processes a cluster left. Simulated clusters running:
tests/cluster/, from the shared pool (conftest.py, cluster_pool)."""

import json
import os
import subprocess
import sys
import time

import pytest

from ray_megatron_env.node import parse_gpu_list
from ray_megatron_env.probe.fake import parse_fake_node
from ray_megatron_env.simulation import (
    AGENT_PORTS, MIXED_NODES, PCIE_NO_P2P_OLD_DRIVER, TRAY_WITHOUT_IMEX, SimulatedCluster,
    SimulatedNode, ray_processes,
)

PLUGINS = [{"class": "ray_megatron_env.plugin.MegatronEnvPlugin"}]


def test_a_node_with_the_plugin_registers_it_and_fakes_its_gpus():
    env = SimulatedNode("h100", "9.0,9.0").environment()
    assert env["RAY_MEGATRON_ENV_FAKE_GPUS"] == "9.0,9.0"
    assert json.loads(env["RAY_RUNTIME_ENV_PLUGINS"]) == PLUGINS


def test_a_node_without_it_has_an_empty_plugin_list_and_its_own_settings_win():
    # An empty RAY_RUNTIME_ENV_PLUGINS is how Ray reads "no plugins".
    assert SimulatedNode("a", "8.0", plugin=False).environment()["RAY_RUNTIME_ENV_PLUGINS"] == ""
    own = SimulatedNode("b", "8.0", env={"RAY_RUNTIME_ENV_PLUGINS": "[]", "X": "1"}).environment()
    assert (own["RAY_RUNTIME_ENV_PLUGINS"], own["X"]) == ("[]", "1")


def test_work_is_pinned_to_a_node_by_its_own_resource():
    node = SimulatedNode("h100_b200", "9.0,10.0")
    assert node.resource == "rme_h100_b200"
    assert SimulatedCluster([node]).pin("h100_b200") == {"num_cpus": 0,
                                                         "resources": {"rme_h100_b200": 1}}


def test_the_mixed_nodes_are_the_demos_and_each_one_reads():
    assert [n.name for n in MIXED_NODES] == ["cpu_head", "v100", "a100", "h100", "b200",
                                             "h100_b200", "l40s"]
    assert MIXED_NODES[0].fake_gpus == "none"  # the head: no GPU
    for node in MIXED_NODES:
        assert node.name.replace("_", "").isalnum()  # a Ray resource name
        parse_gpu_list(node.fake_gpus)
    assert dict(MIXED_NODES[2].env) == {"TORCH_CUDA_ARCH_LIST": "9.0 10.0"}  # a100


def test_the_fake_nodes_are_the_failures_their_packs_prevent():
    # nccl-host-mem's row: some pair without peer access, a driver before CUDA 13.0.
    l40s = parse_fake_node(PCIE_NO_P2P_OLD_DRIVER, default_gpus="8.9,8.9,8.9,8.9").p2p
    assert (len(l40s.without), l40s.cuda_driver) == (6, (12, 8))
    # nccl-fabric's row: every GPU attached to an NVLink domain, no IMEX channel.
    tray = parse_fake_node(TRAY_WITHOUT_IMEX, default_gpus="10.0,10.0").fabric
    assert tray.attached and tray.imex_channel == "absent"


def test_each_new_node_gets_agent_ports_no_other_node_has(monkeypatch):
    from ray._private.node import Node

    cluster = SimulatedCluster()
    monkeypatch.delattr(Node, "_get_cached_port", raising=False)
    assert cluster._agent_ports() == {}  # the raylet binds its own (port 0)
    monkeypatch.setattr(Node, "_get_cached_port", lambda *a, **k: 0, raising=False)
    first, second = cluster._agent_ports(), cluster._agent_ports()
    assert set(first) == set(second) == set(AGENT_PORTS)
    assert len(set(first.values()) | set(second.values())) == 2 * len(AGENT_PORTS)


@pytest.fixture
def sleeper():
    """Start a sleeping Python process with ARG on its command line and ``env``
    added; each is killed afterwards."""
    started = []

    def start(arg, env):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", arg],
                                env={**os.environ, **env})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_the_ray_processes_of_one_cluster_are_found_by_its_environment(sleeper):
    marker = f"RAY_TMPDIR=/tmp/rme-test-{os.getpid()}"
    ours = sleeper("raylet", {"RAY_TMPDIR": marker.split("=", 1)[1]})
    not_ray = sleeper("just-a-script", {"RAY_TMPDIR": marker.split("=", 1)[1]})
    another = sleeper("raylet", {"RAY_TMPDIR": "/tmp/rme-someone-else"})
    deadline = time.monotonic() + 10
    while ours.pid not in ray_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the child has exec'd
    found = ray_processes(marker)
    assert ours.pid in found and "raylet" in found[ours.pid]
    assert not_ray.pid not in found and another.pid not in found


def test_shutting_down_a_cluster_never_started_leaves_the_callers_ray_tmpdir(monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", "/tmp/the-callers")
    SimulatedCluster([SimulatedNode("a100", "8.0")]).shutdown()
    assert os.environ["RAY_TMPDIR"] == "/tmp/the-callers"
