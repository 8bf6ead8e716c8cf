"""What a node's GPUs are, as the policy needs them: compute capabilities.

Pure data. ``probe.py`` fills it in from the hardware; the policy reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

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
