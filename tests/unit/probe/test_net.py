"""The ``net`` node fact: the probe against this machine's real interfaces
(what ``ip -o addr`` and /sys/class/net say, read independently here), the
RDMA ports of a prepared /sys, the fake node's ``net`` key, the record, the
caches, and how the plugin's agent and the setup hook get Ray's node IP."""

import dataclasses
import json
import logging
import socket
import subprocess
from pathlib import Path

import pytest

from ray_megatron_env import build_runtime_env
from ray_megatron_env.agent import NodeAgent, agent_node_ip
from ray_megatron_env.cache import NodeCache, ProbeCache
from ray_megatron_env.node import facts_from_record, FakeNodeError, IbPort, NodeGpus, NodeNet
from ray_megatron_env.probe.fake import parse_fake_node
from ray_megatron_env.names import FAKE_NODE_VARIABLE, NET
from ray_megatron_env.probe import net as net_source, probe_net
from ray_megatron_env.setup_hook import decide_in_worker

IFF_UP = 0x1


def _ip_addresses() -> dict:
    """interface -> addresses, from iproute2's own listing."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    found: dict = {}
    for line in out.splitlines():
        fields = line.split()
        # "2: eth0    inet 192.0.2.2/24 brd ... scope global eth0\ ..."
        name, family, address = fields[1], fields[2], fields[3].split("/")[0]
        if family in ("inet", "inet6"):
            found.setdefault(name.split("@")[0], set()).add(address)
    return found


def _up_by_sysfs() -> set:
    """Interfaces administratively up (flags & IFF_UP) whose operational state
    the kernel reports as up or unknown (lo): IFF_RUNNING (dev_get_flags)."""
    up = set()
    for entry in Path("/sys/class/net").iterdir():
        flags = int((entry / "flags").read_text(), 16)
        state = (entry / "operstate").read_text().strip()
        if flags & IFF_UP and state in ("up", "unknown"):
            up.add(entry.name)
    return up


def test_the_probe_reads_this_machines_interfaces_as_ip_and_sysfs_list_them():
    net = probe_net({}, node_ip=None)
    assert net.is_known and net.error is None and net.method == "probe"
    got = {name: set(addresses) for name, addresses in net.ifaces}
    assert set(got) == _up_by_sysfs()
    listed = _ip_addresses()
    for name in got:
        assert got[name] == listed.get(name, set()), name


def test_rays_node_ip_picks_the_interface_that_carries_it():
    listed = {name: addresses for name, addresses in _ip_addresses().items()
              if name in _up_by_sysfs()}
    # Every address of every interface that is up names that interface.
    for name, addresses in listed.items():
        for address in addresses:
            assert probe_net({}, node_ip=address).ray_iface == name, (name, address)
    assert probe_net({}, node_ip="203.0.113.250").ray_iface is None
    assert probe_net({}, node_ip=None).ray_iface is None


def test_the_probe_never_raises(monkeypatch):
    def broken(*_):
        raise OSError(19, "No such device")

    monkeypatch.setattr(net_source, "read_net", broken)
    failed = probe_net({}, node_ip="10.0.0.1")
    assert (failed.ifaces, failed.node_ip, failed.method) == (None, "10.0.0.1", "probe")
    assert failed.error == "OSError: [Errno 19] No such device"
    monkeypatch.setattr(net_source, "read_net", lambda *_: 1 / 0)
    assert probe_net({}).error == "unexpected ZeroDivisionError: division by zero"


def _port(root: Path, hca: str, number: int, state: str, layer: str, gids: dict) -> None:
    folder = root / "sys/class/infiniband" / hca / "ports" / str(number)
    (folder / "gids").mkdir(parents=True)
    (folder / "state").write_text(state + "\n")
    (folder / "link_layer").write_text(layer + "\n")
    for index, gid in gids.items():
        (folder / "gids" / str(index)).write_text(gid + "\n")


def test_rdma_ports_from_sysfs(tmp_path):
    zero = "0000:0000:0000:0000:0000:0000:0000:0000"
    held = "fe80:0000:0000:0000:1a2b:3c4d:5e6f:0001"
    _port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "Ethernet", {0: held, 1: held, 2: zero, 3: held})
    _port(tmp_path, "mlx5_1", 1, "4: ACTIVE", "InfiniBand", {0: held})
    _port(tmp_path, "mlx5_2", 1, "1: DOWN", "Ethernet", {0: held})
    assert net_source.rdma_ports(str(tmp_path)) == (
        IbPort("mlx5_0", 1, "ethernet", (0, 1, 3)), IbPort("mlx5_1", 1, "infiniband", ()))
    assert net_source.rdma_ports(str(tmp_path / "nothing")) == ()


def test_the_fake_nodes_net_key():
    text = json.dumps({"net": {"node_ip": "10.0.1.7",
                               "ifaces": {"ens5": ["10.0.1.7", "fe80::1"], "lo": ["127.0.0.1"]},
                               "ib": {"mlx5_0:1": {"link_layer": "ethernet", "gids": [3, 0]}}}})
    net = probe_net({FAKE_NODE_VARIABLE: text})
    assert (net.ifaces, net.node_ip, net.ib, net.method) == (
        (("ens5", ("10.0.1.7", "fe80::1")), ("lo", ("127.0.0.1",))), "10.0.1.7",
        (IbPort("mlx5_0", 1, "ethernet", (0, 3)),), "fake")
    assert net.ray_iface == "ens5"
    # No net key: the node's own interfaces are read, beside faked GPUs.
    assert probe_net({FAKE_NODE_VARIABLE: '{"gpus": "9.0"}'}).method == "probe"
    assert parse_fake_node('{"gpus": "9.0"}').net is None


@pytest.mark.parametrize("net,message", [
    ("eth0", "net must be an object"),
    ({"ifaces": {"ens5": ["10.0.1.7"]}, "mtu": 9000}, "unknown net key(s) mtu"),
    ({"node_ip": "10.0.1"}, "net.node_ip: '10.0.1' is not an IPv4 or IPv6 address"),
    ({"ifaces": ["ens5"]}, "net.ifaces must map each interface"),
    ({"ifaces": {"ens5/1": []}}, "'ens5/1' is not an interface name"),
    ({"ifaces": {"x" * 16: []}}, "is not an interface name"),
    ({"ifaces": {"ens5": "10.0.1.7"}}, "net.ifaces.ens5 must be a list of addresses"),
    ({"ifaces": {"ens5": ["10.0.1.300"]}}, "net.ifaces.ens5: '10.0.1.300' is not an IPv4"),
    ({"ib": {"mlx5_0": {"link_layer": "ethernet"}}}, "net.ib key 'mlx5_0' must be \"HCA:port\""),
    ({"ib": {"mlx5_0:1": {"link_layer": "roce"}}}, "link_layer must be one of infiniband, "
                                                   "ethernet"),
    ({"ib": {"mlx5_0:1": {"link_layer": "ethernet", "gids": [-1]}}}, "gids must be a list"),
])
def test_a_bad_net_key_names_what_is_wrong(net, message):
    with pytest.raises(FakeNodeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_fake_node(json.dumps({"net": net}))
    failed = probe_net({FAKE_NODE_VARIABLE: json.dumps({"net": net})})
    assert failed.ifaces is None and failed.method == "fake" and message.split("(")[0] in \
        failed.error


def test_the_record_reads_back():
    net = NodeNet((("ens5", ("10.0.1.7", "fe80::1")),), "10.0.1.7",
                  (IbPort("mlx5_0", 1, "ethernet", (0, 1)),), "probe", detail="d",
                  probed_at=1.5, probe_pid=7)
    assert facts_from_record(NET, json.loads(json.dumps(dataclasses.asdict(net)))) == net
    failed = NodeNet(None, "10.0.1.7", None, "probe", "boom")
    assert facts_from_record(NET, json.loads(json.dumps(dataclasses.asdict(failed)))) == failed


def test_the_node_cache_keeps_net_facts_and_retries_a_failed_probe(tmp_path):
    cache = NodeCache(str(tmp_path), "node1", clock=lambda: 100.0)
    runs = []

    def probe():
        runs.append(1)
        return NodeNet((("ens5", ("10.0.1.7",)),), "10.0.1.7", ())

    assert cache.get(probe, "net").ray_iface == "ens5"
    assert cache.get(probe, "net").ray_iface == "ens5" and len(runs) == 1
    assert cache.stamp(("net",)) is not None
    bad = NodeCache(str(tmp_path), "node2", clock=lambda: 100.0)
    bad.get(lambda: NodeNet(None, error="boom"), "net")
    assert bad.stamp(("net",)) is None  # a failed probe keys no cached decision


# --- Ray's node IP, as each path gets it --------------------------------------------

@pytest.mark.parametrize("argv,ip", [
    # ray/_private/services.py starts the agent with f"--node-ip-address={ip}"
    (["/x/python", "/ray/_private/runtime_env/agent/main.py", "--node-id=ab",
      "--node-ip-address=10.0.1.7", "--runtime-env-agent-port=1"], "10.0.1.7"),
    (["main.py", "--node-ip-address", "fd00::2"], "fd00::2"),
    (["main.py", "--node-ip-address="], None),
    (["pytest"], None),
])
def test_the_agent_reads_rays_node_ip_from_its_command_line(argv, ip):
    assert agent_node_ip(argv) == ip


NET_JOB = build_runtime_env({"engines": {"actor": {"strategy": "megatron"}}},
                            packs=["net-ifaces"])
CUDA_JOB = build_runtime_env({"engines": {"actor": {"strategy": "megatron"}}})


def test_the_agent_probes_the_network_only_for_jobs_that_ask():
    probes = []

    def probe():
        probes.append(1)
        return NodeNet((("ens5", ("10.0.1.7",)),), "10.0.1.7", ())

    agent = NodeAgent(ProbeCache(lambda: NodeGpus.known([(9, 0)], "fake")),
                      caches={"net": ProbeCache(probe)})
    env_vars = {"NCCL_SOCKET_IFNAME": "eth0"}
    decision = agent.decide_and_write(CUDA_JOB, dict(env_vars), {}, logging.getLogger("t"))
    assert "NCCL_SOCKET_IFNAME" not in decision.variables and not probes
    written: dict = {}
    agent.decide_and_write(NET_JOB, written, {"NCCL_SOCKET_IFNAME": "eth0"},
                           logging.getLogger("t"))
    assert written["NCCL_SOCKET_IFNAME"] == "ens5" and len(probes) == 1


def test_the_setup_hook_probes_the_network_with_rays_node_ip(monkeypatch):
    import ray_megatron_env.setup_hook as worker

    here = socket.gethostbyname("localhost")  # 127.0.0.1, carried by lo
    monkeypatch.setattr(worker, "_ray_node_ip", lambda: here)
    kinds = []

    def cache(probe, kind):
        kinds.append(kind)
        return probe()

    node_env = {"RAY_MEGATRON_ENV_FAKE_GPUS": "9.0", "NCCL_SOCKET_IFNAME": "nosuchif0"}
    environ = {**node_env, "RAY_MEGATRON_ENV_FIELD": json.dumps(NET_JOB["megatron_env"])}
    decision = decide_in_worker(environ, node_env, cache, logging.getLogger("t"))
    assert kinds == ["gpus", "net"]
    assert environ["NCCL_SOCKET_IFNAME"] == "lo"
    assert decision.variables["NCCL_SOCKET_IFNAME"].rule == "names-no-interface-here"
