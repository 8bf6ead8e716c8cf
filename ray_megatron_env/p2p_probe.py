"""Finding which of a node's GPUs lack peer access, and its CUDA driver
version: the fake variables, then NVML.

The hardware edge for the ``nccl-host-mem`` pack, run only when a job asks
for a pack that reads these facts. Like ``probe.py`` it never raises, never
waits longer than its bound and never creates a CUDA context: NVML's
``nvmlDeviceGetP2PStatus`` (for every pair, read capability) and
``nvmlSystemGetCudaDriverVersion`` read the driver's own tables. Facts that
cannot be read are recorded as unknown, and the pack then sets nothing.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from .node import FAKE_NODE_VARIABLE, FakeNodeError, NodeP2P, parse_driver, parse_fake_p2p
from .probe import FAKE_VARIABLE, NVML_TIMEOUT_S, ProbeError, _bounded, _nvml_binding

# nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_READ and nvmlGpuP2PStatus_t
# NVML_P2P_STATUS_OK (nvml.h). Written out: the pynvml copy Ray bundles
# defines NVML_P2P_CAPS_INDEX_READ = 0, (a tuple, which ctypes cannot pass).
P2P_CAPS_INDEX_READ = 0
P2P_STATUS_OK = 0


def probe_p2p(environ: Mapping[str, str] = os.environ, *, nvml: Any = None,
              nvml_timeout_s: float = NVML_TIMEOUT_S) -> NodeP2P:
    """This node's peer-access pairs and CUDA driver. Never raises; bounded."""
    try:
        fake = environ.get(FAKE_NODE_VARIABLE, "").strip()
        fake_gpus = environ.get(FAKE_VARIABLE, "").strip()
        if fake or fake_gpus:
            # As for the fabric: without "gpus" of its own the record stands
            # for the fake GPUs; fake GPUs alone have peer access everywhere.
            try:
                return parse_fake_p2p(fake or "{}", default_gpus=fake_gpus or None)
            except FakeNodeError as exc:
                return NodeP2P(None, method="fake", error=str(exc))
        try:
            return _bounded(lambda: _from_nvml(nvml), nvml_timeout_s)
        except ProbeError as exc:
            return NodeP2P(None, error=str(exc))
    except Exception as exc:  # a bug here must not fail every worker start
        return NodeP2P(None, method="probe", error=f"unexpected {type(exc).__name__}: {exc}")


def _from_nvml(nvml: Any) -> NodeP2P:
    if nvml is None:
        nvml = _nvml_binding()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise ProbeError(f"nvmlInit failed: {exc}") from None
    try:
        try:
            driver = parse_driver(int(nvml.nvmlSystemGetCudaDriverVersion()))
        except nvml.NVMLError:
            driver = None  # the pack reads an unreported driver as an old one
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        without = tuple(
            (i, j) for i in range(len(handles)) for j in range(i + 1, len(handles))
            if not _peer(nvml, handles[i], handles[j]) or not _peer(nvml, handles[j], handles[i]))
    except nvml.NVMLError as exc:
        raise ProbeError(f"NVML P2P query failed: {exc}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return NodeP2P(len(handles), without, driver, "nvml",
                   detail=f"{len(handles)} device(s), P2P read status for each pair from NVML")


def _peer(nvml: Any, a: Any, b: Any) -> bool:
    return int(nvml.nvmlDeviceGetP2PStatus(a, b, P2P_CAPS_INDEX_READ)) == P2P_STATUS_OK
