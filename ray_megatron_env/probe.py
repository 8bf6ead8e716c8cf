"""Finding a node's GPUs: the fake variable, NVML, nvidia-smi, then the
kernel drivers' own device listings.

This is the hardware edge. It never raises, and it never hangs longer than
its bounds: any failure becomes a ``NodeGpus`` with ``capabilities=None``
and the error text, which the policy treats conservatively. A node is only
recorded as having no GPU when every source says there is none: NVML that
cannot load is not evidence of that (an agent without ``libnvidia-ml`` on
its library path, a container without the driver's user-space libraries).
It never touches CUDA (no context, no GPU memory): NVML and nvidia-smi read
the driver's device table, and the listings are plain files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
from typing import Any, Callable, List, Mapping, Optional, Sequence

from .gpus import AMD, ASCEND, MUSA, VENDOR_TOKENS, Capability, NodeGpus, parse_capability
from .node import FAKE_NODE_VARIABLE, FakeNodeError, parse_fake_node

FAKE_VARIABLE = "RAY_MEGATRON_ENV_FAKE_GPUS"
METHOD_VARIABLE = "RAY_MEGATRON_ENV_PROBE"  # auto (default) | nvml | nvidia-smi
# Where the kernel's device listings are looked for; "/" unless the node's
# /proc and /dev are mounted elsewhere (and in tests, a prepared folder).
ROOT_VARIABLE = "RAY_MEGATRON_ENV_DEVICE_ROOT"
METHODS = ("auto", "nvml", "nvidia-smi")
SMI_TIMEOUT_S = 3.0
NVML_TIMEOUT_S = 3.0
RETRY_FAILED_AFTER_S = 60.0
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

_INDEX = re.compile(r"^-?\d+$")


class ProbeError(Exception):
    """A probe backend could not tell what the GPUs are."""


class VisibilityError(ProbeError):
    """The node's CUDA_VISIBLE_DEVICES names GPUs the node does not have.
    Another backend would read the same variable, so there is no fallback."""


class Absent(ProbeError):
    """The backend is not installed here; that alone says nothing about GPUs."""


def probe_gpus(environ: Mapping[str, str] = os.environ, *, nvml: Any = None,
               smi_command: Sequence[str] = ("nvidia-smi",),
               smi_timeout_s: float = SMI_TIMEOUT_S,
               nvml_timeout_s: float = NVML_TIMEOUT_S) -> NodeGpus:
    """The GPUs this node exposes to workers. Never raises; bounded in time."""
    try:
        return _probe(environ, nvml, smi_command, smi_timeout_s, nvml_timeout_s)
    except Exception as exc:  # a bug here must not fail every worker start
        return NodeGpus.unknown("probe", f"unexpected {type(exc).__name__}: {exc}")


def _probe(environ, nvml, smi_command, smi_timeout_s, nvml_timeout_s) -> NodeGpus:
    fake = environ.get(FAKE_VARIABLE, "").strip()
    node = environ.get(FAKE_NODE_VARIABLE, "").strip()
    if node:  # the whole node faked (node.py); its "gpus" stands for FAKE_VARIABLE
        try:
            fake = parse_fake_node(node)[0] or fake
        except FakeNodeError as exc:
            return NodeGpus.unknown("fake", str(exc))
    if fake:
        return _from_fake(fake)
    method = environ.get(METHOD_VARIABLE, "auto").strip() or "auto"
    if method not in METHODS:
        return NodeGpus.unknown("probe", f"{METHOD_VARIABLE}={_clip(method)!r} is not one of "
                                         f"{', '.join(METHODS)}")
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    failures: List[str] = []  # what each backend said, for the decision's reason
    errored = False  # a backend was there but failed: not evidence of "no GPU"
    backends = [("nvml", lambda: _bounded(lambda: _from_nvml(visible, nvml), nvml_timeout_s)),
                ("nvidia-smi", lambda: _from_smi(visible, smi_command, smi_timeout_s))]
    for name, run in backends:
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
    return _from_listings(environ, failures, errored)


def _from_listings(environ: Mapping[str, str], failures: List[str], errored: bool) -> NodeGpus:
    """The last word when NVML and nvidia-smi could not say: the kernel's own
    device listings. NVIDIA devices there, capability unreadable: unknown,
    so the node gets the conservative class; an AMD compute device: named."""
    said = "; ".join(failures)
    root = environ.get(ROOT_VARIABLE, "/").strip() or "/"
    if not os.path.isdir(root):
        return NodeGpus.unknown("listing", f"{ROOT_VARIABLE}={_clip(root)!r} is not a folder; "
                                           f"{said}")
    listing = os.path.join(root, NVIDIA_LISTING)
    try:
        devices = sorted(os.listdir(listing))
    except FileNotFoundError:
        devices = []
    except OSError as exc:
        return NodeGpus.unknown("listing", f"cannot read {listing}: {exc.strerror}; {said}")
    if devices:
        return NodeGpus.unknown(
            "listing", f"{len(devices)} NVIDIA device(s) in {listing} ({_clip(', '.join(devices))}) "
                       f"but their compute capability is unreadable ({said})")
    if os.path.exists(os.path.join(root, AMD_DEVICE)):
        return NodeGpus.other(AMD, "listing",
                              detail=f"{os.path.join(root, AMD_DEVICE)} exists (ROCm); no NVIDIA "
                                     f"device ({said})")
    other = _other_devices(os.path.join(root, DEVICE_FOLDER))
    if other is not None:
        vendor, names = other
        return NodeGpus.other(vendor, "listing",
                              detail=f"{len(names)} device node(s) in "
                                     f"{os.path.join(root, DEVICE_FOLDER)} "
                                     f"({_clip(', '.join(names))}); no NVIDIA device ({said})")
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


# One NVML call may hang inside the driver; it is never waited on twice.
_nvml_lock = threading.Lock()
_nvml_stuck: Optional[threading.Thread] = None


def _bounded(call: Callable[[], NodeGpus], timeout_s: float) -> NodeGpus:
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


def _from_fake(text: str) -> NodeGpus:
    if text.lower() == "none":
        return NodeGpus.known((), "fake", detail=f"{FAKE_VARIABLE}=none")
    vendor = VENDOR_TOKENS.get(text.lower())
    if vendor is not None:
        return NodeGpus.other(vendor, "fake", detail=f"{FAKE_VARIABLE}={text}")
    try:
        capabilities = [parse_capability(part) for part in text.split(",")]
    except ValueError as exc:
        return NodeGpus.unknown("fake", f"{FAKE_VARIABLE}={_clip(text)!r}: {exc}")
    return NodeGpus.known(capabilities, "fake", detail=f"{FAKE_VARIABLE}={text}")


def _select(visible: Optional[str], devices: List[tuple],
            extra_uuids: Sequence[tuple] = ()) -> List[Capability]:
    """Apply the node's CUDA_VISIBLE_DEVICES to ``devices``, ``[(uuid, capability)]``
    in index order; ``extra_uuids`` (MIG instances) can be named by UUID only.

    Indices and (prefixes of) GPU-/MIG- UUIDs are accepted as CUDA does; a
    negative index ends the list as in CUDA (``-1`` hides every GPU). A name
    that matches no device is an error rather than CUDA's silent truncation,
    because the decision would otherwise describe GPUs the workers never see.
    """
    if visible is None:
        return [cap for _, cap in devices]
    chosen: List[Capability] = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            if visible.strip():
                raise VisibilityError(
                    f"CUDA_VISIBLE_DEVICES={_clip(visible)!r} has an empty entry")
            break
        if _INDEX.match(entry):
            index = int(entry)
            if index < 0:
                break
            if index >= len(devices):
                raise VisibilityError(f"CUDA_VISIBLE_DEVICES names device {index}, but the "
                                      f"node has {len(devices)} GPU(s)")
            chosen.append(devices[index][1])
            continue
        matches = [cap for uuid, cap in (*devices, *extra_uuids)
                   if uuid and uuid.startswith(entry)]
        if len(matches) != 1:
            problem = "no" if not matches else "more than one"
            raise VisibilityError(f"CUDA_VISIBLE_DEVICES entry {_clip(entry)!r} matches "
                                  f"{problem} GPU UUID on the node")
        chosen.append(matches[0])
    return chosen


def _from_nvml(visible: Optional[str], nvml: Any) -> NodeGpus:
    if nvml is None:
        nvml = _nvml_binding()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_LibraryNotFound:
        raise Absent("the NVML library (libnvidia-ml) cannot be loaded") from None
    except nvml.NVMLError as exc:
        raise ProbeError(f"nvmlInit failed: {exc}") from None
    try:
        devices, migs = [], []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            capability = (int(major), int(minor))
            devices.append((_text(nvml.nvmlDeviceGetUUID(handle)), capability))
            if visible and "MIG-" in visible:
                migs.extend(_mig_devices(nvml, handle, capability))
        capabilities = _select(visible, devices, migs)
    except nvml.NVMLError as exc:
        raise ProbeError(f"NVML device query failed: {exc}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return NodeGpus.known(capabilities, "nvml", detail=_visible_detail(visible, len(devices)))


def _nvml_binding() -> Any:
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
                found.append((_text(nvml.nvmlDeviceGetUUID(mig)), capability))
            except nvml.NVMLError:
                continue  # an empty MIG slot
    except nvml.NVMLError:
        return []  # MIG not supported or not enabled on this GPU
    return [(uuid, cap) for uuid, cap in found if uuid.startswith("MIG-")]


def run_smi(command: Sequence[str], options: Sequence[str], timeout_s: float) -> Optional[str]:
    """nvidia-smi's output with ``options``, bounded; ``None`` when it says
    the node has no devices. Raises ``Absent`` or ``ProbeError``."""
    args = [*command, *options]
    try:
        # Its own session, so a hung nvidia-smi and anything it spawned can
        # be killed together and the pipes close.
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except FileNotFoundError:
        raise Absent(f"{command[0]} is not installed") from None
    except OSError as exc:
        raise ProbeError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise ProbeError(f"{command[0]} did not answer within {timeout_s:g} s") from None
    text = out.decode("utf-8", "replace")
    if proc.returncode != 0:
        if "No devices were found" in text + err.decode("utf-8", "replace"):
            return None
        first = (err or out).decode("utf-8", "replace").strip().splitlines()[:1]
        raise ProbeError(f"{command[0]} exited with {proc.returncode}: "
                         f"{_clip(first[0]) if first else 'no output'}")
    return text


def _from_smi(visible: Optional[str], command: Sequence[str], timeout_s: float) -> NodeGpus:
    text = run_smi(command, ("--query-gpu=index,uuid,compute_cap", "--format=csv,noheader"),
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
            raise ProbeError(f"unexpected {command[0]} output line {_clip(line)!r}") from None
    return NodeGpus.known(_select(visible, devices), "nvidia-smi",
                          detail=_visible_detail(visible, len(devices)))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    try:
        proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass  # a grandchild escaped the group; its pipe is dropped with proc


def _visible_detail(visible: Optional[str], count: int) -> str:
    scope = "all" if visible is None else f"CUDA_VISIBLE_DEVICES={_clip(visible)}"
    return f"{count} device(s) on the node, {scope} visible"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProbeCache:
    """One probe per agent process, shared by every worker start on the node.

    A successful result is kept for the life of the process (a node's GPUs do
    not change under a running raylet); a failed one is retried after
    ``retry_failed_after_s`` so a transient NVML error does not stick.
    ``get_async`` runs the probe in a thread so a slow nvidia-smi never blocks
    the agent's event loop, and concurrent callers share one probe.
    """

    def __init__(self, probe: Callable[[], NodeGpus] = probe_gpus,
                 retry_failed_after_s: float = RETRY_FAILED_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._probe = probe
        self._retry_after = retry_failed_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._result: Optional[NodeGpus] = None
        self._taken_at = 0.0
        self._inflight: Optional[asyncio.Future] = None
        self.runs = 0

    def _fresh(self) -> bool:
        result = self._result
        return result is not None and (
            result.is_known or self._clock() - self._taken_at < self._retry_after)

    def get(self) -> NodeGpus:
        with self._lock:
            if not self._fresh():
                result = self._probe()
                self._result = dataclasses.replace(
                    result, probed_at=time.time(), probe_pid=os.getpid())
                self._taken_at = self._clock()
                self.runs += 1
            return self._result

    async def get_async(self) -> NodeGpus:
        if self._fresh():
            return self._result
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.get_running_loop().run_in_executor(None, self.get)
        return await asyncio.shield(self._inflight)
