"""A node described instead of probed (tests, the demo, a dry run), and
the text it is described in: ``RAY_MEGATRON_ENV_FAKE_NODE`` (the whole node
as JSON, ``parse_fake_node``) and ``RAY_MEGATRON_ENV_FAKE_GPUS`` (a GPU list,
``node.parse_gpu_list``). The node's own ``gpus`` win over the GPU list;
without a fabric or peer-access record, fake GPUs are PCIe GPUs with peer
access everywhere."""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any, Mapping, NamedTuple, Optional, Tuple

from ..names import FAKE_GPUS_VARIABLE as FAKE_VARIABLE, FAKE_NODE_VARIABLE
from ..node import (
    ABSENT, COMPLETED, FABRIC_STATES, HEALTH_DEGRADED, HEALTH_OK, HEALTHS, IMEX_CHANNELS,
    IMEX_STATUSES, LINK_LAYERS, NOT_SUPPORTED, P2P_ALL, P2P_NONE, SUCCESS, FakeNodeError,
    GpuFabric, IbPort, NodeFabric, NodeGpus, NodeNet, NodeP2P, decode_health_mask, parse_driver,
    parse_gpu_list, parse_kernel_driver,
)

IFACE_NAME = re.compile(r"^[^\s/,:]{1,15}$")  # Linux: IFNAMSIZ 16 with its NUL, no '/'
HCA_NAME = re.compile(r"^[\w.-]{1,64}$")  # an ibv_device name (IBV_SYSFS_NAME_MAX 64)


def read(environ: Mapping[str, str]) -> Optional[FakeNode]:
    """The faked node, or ``None`` when nothing is faked. Raises
    ``node.FakeNodeError`` naming the variable and what is wrong."""
    node = environ.get(FAKE_NODE_VARIABLE, "").strip()
    gpus = environ.get(FAKE_VARIABLE, "").strip() or None
    if node:
        return parse_fake_node(node, default_gpus=gpus)
    if gpus is None:
        return None
    listed = parse_gpu_list(gpus, "fake", where=FAKE_VARIABLE, detail=f"{FAKE_VARIABLE}={gpus}")
    return parse_fake_node("{}", FAKE_VARIABLE, default_gpus=gpus)._replace(gpus=listed)


# --- the fake node's JSON ------------------------------------------------------------

_FABRIC_KEYS = ("state", "status", "cluster_uuid", "clique_id", "health", "health_mask")
_TOP_KEYS = ("gpus", "fabric", "imex_channel", "imex_status", "p2p", "cuda_driver",
             "kernel_driver", "net")
_NET_KEYS = ("node_ip", "ifaces", "ib")
_IB_KEYS = ("link_layer", "gids")


class FakeNode(NamedTuple):
    """A node given as text: its GPUs (``None`` where neither the text nor
    the default names them), its fabric and its peer-access facts, and its
    network (``None`` where the text has no ``net``: the node's own is read)."""

    gpus: Optional[NodeGpus]
    fabric: NodeFabric
    p2p: NodeP2P
    net: Optional[NodeNet] = None


def parse_fake_node(text: str, where: str = FAKE_NODE_VARIABLE,
                    default_gpus: Optional[str] = None, method: str = "fake") -> FakeNode:
    """``{"gpus": "10.0,10.0", "fabric": {...}, "imex_channel": "absent",
    "imex_status": "ready", "p2p": "none", "cuda_driver": "12.8", "kernel_driver":
    "570.172.08", "net": {...}}`` -> the node's facts.

    ``gpus`` is read by ``parse_gpu_list`` (``default_gpus`` stands in where
    the object has none: explain's --gpus, RAY_MEGATRON_ENV_FAKE_GPUS). The
    one fabric record applies to every NVIDIA GPU; without ``fabric`` the
    GPUs report NOT_SUPPORTED (a PCIe node). ``p2p`` lists the pairs WITHOUT
    peer access (default ``"all"`` have it). Raises ``FakeNodeError``
    naming the key and what it must be.
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FakeNodeError(f"{where} is not JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise FakeNodeError(f"{where} must be a JSON object with {', '.join(_TOP_KEYS)}")
    _only(data, _TOP_KEYS, f"{where}: unknown key(s)")
    listed = data.get("gpus", default_gpus)
    if listed is not None and not isinstance(listed, str):
        raise FakeNodeError(f"{where}: gpus must be a string like \"10.0,10.0\" or \"none\"")
    # What the probe saw, for operators; a node given to explain was not seen.
    seen = f"{where}={text}" if method == "fake" else None
    gpus = None if listed is None else parse_gpu_list(listed, method, where=f"{where}: gpus",
                                                      detail=seen)
    count = len(gpus.capabilities) if gpus is not None and gpus.vendor is None else 0
    imex = data.get("imex_channel", ABSENT)
    if imex not in IMEX_CHANNELS:
        raise FakeNodeError(f"{where}: imex_channel must be one of {', '.join(IMEX_CHANNELS)}, "
                            f"got {imex!r}")
    status = data.get("imex_status")  # absent: unknown, as a probe that cannot tell
    if status is not None and status not in IMEX_STATUSES:
        raise FakeNodeError(f"{where}: imex_status must be one of {', '.join(IMEX_STATUSES)} "
                            f"(leave it out for unknown), got {status!r}")
    fabric = _fake_fabric(data.get("fabric"), where)
    net = None if data.get("net") is None else _fake_net(data["net"], where, text, method)
    return FakeNode(gpus, NodeFabric(tuple(fabric for _ in range(count)), imex, method,
                                     detail=f"{where}={text}", imex_status=status),
                    _fake_p2p(data, count, where, text, method), net)


def _only(data: Mapping[str, Any], allowed: Tuple[str, ...], words: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise FakeNodeError(f"{words} {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def _fake_fabric(raw: Any, where: str) -> GpuFabric:
    if raw is None:
        return GpuFabric(NOT_SUPPORTED)
    if not isinstance(raw, Mapping):
        raise FakeNodeError(f"{where}: fabric must be an object with {', '.join(_FABRIC_KEYS)}")
    _only(raw, _FABRIC_KEYS, f"{where}: unknown fabric key(s)")
    state = raw.get("state")
    if state not in FABRIC_STATES:
        raise FakeNodeError(f"{where}: fabric.state must be one of {', '.join(FABRIC_STATES)}, "
                            f"got {state!r}")
    health = raw.get("health")
    if health is not None and health not in HEALTHS:
        raise FakeNodeError(f"{where}: fabric.health must be one of {', '.join(HEALTHS)}, "
                            f"got {health!r}")
    for key in ("status", "cluster_uuid"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise FakeNodeError(f"{where}: fabric.{key} must be a string")
    for key in ("clique_id", "health_mask"):
        number = raw.get(key)
        if number is not None and (isinstance(number, bool) or not isinstance(number, int)
                                   or number < 0):
            raise FakeNodeError(f"{where}: fabric.{key} must be a non-negative integer")
    clique = raw.get("clique_id")
    mask = raw.get("health_mask")
    if mask is not None and health is None:  # NVML's DEGRADED_BW field, as the probe reads it
        health = {"true": HEALTH_DEGRADED, "false": HEALTH_OK}.get(
            decode_health_mask(mask).get("degraded_bw"))
    # A completed fabric without a status reads as NVML reports it: success.
    status = raw.get("status", SUCCESS if state == COMPLETED else None)
    return GpuFabric(state, status, raw.get("cluster_uuid"), clique, health, mask)


def _fake_p2p(data: Mapping[str, Any], count: int, where: str, text: str,
              method: str) -> NodeP2P:
    raw = data.get("p2p", P2P_ALL)
    every = [(i, j) for i in range(count) for j in range(i + 1, count)]
    if raw == P2P_ALL:
        without: Tuple[Tuple[int, int], ...] = ()
    elif raw == P2P_NONE:
        without = tuple(every)
    elif isinstance(raw, list):
        pairs = set()
        for pair in raw:
            if not (isinstance(pair, list) and len(pair) == 2 and all(
                    isinstance(i, int) and not isinstance(i, bool) for i in pair)) \
                    or pair[0] == pair[1] or not all(0 <= i < count for i in pair):
                raise FakeNodeError(f"{where}: p2p pairs must be [i, j], two different GPU "
                                    f"indices below {count}, got {pair!r}")
            pairs.add((min(pair), max(pair)))
        without = tuple(sorted(pairs))
    else:
        raise FakeNodeError(f"{where}: p2p must be \"all\", \"none\" or a list of [i, j] "
                            f"pairs without peer access, got {raw!r}")
    driver = data.get("cuda_driver")
    if driver is not None:
        if not isinstance(driver, str):
            raise FakeNodeError(f"{where}: cuda_driver must be a string like \"12.8\"")
        try:
            driver = parse_driver(driver)
        except ValueError as exc:
            raise FakeNodeError(f"{where}: cuda_driver: {exc}") from None
    kernel = data.get("kernel_driver")  # absent: unknown
    if kernel is not None:
        if not isinstance(kernel, str):
            raise FakeNodeError(f"{where}: kernel_driver must be a string like \"570.172.08\"")
        try:
            parse_kernel_driver(kernel)
        except ValueError as exc:
            raise FakeNodeError(f"{where}: kernel_driver: {exc}") from None
    return NodeP2P(count, without, driver, method, detail=f"{where}={text}",
                   kernel_driver=kernel)


def _address(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise FakeNodeError(f"{key} must be an IP address as a string, got {value!r}")
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise FakeNodeError(f"{key}: {value!r} is not an IPv4 or IPv6 address") from None
    return value


def _fake_net(raw: Any, where: str, text: str, method: str) -> NodeNet:
    """``{"node_ip": "10.0.1.7", "ifaces": {"ens5": ["10.0.1.7"]}, "ib":
    {"mlx5_0:1": {"link_layer": "ethernet", "gids": [0, 1]}}}``: the
    interfaces that are up, Ray's node IP (absent: unknown) and the active
    RDMA ports (absent: none)."""
    if not isinstance(raw, Mapping):
        raise FakeNodeError(f"{where}: net must be an object with {', '.join(_NET_KEYS)}")
    _only(raw, _NET_KEYS, f"{where}: unknown net key(s)")
    node_ip = raw.get("node_ip")
    if node_ip is not None:
        _address(node_ip, f"{where}: net.node_ip")
    listed = raw.get("ifaces", {})
    if not isinstance(listed, Mapping):
        raise FakeNodeError(f"{where}: net.ifaces must map each interface that is up to its "
                            "addresses, e.g. {\"ens5\": [\"10.0.1.7\"]}")
    ifaces = []
    for name, addresses in listed.items():
        if not isinstance(name, str) or not IFACE_NAME.match(name):
            raise FakeNodeError(f"{where}: net.ifaces: {name!r} is not an interface name (1 to "
                                "15 characters, no blank, '/', ',' or ':')")
        if not isinstance(addresses, list):
            raise FakeNodeError(f"{where}: net.ifaces.{name} must be a list of addresses")
        ifaces.append((name, tuple(_address(a, f"{where}: net.ifaces.{name}")
                                   for a in addresses)))
    return NodeNet(tuple(ifaces), node_ip, _fake_ib(raw.get("ib", {}), where), method,
                   detail=f"{where}={text}")


def _fake_ib(raw: Any, where: str) -> Tuple[IbPort, ...]:
    if not isinstance(raw, Mapping):
        raise FakeNodeError(f"{where}: net.ib must map \"HCA:port\" to {{\"link_layer\": "
                            "..., \"gids\": [...]}")
    ports = []
    for key, port in raw.items():
        hca, _, number = str(key).partition(":")
        if not HCA_NAME.match(hca) or not number.isdigit():
            raise FakeNodeError(f"{where}: net.ib key {key!r} must be \"HCA:port\", e.g. "
                                "\"mlx5_0:1\"")
        if not isinstance(port, Mapping):
            raise FakeNodeError(f"{where}: net.ib.{key} must be an object with "
                                f"{', '.join(_IB_KEYS)}")
        _only(port, _IB_KEYS, f"{where}: unknown net.ib.{key} key(s)")
        layer = port.get("link_layer")
        if layer not in LINK_LAYERS:
            raise FakeNodeError(f"{where}: net.ib.{key}.link_layer must be one of "
                                f"{', '.join(LINK_LAYERS)}, got {layer!r}")
        gids = port.get("gids", [])
        if not isinstance(gids, list) or not all(
                isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gids):
            raise FakeNodeError(f"{where}: net.ib.{key}.gids must be a list of the GID "
                                "indices that hold a GID")
        ports.append(IbPort(hca, int(number), layer, tuple(sorted(set(gids)))))
    return tuple(ports)
