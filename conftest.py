"""Cluster fixtures (what pytest-ray would give; it is not in this registry).

One real local multi-node Ray cluster at a time: a test module asks for a
node set by name (module attribute ``CLUSTER``, default ``"standard"``),
tests are ordered so modules sharing a node set run together, and the
cluster is only restarted when the set changes. ``RAY_TMPDIR`` is isolated
per cluster and every Ray process is stopped at the end of the session.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from ray_megatron_env.simulation import MIXED_NODES, SimulatedCluster, SimulatedNode

FAKES = Path(__file__).parent / "tests" / "fakes"
_FAKE_PATH = f"{FAKES}{os.pathsep}{os.environ.get('PATH', '')}"


def _smi_node(name: str, **env: str) -> SimulatedNode:
    # No fake GPU list: the probe goes to nvidia-smi, here tests/fakes/nvidia-smi.
    return SimulatedNode(name, "", {"RAY_MEGATRON_ENV_PROBE": "nvidia-smi",
                                    "PATH": _FAKE_PATH, **env})


NODE_SETS: Dict[str, Tuple[SimulatedNode, ...]] = {
    # The mixed cluster of the issue, plus nodes for precedence, registration
    # and probe-path tests.
    "standard": MIXED_NODES + (
        SimulatedNode("a100_inherit1", "8.0", {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
        SimulatedNode("h100_inherit4", "9.0", {"CUDA_DEVICE_MAX_CONNECTIONS": "4"}),
        SimulatedNode("unplugged", "9.0", plugin=False),
        _smi_node("smi", CUDA_VISIBLE_DEVICES="GPU-22222222"),
        _smi_node("smi_hang", FAKE_NVIDIA_SMI="hang"),
        SimulatedNode("real_nvml", ""),  # the real NVML path on this machine
        SimulatedNode("bad_fake", "9.x"),
    ),
    # Every node registered: what a correctly set up cluster looks like.
    "registered": MIXED_NODES[:4],
}


class ClusterPool:
    """Keeps at most one cluster running; swaps it when the node set changes."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.cluster: Optional[SimulatedCluster] = None

    def get(self, name: str) -> SimulatedCluster:
        if name != self.name:
            self.close()
            self.cluster = SimulatedCluster(NODE_SETS[name]).start()
            self.name = name
        return self.cluster

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()
        self.cluster, self.name = None, None


@pytest.fixture(scope="session")
def cluster_pool():
    pool = ClusterPool()
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def cluster(cluster_pool, request) -> SimulatedCluster:
    """The module's cluster, connected (``ray.init`` done)."""
    return cluster_pool.get(getattr(request.module, "CLUSTER", "standard"))


@pytest.fixture(scope="module")
def no_cluster(cluster_pool) -> None:
    """For tests that start a cluster of their own (the demo): none running."""
    cluster_pool.close()


def pytest_collection_modifyitems(config, items):
    # Pure tests first, then cluster tests grouped by node set, so each set
    # starts once per session.
    def group(item):
        names = getattr(item, "fixturenames", ())
        if "no_cluster" in names:
            return "~own"  # after every shared cluster
        if "cluster" in names:
            return getattr(item.module, "CLUSTER", "standard")
        return ""

    items.sort(key=lambda item: (group(item) != "", group(item)))
    for item in items:
        if group(item):
            item.add_marker(pytest.mark.cluster)
