"""nccl-host-mem and torch-arch on the mixed cluster (conftest.py's
"standard" set) through both paths: the plugin on registered nodes, the job
env's setup hook on unregistered ones, each worker's environment and record.

Golden, written from docs/packs.md's rows (NCCL src/misc/cudawrap.cc,
src/transport/shm.cc, the troubleshooting guide; PyTorch
torch/utils/cpp_extension.py): the 4xL40S nodes (no peer access, driver
12.8) get NCCL_CUMEM_HOST_ENABLE=0 (no-p2p-old-driver); every other node
nothing of it. TORCH_CUDA_ARCH_LIST is each node's own archs where unset
(unset), replaces an image's "9.0 10.0" on A100 nodes on both paths
(misses-node-arch) and keeps it on the B200 node (covers-node-archs); the CPU
head gets none (leave).
"""

import json


from ray_megatron_env import build_runtime_env
from ray_megatron_env.check import observe_many
from ray_megatron_env.setup_hook import as_actor_env
from workers import env_in_actors

HOST, ARCHS = "NCCL_CUMEM_HOST_ENABLE", "TORCH_CUDA_ARCH_LIST"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}

# node: (via, NCCL_CUMEM_HOST_ENABLE and its row, TORCH_CUDA_ARCH_LIST, its source and row)
GOLDEN = {
    "cpu_head": ("plugin", None, "leave-to-nccl", None, "none", "leave"),
    "a100": ("plugin", None, "leave-to-nccl", "8.0", "policy", "misses-node-arch"),
    "b200": ("plugin", None, "leave-to-nccl", "9.0 10.0", "node", "covers-node-archs"),
    "l40s": ("plugin", "0", "no-p2p-old-driver", "8.9", "policy", "unset"),
    "l40s_unplugged": ("setup-hook", "0", "no-p2p-old-driver", "8.9", "policy", "unset"),
    "a100_inherit1_unplugged": ("setup-hook", None, "leave-to-nccl", "8.0", "policy",
                                "misses-node-arch"),
}


def test_both_packs_on_every_kind_of_node_through_both_paths(cluster):
    # As the demo and check start actors: the job env's setup hook travels in
    # the actor's env, so unregistered nodes decide through it.
    env = as_actor_env(build_runtime_env(MEGATRON_TP2, packs=["nccl-host-mem", "torch-arch"]))
    seen = env_in_actors(cluster, GOLDEN, env)
    got = {}
    for name, values in seen.items():
        record = json.loads(values["RAY_MEGATRON_ENV_DECISION"])
        host, arch = record["variables"][HOST], record["variables"][ARCHS]
        assert (host["value"], arch["value"]) == (values.get(HOST), values.get(ARCHS)), name
        assert host["pack"] == "nccl-host-mem" and arch["pack"] == "torch-arch"
        got[name] = (record["via"], values.get(HOST), host["rule"], values.get(ARCHS), arch["source"],
                     arch["rule"])
    assert got == GOLDEN


def test_check_names_nccl_host_mem_and_torch_arch_where_the_job_did_not_ask(cluster):
    env = build_runtime_env(MEGATRON_TP2)
    nodes = [(cluster.node_ids[name], "-") for name in ("l40s", "a100")]
    l40s, a100 = observe_many([(nodes, env)], timeout_s=120, fabric=True)[0]
    assert l40s.advice.startswith("nccl-host-mem would set NCCL_CUMEM_HOST_ENABLE=0 on node")
    assert "no peer access between any pair, CUDA driver 12.8" in l40s.advice
    assert a100.advice.startswith("torch-arch would set TORCH_CUDA_ARCH_LIST=8.0 on node")
    assert all(not r.decision.packs for r in (l40s, a100))  # the job itself is unchanged
