"""The ``net-ifaces`` pack, opt-in: the network interface each communication
library binds, per node.

``NCCL_SOCKET_IFNAME`` (and Ascend's ``HCCL_SOCKET_IFNAME``) is a pattern
list, "find or fail": prefixes, ``^`` to exclude, ``=`` for exact names.
``GLOO_SOCKET_IFNAME`` takes exact names only, each of which must exist;
``TP_SOCKET_IFNAME`` (TensorPipe, torch RPC) one exact name, else it binds
the loopback address. A value set for one host (an image's ``eth0``, the
launching shell's copied by the framework) names nothing on a host whose
interface is ``ens5``, and init fails there. The node knows its interfaces
and the address Ray uses for it (``node.NodeNet``), so it keeps a value
that selects an interface here and replaces one that cannot work with the
interface carrying Ray's node IP, which every other node already reaches.

It also warns, setting nothing, where ``NCCL_IB_HCA`` selects none of the
node's active RDMA ports (NCCL then takes its socket transport) and where a
forced ``NCCL_IB_GID_INDEX`` points at an empty GID of a RoCE port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Tuple

from ..node import ETHERNET, IbPort, NodeFacts, NodeNet, same_address
from ..names import (
    GID_INDEX_VARIABLE as GID_INDEX, GLOO_IFNAME_VARIABLE as GLOO,
    HCCL_IFNAME_VARIABLE as HCCL, IB_HCA_VARIABLE as IB_HCA, NCCL_IFNAME_VARIABLE as NCCL,
    NET, NET_IFACES, PACK_FACT_KINDS, PACK_VARIABLES_OF,
    SOCKET_IFNAME_VARIABLES as SOCKET_VARIABLES,
    TP_IFNAME_VARIABLE as TP,
)
from .nccl_params import nccl_param, worker_value
from .pack import Demand, KEEP, LEAVE, NONE, Outcome, Pack, PackRow, PackVerdict, REQUIRED, SET

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec

PATTERNS = (NCCL, HCCL)  # prefix lists with ^ and =; the others take names
VARIABLES = PACK_VARIABLES_OF[NET_IFACES]
MAX_IFS = 16  # NCCL src/include/socket.h: the entries of NCCL_SOCKET_IFNAME read
MAX_IB_DEVS = 32  # NCCL src/transport/net_ib/common.h: the entries of NCCL_IB_HCA read
THE_RAY_IFACE = "the interface carrying Ray's node IP"

_NCCL = ("NCCL src/misc/socket.cc ncclFindInterfaces (a value longer than one character: "
         "'Specified by user : find or fail'); src/os/linux.cc ncclOsFindInterfaces (interfaces "
         "with IFF_RUNNING and an IPv4 or non-loopback IPv6 address; a leading '^' excludes, "
         "then '=' matches exactly); src/misc/utils.cc parseStringList/matchIfList (a "
         "comma-separated list of prefix[:port]); src/bootstrap.cc 'Bootstrap : no socket "
         "interface found'; NVIDIA/nccl#286 ('the environment variables might be different (for "
         "NCCL_SOCKET_IFNAME at least)'); aws/deep-learning-containers PR #6469 (eth0 image-wide, "
         "hosts with ens6/enp40s0)")
_HCCL = ("Ascend CANN docs, environment variable HCCL_SOCKET_IFNAME: a prefix list, '^' to "
         "exclude, '=' for exact names, '^=' both; the first match is used")
_GLOO = ("PyTorch torch/csrc/distributed/c10d/init.cpp ProcessGroupGloo: GLOO_SOCKET_IFNAME "
         "(longer than one character) split on ',', each createDeviceForInterface; "
         "gloo/transport/tcp/device.cc lookupAddrForIface (strcmp on the name, else 'Unable to "
         "find address for'); unset: createDefaultDevice binds the address the hostname "
         "resolves to, else the loopback address; aws-do-eks PR #51 ('Unable to find address "
         "for: ^lo'); verl#967 ('Gloo connectFullMesh failed')")
_TP = ("PyTorch torch/csrc/distributed/rpc/tensorpipe_agent.cpp guessUvAddress: "
       "TP_SOCKET_IFNAME is one interface name (tensorpipe lookupAddrForIface); failing, a "
       "warning and 127.0.0.1, which other nodes cannot reach")
_WHO = ("miles miles/utils/external_utils/command_utils.py execute_train copies the launching "
        "shell's NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME into the job's env_vars; sparkrun#135 "
        "(the head's values overwrite per-host ones)")
_IB = ("NCCL src/transport/net_ib/init.cc: NCCL_IB_HCA ('^', '=', dev[:port] entries) against "
       "each active port with an InfiniBand or Ethernet link layer; none: 'NET/IB : No device "
       "found.', and src/plugin/net.cc falls back to the socket transport")
_GID = ("NCCL src/transport/net_ib/connect.cc ncclIbGetGidIndex: on a RoCE (Ethernet) port a "
        "NCCL_IB_GID_INDEX >= 0 is used as it is (-1: detected); src/misc/ibvwrap.cc: "
        "ibv_modify_qp EINVAL, 'the incorrect GID index is forced by NCCL_IB_GID_INDEX'")

ROWS = (
    PackRow("names-no-interface-here",
            "a value inherited from the node or copied from the driver that can select no "
            "interface that is up here: NCCL's or HCCL's pattern matches none (prefixes; '^' "
            "excludes; '=' exact), a Gloo name (each of its comma-separated names) or the TP "
            "name is not one, or Gloo's or TP's value holds a pattern; Ray's node IP is on an "
            "interface that is up",
            SET, tuple((v, THE_RAY_IFACE) for v in SOCKET_VARIABLES), REQUIRED,
            "NCCL fails bootstrap ('no socket interface found'), Gloo raises ('Unable to find "
            "address for'), TensorPipe binds 127.0.0.1; the interface that carries Ray's node "
            "IP is one every other node reaches. Written as a name, or '=name' where the name "
            "as a prefix would select more. A job's own value is kept with a warning (not "
            "satisfied)",
            f"{_NCCL}; {_HCCL}; {_GLOO}; {_TP}; {_WHO}"),
    PackRow("no-interface-carries-ray-ip",
            "a value that can select no interface here, and Ray's node IP is unknown or on no "
            "interface that is up",
            KEEP, tuple((v, "") for v in SOCKET_VARIABLES), REQUIRED,
            "the value cannot work here and the node knows no interface to put instead; kept, "
            "with a warning (not satisfied)",
            f"{_NCCL}; {_GLOO}; {_TP}"),
    PackRow("selects-an-interface",
            "NCCL's or HCCL's pattern matches an interface that is up, or each Gloo name and "
            "the TP name is one",
            KEEP, tuple((v, "") for v in SOCKET_VARIABLES), NONE,
            "it binds an interface here; whether peers reach it is the job's choice",
            f"{_NCCL}; {_HCCL}; {_GLOO}; {_TP}"),
    PackRow("ib-hca-selects-none",
            "NCCL_IB_HCA selects none of the node's active RDMA ports (HCA[:port] entries, "
            "'^' excludes, '=' exact)",
            LEAVE, ((IB_HCA, ""),), NONE,
            "a warning, nothing set: NCCL finds no IB device and takes its socket transport "
            "on this node, much slower; the job's value stays",
            _IB),
    PackRow("gid-index-empty",
            "NCCL_IB_GID_INDEX forced (>= 0) and some active RoCE port NCCL_IB_HCA selects has "
            "no GID at that index",
            LEAVE, ((GID_INDEX, ""),), NONE,
            "a warning, nothing set: queue pairs on that port fail (ibv_modify_qp EINVAL); "
            "-1 lets NCCL pick the index",
            _GID),
    PackRow("leave",
            "unset (each library's own choice), an NCCL or Gloo value of one character (both "
            "ignore it), or interfaces that could not be read",
            LEAVE, tuple((v, "") for v in VARIABLES), NONE,
            "nothing for the node to say",
            f"{_NCCL}; {_GLOO}"),
)
_BY_ID = {row.id: row for row in ROWS}


def parse_list(value: str, limit: int) -> Tuple[bool, bool, List[Tuple[str, int]]]:
    """NCCL's reading of an interface or HCA list: (exclude, exact, [(prefix,
    port)]), port -1 where none is given (src/misc/utils.cc parseStringList:
    empty entries and entries with an empty prefix skipped; the port read
    with atoi)."""
    exclude = value.startswith("^")
    text = value[1:] if exclude else value
    exact = text.startswith("=")
    text = text[1:] if exact else text
    entries = []
    for entry in (e for e in text.split(",") if e):
        prefix, _, rest = entry.partition(":")
        if prefix and len(entries) < limit:
            digits = rest.partition(":")[0]
            entries.append((prefix, _atoi(digits) if digits else -1))
    return exclude, exact, entries


def _atoi(text: str) -> int:
    stripped = text.lstrip()
    sign = -1 if stripped[:1] == "-" else 1
    digits = ""
    for char in stripped.lstrip("+-")[:18]:
        if not char.isdigit():
            break
        digits += char
    return sign * int(digits) if digits else 0


def _matches(name: str, port: int, entries: List[Tuple[str, int]], exact: bool) -> bool:
    """matchIfList: no entry matches everything; else a prefix (or, with
    '=', the whole name) and the port (-1 on either side matches)."""
    if not entries:
        return True
    return any((name == prefix if exact else name.startswith(prefix))
               and (port == -1 or want == -1 or port == want) for prefix, want in entries)


def _nccl_usable(addresses: Tuple[str, ...]) -> bool:
    # ncclOsFindInterfaces skips IPv6 loopback addresses.
    return any(":" not in a or not same_address(a, "::1") for a in addresses)


def selects(variable: str, value: str, net: NodeNet) -> List[str]:
    """The interfaces up here that ``value`` of ``variable`` selects, as its
    library reads it: NCCL's and HCCL's patterns, Gloo's names (all or
    nothing: each must exist), TP's one name."""
    up = [(name, addresses) for name, addresses in net.ifaces or () if addresses]
    if variable in PATTERNS:
        exclude, exact, entries = parse_list(value, MAX_IFS)
        usable = [(n, a) for n, a in up if variable != NCCL or _nccl_usable(a)]
        return [n for n, _ in usable if _matches(n, -1, entries, exact) != exclude]
    names = dict(up)
    if variable == TP:
        return [value] if value in names else []
    pieces = value.split(",")
    if len(pieces) > 1 and pieces[-1] == "":
        pieces.pop()  # c10d's split (std::getline) gives no trailing empty piece
    return pieces if all(p in names for p in pieces) else []


def ignored(variable: str, value: str) -> bool:
    """A value the library reads as unset: NCCL and Gloo read one character
    or none as their own default (strlen(env) > 1)."""
    return variable in (NCCL, GLOO) and len(value) <= 1


def replacement(variable: str, iface: str, net: NodeNet) -> str:
    """What the pack writes for ``iface``: its name, or for a pattern
    variable ``=name`` where the name as a prefix would select more."""
    if variable in PATTERNS and selects(variable, iface, net) != [iface]:
        return f"={iface}"
    return iface


def _outcome(variable: str, rule_id: str, value: Optional[str], reason: str,
             **kw: Any) -> Outcome:
    row = _BY_ID[rule_id]
    return Outcome(variable, row.action, value, row.strength, row.id, reason, **kw)


def _socket(variable: str, net: NodeNet, env_vars: Mapping[str, Any],
            node_environ: Mapping[str, str], where: str) -> Tuple[Outcome, Optional[str]]:
    explicit = env_vars.get(variable)
    whose = "the job's" if explicit is not None else "the inherited"
    value = worker_value(variable, env_vars, node_environ)
    if value is None:
        return _outcome(variable, "leave", None, f"{where}: unset, the library's own choice "
                                                 "[leave]"), None
    value = str(value)
    if ignored(variable, value):
        return _outcome(variable, "leave", value, f"{where}: {variable}={value!r} is read as "
                                                  "unset (one character) [leave]"), None
    chosen = selects(variable, value, net)
    if chosen:
        return _outcome(variable, "selects-an-interface", value,
                        f"{where}: {whose} {variable}={value} selects {', '.join(chosen)} "
                        "[selects-an-interface]"), None
    iface = net.ray_iface
    if iface is None:
        reason = (f"{where}: {whose} {variable}={value} selects no interface that is up here, "
                  "and none carries Ray's node IP to put instead [no-interface-carries-ray-ip]")
        demand = Demand("no-interface-carries-ray-ip", REQUIRED, frozenset(), False,
                        f"the {NET_IFACES} pack (asks an interface that is up here) "
                        f"[no-interface-carries-ray-ip; {reason}]", variable)
        return (_outcome(variable, "no-interface-carries-ray-ip", value, reason,
                         demands=(demand,)),
                None if explicit is not None else f"{NET_IFACES} [no-interface-carries-ray-ip]: "
                                                  f"{reason}")
    written = replacement(variable, iface, net)
    return _outcome(variable, "names-no-interface-here", written,
                    f"{where}: {whose} {variable}={value} selects no interface that is up here "
                    f"[names-no-interface-here]", fill=False), None


def _ib(net: NodeNet, env_vars: Mapping[str, Any], node_environ: Mapping[str, str],
        where: str) -> Tuple[List[Outcome], List[str]]:
    hca = worker_value(IB_HCA, env_vars, node_environ)
    gid = worker_value(GID_INDEX, env_vars, node_environ)
    ports: Optional[Tuple[IbPort, ...]] = net.ib
    outcomes, warnings = [], []
    selected = list(ports or ())
    if hca is not None and ports is not None:
        exclude, exact, entries = parse_list(str(hca), MAX_IB_DEVS)
        selected = [p for p in ports if _matches(p.hca, p.port, entries, exact) != exclude]
        if not selected:
            have = ", ".join(f"{p.hca}:{p.port}" for p in ports) or "none"
            reason = (f"{where}: NCCL_IB_HCA={hca} selects none of the active RDMA ports here "
                      f"({have}), so NCCL takes its socket transport on this node "
                      "[ib-hca-selects-none]")
            outcomes.append(_outcome(IB_HCA, "ib-hca-selects-none", str(hca), reason))
            warnings.append(f"{NET_IFACES} [ib-hca-selects-none]: {reason}")
    index = nccl_param(gid, -1) if gid is not None else -1
    if index >= 0 and ports is not None:
        empty = [p for p in selected if p.link_layer == ETHERNET and index not in p.gids]
        if empty:
            reason = (f"{where}: NCCL_IB_GID_INDEX={gid} points at an empty GID on RoCE port(s) "
                      f"{', '.join(f'{p.hca}:{p.port}' for p in empty)}; queue pairs there fail "
                      "(ibv_modify_qp EINVAL) [gid-index-empty]")
            outcomes.append(_outcome(GID_INDEX, "gid-index-empty", str(gid), reason))
            warnings.append(f"{NET_IFACES} [gid-index-empty]: {reason}")
    return outcomes, warnings


def evaluate(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
             node_environ: Mapping[str, str]) -> PackVerdict:
    """The pack's rows on one node: one outcome per variable, and warnings."""
    net = facts.net
    decided = {}
    warnings: List[str] = []
    if net is None or not net.is_known:
        error = f"not probed ({NET} facts)" if net is None else net.error
        warnings.append(f"{NET_IFACES}: the node's interfaces could not be read ({error}); "
                        "every interface variable is left as it is")
        where = f"interfaces unknown ({error})"
    else:
        where = net.describe()
        for variable in SOCKET_VARIABLES:
            decided[variable], warning = _socket(variable, net, env_vars, node_environ, where)
            if warning:
                warnings.append(warning)
        ib_outcomes, ib_warnings = _ib(net, env_vars, node_environ, where)
        decided.update((o.variable, o) for o in ib_outcomes)
        warnings.extend(ib_warnings)
    outcomes = tuple(decided.get(v) or _outcome(
        v, "leave", worker_value(v, env_vars, node_environ), f"{where}: nothing to decide "
                                                              "[leave]")
        for v in VARIABLES)
    return PackVerdict(outcomes, tuple(warnings))


PACK = Pack(
    name=NET_IFACES,
    summary=("The network interface NCCL, Gloo, TensorPipe and HCCL bind: a name an image or "
             "the launching shell sets for every node fails on a node whose interfaces are "
             "named otherwise. The pack keeps a value that selects an interface that is up "
             "here, and puts the interface carrying Ray's node IP in place of an inherited one "
             "that cannot; it warns where NCCL_IB_HCA or NCCL_IB_GID_INDEX cannot work. Leave "
             "it out where every node names its interfaces alike."),
    variables=VARIABLES,
    node_facts=("the interfaces that are up (IFF_UP and IFF_RUNNING, SIOCGIFFLAGS) with their "
                "IPv4 (SIOCGIFCONF) and IPv6 (/proc/net/if_inet6) addresses",
                "the address Ray uses for the node (the agent's --node-ip-address; a worker's "
                "Ray connection) and so the interface that carries it",
                "the active RDMA ports (/sys/class/infiniband: state, link layer, and on RoCE "
                "ports the GID indices that hold a GID)"),
    config_facts=("the job's own GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME, "
                  "HCCL_SOCKET_IFNAME, NCCL_IB_HCA and NCCL_IB_GID_INDEX (its env_vars, else "
                  "the node's or a driver's copy)",),
    rows=ROWS,
    evaluate=evaluate,
    fact_kinds=PACK_FACT_KINDS[NET_IFACES],
    defaults=((GLOO, "the address the hostname resolves to, else the loopback address"),
              (NCCL, "ib*, else NCCL_COMM_ID's subnet, else any but docker*, lo*, virbr*, "
                     "else docker*, lo*, virbr* (src/misc/socket.cc)"),
              (TP, "the address the hostname resolves to, else 127.0.0.1"),
              (HCCL, "HCCL_IF_IP, else any but docker and lo by name, then docker, then lo"),
              (IB_HCA, "every active port"),
              (GID_INDEX, "-1: detected per port (src/transport/net_ib/connect.cc)")),
)
