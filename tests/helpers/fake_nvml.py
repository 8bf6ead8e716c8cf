"""One fake of pynvml for every probe test: the GPU list (capabilities, UUIDs,
MIG slots), peer access (P2P read and write status), the CUDA and kernel
driver versions, and each GPU's fabric record. It raises pynvml's real
exception classes and fills pynvml's real fabric structures, as the driver
would; nothing else of pynvml is imitated."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import pynvml


@dataclasses.dataclass
class Gpu:
    uuid: str
    capability: Tuple[int, int] = (9, 0)
    migs: Optional[List[Optional[str]]] = None  # None: MIG unsupported; None slot: empty


class FakeNvml:
    """``gpus``: a list of :class:`Gpu`, or a count of plain H100s.
    ``fail``: function name -> the exception it raises (every call is
    recorded in ``calls`` first). ``without`` / ``without_write``: ordered
    pairs of GPU indices whose P2P read / write status is not OK (every pair
    asked for read is recorded in ``p2p_asked``). ``driver``: what
    nvmlSystemGetCudaDriverVersion returns; ``kernel``: what
    nvmlSystemGetDriverVersion returns (None: the binding lacks the call).
    ``fabric``: per GPU, the fields of its fabric record, or an exception to
    raise (defaults to one GPU per record). ``hang``: nvmlInit waits on it."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    c_nvmlGpuFabricInfoV_t = pynvml.c_nvmlGpuFabricInfoV_t
    c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t
    NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW = \
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW = \
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW

    def __init__(self, gpus: Union[int, Sequence[Gpu], None] = None, *,
                 fail: Optional[Dict[str, Exception]] = None,
                 without: Iterable[Tuple[int, int]] = (),
                 without_write: Iterable[Tuple[int, int]] = (),
                 driver: int = 12080, kernel: Any = None,
                 fabric: Optional[Sequence[Any]] = None,
                 hang: Optional[threading.Event] = None):
        if gpus is None:
            gpus = len(fabric) if fabric is not None else 0
        if isinstance(gpus, int):
            gpus = [Gpu(f"GPU-{i:08d}-0000-0000-0000-000000000000") for i in range(gpus)]
        self.gpus = list(gpus)
        self.fail = dict(fail or {})
        self.without, self.without_write = set(without), set(without_write)
        self.driver, self.kernel = driver, kernel
        self.fabric = list(fabric or [])
        self.hang = hang
        self.calls: List[str] = []
        self.p2p_asked: List[Tuple[int, int]] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]

    @property
    def shut(self) -> bool:
        return "nvmlShutdown" in self.calls

    def nvmlInit(self):
        self._call("nvmlInit")
        if self.hang is not None:
            self.hang.wait(30)

    def nvmlShutdown(self):
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self):
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._call("nvmlDeviceGetHandleByIndex")
        return ("gpu", index)

    def nvmlDeviceGetUUID(self, handle):
        self._call("nvmlDeviceGetUUID")
        gpu = self.gpus[handle[1]]
        return gpu.uuid if handle[0] == "gpu" else gpu.migs[handle[2]]

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        self._call("nvmlDeviceGetCudaComputeCapability")
        return self.gpus[handle[1]].capability

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        self._call("nvmlDeviceGetMaxMigDeviceCount")
        migs = self.gpus[handle[1]].migs
        if migs is None:
            raise pynvml.NVMLError_NotSupported()
        return len(migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):
        self._call("nvmlDeviceGetMigDeviceHandleByIndex")
        if self.gpus[handle[1]].migs[slot] is None:
            raise pynvml.NVMLError_NotFound()
        return ("mig", handle[1], slot)

    def nvmlSystemGetCudaDriverVersion(self):
        self._call("nvmlSystemGetCudaDriverVersion")
        return self.driver

    def __getattr__(self, name):
        if name == "nvmlSystemGetDriverVersion" and self.kernel is not None:
            return lambda: self.kernel
        raise AttributeError(name)

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        self._call("nvmlDeviceGetP2PStatus")
        # an int, as ctypes can pass it (not pynvml's tuple constant); nvml.h:
        # NVML_P2P_CAPS_INDEX_READ = 0, NVML_P2P_CAPS_INDEX_WRITE = 1
        assert type(index) is int and index in (0, 1)
        pair = (a[1], b[1])
        if index == 0:
            self.p2p_asked.append(pair)
        failing = self.without if index == 0 else self.without_write
        return pynvml.NVML_P2P_STATUS_NOT_SUPPORTED if pair in failing \
            else pynvml.NVML_P2P_STATUS_OK

    def nvmlDeviceGetGpuFabricInfoV(self, handle, info):
        self._call("nvmlDeviceGetGpuFabricInfoV")
        record = self.fabric[handle[1]] if handle[1] < len(self.fabric) \
            else pynvml.NVMLError_NotSupported()
        if isinstance(record, Exception):
            raise record
        for name, value in record.items():
            if name == "clusterUuid":
                for i, byte in enumerate(value):
                    info.clusterUuid[i] = byte
            else:
                setattr(info, name, value)
