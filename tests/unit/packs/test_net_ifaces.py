"""Issue 40 (item 3): the net-ifaces rows against their sources, on nodes
given as the fake node's ``net`` key. Every expected value is written by
hand from the source named beside it, never computed by the code under test:

* NCCL @ 5067397c src/misc/socket.cc ncclFindInterfaces (a value of more than
  one character is "find or fail"), src/os/linux.cc ncclOsFindInterfaces
  (IFF_RUNNING; IPv6 loopback skipped; '^' then '=' stripped in that order),
  src/misc/utils.cc parseStringList (comma list, ``prefix[:port]``, empty
  entries skipped, at most MAX_IFS = 16) and matchIfList (prefix, or the
  whole name with '='; no entry matches everything), src/transport/net_ib/
  init.cc (NCCL_IB_HCA against active ports, ``dev:port``), connect.cc
  ncclIbGetGidIndex (a forced index on a RoCE port).
* PyTorch torch/csrc/distributed/c10d/init.cpp (GLOO_SOCKET_IFNAME longer than
  one character, split on ',', each an interface by exact name, gloo's
  lookupAddrForIface: strcmp), torch/csrc/distributed/rpc/tensorpipe_agent.cpp
  (TP_SOCKET_IFNAME: one name, else 127.0.0.1).
* Ascend CANN docs, HCCL_SOCKET_IFNAME: prefixes, '^', '=', '^='.
"""

import json

import pytest

from ray_megatron_env.cli import OK, PROBLEM, main
from ray_megatron_env.explanation import explain_node
from ray_megatron_env.node import NodeNet
from ray_megatron_env.packs.net_ifaces import parse_list, selects

from configs import MEGATRON_YAML

GLOO, NCCL, TP, HCCL = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                        "HCCL_SOCKET_IFNAME")
MEGATRON_TP2 = {"engines": {"actor": {"strategy": "megatron", "tensor_parallel": 2}}}
# The node: Ray's IP on ens5.
ENS5 = {"node_ip": "10.0.1.7", "ifaces": {"ens5": ["10.0.1.7"], "lo": ["127.0.0.1"]}}
# Ray's IP on eth0; docker0 and an ens50 beside an ens5 without Ray's IP.
ETH0 = {"node_ip": "10.0.2.9", "ifaces": {"eth0": ["10.0.2.9"], "lo": ["127.0.0.1", "::1"],
                                           "docker0": ["172.17.0.1"]}}
PREFIXED = {"node_ip": "10.0.1.7", "ifaces": {"ens5": ["10.0.1.7"], "ens50": ["10.9.0.1"],
                                               "lo": ["127.0.0.1"]}}


def node(net, gpus="9.0"):
    return json.dumps({"gpus": gpus, "net": net})


def run(net, job=None, inherited=None):
    return explain_node(MEGATRON_TP2, node=node(net), packs=["net-ifaces"],
                        job_env=job or None, node_env=inherited or None)


def seen(result, variable):
    entry = result.decision.variables[variable]
    return entry.value, entry.source, entry.rule


# variable, net, job value, inherited value -> the worker's value, source, row; satisfied.
@pytest.mark.parametrize("variable,net,job,inherited,want,satisfied", [
    # the cases: an inherited eth0 where Ray's IP is on ens5
    (GLOO, ENS5, None, "eth0", ("ens5", "policy", "names-no-interface-here"), True),
    (NCCL, ENS5, None, "eth0", ("ens5", "policy", "names-no-interface-here"), True),
    (TP, ENS5, None, "eth0", ("ens5", "policy", "names-no-interface-here"), True),
    (HCCL, ENS5, None, "eth0", ("ens5", "policy", "names-no-interface-here"), True),
    # eth0 where eth0 carries Ray's IP: left
    (GLOO, ETH0, None, "eth0", ("eth0", "node", "selects-an-interface"), True),
    (NCCL, ETH0, None, "eth0", ("eth0", "node", "selects-an-interface"), True),
    # NCCL's own patterns that match: a prefix, exclusions, an exact name, a port
    (NCCL, ENS5, None, "ens", ("ens", "node", "selects-an-interface"), True),
    (NCCL, ETH0, None, "^docker,lo", ("^docker,lo", "node", "selects-an-interface"), True),
    (NCCL, ENS5, None, "=ens5", ("=ens5", "node", "selects-an-interface"), True),
    (NCCL, ENS5, None, "ens5:0", ("ens5:0", "node", "selects-an-interface"), True),
    (NCCL, ENS5, None, "eth,ens", ("eth,ens", "node", "selects-an-interface"), True),
    (HCCL, ETH0, None, "^=docker0,lo", ("^=docker0,lo", "node", "selects-an-interface"), True),
    # patterns that select nothing here
    (NCCL, ENS5, None, "=ens", ("ens5", "policy", "names-no-interface-here"), True),
    (NCCL, ENS5, None, "^ens,lo", ("ens5", "policy", "names-no-interface-here"), True),
    (NCCL, ENS5, None, "ib", ("ens5", "policy", "names-no-interface-here"), True),
    # Gloo and TP take names: a pattern is no interface
    (GLOO, ENS5, None, "^lo,docker", ("ens5", "policy", "names-no-interface-here"), True),
    (GLOO, ENS5, None, "ens", ("ens5", "policy", "names-no-interface-here"), True),
    (GLOO, ETH0, None, "eth0,docker0", ("eth0,docker0", "node", "selects-an-interface"), True),
    (GLOO, ETH0, None, "eth0,ens5", ("eth0", "policy", "names-no-interface-here"), True),
    (TP, ETH0, None, "eth0,docker0", ("eth0", "policy", "names-no-interface-here"), True),
    (TP, ETH0, None, "", ("eth0", "policy", "names-no-interface-here"), True),
    # one character: NCCL's and Gloo's own default
    (NCCL, ENS5, None, "e", ("e", "node", "leave"), True),
    (GLOO, ENS5, None, "", ("", "node", "leave"), True),
    (NCCL, ENS5, None, None, (None, "none", "leave"), True),
    # the job's own value that cannot work: kept, and the required row breaks
    (GLOO, ENS5, "^lo,docker", None, ("^lo,docker", "explicit", "names-no-interface-here"),
     False),
    (NCCL, ENS5, "eth0", None, ("eth0", "explicit", "names-no-interface-here"), False),
    (NCCL, ENS5, "ens", None, ("ens", "explicit", "selects-an-interface"), True),
])
def test_net_ifaces_rows(variable, net, job, inherited, want, satisfied):
    result = run(net, {variable: job} if job is not None else None,
                 {variable: inherited} if inherited is not None else None)
    assert seen(result, variable) == want
    assert result.decision.satisfied == satisfied
    assert (result.env().get(variable) is not None) == (want[1] == "policy")


def test_a_name_that_is_also_a_prefix_of_another_is_written_exact_for_nccl_and_hccl():
    # "ens5" as an NCCL prefix selects ens5 and ens50: "=ens5" selects one.
    result = run(PREFIXED, inherited={NCCL: "eth0", HCCL: "eth0", GLOO: "eth0"})
    assert (result.env()[NCCL], result.env()[HCCL], result.env()[GLOO]) == \
        ("=ens5", "=ens5", "ens5")


def test_no_interface_for_rays_ip_keeps_the_value_and_warns():
    lost = {"node_ip": "10.0.9.9", "ifaces": {"ens5": ["10.0.1.7"]}}
    for net in (lost, {"ifaces": {"ens5": ["10.0.1.7"]}}):  # an IP on no interface; none known
        result = run(net, inherited={NCCL: "eth0"})
        assert seen(result, NCCL) == ("eth0", "node", "no-interface-carries-ray-ip")
        assert not result.decision.satisfied
        assert any("net-ifaces [no-interface-carries-ray-ip]" in w
                   for w in result.decision.warnings)


def test_unreadable_interfaces_leave_everything():
    result = explain_node(MEGATRON_TP2, "9.0", packs=["net-ifaces"], node_env={NCCL: "eth0"})
    assert seen(result, NCCL) == ("eth0", "node", "leave")
    assert any("net-ifaces: the node's interfaces could not be read (no --node given with a "
               "\"net\" key)" in w for w in result.decision.warnings)


def test_an_ipv6_loopback_alone_is_no_interface_for_nccl():
    # ncclOsFindInterfaces skips IPv6 loopback addresses; Gloo's lookup does not.
    net = {"node_ip": "10.0.1.7", "ifaces": {"ens5": ["10.0.1.7"], "lo": ["::1"]}}
    facts = NodeNet(tuple((n, tuple(a)) for n, a in net["ifaces"].items()), net["node_ip"])
    assert selects(NCCL, "lo", facts) == [] and selects(GLOO, "lo", facts) == ["lo"]


def test_nccl_list_parsing():
    assert parse_list("^=eth0:1,,ib", 16) == (True, True, [("eth0", 1), ("ib", -1)])
    assert parse_list(":3,eth", 16) == (False, False, [("eth", -1)])
    assert len(parse_list(",".join(f"e{i}" for i in range(20)), 16)[2]) == 16


# --- NCCL_IB_HCA and NCCL_IB_GID_INDEX: warnings only ---------------------------------

ROCE = {**ENS5, "ib": {"mlx5_0:1": {"link_layer": "ethernet", "gids": [0, 1]},
                       "mlx5_1:1": {"link_layer": "infiniband"}}}


@pytest.mark.parametrize("env,rules", [
    ({"NCCL_IB_HCA": "mlx5_0"}, set()),
    ({"NCCL_IB_HCA": "=mlx5_0:1"}, set()),
    ({"NCCL_IB_HCA": "mlx5_0:2"}, {"ib-hca-selects-none"}),  # no active port 2
    ({"NCCL_IB_HCA": "^mlx5"}, {"ib-hca-selects-none"}),
    ({"NCCL_IB_HCA": "bnxt_re"}, {"ib-hca-selects-none"}),
    ({"NCCL_IB_GID_INDEX": "1"}, set()),
    ({"NCCL_IB_GID_INDEX": "3"}, {"gid-index-empty"}),  # mlx5_0's GID 3 is empty
    ({"NCCL_IB_GID_INDEX": "-1"}, set()),  # NCCL picks
    ({"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "mlx5_1"}, set()),  # an IB port: not used
    ({"NCCL_IB_GID_INDEX": "0x3"}, {"gid-index-empty"}),  # strtoll
])
def test_ib_warnings(env, rules):
    result = run(ROCE, job=env)
    warned = {rule for rule in ("ib-hca-selects-none", "gid-index-empty")
              if any(f"[{rule}]" in w for w in result.decision.warnings)}
    assert warned == rules
    assert result.decision.satisfied
    assert not result.env().keys() & {"NCCL_IB_HCA", "NCCL_IB_GID_INDEX"}


def test_ib_hca_on_a_node_without_rdma_warns():
    result = run(ENS5, inherited={"NCCL_IB_HCA": "mlx5"})
    assert any("selects none of the active RDMA ports here (none)" in w
               for w in result.decision.warnings)


# --- the Done when, through the CLI ----------------------------------------------

def test_explain_done_when(capsys):
    base = ["explain", str(MEGATRON_YAML), "--packs", "net-ifaces", "--json"]
    assert main([*base, "--node", node(ENS5), "--node-env", "GLOO_SOCKET_IFNAME=eth0",
                 "--node-env", "NCCL_SOCKET_IFNAME=eth0"]) == OK
    env = json.loads(capsys.readouterr().out)["env"]
    assert (env[GLOO], env[NCCL]) == ("ens5", "ens5")
    assert main([*base, "--node", node(ETH0), "--node-env", "GLOO_SOCKET_IFNAME=eth0"]) == OK
    assert GLOO not in json.loads(capsys.readouterr().out)["env"]
    assert main([*base, "--node", node(ETH0), "--node-env", "NCCL_SOCKET_IFNAME=^docker,lo"]) \
        == OK
    assert json.loads(capsys.readouterr().out)["variables"][NCCL]["rule"] == \
        "selects-an-interface"
    assert main([*base, "--node", node(ENS5), "--job-env", "GLOO_SOCKET_IFNAME=^lo,docker"]) \
        == PROBLEM
    record = json.loads(capsys.readouterr().out)
    assert record["variables"][GLOO]["value"] == "^lo,docker" and not record["satisfied"]
    assert any(w.startswith("net-ifaces: explicit GLOO_SOCKET_IFNAME=^lo,docker breaks a "
                            "required rule") for w in record["warnings"])

