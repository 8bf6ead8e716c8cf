"""check on a cluster where every node registers the plugin.

Marked slow: the "registered" set is the load test's; .ci/run's slow step
runs these on the cluster it starts for the load test anyway, and the
README's command starts one cluster fewer (15 s).
"""

import json
import subprocess
import sys

import pytest

from configs import MEGATRON_TP2, verl
from conftest import NODE_SETS
from ray_megatron_env import check_cluster
from ray_megatron_env.check import alive_nodes
from workers import env_in_actors

CLUSTER = "registered"
pytestmark = pytest.mark.slow


def test_check_strict_passes_and_reports_every_node(cluster):
    result = subprocess.run([sys.executable, "-m", "ray_megatron_env", "check", "--address",
                             cluster.address, "--strict", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = json.loads(result.stdout)
    assert sorted(r["node_id"] for r in reports) == sorted(cluster.node_ids.values())
    assert len(reports) == len(NODE_SETS["registered"])
    assert all(r["ok"] and r["registered"] and r["problem"] is None for r in reports)
    gpus = sorted(tuple(r["decision"]["gpus"]) for r in reports)
    assert gpus == [(), ("10.0",), ("8.0",), ("9.0", "9.0")]


WATCHED = ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE",
           "NCCL_CUMEM_ENABLE")
# Golden, per node of the "registered" set, for Megatron TP=2 with nccl-fabric:
# CUDA_DEVICE_MAX_CONNECTIONS from docs/rules.md (1 below Blackwell), the
# NCCL values from docs/packs.md: the HGX with its fabric not registered gets
# NVLS off (nvswitch-fabric-not-ready), the tray without an IMEX channel
# MNNVL off only (fabric-without-imex: with MNNVL off NVLS uses POSIX handles
# per host, NCCL src/transport/nvls.cc); the A100 node (fake GPUs alone:
# no fabric, as a PCIe node) and the CPU head get no NCCL value.
GOLDEN_WITH_FABRIC = {
    "cpu_head": (None, None, None, None),
    "a100": ("1", None, None, None),
    "h100": ("1", None, "0", None),
    "b200": (None, "0", None, None),
}


def test_each_worker_gets_its_nodes_nccl_values_with_its_cuda_value(cluster):
    from ray_megatron_env import build_runtime_env

    env = build_runtime_env({"engines": {"actor": {"strategy": "megatron",
                                                   "tensor_parallel": 2}}},
                            packs=["nccl-fabric"])
    seen = env_in_actors(cluster, cluster.node_ids, env)
    assert {name: tuple(values.get(v) for v in WATCHED) for name, values in seen.items()} == \
        GOLDEN_WITH_FABRIC


def test_check_names_the_pack_a_job_did_not_ask_for(cluster):
    reports = check_cluster({"engines": {"actor": {"strategy": "megatron",
                                                   "tensor_parallel": 2}}})
    names = {node_id: name for name, node_id in cluster.node_ids.items()}
    advice = {names[r.node_id]: r.advice for r in reports}
    assert advice["a100"] is None and advice["cpu_head"] is None
    assert advice["h100"].startswith("nccl-fabric would set NCCL_NVLS_ENABLE=0 on node")
    assert "nccl-fabric would set NCCL_MNNVL_ENABLE=0" in advice["b200"]
    assert "IMEX channel absent" in advice["b200"]
    assert all(not r.decision.packs for r in reports)  # the job itself is unchanged


def test_check_cluster_api_from_a_connected_driver_for_one_role(cluster):
    reports = {r.node_id: r for r in check_cluster(verl(*MEGATRON_TP2), role="actor")}
    assert set(reports) == {node_id for node_id, _ in alive_nodes()}
    assert all(r.ok and r.registered and r.via == "plugin" for r in reports.values())
    assert reports[cluster.node_ids["b200"]].value is None
    a100 = reports[cluster.node_ids["a100"]]
    assert (a100.value, a100.decision.rules) == ("1", {"actor": "megatron-model-parallel"})

