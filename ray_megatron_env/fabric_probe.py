"""Finding a node's NVLink fabric facts: the fake variable, NVML, then
``nvidia-smi -q``; the IMEX channel from ``/dev``; and the IMEX daemon's
state from ``nvidia-imex-ctl -N -j`` where that tool answers.

The hardware edge for the ``nccl-fabric`` pack, run only when a job asks
for that pack. Like ``probe.py`` it never raises, never waits longer than
its bounds and never creates a CUDA context: NVML's
``nvmlDeviceGetGpuFabricInfoV`` and ``nvidia-smi -q`` read the driver's
records, and the IMEX channel is a device file checked with ``os.access``.
A fabric that cannot be read is recorded as unknown, and the pack then sets
nothing (leaving NCCL's defaults is what every job does today).

IMEX's state: an unprivileged process cannot ask systemd or read the
daemon's log, and a container sees neither the daemon's process nor, often,
``/etc/nvidia-imex/``. What it can run is the daemon's control tool, which
asks the daemon over its command port: ``nvidia-imex-ctl -N -j`` prints the
domain as JSON, ``{"nodes": {...: {"status": "READY" | ...}}, "status":
"UP" | "DEGRADED" | "DOWN"}``. The probe reads only the domain's ``status``:
UP (every node READY and connected) is ready, DOWN is not ready; anything
else (DEGRADED, where this node may or may not be the one missing; no tool;
no answer within the bound; a refused connection, which also happens when
the daemon's command service is simply switched off) is unknown, and the
pack then leaves IMEX to NCCL's own check.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Sequence, Tuple

from .node import (
    ABSENT, COMPLETED, FAKE_NODE_VARIABLE, HEALTH_DEGRADED, HEALTH_OK, IMEX_NOT_READY,
    IMEX_READY, IN_PROGRESS, NOT_STARTED, NOT_SUPPORTED, SUCCESS, UNWRITABLE, WRITABLE,
    FakeNodeError, GpuFabric, NodeFabric, NodeFacts, decode_health_mask, parse_fake_node,
)
from .probe import (
    FAKE_VARIABLE, NVML_TIMEOUT_S, ROOT_VARIABLE, SMI_TIMEOUT_S, Absent, ProbeError, _bounded,
    probe_gpus, run_smi,
)

if TYPE_CHECKING:  # pragma: no cover
    from .spec import Spec

IMEX_FOLDER = "dev/nvidia-caps-imex-channels"  # channel<N> device files, one per channel
_CHANNEL = re.compile(r"^channel\d+$")
# nvmlGpuFabricState_t 0..3, in NVML's order.
_NVML_STATES = (NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED)
# nvidia-smi -q prints the state in words.
_SMI_STATES = {"n/a": NOT_SUPPORTED, "not supported": NOT_SUPPORTED,
               "not started": NOT_STARTED, "in progress": IN_PROGRESS, "completed": COMPLETED}


IMEX_CTL = ("nvidia-imex-ctl",)
IMEX_TIMEOUT_S = SMI_TIMEOUT_S


def probe_fabric(environ: Mapping[str, str] = os.environ, *, nvml: Any = None,
                 smi_command: Sequence[str] = ("nvidia-smi",),
                 smi_timeout_s: float = SMI_TIMEOUT_S,
                 nvml_timeout_s: float = NVML_TIMEOUT_S,
                 imex_command: Sequence[str] = IMEX_CTL,
                 imex_timeout_s: float = IMEX_TIMEOUT_S) -> NodeFabric:
    """This node's fabric facts. Never raises; bounded in time."""
    try:
        fabric = _probe(environ, nvml, smi_command, smi_timeout_s, nvml_timeout_s)
    except Exception as exc:  # a bug here must not fail every worker start
        return NodeFabric(None, imex_channel(environ), "probe",
                          f"unexpected {type(exc).__name__}: {exc}")
    if fabric.method == "fake" or not fabric.attached:
        return fabric  # IMEX matters only where NCCL would take the MNNVL path
    status, detail = imex_status(imex_command, imex_timeout_s)
    return dataclasses.replace(fabric, imex_status=status, imex_detail=detail)


def imex_status(command: Sequence[str] = IMEX_CTL,
                timeout_s: float = IMEX_TIMEOUT_S) -> Tuple[Optional[str], str]:
    """(ready | not-ready | None for unknown, words saying how it was read)."""
    try:
        text = run_smi(command, ("-N", "-j"), timeout_s)
    except (Absent, ProbeError) as exc:
        return None, f"{command[0]} -N -j: {exc}"
    except Exception as exc:  # never fail a worker over this
        return None, f"{command[0]} -N -j: unexpected {type(exc).__name__}: {exc}"
    return parse_imex_domain(text or "")


def parse_imex_domain(text: str) -> Tuple[Optional[str], str]:
    """``nvidia-imex-ctl -N -j`` output -> (status, words)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None, "nvidia-imex-ctl -N -j printed no JSON"
    domain = data.get("status") if isinstance(data, Mapping) else None
    if domain == "UP":
        return IMEX_READY, "IMEX domain UP (nvidia-imex-ctl -N -j)"
    if domain == "DOWN":
        return IMEX_NOT_READY, "IMEX domain DOWN (nvidia-imex-ctl -N -j)"
    return None, f"IMEX domain status {domain!r} does not say whether this node is ready"


def _probe(environ, nvml, smi_command, smi_timeout_s, nvml_timeout_s) -> NodeFabric:
    fake = environ.get(FAKE_NODE_VARIABLE, "").strip()
    fake_gpus = environ.get(FAKE_VARIABLE, "").strip()
    if fake or fake_gpus:
        # Without "gpus" of its own, the record stands for each fake GPU; fake
        # GPUs alone are a node without fabric (PCIe), not this machine's.
        try:
            return parse_fake_node(fake or "{}", default_gpus=fake_gpus or None)[1]
        except FakeNodeError as exc:
            return NodeFabric(None, ABSENT, "fake", str(exc))
    channel = imex_channel(environ)
    failures: List[str] = []
    for name, run in (("nvml", lambda: _bounded(lambda: _from_nvml(nvml), nvml_timeout_s)),
                      ("nvidia-smi", lambda: _from_smi(smi_command, smi_timeout_s))):
        try:
            gpus, detail = run()
        except ProbeError as exc:
            failures.append(f"{name}: {exc}")
            continue
        if failures:
            detail = f"{detail}; after {'; '.join(failures)}"
        return NodeFabric(gpus, channel, name, detail=detail)
    return NodeFabric(None, channel, "probe", "; ".join(failures))


def probe_node(spec: "Spec", environ: Mapping[str, str] = os.environ) -> NodeFacts:
    """Every fact the packs ``spec`` asks for read about this node, uncached:
    the GPUs always, the fabric and peer access only when one of its packs
    reads them. For a
    caller without the agent's caches (a worker deciding for itself)."""
    from .agent import fact_kinds
    from .p2p_probe import probe_p2p
    from .packs import FABRIC, P2P

    kinds = fact_kinds(spec)
    return NodeFacts(probe_gpus(environ), probe_fabric(environ) if FABRIC in kinds else None,
                     probe_p2p(environ) if P2P in kinds else None)


def imex_channel(environ: Mapping[str, str] = os.environ) -> str:
    """writable: some /dev/nvidia-caps-imex-channels/channel<N> this process
    may open read-write (what CUDA needs to export and import FABRIC
    handles); unwritable: channels exist but none is; absent: none exist."""
    root = environ.get(ROOT_VARIABLE, "/").strip() or "/"
    folder = os.path.join(root, IMEX_FOLDER)
    try:
        channels = sorted(e for e in os.listdir(folder) if _CHANNEL.match(e))
    except OSError:
        return ABSENT
    if not channels:
        return ABSENT
    if any(os.access(os.path.join(folder, c), os.R_OK | os.W_OK) for c in channels):
        return WRITABLE
    return UNWRITABLE


def _from_nvml(nvml: Any) -> Tuple[Tuple[GpuFabric, ...], str]:
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py; loaded on first probe only
        except Exception as exc:
            raise Absent(f"nvidia-ml-py is not importable: {exc}") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise ProbeError(f"nvmlInit failed: {exc}") from None
    try:
        gpus = tuple(_nvml_fabric(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
                     for i in range(nvml.nvmlDeviceGetCount()))
    except nvml.NVMLError as exc:
        raise ProbeError(f"NVML fabric query failed: {exc}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return gpus, f"{len(gpus)} device(s), fabric from NVML"


def _nvml_fabric(nvml: Any, handle: Any) -> GpuFabric:
    """One GPU's record: the versioned call first (it has the health mask),
    then the older one; a GPU or driver without either reports no fabric."""
    for call, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                         ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
        if not hasattr(nvml, call) or not hasattr(nvml, struct):
            continue
        info = getattr(nvml, struct)()
        try:
            getattr(nvml, call)(handle, info)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            continue
        return _record(nvml, info)
    return GpuFabric(NOT_SUPPORTED)


def _record(nvml: Any, info: Any) -> GpuFabric:
    state = _NVML_STATES[info.state] if 0 <= info.state < len(_NVML_STATES) else NOT_SUPPORTED
    status = SUCCESS if info.status == 0 else f"NVML error {info.status}"
    raw = bytes(info.clusterUuid)
    uuid = "-".join((raw[:4].hex(), raw[4:6].hex(), raw[6:8].hex(), raw[8:10].hex(),
                     raw[10:].hex()))
    health = None
    mask = getattr(info, "healthMask", None)
    if mask is not None:
        # NVML's layout (node.HEALTH_FIELDS): DEGRADED_BW is bits 0-1, 1 TRUE
        # (degraded), 2 FALSE, 0 not supported.
        mask = int(mask)
        health = {"true": HEALTH_DEGRADED, "false": HEALTH_OK}.get(
            decode_health_mask(mask).get("degraded_bw"))
    return GpuFabric(state, status, uuid, int(info.cliqueId), health, mask)


def _from_smi(command: Sequence[str], timeout_s: float) -> Tuple[Tuple[GpuFabric, ...], str]:
    text = run_smi(command, ("-q",), timeout_s)
    if text is None:
        return (), "nvidia-smi: no devices"
    gpus = parse_smi_fabric(text)
    if gpus is None:
        raise ProbeError(f"{command[0]} -q printed no Fabric section (a driver before R550?)")
    return gpus, f"{len(gpus)} device(s), fabric from nvidia-smi -q"


_LINE = re.compile(r"^(\s*)([^:]+?)\s*(?::\s*(.*?))?\s*$")


def parse_smi_fabric(text: str) -> Optional[Tuple[GpuFabric, ...]]:
    """The Fabric block of each ``GPU`` section of ``nvidia-smi -q`` output
    (a GPU section without one reports NOT_SUPPORTED); ``None`` when the
    output has no Fabric block at all (a driver too old to print it)."""
    sections: List[dict] = []
    block: Optional[dict] = None
    block_indent, child_indent, in_health = -1, None, False
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match or not line.strip():
            continue
        indent, key, value = len(match.group(1)), match.group(2).strip(), match.group(3)
        if key.startswith("GPU ") and value is None and indent == 0:
            sections.append({})
            block = None
            continue
        if key == "Fabric" and value is None:
            if not sections or sections[-1].get("seen"):  # an excerpt without GPU headers
                sections.append({})
            block = sections[-1]
            block["seen"] = "yes"
            block_indent, child_indent, in_health = indent, None, False
            continue
        if block is None:
            continue
        if indent <= block_indent:
            block = None
            continue
        child_indent = indent if child_indent is None else child_indent
        if indent == child_indent:
            in_health = key == "Health" and value is None
            if not in_health:
                block[key] = (value or "").strip()
        elif in_health and key == "Bandwidth":
            block["bandwidth"] = (value or "").strip()
    if not any(s.get("seen") for s in sections):
        return None
    return tuple(_smi_record(s) for s in sections)


def _smi_record(block: Mapping[str, str]) -> GpuFabric:
    state = _SMI_STATES.get(block.get("State", "N/A").lower(), NOT_SUPPORTED)
    status = block.get("Status")
    status = None if status in (None, "N/A") else (SUCCESS if status.lower() == "success"
                                                    else status)
    uuid = block.get("ClusterUUID")
    uuid = None if uuid in (None, "N/A") else uuid
    clique = block.get("CliqueId")
    clique_id = int(clique) if clique and clique.isdigit() else None
    bandwidth = block.get("bandwidth", "").lower()
    health = HEALTH_OK if bandwidth == "full" else (
        HEALTH_DEGRADED if bandwidth.startswith("degraded") else None)
    return GpuFabric(state, status, uuid, clique_id, health)
