"""The node's network: the interfaces that are up with their addresses, and
the active ports of its RDMA devices. Standard library only (ioctls on a
datagram socket, ``/proc/net/if_inet6``, ``/sys/class/infiniband``):
nothing runs, nothing waits, and every list is bounded.

"Up" is what NCCL takes (``src/os/linux.cc``, ``ncclOsFindInterfaces``:
``IFF_RUNNING``) and the administrator set (``IFF_UP``): both, as
``SIOCGIFFLAGS`` reports them (``/sys/class/net/*/flags`` lacks
``IFF_RUNNING``). IPv4 addresses come from ``SIOCGIFCONF``, which lists
every one (an alias ``eth0:1`` is ``eth0``'s), IPv6 ones from
``/proc/net/if_inet6``.
"""

from __future__ import annotations

import array
import fcntl
import ipaddress
import os
import socket
import struct
from typing import Dict, List, Mapping, Optional, Tuple

from ..node import ETHERNET, INFINIBAND, IbPort, NodeNet
from .common import clip, root

SIOCGIFCONF = 0x8912  # linux/sockios.h
SIOCGIFFLAGS = 0x8913
IFF_UP, IFF_RUNNING = 0x1, 0x40  # linux/if.h
IFNAMSIZ = 16
# struct ifreq: the name, then a union whose largest member (struct ifmap) is
# 24 bytes with 64-bit pointers, 16 with 32-bit ones.
IFREQ_SIZE = IFNAMSIZ + (24 if struct.calcsize("P") == 8 else 16)
MAX_IFACES = 256
MAX_ADDRESSES = 16  # per interface
MAX_PORTS = 64  # RDMA ports, over every device
MAX_GIDS = 256  # a GID table's entries read per port
INET6_LISTING = "proc/net/if_inet6"
RDMA_FOLDER = "sys/class/infiniband"
_ACTIVE = "ACTIVE"  # the word after the number in ports/<n>/state ("4: ACTIVE")
_LINK_LAYERS = {"InfiniBand": INFINIBAND, "Ethernet": ETHERNET}


def read_net(environ: Mapping[str, str], node_ip: Optional[str]) -> NodeNet:
    """The node's interfaces that are up and its RDMA ports. Raises
    ``OSError`` when the interfaces cannot be read (the caller records it);
    RDMA ports that cannot be read are left out."""
    top = root(environ)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        up = [name for _, name in socket.if_nameindex()[:4 * MAX_IFACES]
              if _flags(sock, name) & (IFF_UP | IFF_RUNNING) == IFF_UP | IFF_RUNNING]
        addresses: Dict[str, List[str]] = {name: [] for name in up[:MAX_IFACES]}
        for name, address in _ipv4(sock):
            _add(addresses, name, address)
    for name, address in _ipv6(top):
        _add(addresses, name, address)
    ifaces = tuple((name, tuple(found)) for name, found in addresses.items())
    detail = f"{len(ifaces)} interface(s) up; node IP from Ray: {node_ip or 'unknown'}"
    return NodeNet(ifaces, node_ip, rdma_ports(top), "probe", detail=detail)


def _add(addresses: Dict[str, List[str]], label: str, address: str) -> None:
    # An IPv4 alias is labelled "eth0:1"; it is eth0's address.
    found = addresses.get(label.split(":", 1)[0])
    if found is not None and address not in found and len(found) < MAX_ADDRESSES:
        found.append(address)


def _flags(sock: socket.socket, name: str) -> int:
    request = struct.pack(f"{IFNAMSIZ}sH", name.encode()[:IFNAMSIZ - 1], 0)
    try:
        answer = fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request.ljust(IFREQ_SIZE, b"\0"))
    except OSError:
        return 0  # gone since it was listed
    return struct.unpack_from("H", answer, IFNAMSIZ)[0]


def _ipv4(sock: socket.socket) -> List[Tuple[str, str]]:
    """(label, address) of every IPv4 address the kernel lists (SIOCGIFCONF)."""
    size = IFREQ_SIZE * MAX_IFACES * 2
    buffer = array.array("B", bytes(size))
    pointer, _ = buffer.buffer_info()
    answer = fcntl.ioctl(sock.fileno(), SIOCGIFCONF, struct.pack("iP", size, pointer))
    used = min(struct.unpack("iP", answer)[0], size)
    data = buffer.tobytes()
    out = []
    for offset in range(0, used - IFREQ_SIZE + 1, IFREQ_SIZE):
        label = data[offset:offset + IFNAMSIZ].split(b"\0", 1)[0].decode("utf-8", "replace")
        family = struct.unpack_from("H", data, offset + IFNAMSIZ)[0]
        if family == socket.AF_INET:
            out.append((label, socket.inet_ntoa(data[offset + IFNAMSIZ + 4:
                                                      offset + IFNAMSIZ + 8])))
    return out


def _ipv6(top: str) -> List[Tuple[str, str]]:
    """(interface, address) of each line of /proc/net/if_inet6 (absent
    without IPv6: none)."""
    out = []
    try:
        with open(os.path.join(top, INET6_LISTING)) as listing:
            lines = listing.readlines(1 << 16)
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) == 6 and len(fields[0]) == 32:
            try:
                out.append((fields[5], str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))))
            except ValueError:
                continue
    return out


def rdma_ports(top: str) -> Optional[Tuple[IbPort, ...]]:
    """The active ports of the node's RDMA devices (``/sys/class/infiniband``;
    none there: no device), each Ethernet (RoCE) port with the indices of its
    GID table that hold a GID. ``None`` when the folder cannot be listed."""
    folder = os.path.join(top, RDMA_FOLDER)
    try:
        devices = sorted(os.listdir(folder))
    except FileNotFoundError:
        return ()
    except OSError:
        return None
    ports: List[IbPort] = []
    for hca in devices:
        try:
            numbers = sorted(int(n) for n in os.listdir(os.path.join(folder, hca, "ports"))
                             if n.isdigit())
        except OSError:
            continue
        for number in numbers:
            if len(ports) >= MAX_PORTS:
                return tuple(ports)
            port = _port(os.path.join(folder, hca, "ports", str(number)), hca, number)
            if port is not None:
                ports.append(port)
    return tuple(ports)


def _port(path: str, hca: str, number: int) -> Optional[IbPort]:
    state, layer = _read(os.path.join(path, "state")), _read(os.path.join(path, "link_layer"))
    if state is None or state.split(":")[-1].strip() != _ACTIVE or layer not in _LINK_LAYERS:
        return None
    layer = _LINK_LAYERS[layer]
    if layer != ETHERNET:
        return IbPort(hca, number, layer)
    try:
        indices = sorted(int(i) for i in os.listdir(os.path.join(path, "gids")) if i.isdigit())
    except OSError:
        indices = []
    held = tuple(i for i in indices[:MAX_GIDS]
                 if (_read(os.path.join(path, "gids", str(i))) or "").strip("0:") != "")
    return IbPort(hca, number, layer, held)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read(256).strip()
    except (OSError, UnicodeDecodeError):
        return None  # some drivers refuse to read an unused GID entry (EINVAL)


def describe_failure(exc: BaseException) -> str:
    return clip(f"{type(exc).__name__}: {exc}")
