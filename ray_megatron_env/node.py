"""What a node is, as the packs need it: its GPUs (compute capabilities, or
another vendor's accelerators), the NVLink fabric of each GPU and the IMEX
channel and daemon, which GPU pairs lack peer access under which CUDA
driver, and its network interfaces with the address Ray uses for it.

Pure data, and the reader of a GPU list (``parse_gpu_list``:
``RAY_MEGATRON_ENV_FAKE_GPUS``, ``explain --gpus``, a record's ``gpus``); a
whole node given as JSON is read beside the fake probe (``probe/fake.py``).
The probe fills the same types in from the hardware.

The fabric words follow NVML's ``nvmlGpuFabricInfoV_t`` (``state``,
``status``, ``clusterUuid``, ``cliqueId``, ``healthMask``), which is also
what NCCL reads for every rank (NCCL ``src/init.cc``, ``fillInfo``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

# The kinds of node fact (the GPUs, always read; those read only for a job
# whose packs need them, ``Pack.fact_kinds``), handed on from their home.
from .names import FABRIC, GPUS, NET, P2P

Capability = Tuple[int, int]

# Accelerators other than NVIDIA's, by the id the decision records
# (``gpus: ["ascend"]``) -> the words a reason uses. Their runtimes do not
# read CUDA_DEVICE_MAX_CONNECTIONS; only Python code (Megatron's asserts)
# does, so the policy gives them a class of their own (docs/rules.md).
AMD = "amd"
ASCEND = "ascend"
MUSA = "musa"
VENDORS = {
    AMD: "AMD (ROCm) GPUs",
    ASCEND: "Huawei Ascend NPUs",
    MUSA: "Moore Threads (MUSA) GPUs",
}
# What ``RAY_MEGATRON_ENV_FAKE_GPUS`` and ``explain --gpus`` accept for each.
VENDOR_TOKENS = {"amd": AMD, "npu": ASCEND, "ascend": ASCEND, "musa": MUSA}

_CAPABILITY = re.compile(r"^\s*(\d{1,2})\.(\d{1,2})\s*$")


def parse_capability(text: str) -> Capability:
    """``"9.0"`` -> ``(9, 0)``; raises ``ValueError`` for anything else."""
    match = _CAPABILITY.match(text)
    if not match:
        raise ValueError(f"not a compute capability like '9.0': {text!r}")
    return int(match.group(1)), int(match.group(2))


def format_capability(capability: Capability) -> str:
    return f"{capability[0]}.{capability[1]}"


class FakeNodeError(ValueError):
    """A node's facts given as text (RAY_MEGATRON_ENV_FAKE_NODE or _FAKE_GPUS,
    explain's --node or --gpus) are not what they must be."""


def parse_gpu_list(gpus: Union[str, Sequence[str]], method: str = "given", *,
                   where: str = "gpus", detail: Optional[str] = None) -> "NodeGpus":
    """The one reader of a GPU list: ``"9.0,9.0,10.0"`` (or a list of such)
    -> those capabilities; ``"none"`` or ``""`` -> no GPU; a vendor's name
    (``amd``; ``npu`` or ``ascend``; ``musa``) -> a node with that vendor's
    accelerators. Raises ``FakeNodeError`` naming ``where``."""
    items = [str(item).strip() for item in (gpus.split(",") if isinstance(gpus, str) else gpus)]
    if [item.lower() for item in items] in ([], [""], ["none"]):
        return NodeGpus.known((), method, detail=detail)
    if len(items) == 1 and items[0].lower() in VENDOR_TOKENS:
        return NodeGpus.other(VENDOR_TOKENS[items[0].lower()], method, detail=detail)
    try:
        return NodeGpus.known([parse_capability(item) for item in items], method, detail=detail)
    except ValueError as exc:
        raise FakeNodeError(f"{where}: {exc}; or one of none, {', '.join(VENDOR_TOKENS)}") \
            from None


@dataclass(frozen=True)
class NodeGpus:
    """The NVIDIA GPUs one node exposes to its workers.

    ``capabilities`` is ``()`` for a node without NVIDIA GPUs and ``None``
    when the probe failed, so the policy can tell "none" from "unknown".
    ``vendor`` names another vendor's accelerators (``VENDORS``) on a node
    without NVIDIA GPUs.
    """

    capabilities: Optional[Tuple[Capability, ...]]
    method: str
    error: Optional[str] = None
    vendor: Optional[str] = None
    detail: Optional[str] = None  # what the probe saw, for operators
    probed_at: Optional[float] = None
    probe_pid: Optional[int] = None

    @classmethod
    def known(cls, capabilities: Sequence[Capability], method: str, **kw) -> "NodeGpus":
        return cls(tuple(capabilities), method, None, **kw)

    @classmethod
    def unknown(cls, method: str, error: str, **kw) -> "NodeGpus":
        return cls(None, method, error, **kw)

    @classmethod
    def other(cls, vendor: str, method: str, **kw) -> "NodeGpus":
        return cls((), method, None, vendor, **kw)

    @property
    def is_known(self) -> bool:
        return self.capabilities is not None

    @property
    def oldest(self) -> Optional[Capability]:
        """The GPU that decides a mixed node: the oldest architecture."""
        return min(self.capabilities) if self.capabilities else None

    def labels(self) -> Optional[list]:
        if self.capabilities is None:
            return None
        if self.vendor is not None:
            return [self.vendor]
        return [format_capability(c) for c in self.capabilities]

    def describe(self) -> str:
        """Words for a reason sentence: 'compute capability 9.0', etc."""
        if self.capabilities is None:
            return f"unknown GPUs ({self.method} probe failed: {self.error})"
        if not self.capabilities:
            return VENDORS.get(self.vendor, self.vendor) if self.vendor else "no NVIDIA GPU"
        distinct = sorted(set(self.capabilities))
        oldest = format_capability(distinct[0])
        if len(distinct) == 1:
            return f"compute capability {oldest}"
        others = ", ".join(format_capability(c) for c in distinct)
        return f"compute capability {oldest} (the oldest of {others})"


# NVML's nvmlGpuFabricState_t, in its own order (0..3).
NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED = (
    "not_supported", "not_started", "in_progress", "completed")
FABRIC_STATES = (NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED)
SUCCESS = "success"
HEALTH_OK, HEALTH_DEGRADED = "ok", "degraded"
HEALTHS = (HEALTH_OK, HEALTH_DEGRADED)
# /dev/nvidia-caps-imex-channels/channel<N> as the worker sees it.
WRITABLE, UNWRITABLE, ABSENT = "writable", "unwritable", "absent"
IMEX_CHANNELS = (WRITABLE, UNWRITABLE, ABSENT)
# The IMEX daemon's own state as the node could read it (``nvidia-imex-ctl
# -N -j``); None: unknown (tool absent, no answer, or an answer that does
# not settle it).
IMEX_READY, IMEX_NOT_READY = "ready", "not-ready"
IMEX_STATUSES = (IMEX_READY, IMEX_NOT_READY)

# NVML's fabric health mask (nvml.h, NVML_GPU_FABRIC_HEALTH_MASK_*; the same
# constants in nvidia-ml-py's pynvml): (field, shift, width, {value: word}).
# A field reads 0 where the driver does not report it.
HEALTH_FIELDS = (
    ("degraded_bw", 0, 0x3, {1: "true", 2: "false"}),
    ("route_recovery", 2, 0x3, {1: "true", 2: "false"}),
    ("route_unhealthy", 4, 0x3, {1: "true", 2: "false"}),
    ("access_timeout_recovery", 6, 0x3, {1: "true", 2: "false"}),
    ("incorrect_configuration", 8, 0xF,
     {1: "none", 2: "incorrect_sysguid", 3: "incorrect_chassis_sn", 4: "no_partition",
      5: "insufficient_nvlinks", 6: "incompatible_gpu_fw", 7: "invalid_location",
      8: "gpu_state_invalid"}),
    ("partition_assigned", 12, 0x3, {1: "true", 2: "false"}),
    ("gfm_state", 14, 0x3, {1: "connected", 2: "disconnected"}),
)
# The value of each field that says something is wrong (the others say it
# is fine or are not reported).
_HEALTH_PROBLEMS = {"degraded_bw": ("true",), "route_recovery": ("true",),
                    "route_unhealthy": ("true",), "access_timeout_recovery": ("true",),
                    "incorrect_configuration": ("incorrect_sysguid", "incorrect_chassis_sn",
                                                "no_partition", "insufficient_nvlinks",
                                                "incompatible_gpu_fw", "invalid_location",
                                                "gpu_state_invalid"),
                    "partition_assigned": ("false",), "gfm_state": ("disconnected",)}


def decode_health_mask(mask: int) -> dict:
    """NVML's health mask, field by field: ``{field: word}`` for each field
    the driver reports (a field reading 0, not supported, is left out)."""
    out = {}
    for name, shift, width, words in HEALTH_FIELDS:
        value = (mask >> shift) & width
        if value:
            out[name] = words.get(value, f"unknown({value})")
    return out


def health_problems(mask: int) -> Tuple[str, ...]:
    """``field=word`` for each field of the mask that reports a problem."""
    return tuple(f"{name}={word}" for name, word in decode_health_mask(mask).items()
                 if word in _HEALTH_PROBLEMS.get(name, ()))
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class GpuFabric:
    """One GPU's NVLink fabric record."""

    state: str  # one of FABRIC_STATES
    status: Optional[str] = None  # "success", or NVML's error words; None: not reported
    cluster_uuid: Optional[str] = None  # None or the zero UUID: no multi-node NVLink domain
    clique_id: Optional[int] = None
    health: Optional[str] = None  # ok | degraded | None (not reported): NVML's DEGRADED_BW
    health_mask: Optional[int] = None  # NVML's whole healthMask, when read from NVML

    @property
    def completed(self) -> bool:
        return self.state == COMPLETED

    @property
    def health_problems(self) -> Tuple[str, ...]:
        """What the health mask (or, without one, the bandwidth word) says is wrong."""
        if self.health_mask is not None:
            return health_problems(self.health_mask)
        return ("degraded_bw=true",) if self.health == HEALTH_DEGRADED else ()

    @property
    def has_cluster(self) -> bool:
        # NCCL src/mnnvl.cc: a zero cluster UUID means no MNNVL fabric info.
        return bool(self.cluster_uuid) and self.cluster_uuid.strip("0-") != ""

    @property
    def ready(self) -> bool:
        return self.state == COMPLETED and self.status == SUCCESS


@dataclass(frozen=True)
class NodeFabric:
    """The fabric facts of one node. ``gpus`` is ``None`` when they could not
    be read (``error`` says why); ``()`` on a node without NVIDIA GPUs."""

    gpus: Optional[Tuple[GpuFabric, ...]]
    imex_channel: str  # writable | unwritable | absent
    method: str
    error: Optional[str] = None
    detail: Optional[str] = None
    probed_at: Optional[float] = None
    probe_pid: Optional[int] = None
    imex_status: Optional[str] = None  # ready | not-ready | None (unknown)
    imex_detail: Optional[str] = None

    @property
    def is_known(self) -> bool:
        return self.gpus is not None

    @property
    def switched(self) -> bool:
        """The GPUs sit behind NVSwitches: NVML reports a fabric state other
        than NOT_SUPPORTED (PCIe and NVLink-bridge GPUs report NOT_SUPPORTED)."""
        return bool(self.gpus) and any(g.state != NOT_SUPPORTED for g in self.gpus)

    @property
    def attached(self) -> bool:
        """NCCL's own condition for taking the MNNVL path (src/mnnvl.cc,
        ncclMnnvlCheck): every GPU's fabric state COMPLETED and a non-zero
        cluster UUID. The status field is not tested, as NCCL does not."""
        return bool(self.gpus) and all(g.completed and g.has_cluster for g in self.gpus)

    @property
    def registration_failed(self) -> bool:
        """Attached, but some GPU's completed registration reports an error
        status (NVML: status is meaningful once the state is COMPLETED)."""
        return self.attached and any(g.status not in (None, SUCCESS) for g in self.gpus)

    @property
    def ready(self) -> bool:
        return bool(self.gpus) and all(g.ready for g in self.gpus)

    @property
    def degraded(self) -> bool:
        return bool(self.gpus) and any(g.health == HEALTH_DEGRADED for g in self.gpus)

    @property
    def health_problems(self) -> Tuple[str, ...]:
        """Every problem any GPU's health reports, once each, in order."""
        seen = {}
        for gpu in self.gpus or ():
            for problem in gpu.health_problems:
                seen.setdefault(problem, None)
        return tuple(seen)

    def describe(self) -> str:
        """Words for a reason sentence."""
        if self.gpus is None:
            return f"fabric unknown ({self.method}: {self.error})"
        if not self.gpus:
            return "no NVIDIA GPU fabric"
        states = sorted({g.state for g in self.gpus})
        words = f"fabric {'/'.join(states)}"
        statuses = sorted({g.status for g in self.gpus if g.status})
        if statuses and statuses != [SUCCESS]:
            words += f" (status {'/'.join(statuses)})"
        uuids = sorted({g.cluster_uuid for g in self.gpus if g.has_cluster})
        if uuids:
            words += f", cluster {uuids[0]}"
        imex = self.imex_status or "unknown"
        return f"{words}, IMEX channel {self.imex_channel}, IMEX {imex}"

    def to_dict(self) -> dict:
        return {"method": self.method, "error": self.error, "detail": self.detail,
                "imex_channel": self.imex_channel, "imex_status": self.imex_status,
                "imex_detail": self.imex_detail,
                "gpus": None if self.gpus is None else [
                    {"state": g.state, "status": g.status, "cluster_uuid": g.cluster_uuid,
                     "clique_id": g.clique_id, "health": g.health,
                     "health_mask": g.health_mask} for g in self.gpus]}


# --- Peer access and the CUDA driver version (the nccl-host-mem pack) ------
# Kept apart so it can move with the probe; ``p2p_probe.py`` fills it in.

P2P_ALL, P2P_NONE = "all", "none"


def format_driver(version: Tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def parse_driver(text: str) -> Tuple[int, int]:
    """``"12.8"`` -> ``(12, 8)``; NVML's integer ``12080`` -> ``(12, 8)``."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text // 1000, (text % 1000) // 10
    match = re.match(r"^\s*(\d{1,3})\.(\d{1,2})\s*$", str(text))
    if not match:
        raise ValueError(f"not a CUDA driver version like '12.8': {text!r}")
    return int(match.group(1)), int(match.group(2))


_KERNEL_DRIVER = re.compile(r"^\s*(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?\s*$")


def parse_kernel_driver(text: Any) -> Tuple[int, ...]:
    """The kernel driver's version as NVML's ``nvmlSystemGetDriverVersion``
    (and ``/proc/driver/nvidia/version``) write it: ``"570.172.08"`` ->
    ``(570, 172, 8)``."""
    match = _KERNEL_DRIVER.match(str(text))
    if not match:
        raise ValueError(f"not a kernel driver version like '570.172.08': {text!r}")
    return tuple(int(part) for part in match.groups() if part is not None)


@dataclass(frozen=True)
class NodeP2P:
    """Which pairs of the node's NVIDIA GPUs lack peer access (NVML's P2P
    read and write status, both as NCCL requires), over every GPU on the node
    (NCCL's ranks on one node may use any of them), the CUDA driver version
    NVML reports (``nvmlSystemGetCudaDriverVersion``: the installed libcuda's,
    which CUDA forward compatibility raises) and the kernel driver's version
    (``nvmlSystemGetDriverVersion``, which it does not). ``count`` is ``None``
    when they could not be read (``error`` says why)."""

    count: Optional[int]  # NVIDIA GPUs on the node
    without: Tuple[Tuple[int, int], ...] = ()  # pairs (i < j) without peer access
    cuda_driver: Optional[Tuple[int, int]] = None  # None: not reported
    method: str = "nvml"
    error: Optional[str] = None
    detail: Optional[str] = None
    probed_at: Optional[float] = None
    probe_pid: Optional[int] = None
    kernel_driver: Optional[str] = None  # "570.172.08"; None: unknown

    @property
    def is_known(self) -> bool:
        return self.count is not None

    def describe(self) -> str:
        """Words for a reason sentence."""
        if self.count is None:
            return f"peer access unknown ({self.method}: {self.error})"
        driver = ("CUDA driver not reported" if self.cuda_driver is None
                  else f"CUDA driver {format_driver(self.cuda_driver)}")
        if self.kernel_driver is not None:
            driver += f", kernel driver {self.kernel_driver}"
        pairs = self.count * (self.count - 1) // 2
        if not self.without:
            access = "peer access between every pair" if pairs else "no GPU pair"
        elif len(self.without) == pairs:
            access = "no peer access between any pair"
        else:
            shown = ", ".join(f"{i}-{j}" for i, j in self.without[:4])
            more = f" and {len(self.without) - 4} more" if len(self.without) > 4 else ""
            access = f"no peer access between GPUs {shown}{more}"
        return f"{self.count} NVIDIA GPU(s), {access}, {driver}"

    def to_dict(self) -> dict:
        return {"count": self.count, "without": [list(p) for p in self.without],
                "cuda_driver": None if self.cuda_driver is None else list(self.cuda_driver),
                "kernel_driver": self.kernel_driver,
                "method": self.method, "error": self.error, "detail": self.detail}


# --- Network interfaces and RDMA ports (the net-ifaces pack) ------------------

INFINIBAND, ETHERNET = "infiniband", "ethernet"  # an RDMA port's link layer
LINK_LAYERS = (INFINIBAND, ETHERNET)


def same_address(a: str, b: str) -> bool:
    """Two IP addresses as text are the same address (``::1`` is ``0::1``)."""
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


@dataclass(frozen=True)
class IbPort:
    """One active port of an RDMA device (an HCA), as NCCL lists them
    (src/transport/net_ib/init.cc: ``IBV_PORT_ACTIVE``, link layer InfiniBand
    or Ethernet): its link layer, and for an Ethernet (RoCE) port the indices
    of its GID table that hold a GID (not all zeros)."""

    hca: str
    port: int
    link_layer: str  # infiniband | ethernet
    gids: Tuple[int, ...] = ()


@dataclass(frozen=True)
class NodeNet:
    """The node's network interfaces that are up (``IFF_UP`` and
    ``IFF_RUNNING``, as NCCL requires), each with its IPv4 and IPv6
    addresses, the address Ray uses for this node (``node_ip``: the raylet's
    ``--node-ip-address``; ``None`` when unknown), and its active RDMA ports
    (``ib``; ``None`` when they were not read). ``ifaces`` is ``None`` when
    the interfaces could not be read (``error`` says why)."""

    ifaces: Optional[Tuple[Tuple[str, Tuple[str, ...]], ...]]
    node_ip: Optional[str] = None
    ib: Optional[Tuple[IbPort, ...]] = None
    method: str = "probe"
    error: Optional[str] = None
    detail: Optional[str] = None
    probed_at: Optional[float] = None
    probe_pid: Optional[int] = None

    @property
    def is_known(self) -> bool:
        return self.ifaces is not None

    def addresses(self) -> Dict[str, Tuple[str, ...]]:
        return dict(self.ifaces or ())

    @property
    def ray_iface(self) -> Optional[str]:
        """The interface that is up and carries Ray's node IP: one every
        other node of the cluster already reaches (Ray's own traffic runs
        there). ``None`` when the IP is unknown or on no interface that is up."""
        if self.node_ip is None:
            return None
        return next((name for name, addresses in self.ifaces or ()
                     if any(same_address(a, self.node_ip) for a in addresses)), None)

    def describe(self) -> str:
        """Words for a reason sentence."""
        if self.ifaces is None:
            return f"interfaces unknown ({self.method}: {self.error})"
        shown = ", ".join(name for name, _ in self.ifaces[:8]) or "none"
        more = f" and {len(self.ifaces) - 8} more" if len(self.ifaces) > 8 else ""
        if self.node_ip is None:
            ray = "Ray's node IP unknown"
        else:
            iface = self.ray_iface
            ray = f"Ray's node IP {self.node_ip} " + (f"on {iface}" if iface else
                                                      "on no interface that is up")
        return f"interfaces up: {shown}{more}; {ray}"

    def to_dict(self) -> dict:
        return {"node_ip": self.node_ip, "method": self.method, "error": self.error,
                "detail": self.detail,
                "ifaces": None if self.ifaces is None else {n: list(a) for n, a in self.ifaces},
                "ib": None if self.ib is None else [dataclasses.asdict(p) for p in self.ib]}


@dataclass(frozen=True)
class NodeFacts:
    """Everything the packs read about one node. ``fabric``, ``p2p`` and
    ``net`` are ``None`` when no pack the job asked for needs them (they are
    then never probed)."""

    gpus: NodeGpus
    fabric: Optional[NodeFabric] = None
    p2p: Optional[NodeP2P] = None
    net: Optional[NodeNet] = None


# --- A node's facts as JSON (the workers' per-node cache, check's probe actor) ----------

def facts_from_record(kind: str, data: Dict[str, Any]) -> Any:
    """``dataclasses.asdict`` of a ``NodeGpus`` (``gpus``), ``NodeFabric``
    (``fabric``), ``NodeP2P`` (``p2p``) or ``NodeNet`` (``net``), read back. Fields this version
    does not know are dropped."""
    if kind == GPUS:
        values = _known_fields(NodeGpus, data)
        caps = values.get("capabilities")
        values["capabilities"] = None if caps is None else tuple(tuple(c) for c in caps)
        return NodeGpus(**values)
    if kind == FABRIC:
        values = _known_fields(NodeFabric, data)
        gpus = values.get("gpus")
        values["gpus"] = None if gpus is None else tuple(
            GpuFabric(**_known_fields(GpuFabric, g)) for g in gpus)
        return NodeFabric(**values)
    if kind == P2P:
        values = _known_fields(NodeP2P, data)
        values["without"] = tuple(tuple(p) for p in values.get("without") or ())
        driver = values.get("cuda_driver")
        values["cuda_driver"] = None if driver is None else tuple(driver)
        return NodeP2P(**values)
    if kind == NET:
        values = _known_fields(NodeNet, data)
        ifaces = values.get("ifaces")
        values["ifaces"] = None if ifaces is None else tuple(
            (name, tuple(addresses)) for name, addresses in ifaces)
        ib = values.get("ib")
        values["ib"] = None if ib is None else tuple(
            IbPort(**{**_known_fields(IbPort, p), "gids": tuple(p.get("gids") or ())})
            for p in ib)
        return NodeNet(**values)
    raise ValueError(f"unknown kind of node fact {kind!r}")


def _known_fields(cls: type, data: Mapping[str, Any]) -> Dict[str, Any]:
    known = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in known}
