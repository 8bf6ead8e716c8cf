"""The kernel's own listings, when NVML and nvidia-smi cannot say: NVIDIA's
device folders under /proc, AMD's /dev/kfd, Ascend's and Moore Threads'
device nodes in /dev, and the IMEX channels in /dev. Plain files: nothing
runs, nothing can hang."""

from __future__ import annotations

import os
import re
from typing import List, Mapping, Optional

from ..node import ABSENT, AMD, ASCEND, MUSA, UNWRITABLE, WRITABLE, NodeGpus
from .common import clip, root
from ..names import DEVICE_ROOT_VARIABLE as ROOT_VARIABLE

NVIDIA_LISTING = "proc/driver/nvidia/gpus"  # one folder per device, from the kernel module

AMD_DEVICE = "dev/kfd"  # the ROCm compute device; present when an AMD GPU driver is loaded

DEVICE_FOLDER = "dev"

# One device node per accelerator, as the vendors' container runtimes hand
# them to containers: Ascend's driver creates /dev/davinci<N> for each NPU
# (beside the shared davinci_manager, devmm_svm and hisi_hdc nodes, which are
# not devices); Moore Threads' driver creates /dev/mtgpu.<N> (some releases
# and docs spell it /dev/mtgpu<N>). Reading names in /dev runs nothing: no
# npu-smi or mthreads-gmi subprocess that could hang.
OTHER_DEVICES = ((ASCEND, re.compile(r"^davinci\d+$")), (MUSA, re.compile(r"^mtgpu\.?\d+$")))
IMEX_FOLDER = "dev/nvidia-caps-imex-channels"  # channel<N> device files, one per channel

_CHANNEL = re.compile(r"^channel\d+$")


def read_gpus(environ: Mapping[str, str], failures: List[str], errored: bool) -> NodeGpus:
    """The last word when NVML and nvidia-smi could not say: the kernel's own
    device listings. NVIDIA devices there, capability unreadable: unknown,
    so the node gets the conservative class; an AMD compute device: named."""
    said = "; ".join(failures)
    top = root(environ)
    if not os.path.isdir(top):
        return NodeGpus.unknown("listing", f"{ROOT_VARIABLE}={clip(top)!r} is not a folder; "
                                           f"{said}")
    listing = os.path.join(top, NVIDIA_LISTING)
    try:
        devices = sorted(os.listdir(listing))
    except FileNotFoundError:
        devices = []
    except OSError as exc:
        return NodeGpus.unknown("listing", f"cannot read {listing}: {exc.strerror}; {said}")
    if devices:
        return NodeGpus.unknown(
            "listing", f"{len(devices)} NVIDIA device(s) in {listing} ({clip(', '.join(devices))}) "
                       f"but their compute capability is unreadable ({said})")
    if os.path.exists(os.path.join(top, AMD_DEVICE)):
        return NodeGpus.other(AMD, "listing",
                              detail=f"{os.path.join(top, AMD_DEVICE)} exists (ROCm); no NVIDIA "
                                     f"device ({said})")
    other = _other_devices(os.path.join(top, DEVICE_FOLDER))
    if other is not None:
        vendor, names = other
        return NodeGpus.other(vendor, "listing",
                              detail=f"{len(names)} device node(s) in "
                                     f"{os.path.join(top, DEVICE_FOLDER)} "
                                     f"({clip(', '.join(names))}); no NVIDIA device ({said})")
    if errored:
        return NodeGpus.unknown("listing", f"no device in {listing}, but a probe failed: {said}")
    return NodeGpus.known((), "listing",
                          detail=f"no NVIDIA, AMD, Ascend or Moore Threads device; {said}")

def _other_devices(folder: str) -> Optional[tuple]:
    """(vendor, device names) of the first vendor with device nodes in
    ``folder``, or None. An unreadable /dev says nothing, as an absent one."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for vendor, pattern in OTHER_DEVICES:
        found = [name for name in names if pattern.match(name)]
        if found:
            return vendor, found
    return None


def imex_channel(environ: Mapping[str, str] = os.environ) -> str:
    """writable: some /dev/nvidia-caps-imex-channels/channel<N> this process
    may open read-write (what CUDA needs to export and import FABRIC
    handles); unwritable: channels exist but none is; absent: none exist."""
    folder = os.path.join(root(environ), IMEX_FOLDER)
    try:
        channels = sorted(e for e in os.listdir(folder) if _CHANNEL.match(e))
    except OSError:
        return ABSENT
    if not channels:
        return ABSENT
    if any(os.access(os.path.join(folder, c), os.R_OK | os.W_OK) for c in channels):
        return WRITABLE
    return UNWRITABLE
