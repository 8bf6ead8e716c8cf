"""NVML, the driver's own tables, read without a CUDA context: each GPU's
compute capability (and MIG instances, for UUIDs in CUDA_VISIBLE_DEVICES),
its NVLink fabric record, peer access between every pair, and the CUDA
driver version.

One binding for all of them, loaded on first use: nvidia-ml-py's ``pynvml``,
else the copy Ray bundles (``ray._private.thirdparty.pynvml``), so a bare
Ray node where the package travels with the job (``py_modules``) reads the
fabric and peer access as it reads the GPUs. Every read runs inside one
``session`` (init, shutdown, one error vocabulary) and in a thread
bounded by ``bounded``: a hung driver call is never waited on twice.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional, Tuple

from ..node import (
    COMPLETED, HEALTH_DEGRADED, HEALTH_OK, IN_PROGRESS, NOT_STARTED, NOT_SUPPORTED, SUCCESS,
    Capability, GpuFabric, NodeGpus, NodeP2P, decode_health_mask, parse_driver,
    parse_kernel_driver,
)
from .common import Absent, ProbeError, select_visible, text_of, visible_detail

# nvmlGpuFabricState_t 0..3, in NVML's order.
_NVML_STATES = (NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS, COMPLETED)
# nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_READ and _WRITE, and
# nvmlGpuP2PStatus_t NVML_P2P_STATUS_OK (nvml.h). Written out: the pynvml copy
# Ray bundles defines NVML_P2P_CAPS_INDEX_READ = 0, (a tuple, which ctypes
# cannot pass).
P2P_CAPS_INDEX_READ = 0
P2P_CAPS_INDEX_WRITE = 1
P2P_STATUS_OK = 0

# One NVML call may hang inside the driver; it is never waited on twice.
_nvml_lock = threading.Lock()

_nvml_stuck: Optional[threading.Thread] = None


def bounded(call: Callable[[], Any], timeout_s: float) -> Any:
    """Run an NVML probe in a thread and give up after ``timeout_s``: a hung
    driver call cannot be interrupted, but the caller need not wait for it."""
    global _nvml_stuck
    with _nvml_lock:
        if _nvml_stuck is not None and _nvml_stuck.is_alive():
            raise ProbeError("an earlier NVML call has still not returned")
        box: dict = {}

        def run() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc

        thread = threading.Thread(target=run, name="ray-megatron-env-nvml", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            _nvml_stuck = thread
            raise ProbeError(f"NVML did not answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def binding() -> Any:
    """nvidia-ml-py, loaded on first probe only; else the copy Ray bundles
    (ray._private.thirdparty.pynvml), so a bare Ray node where the worker-side
    fallback runs needs nothing more installed."""
    try:
        import pynvml
        return pynvml
    except Exception as exc:
        first = exc
    try:
        from ray._private.thirdparty import pynvml
        return pynvml
    except Exception:
        raise Absent(f"nvidia-ml-py is not importable: {first}") from None


@contextmanager
def session(nvml: Any, what: str) -> Iterator[Any]:
    """An initialised NVML (``nvml``, or the binding when None); any NVML
    error inside becomes a ``ProbeError`` naming ``what`` was read."""
    nvml = binding() if nvml is None else nvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        if isinstance(exc, getattr(nvml, "NVMLError_LibraryNotFound", ())):
            raise Absent("the NVML library (libnvidia-ml) cannot be loaded") from None
        raise ProbeError(f"nvmlInit failed: {exc}") from None
    try:
        yield nvml
    except nvml.NVMLError as exc:
        raise ProbeError(f"NVML {what} query failed: {exc}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _handles(nvml: Any) -> List[Any]:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]


# --- compute capability -------------------------------------------------------------

def read_gpus(visible: Optional[str], nvml: Any = None) -> NodeGpus:
    with session(nvml, "device") as nvml:
        devices, migs = [], []
        for handle in _handles(nvml):
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            capability = (int(major), int(minor))
            devices.append((text_of(nvml.nvmlDeviceGetUUID(handle)), capability))
            if visible and "MIG-" in visible:
                migs.extend(_mig_devices(nvml, handle, capability))
        capabilities = select_visible(visible, devices, migs)
    return NodeGpus.known(capabilities, "nvml", detail=visible_detail(visible, len(devices)))


def _mig_devices(nvml: Any, handle: Any, capability: Capability) -> List[tuple]:
    """MIG instances carry their parent's capability; listed only so that a
    MIG-... UUID in CUDA_VISIBLE_DEVICES resolves (indices never name them)."""
    get_count = getattr(nvml, "nvmlDeviceGetMaxMigDeviceCount", None)
    if get_count is None:
        return []
    found = []
    try:
        for i in range(get_count(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                found.append((text_of(nvml.nvmlDeviceGetUUID(mig)), capability))
            except nvml.NVMLError:
                continue  # an empty MIG slot
    except nvml.NVMLError:
        return []  # MIG not supported or not enabled on this GPU
    return [(uuid, cap) for uuid, cap in found if uuid.startswith("MIG-")]


# --- the NVLink fabric ---------------------------------------------------------------

def read_fabric(nvml: Any = None) -> Tuple[Tuple[GpuFabric, ...], str]:
    with session(nvml, "fabric") as nvml:
        gpus = tuple(_fabric(nvml, handle) for handle in _handles(nvml))
    return gpus, f"{len(gpus)} device(s), fabric from NVML"


def _fabric(nvml: Any, handle: Any) -> GpuFabric:
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
        return _record(info)
    return GpuFabric(NOT_SUPPORTED)

def _record(info: Any) -> GpuFabric:
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


# --- peer access and the CUDA driver ---------------------------------------------------

def read_p2p(nvml: Any = None) -> NodeP2P:
    with session(nvml, "P2P") as nvml:
        try:
            driver = parse_driver(int(nvml.nvmlSystemGetCudaDriverVersion()))
        except nvml.NVMLError:
            driver = None  # the pack reads an unreported driver as an old one
        kernel = _kernel_driver(nvml)
        handles = _handles(nvml)
        without = tuple(
            (i, j) for i in range(len(handles)) for j in range(i + 1, len(handles))
            if not _peer(nvml, handles[i], handles[j]) or not _peer(nvml, handles[j], handles[i]))
    return NodeP2P(len(handles), without, driver, "nvml",
                   detail=f"{len(handles)} device(s), P2P read and write status for each pair "
                          "from NVML", kernel_driver=kernel)


def _kernel_driver(nvml: Any) -> Optional[str]:
    """The kernel driver's version (``nvmlSystemGetDriverVersion``: "the
    system's graphics driver", libnvidia-ml of the kernel module's release,
    which CUDA forward compatibility does not replace); ``None`` when NVML
    does not say or says something else."""
    try:
        text = text_of(nvml.nvmlSystemGetDriverVersion()).strip()
        parse_kernel_driver(text)
    except (nvml.NVMLError, ValueError, AttributeError):
        return None
    return text


def _peer(nvml: Any, a: Any, b: Any) -> bool:
    """NCCL's own test (src/graph/paths.cc, ncclTopoCheckP2p):
    the read AND the write status must be OK."""
    return all(int(nvml.nvmlDeviceGetP2PStatus(a, b, index)) == P2P_STATUS_OK
               for index in (P2P_CAPS_INDEX_READ, P2P_CAPS_INDEX_WRITE))
