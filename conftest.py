"""Cluster fixtures (what pytest-ray would give; it is not in this registry).

One real local multi-node Ray cluster at a time: a test module asks for a
node set by name (module attribute ``CLUSTER``, default ``"standard"``),
tests are ordered so modules sharing a node set run together, and the
cluster is only restarted when the set changes. ``RAY_TMPDIR`` is isolated
per cluster and every Ray process is stopped at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

import pytest

import ray_megatron_env
from ray_megatron_env.names import FAKE_NODE_VARIABLE
from ray_megatron_env.simulation import (
    PCIE_NO_P2P_OLD_DRIVER, TRAY_WITHOUT_IMEX, WRONG_ARCH_IMAGE, SimulatedCluster, SimulatedNode,
    ray_processes,
)

# --must-run PATH: .ci/run's way to fail a framework-package test that skips.
pytest_plugins = ["must_run"]

FAKES = Path(__file__).parent / "tests" / "fakes"
# A node where the package is not installed (tests/fakes/not_installed).
NOT_INSTALLED = {"PYTHONPATH": str(FAKES / "not_installed"),
                 "RAY_MEGATRON_ENV_TEST_HIDE": str(Path(ray_megatron_env.__file__).parent)}
_FAKE_PATH = f"{FAKES}{os.pathsep}{os.environ.get('PATH', '')}"


def _smi_node(name: str, probe: str = "nvidia-smi", **env: str) -> SimulatedNode:
    # No fake GPU list: the probe goes to nvidia-smi, here tests/fakes/nvidia-smi.
    return SimulatedNode(name, "", {"RAY_MEGATRON_ENV_PROBE": probe, "PATH": _FAKE_PATH, **env})


def _device_root(workdir: Path, name: str, *entries: str) -> str:
    """A folder laid out like / for the probe's last step: the NVIDIA kernel
    module's device listing and AMD's /dev/kfd, as a node shows them."""
    root = workdir / name
    for entry in entries:
        (root / entry).mkdir(parents=True, exist_ok=True)
    (root / "dev").mkdir(parents=True, exist_ok=True)
    return str(root)


def _shadow_install(workdir: Path, name: str, change: Callable[[Path], None]) -> str:
    """A copy of the package, changed, for a node to import first (PYTHONPATH):
    how a broken or older install on one node looks to Ray's agent there."""
    root = workdir / name
    shutil.copytree(Path(ray_megatron_env.__file__).parent, root / "ray_megatron_env",
                    ignore=shutil.ignore_patterns("__pycache__"))
    change(root / "ray_megatron_env")
    return str(root)


def _older(package: Path) -> None:
    spec = package / "spec.py"
    # An install that reads only the first format version, as 0.1.0 does.
    spec.write_text(spec.read_text().replace("FORMAT_VERSION = 2", "FORMAT_VERSION = 1")
                    .replace("READABLE_VERSIONS = (1, 2)", "READABLE_VERSIONS = (1,)"))


def fault_nodes(workdir: Path) -> Tuple[SimulatedNode, ...]:
    # A module that cannot be imported (a deleted file would be found again
    # through an editable install's import hook).
    broken = _shadow_install(workdir, "broken",
                             lambda p: (p / "packs" / "connections.py").write_text("def broken(:\n"))
    older = _shadow_install(workdir, "older", _older)
    plugins = ('[{"class": "other_plugin.OtherPlugin"}, '
               '{"class": "ray_megatron_env.plugin.MegatronEnvPlugin"}]')
    # Probe fallbacks on real nodes. This machine has no NVML library and no
    # nvidia-smi; these nodes show what such a node gets when the kernel
    # lists NVIDIA devices, and when it has an AMD compute device.
    nvidia_listed = _device_root(workdir, "nvidia_listed", "proc/driver/nvidia/gpus/0000:3b:00.0")
    amd = _device_root(workdir, "amd", "dev/kfd")
    return (
        SimulatedNode("h100", "9.0"),
        SimulatedNode("nvidia_listed", "", {"RAY_MEGATRON_ENV_DEVICE_ROOT": nvidia_listed}),
        SimulatedNode("amd", "", {"RAY_MEGATRON_ENV_DEVICE_ROOT": amd}),
        SimulatedNode("broken_install", "9.0", {"PYTHONPATH": broken}),
        SimulatedNode("old_install", "9.0", {"PYTHONPATH": older}),
        SimulatedNode("two_plugins", "8.0", {"PYTHONPATH": str(FAKES),
                                             "RAY_RUNTIME_ENV_PLUGINS": plugins}),
        _smi_node("smi_missing", CUDA_VISIBLE_DEVICES="5"),
        # Neither installed nor registered: reached only by a job that ships
        # the package in py_modules.
        SimulatedNode("not_installed", "9.0", NOT_INSTALLED, plugin=False),
    )


HGX_FABRIC_NOT_READY = '{"fabric": {"state": "not_started"}}'

# The te-fp8-scales, fla-backend and net-ifaces packs (tests/cluster/
# test_packs_fp8_fla_net.py): Blackwell nodes whose image sets FP32 FP8 scales,
# TileLang and an eth0 for NCCL and Gloo where Ray's (faked) node IP is on
# ens5; Hopper nodes whose image turns TileLang off and names an interface no
# node has, their own interfaces read.
BLACKWELL_IMAGE = {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1", "FLA_TILELANG": "1",
                   "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0",
                   FAKE_NODE_VARIABLE: '{"net": {"node_ip": "10.0.1.7", "ifaces": '
                                       '{"ens5": ["10.0.1.7"], "lo": ["127.0.0.1"]}}}'}
HOPPER_IMAGE = {"NVTE_FP8_BLOCK_SCALING_FP32_SCALES": "1", "FLA_TILELANG": "0",
                "NCCL_SOCKET_IFNAME": "nosuchif0", "GLOO_SOCKET_IFNAME": "nosuchif0"}

NodeSet = Union[Tuple[SimulatedNode, ...], Callable[[Path], Tuple[SimulatedNode, ...]]]

NODE_SETS: Dict[str, NodeSet] = {
    # One node of each kind the cluster tests need (tests/cluster/
    # name them), 12 in all: each simulated node costs start-up and idle CPU
    # on a 2-core machine (docs/design.md#facts-about-the-simulated-cluster-the-tests-use).
    # The V100 and 2xH100 GPU classes, and the per-node value of every
    # config on every class, are the unit matrix in
    # tests/unit/test_agent.py (the agent's own code) and the demo's run
    # (tests/cluster/test_demo.py); here each path and each claim is shown once on
    # a live worker.
    "standard": (
        SimulatedNode("cpu_head", "none"),
        # The A100's and the B200's images pin TORCH_CUDA_ARCH_LIST="9.0 10.0"
        # (torch-arch: replaced on the one, kept on the other).
        SimulatedNode("a100", "8.0", dict(WRONG_ARCH_IMAGE)),
        SimulatedNode("b200", "10.0", dict(WRONG_ARCH_IMAGE)),  # Megatron-LM asks nothing
        SimulatedNode("h100_b200", "9.0,10.0"),  # the mixed node of the issue
        # The node's own value competes with the decision (precedence).
        SimulatedNode("a100_inherit1", "8.0", {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
        # Nodes started without RAY_RUNTIME_ENV_PLUGINS: the worker-side
        # setup hook decides there (UNREGISTERED below).
        SimulatedNode("unplugged", "9.0", plugin=False),
        # ... its image pins TORCH_CUDA_ARCH_LIST="9.0 10.0" too (torch-arch)
        SimulatedNode("a100_inherit1_unplugged", "8.0", {"CUDA_DEVICE_MAX_CONNECTIONS": "1",
                                                          **WRONG_ARCH_IMAGE}, plugin=False),
        # PCIe GPUs without peer access on driver 12.8 (nccl-host-mem), on
        # both paths.
        SimulatedNode("l40s", "8.9,8.9,8.9,8.9", {FAKE_NODE_VARIABLE: PCIE_NO_P2P_OLD_DRIVER}),
        SimulatedNode("l40s_unplugged", "8.9,8.9,8.9,8.9",
                      {FAKE_NODE_VARIABLE: PCIE_NO_P2P_OLD_DRIVER}, plugin=False),
        # NVML in auto mode (it cannot load here), then the fake nvidia-smi.
        _smi_node("smi", probe="auto", CUDA_VISIBLE_DEVICES="GPU-22222222"),
        _smi_node("smi_hang", FAKE_NVIDIA_SMI="hang"),
        SimulatedNode("real_nvml", ""),  # the real NVML path on this machine
    ),
    # Registration and install faults (built in a temp dir when first used).
    "faults": fault_nodes,
    # Each of the three packs on both paths (5 nodes).
    "fp8_fla_net": (
        SimulatedNode("cpu_head", "none"),
        SimulatedNode("b200", "10.0", dict(BLACKWELL_IMAGE)),
        SimulatedNode("b200_unplugged", "10.0", dict(BLACKWELL_IMAGE), plugin=False),
        SimulatedNode("h100", "9.0", dict(HOPPER_IMAGE)),
        SimulatedNode("h100_unplugged", "9.0", dict(HOPPER_IMAGE), plugin=False),
    ),
    # Every node registered: what a correctly set up cluster looks like, and
    # what verl's RayResourcePool places on (GPUs and Ray's accelerator_type
    # resources, logical only), behind a CPU-only head.
    "registered": (
        SimulatedNode("cpu_head", "none", cpus=2),
        # Two trainer ranks on each; a one-rank rollout group beside them on H100.
        # Fabric facts (read only by jobs with the nccl-fabric pack): the H100
        # node is an HGX whose NVSwitch fabric is not registered yet, the B200
        # node a GB200-like tray in a multi-node NVLink domain without an IMEX
        # channel in its container.
        *(SimulatedNode(name, gpus_seen, {FAKE_NODE_VARIABLE: fabric} if fabric else {},
                        cpus=gpus, gpus=gpus, resources={f"accelerator_type:{accelerator}": 1})
          for name, gpus_seen, gpus, accelerator, fabric in (
              ("a100", "8.0", 2, "A100", None),
              ("h100", "9.0,9.0", 3, "H100", HGX_FABRIC_NOT_READY),
              ("b200", "10.0", 2, "B200", TRAY_WITHOUT_IMEX))),
    ),
}


UNREGISTERED = frozenset(n.name for n in NODE_SETS["standard"] if not n.plugin)


class ClusterPool:
    """Keeps at most one cluster running; swaps it when the node set changes."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.cluster: Optional[SimulatedCluster] = None
        self.workdir = Path(tempfile.mkdtemp(prefix="rme-nodes-"))

    def get(self, name: str) -> SimulatedCluster:
        if name != self.name:
            self.close()
            nodes = NODE_SETS[name]
            self.cluster = SimulatedCluster(nodes(self.workdir) if callable(nodes) else nodes)
            self.cluster.start()
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
    shutil.rmtree(pool.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(cluster_pool, request) -> SimulatedCluster:
    """The module's cluster, connected (``ray.init`` done)."""
    return cluster_pool.get(getattr(request.module, "CLUSTER", "standard"))


@pytest.fixture(scope="module")
def no_cluster(cluster_pool) -> None:
    """For tests that start a cluster of their own (the demo): none running."""
    cluster_pool.close()


# Every process this test session starts, and every process those start
# (Ray's raylets hand their environment to agents and workers), carries this
# variable with the session's own token: how the leak check tells our Ray
# processes from another Ray job's on the same machine.
SESSION_VARIABLE = "RAY_MEGATRON_ENV_TEST_SESSION"


def our_ray_processes(token: str) -> Dict[int, str]:
    """Live Ray processes this session started (their environment carries
    ``token``), each with its command line and the simulated node it
    belonged to, for the report."""
    found = {}
    for pid, command in ray_processes(f"{SESSION_VARIABLE}={token}").items():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                node = [e.decode(errors="replace") for e in f.read().split(b"\0")
                        if e.startswith((b"RAY_MEGATRON_ENV_FAKE_GPUS=", b"PYTHONPATH="))]
        except OSError:
            node = []
        found[pid] = f"{command[:300]} {node}"
    return found


def pytest_sessionstart(session):
    session.config._rme_token = f"{os.getpid()}-{time.time_ns()}"
    os.environ[SESSION_VARIABLE] = session.config._rme_token
    # Ray's agent tries a failing runtime env setup 3 times, 1 s apart, before
    # the worker's caller gets RuntimeEnvSetupError; the tests that expect that
    # error see the same retries 0.1 s apart (the agent reads this variable).
    os.environ.setdefault("RUNTIME_ENV_RETRY_INTERVAL_MS", "100")


def pytest_sessionfinish(session, exitstatus):
    # Every test cleans up the Ray processes it starts; fail the run if not.
    token = getattr(session.config, "_rme_token", None)
    if token is None:
        return
    deadline = time.monotonic() + 15
    left = our_ray_processes(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = our_ray_processes(token)
    if left:
        print("\nRay processes left behind by the tests:")
        for pid, command in left.items():
            print(f"  {pid}: {command}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
        # tests/cluster/ holds every module that starts Ray, fixture or not.
        if group(item) or item.nodeid.startswith("tests/cluster/"):
            item.add_marker(pytest.mark.cluster)
