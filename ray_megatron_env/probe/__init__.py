"""The hardware edge: what a node is, read from the node itself.

One entry per kind of fact (``probe_gpus``, ``probe_fabric``,
``probe_p2p``, ``probe_net``; ``probe_node`` for several), each trying its sources in
order: a faked node (``fake``), NVML (``nvml``), the driver's tools
(``smi``), the kernel's listings (``listings``). The promise kept here, for
every kind: it never raises, and never waits longer than its bounds. Any
failure becomes a fact marked unknown with the error text, which the packs
treat conservatively. A node is only recorded as having no GPU when every
source says there is none: NVML that cannot load is not evidence of that.
Nothing here creates a CUDA context or touches GPU memory.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence

from ..node import ABSENT, FakeNodeError, NodeFabric, NodeFacts, NodeGpus, NodeNet, NodeP2P
from ..names import (
    DEVICE_ROOT_VARIABLE as ROOT_VARIABLE, FABRIC, FAKE_GPUS_VARIABLE as FAKE_VARIABLE, GPUS, NET,
    P2P, PROBE_METHOD_VARIABLE as METHOD_VARIABLE,
)
from . import fake, listings, net as net_source, nvml as nvml_source, smi
from .common import (
    Absent, clip, METHODS, NVML_TIMEOUT_S, ProbeError, SMI_TIMEOUT_S, VisibilityError,
)
from .listings import imex_channel
from .smi import IMEX_CTL, IMEX_TIMEOUT_S, parse_imex_domain, parse_smi_fabric

__all__ = ["FAKE_VARIABLE", "METHOD_VARIABLE", "ROOT_VARIABLE", "imex_channel",
           "parse_imex_domain", "parse_smi_fabric", "probe_fabric", "probe_gpus", "probe_net",
           "probe_node", "probe_p2p"]


def probe_gpus(environ: Mapping[str, str] = os.environ, *, nvml: Any = None,
               smi_command: Sequence[str] = ("nvidia-smi",),
               smi_timeout_s: float = SMI_TIMEOUT_S,
               nvml_timeout_s: float = NVML_TIMEOUT_S) -> NodeGpus:
    """The GPUs this node exposes to workers. Never raises; bounded in time."""
    try:
        return _gpus(environ, nvml, smi_command, smi_timeout_s, nvml_timeout_s)
    except Exception as exc:  # a bug here must not fail every worker start
        return NodeGpus.unknown("probe", f"unexpected {type(exc).__name__}: {exc}")


def _gpus(environ, nvml, smi_command, smi_timeout_s, nvml_timeout_s) -> NodeGpus:
    try:
        faked = fake.read(environ)
    except FakeNodeError as exc:
        return NodeGpus.unknown("fake", str(exc))
    if faked is not None and faked.gpus is not None:
        return faked.gpus
    method = environ.get(METHOD_VARIABLE, "auto").strip() or "auto"
    if method not in METHODS:
        return NodeGpus.unknown("probe", f"{METHOD_VARIABLE}={clip(method)!r} is not one of "
                                         f"{', '.join(METHODS)}")
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    failures: List[str] = []  # what each source said, for the decision's reason
    errored = False  # a source was there but failed: not evidence of "no GPU"
    sources = [("nvml", lambda: nvml_source.bounded(lambda: nvml_source.read_gpus(visible, nvml),
                                                    nvml_timeout_s)),
               ("nvidia-smi", lambda: smi.read_gpus(visible, smi_command, smi_timeout_s))]
    for name, run in sources:
        if method not in ("auto", name):
            continue
        try:
            found = run()
            if failures:  # say what was passed over to get here
                found = dataclasses.replace(
                    found, detail=f"{found.detail}; after {'; '.join(failures)}")
            return found
        except VisibilityError as exc:
            return NodeGpus.unknown(name, str(exc))
        except ProbeError as exc:
            failures.append(f"{name}: {exc}")
            errored = errored or not isinstance(exc, Absent)
    if method != "auto":
        return NodeGpus.unknown(method, "; ".join(failures))
    return listings.read_gpus(environ, failures, errored)


def probe_fabric(environ: Mapping[str, str] = os.environ, *, nvml: Any = None,
                 smi_command: Sequence[str] = ("nvidia-smi",),
                 smi_timeout_s: float = SMI_TIMEOUT_S,
                 nvml_timeout_s: float = NVML_TIMEOUT_S,
                 imex_command: Sequence[str] = IMEX_CTL,
                 imex_timeout_s: float = IMEX_TIMEOUT_S) -> NodeFabric:
    """This node's NVLink fabric, IMEX channel and, on a fabric-attached
    node, the IMEX daemon's state. Never raises; bounded in time."""
    try:
        fabric = _fabric(environ, nvml, smi_command, smi_timeout_s, nvml_timeout_s)
    except Exception as exc:  # a bug here must not fail every worker start
        return NodeFabric(None, imex_channel(environ), "probe",
                          f"unexpected {type(exc).__name__}: {exc}")
    if fabric.method == "fake" or not fabric.attached:
        return fabric  # IMEX matters only where NCCL would take the MNNVL path
    status, detail = smi.imex_status(imex_command, imex_timeout_s)
    return dataclasses.replace(fabric, imex_status=status, imex_detail=detail)


def _fabric(environ, nvml, smi_command, smi_timeout_s, nvml_timeout_s) -> NodeFabric:
    try:
        faked = fake.read(environ)
    except FakeNodeError as exc:
        return NodeFabric(None, ABSENT, "fake", str(exc))
    if faked is not None:
        return faked.fabric
    channel = imex_channel(environ)
    failures: List[str] = []
    for name, run in (("nvml", lambda: nvml_source.bounded(lambda: nvml_source.read_fabric(nvml),
                                                           nvml_timeout_s)),
                      ("nvidia-smi", lambda: smi.read_fabric(smi_command, smi_timeout_s))):
        try:
            gpus, detail = run()
        except ProbeError as exc:
            failures.append(f"{name}: {exc}")
            continue
        if failures:
            detail = f"{detail}; after {'; '.join(failures)}"
        return NodeFabric(gpus, channel, name, detail=detail)
    return NodeFabric(None, channel, "probe", "; ".join(failures))


def probe_p2p(environ: Mapping[str, str] = os.environ, *, nvml: Any = None,
              nvml_timeout_s: float = NVML_TIMEOUT_S) -> NodeP2P:
    """Which GPU pairs lack peer access, and the CUDA driver version. Never
    raises; bounded in time."""
    try:
        try:
            faked = fake.read(environ)
        except FakeNodeError as exc:
            return NodeP2P(None, method="fake", error=str(exc))
        if faked is not None:
            return faked.p2p
        try:
            return nvml_source.bounded(lambda: nvml_source.read_p2p(nvml), nvml_timeout_s)
        except ProbeError as exc:
            return NodeP2P(None, error=str(exc))
    except Exception as exc:  # a bug here must not fail every worker start
        return NodeP2P(None, method="probe", error=f"unexpected {type(exc).__name__}: {exc}")


def probe_net(environ: Mapping[str, str] = os.environ,
              node_ip: Optional[str] = None) -> NodeNet:
    """The interfaces that are up with their addresses, the RDMA ports, and
    ``node_ip``, the address Ray gave this node (the caller knows it: the
    agent's command line, a worker's Ray connection). A faked node's
    ``net`` stands for all three. Never raises; nothing here can wait."""
    try:
        try:
            faked = fake.read(environ)
        except FakeNodeError as exc:
            return NodeNet(None, node_ip, method="fake", error=str(exc))
        if faked is not None and faked.net is not None:
            return faked.net
        try:
            return net_source.read_net(environ, node_ip)
        except OSError as exc:
            return NodeNet(None, node_ip, error=net_source.describe_failure(exc))
    except Exception as exc:  # a bug here must not fail every worker start
        return NodeNet(None, node_ip, error=f"unexpected {type(exc).__name__}: {exc}")


def probes(environ: Mapping[str, str] = os.environ,
           node_ip: Optional[str] = None) -> Dict[str, Callable[[], Any]]:
    """The registry of node facts: one probe per kind (``names.GPUS`` and
    ``names.FACT_KINDS``, each also a field of ``NodeFacts``), bound to the
    node's environment and the address Ray gave the node. A new kind of
    fact is one entry here."""
    return {GPUS: lambda: probe_gpus(environ), FABRIC: lambda: probe_fabric(environ),
            P2P: lambda: probe_p2p(environ), NET: lambda: probe_net(environ, node_ip)}


def node_facts(kinds: Collection[str], get: Callable[[str], Any]) -> NodeFacts:
    """``NodeFacts`` with the GPUs and each kind in ``kinds``, each taken
    with ``get(kind)`` (a cache, or a probe run now)."""
    return NodeFacts(get(GPUS), **{kind: get(kind) for kind in kinds})


def probe_node(kinds: Collection[str] = (), environ: Mapping[str, str] = os.environ,
               node_ip: Optional[str] = None) -> NodeFacts:
    """The GPUs and each other kind of fact in ``kinds`` (``fabric``,
    ``p2p``, ``net``: what a job's packs read), uncached."""
    bound = probes(environ, node_ip)
    return node_facts(kinds, lambda kind: bound[kind]())
