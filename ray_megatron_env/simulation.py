"""A local simulated mixed-GPU Ray cluster, for the demo and the tests.

Each simulated node is a real raylet and runtime-env agent on this machine
(``ray.cluster_utils.Cluster``) with its own environment: a fake GPU set in
``RAY_MEGATRON_ENV_FAKE_GPUS``, the plugin registered or not, and anything
else a real node's ``ray start`` environment would have. Each node carries a
custom resource named after it so work can be pinned there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Set, Tuple

from .names import (
    FAKE_GPUS_VARIABLE as FAKE_VARIABLE, FAKE_NODE_VARIABLE, PLUGIN_CLASS_PATH as CLASS_PATH,
    PLUGINS_VARIABLE,
)
# Every simulated node's raylet shares this machine's few cores. Under load
# (a burst of worker starts) a raylet can answer the GCS health check later
# than Ray's default allows (5 misses of a 3 s period), and the GCS then
# declares a live node dead: its work is lost, and the driver prints Ray's
# "node ... has been marked dead because the detector has missed too many
# heartbeats" warning. A simulated node only dies when it is shut down, so
# the GCS waits two minutes of missed checks instead.
HEALTH_CHECK = {"health_check_period_ms": 3000, "health_check_failure_threshold": 40}
REGISTRATION = json.dumps([{"class": CLASS_PATH}])
# A raylet starts as many workers at once as its node has CPUs. Simulated
# nodes share this machine's cores, so a burst of worker starts over several
# nodes over-subscribes them, and each start then costs more CPU (measured on
# 2 cores: about 0.9 CPU-s per worker with 9 starting at once, 0.6 with 2).
# One start at a time per simulated node instead.
#
# Nothing reads a simulated node's metrics, and exporting them costs every
# worker start CPU (44 worker starts on the tests' 12-node set: 122 CPU-s
# with, 107 without): metrics off, and each dashboard agent's node report
# once a minute instead of every 5 s.
NODE_RAY_SETTINGS = {"RAY_worker_maximum_startup_concurrency": "1",
                     "RAY_enable_metrics_collection": "0",
                     "REPORTER_UPDATE_INTERVAL_MS": "60000"}
# The ports a node's agents listen on. Some Ray versions pick them in Python
# (Node._get_cached_port: 2.41 does; 2.60's raylet binds port 0 itself),
# each a random free port that excludes only the same node's others: two simulated nodes on one host can pick the same port
# before either agent binds it. The second agent then fails to bind and its
# raylet talks to the first node's runtime-env agent, so a node started
# without the plugin is served by a registered one (seen on Ray 2.41 in CI).
# Real nodes are separate hosts; here every node gets ports of its own.
STRAGGLER_GRACE_S = 5.0  # how long a process may take to leave after shutdown
# What a Ray process's command line holds: raylet, GCS, agents, workers.
RAY_PROCESS_NAMES = ("raylet", "gcs_server", "ray::", "dashboard", "runtime_env", "log_monitor",
                     "default_worker", "monitor.py")
AGENT_PORTS = ("dashboard_agent_listen_port", "metrics_agent_port", "metrics_export_port",
               "runtime_env_agent_port")


@dataclass(frozen=True)
class SimulatedNode:
    name: str  # letters, digits and '_' only: it becomes a resource name
    fake_gpus: str  # RAY_MEGATRON_ENV_FAKE_GPUS, e.g. "9.0,10.0" or "none"
    env: Dict[str, str] = field(default_factory=dict)
    plugin: bool = True  # whether this node's environment registers the plugin
    # Logical Ray resources (no real device behind them), for frameworks that
    # place work by GPU count or accelerator type.
    cpus: int = 1
    gpus: int = 0
    resources: Dict[str, float] = field(default_factory=dict)

    @property
    def resource(self) -> str:
        return f"rme_{self.name}"

    def environment(self) -> Dict[str, str]:
        # An empty plugin list is how Ray reads "no plugins": the node then
        # ignores the field, exactly like a real node started without it.
        env = {FAKE_VARIABLE: self.fake_gpus,
               PLUGINS_VARIABLE: REGISTRATION if self.plugin else ""}
        env.update(self.env)  # the node's own settings win (several plugins, say)
        return env


# Four PCIe GPUs without peer access on a CUDA driver before 13.0 (as 4xL4 or
# L40S nodes report it): where NCCL's cuMem host memory fails (nccl-host-mem).
PCIE_NO_P2P_OLD_DRIVER = '{"p2p": "none", "cuda_driver": "12.8"}'
# An image built for Hopper and Blackwell (NeMo-RL's pins "9.0 10.0"): on an
# A100 node it lists no arch of the node's GPU (torch-arch).
WRONG_ARCH_IMAGE = {"TORCH_CUDA_ARCH_LIST": "9.0 10.0"}
# A GB200-like tray in a multi-node NVLink domain (fabric registered, a
# cluster UUID) whose container has no IMEX channel (nccl-fabric).
TRAY_WITHOUT_IMEX = ('{"fabric": {"state": "completed", "status": "success", "cluster_uuid": '
                     '"3f4e0c1a-9b2d-4c1e-8f00-5a6b7c8d9e01", "clique_id": 32766, '
                     '"health": "ok"}, "imex_channel": "absent"}')

MIXED_NODES: Tuple[SimulatedNode, ...] = (
    SimulatedNode("cpu_head", "none"),
    SimulatedNode("v100", "7.0"),
    SimulatedNode("a100", "8.0", dict(WRONG_ARCH_IMAGE)),
    SimulatedNode("h100", "9.0,9.0"),
    SimulatedNode("b200", "10.0"),
    SimulatedNode("h100_b200", "9.0,10.0"),
    SimulatedNode("l40s", "8.9,8.9,8.9,8.9", {FAKE_NODE_VARIABLE: PCIE_NO_P2P_OLD_DRIVER}),
)


class SimulatedCluster:
    """Start with ``with SimulatedCluster(nodes) as cluster:``; the first node
    is the head. Everything it starts, including its temp dir, is removed on
    exit."""

    def __init__(self, nodes: Iterable[SimulatedNode] = MIXED_NODES,
                 object_store_mb: int = 80) -> None:
        self.nodes = tuple(nodes)
        self._object_store = object_store_mb * 1024 * 1024
        self._cluster = None
        self._tmpdir: Optional[str] = None
        self._saved_tmpdir: Optional[str] = None
        self.node_ids: Dict[str, str] = {}  # node name -> Ray node id (hex)
        self._ports_given: Set[int] = set()
        self.straggler_grace_s = STRAGGLER_GRACE_S

    @property
    def address(self) -> str:
        return self._cluster.address

    def start(self, connect: bool = True) -> "SimulatedCluster":
        from ray.cluster_utils import Cluster

        # Short path: Ray's unix sockets live under it (108-byte limit).
        self._tmpdir = tempfile.mkdtemp(prefix="rme-", dir="/tmp")
        os.makedirs(os.path.join(self._tmpdir, "ray"))
        self._saved_tmpdir = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = self._tmpdir
        self._cluster = Cluster(shutdown_at_exit=True)
        try:
            head, *others = self.nodes
            # No fixed dashboard port: another Ray on this machine may hold 8265.
            self.add(head, include_dashboard=False, dashboard_port=None,
                     _system_config=HEALTH_CHECK)
            for node in others:
                self.add(node)
            if connect:
                self.connect()
        except BaseException:
            self.shutdown()
            raise
        return self

    def connect(self) -> None:
        import ray

        ray.init(address=self._cluster.address, log_to_driver=False, logging_level="WARNING")

    def add(self, node: SimulatedNode, **ray_params: object) -> None:
        """Add a node to the cluster (the first one added is the head)."""
        started = self._cluster.add_node(
            num_cpus=node.cpus, num_gpus=node.gpus,
            resources={node.resource: 10_000, **node.resources},
            object_store_memory=self._object_store,
            env_vars={**NODE_RAY_SETTINGS, **node.environment()}, **self._agent_ports(), **ray_params)
        self.node_ids[node.name] = started.node_id

    def _agent_ports(self) -> Dict[str, int]:
        """Ports for a new node's agents that no other node here was given,
        where Ray would pick them in Python (see AGENT_PORTS); none where the
        raylet binds them itself (port 0, no race)."""
        from ray._private.node import Node

        if not hasattr(Node, "_get_cached_port"):
            return {}
        ports: Dict[str, int] = {}
        with ExitStack() as held:  # held open until all are picked: all differ
            while len(ports) < len(AGENT_PORTS):
                probe = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                probe.bind(("", 0))
                port = probe.getsockname()[1]
                if port not in self._ports_given:
                    ports[AGENT_PORTS[len(ports)]] = port
                    self._ports_given.add(port)
        return ports

    def logs_dir(self) -> str:
        """Where every simulated node writes its logs (they share a session)."""
        return self._cluster.head_node.get_logs_dir_path()

    def pin(self, name: str) -> Dict[str, float]:
        """Actor/task options that place work on node ``name``."""
        return {"num_cpus": 0, "resources": {f"rme_{name}": 1}}

    def shutdown(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
            self._stop_stragglers()
        if not self._tmpdir:
            return  # never started: the caller's RAY_TMPDIR was not ours to change
        if self._saved_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = self._saved_tmpdir
        shutil.rmtree(self._tmpdir, ignore_errors=True)
        self._tmpdir = None

    def _stop_stragglers(self) -> None:
        """Stop what Ray's own shutdown left running. A node's dashboard
        agent leaves by itself when it sees its raylet gone, but it only
        starts watching once it has finished starting: one still starting
        when the cluster stops (its GCS already gone) lingers for a minute
        (seen on Ray 2.41). Every process of this cluster carries its
        RAY_TMPDIR; those still there after a grace period are killed."""
        ours = f"RAY_TMPDIR={self._tmpdir}"
        deadline = time.monotonic() + self.straggler_grace_s
        left = ray_processes(ours)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = ray_processes(ours)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def __enter__(self) -> "SimulatedCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()


def ray_processes(environment_entry: str) -> Dict[int, str]:
    """Live (not zombie) Ray processes, other than this one, whose
    environment holds ``environment_entry`` ("NAME=value"), with their
    command lines; none where /proc cannot be read."""
    marker = environment_entry.encode()
    found = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()]
    except OSError:
        return {}
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except (OSError, IndexError):
            continue
        if state != "Z" and marker in environ and any(n in command for n in RAY_PROCESS_NAMES):
            found[int(entry)] = command
    return found
