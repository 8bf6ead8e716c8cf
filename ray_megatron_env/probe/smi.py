"""The driver's command-line tools, bounded: ``nvidia-smi`` for each GPU's
compute capability (``--query-gpu``) and fabric record (``-q``), and
``nvidia-imex-ctl -N -j`` for the IMEX domain's state."""

from __future__ import annotations

import json
import re
from typing import List, Mapping, Optional, Sequence, Tuple

from ..node import (
    COMPLETED, HEALTH_DEGRADED, HEALTH_OK, IMEX_NOT_READY, IMEX_READY, IN_PROGRESS, NOT_STARTED,
    NOT_SUPPORTED, SUCCESS, GpuFabric, NodeGpus, parse_capability,
)
from .common import (
    SMI_TIMEOUT_S, Absent, ProbeError, clip, run_command, select_visible, visible_detail,
)

# nvidia-smi -q prints the state in words.
_SMI_STATES = {"n/a": NOT_SUPPORTED, "not supported": NOT_SUPPORTED,
               "not started": NOT_STARTED, "in progress": IN_PROGRESS, "completed": COMPLETED}

IMEX_CTL = ("nvidia-imex-ctl",)

IMEX_TIMEOUT_S = SMI_TIMEOUT_S


# --- nvidia-smi -------------------------------------------------------------------------

def read_gpus(visible: Optional[str], command: Sequence[str], timeout_s: float) -> NodeGpus:
    text = run_command(command, ("--query-gpu=index,uuid,compute_cap", "--format=csv,noheader"),
                   timeout_s)
    if text is None:
        return NodeGpus.known((), "nvidia-smi", detail="nvidia-smi: no devices")
    devices = []
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        fields = [f.strip() for f in line.split(",")]
        try:
            if len(fields) != 3 or int(fields[0]) != len(devices):
                raise ValueError("expected 'index, uuid, compute_cap'")
            devices.append((fields[1], parse_capability(fields[2])))
        except ValueError:
            raise ProbeError(f"unexpected {command[0]} output line {clip(line)!r}") from None
    return NodeGpus.known(select_visible(visible, devices), "nvidia-smi",
                          detail=visible_detail(visible, len(devices)))


def read_fabric(command: Sequence[str], timeout_s: float) -> Tuple[Tuple[GpuFabric, ...], str]:
    text = run_command(command, ("-q",), timeout_s)
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


# --- nvidia-imex-ctl ---------------------------------------------------------------------

def imex_status(command: Sequence[str] = IMEX_CTL,
                timeout_s: float = IMEX_TIMEOUT_S) -> Tuple[Optional[str], str]:
    """(ready | not-ready | None for unknown, words saying how it was read)."""
    try:
        text = run_command(command, ("-N", "-j"), timeout_s)
    except (Absent, ProbeError) as exc:
        return None, f"{command[0]} -N -j: {exc}"
    except Exception as exc:  # never fail a worker over this
        return None, f"{command[0]} -N -j: unexpected {type(exc).__name__}: {exc}"
    return parse_imex_domain(text or "")

def parse_imex_domain(text: str) -> Tuple[Optional[str], str]:
    """``nvidia-imex-ctl -N -j`` output -> (status, words), from the
    domain-wide ``status``. The node's own entry under ``nodes`` is not used:
    it names the node only by the address in the IMEX nodes config
    (``host``), which the probe cannot tie to one of the node's interfaces
    without guessing, and MNNVL imports memory exported by other trays, whose
    daemons matter as much (docs/packs.md, "IMEX status unknown")."""
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
