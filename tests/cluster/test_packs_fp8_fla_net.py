"""te-fp8-scales, fla-backend and net-ifaces on live workers (conftest.py's
"fp8_fla_net" set) through both paths: the plugin on registered nodes, the
job env's setup hook on unregistered ones, each worker's environment and
record.

Golden, written from docs/packs.md's rows (Transformer Engine's recipe and
blockwise kernels; fla's backends and chunk_o.py; NCCL's socket.cc, PyTorch's
Gloo and TensorPipe readers): the Blackwell nodes' inherited
NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 and FLA_TILELANG=1 become 0, and their
NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME=eth0 become ens5, the interface
carrying their (faked) Ray node IP; the Hopper nodes keep the 1 (TE takes
FP32 scales there), their FLA_TILELANG=0 becomes 1, and their nosuchif0
becomes the real interface carrying Ray's node IP on this machine (read
here from ``ip -o addr``, not by the code under test); the CPU head gets
nothing.
"""

import json
import subprocess

import pytest
import ray

from ray_megatron_env import build_runtime_env
from ray_megatron_env.setup_hook import as_actor_env
from paths import FIXTURES
from workers import env_in_actors

CLUSTER = "fp8_fla_net"
# A node set of its own (about 25 s with its start); the agent's node IP (its
# --node-ip-address) and the worker's are Ray plumbing: run on both Rays.
pytestmark = [pytest.mark.slow, pytest.mark.ray_version_specific]
SCALES, TILELANG = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "FLA_TILELANG"
NCCL, GLOO = "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
NODES = ("cpu_head", "b200", "b200_unplugged", "h100", "h100_unplugged")
VIA = {"cpu_head": "plugin", "b200": "plugin", "b200_unplugged": "setup-hook",
       "h100": "plugin", "h100_unplugged": "setup-hook"}


def _decided(seen, variables):
    """{node: (via, {variable: (the worker's value, the record's value, rule)})}."""
    got = {}
    for name, values in seen.items():
        record = json.loads(values["RAY_MEGATRON_ENV_DECISION"])
        got[name] = (record["via"], {v: (values.get(v), record["variables"][v]["value"],
                                         record["variables"][v]["rule"]) for v in variables})
    return got


def test_te_fp8_scales_and_fla_backend_through_both_paths(cluster):
    env = as_actor_env(build_runtime_env(MEGATRON_TP2, packs=["te-fp8-scales", "fla-backend"]))
    got = _decided(env_in_actors(cluster, NODES, env), (SCALES, TILELANG))
    blackwell = {SCALES: ("0", "0", "fp32-scales-on-blackwell"),
                 TILELANG: ("0", "0", "tilelang-on-blackwell")}
    hopper = {SCALES: ("1", "1", "before-blackwell"),
              TILELANG: ("1", "1", "tilelang-off-on-hopper")}
    assert got == {
        "cpu_head": ("plugin", {SCALES: (None, None, "leave"), TILELANG: (None, None, "leave")}),
        "b200": ("plugin", blackwell), "b200_unplugged": ("setup-hook", blackwell),
        "h100": ("plugin", hopper), "h100_unplugged": ("setup-hook", hopper)}


def test_skyrls_own_fla_tilelang_through_both_paths(cluster):
    # SkyRL's prepare_runtime_environment puts FLA_TILELANG=1 in the job's
    # env_vars; its reader declares that 1 (framework_env), so each node decides
    # it anew: 0 on Blackwell, and on Hopper the 1 stays (fla's own choice there).
    config = str(FIXTURES / "skyrl" / "run_megatron_qwen3.5.txt")
    env = as_actor_env(build_runtime_env(config, packs=["fla-backend"],
                                         base={"env_vars": {TILELANG: "1"}},
                                         driver_environ={}))
    got = _decided(env_in_actors(cluster, NODES[1:], env), (TILELANG,))
    assert got == {"b200": ("plugin", {TILELANG: ("0", "0", "tilelang-on-blackwell")}),
                   "b200_unplugged": ("setup-hook",
                                      {TILELANG: ("0", "0", "tilelang-on-blackwell")}),
                   "h100": ("plugin", {TILELANG: ("1", "1", "leave")}),
                   "h100_unplugged": ("setup-hook", {TILELANG: ("1", "1", "leave")})}


def _iface_of(address: str) -> str:
    """The interface ``ip -o addr`` lists with ``address``."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    names = {line.split()[1] for line in out.splitlines()
             if line.split()[3].split("/")[0] == address}
    assert len(names) == 1, (address, out)
    return names.pop()


def test_net_ifaces_through_both_paths(cluster):
    # The live case: on a registered node and on one without the
    # plugin, both with GLOO_SOCKET_IFNAME=NCCL_SOCKET_IFNAME=nosuchif0 in
    # their own env, a worker of a job with packs=["net-ifaces"] gets the
    # interface carrying Ray's node IP for both.
    env = as_actor_env(build_runtime_env(MEGATRON_TP2, packs=["net-ifaces"]))
    seen = env_in_actors(cluster, NODES, env)
    got = _decided(seen, (NCCL, GLOO))
    addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    ens5 = ("ens5", "ens5", "names-no-interface-here")

    def replaced(name, variable):
        iface = _iface_of(addresses[cluster.node_ids[name]])
        # NCCL reads a name as a prefix: where it would select another
        # interface too, the exact form "=name".
        written = f"={iface}" if variable == NCCL and any(
            other != iface and other.startswith(iface) for other in _up_interfaces()) else iface
        return (written, written, "names-no-interface-here")

    assert got == {
        "cpu_head": ("plugin", {NCCL: (None, None, "leave"), GLOO: (None, None, "leave")}),
        "b200": ("plugin", {NCCL: ens5, GLOO: ens5}),
        "b200_unplugged": ("setup-hook", {NCCL: ens5, GLOO: ens5}),
        **{name: (VIA[name], {v: replaced(name, v) for v in (NCCL, GLOO)})
           for name in ("h100", "h100_unplugged")}}
    # The record carries the node's own value and the net fact's words.
    entry = json.loads(seen["h100"]["RAY_MEGATRON_ENV_DECISION"])["variables"][NCCL]
    assert entry["node_value"] == "nosuchif0" and "Ray's node IP" in entry["reason"]


def _up_interfaces():
    out = subprocess.run(["ip", "-o", "link", "show", "up"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}
