"""The GPU probe without a GPU or a Ray cluster.

NVML is a fake module (``nvml=``) that raises pynvml's real exception
classes; nvidia-smi is tests/fakes/nvidia-smi, whose behaviour comes from
FAKE_NVIDIA_SMI in the *process* environment. The probe's own environment is
always an explicit dict, never os.environ.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import tempfile
import threading
import time
from typing import List

import pynvml
import pytest

from ray_megatron_env.node import NodeGpus
from ray_megatron_env.cache import ProbeCache
from ray_megatron_env.probe import FAKE_VARIABLE, METHOD_VARIABLE, ROOT_VARIABLE, probe_gpus
from fake_nvml import FakeNvml, Gpu
from paths import FAKES

FAKE_SMI = [str(FAKES / "nvidia-smi")]
NO_SMI = ["/nonexistent/ray-megatron-env-tests/nvidia-smi"]

UUID0 = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID1 = "GPU-bbbb2222-0000-0000-0000-000000000001"
UUID2 = "GPU-bbbb3333-0000-0000-0000-000000000002"
MIG_UUID = "MIG-cccc4444-0000-0000-0000-000000000003"


# --- fakes -----------------------------------------------------------------

GPUS = (Gpu(UUID0, (8, 0)), Gpu(UUID1, (9, 0), migs=[None, MIG_UUID]), Gpu(UUID2, (10, 0)))


class Untouchable:
    """An nvml module the probe must not use."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        pytest.fail(f"the probe used NVML ({name}) although it should not have")


class Exploding:
    """An nvml module whose every attribute access fails."""

    def __getattr__(self, name):
        if name.startswith("__"):  # let pytest and repr() look
            raise AttributeError(name)
        raise RuntimeError(f"no attribute today: {name}")


EMPTY_ROOT = tempfile.mkdtemp(prefix="rme-empty-root-")  # no device listings at all


def probe(nvml, *, smi=NO_SMI, timeout=2.0, fake=None, method=None, visible=None,
          root=EMPTY_ROOT, nvml_timeout=2.0, **env) -> NodeGpus:
    """probe_gpus with an explicit environment built from the keywords."""
    for name, value in ((FAKE_VARIABLE, fake), (METHOD_VARIABLE, method),
                        ("CUDA_VISIBLE_DEVICES", visible), (ROOT_VARIABLE, root)):
        if value is not None:
            env[name] = str(value)
    return probe_gpus(env, nvml=nvml, smi_command=smi, smi_timeout_s=timeout,
                      nvml_timeout_s=nvml_timeout)


def device_root(tmp_path, nvidia=(), amd=False):
    """A folder laid out like / for the listings: NVIDIA devices by PCI bus id,
    and /dev/kfd for an AMD GPU driver."""
    for bus in nvidia:
        (tmp_path / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
        (tmp_path / "proc/driver/nvidia/gpus" / bus / "information").write_text(
            "Model: \t NVIDIA H100 80GB HBM3\n")
    if amd:
        (tmp_path / "dev").mkdir()
        (tmp_path / "dev/kfd").write_text("")
    return tmp_path


@pytest.fixture
def smi(monkeypatch):
    """Pick the fake nvidia-smi's behaviour; returns its command."""
    def choose(behaviour: str):
        monkeypatch.setenv("FAKE_NVIDIA_SMI", behaviour)
        return FAKE_SMI
    return choose


def assert_unknown(result: NodeGpus, method: str, *fragments: str) -> None:
    assert result.capabilities is None, result
    assert not result.is_known
    assert result.method == method
    for fragment in fragments:
        assert fragment in result.error, (fragment, result.error)


# --- RAY_MEGATRON_ENV_FAKE_GPUS ---------------------------------------------

@pytest.mark.parametrize("value, expected", [
    ("9.0", ((9, 0),)),
    ("9.0,9.0,10.0", ((9, 0), (9, 0), (10, 0))),
    (" 8.0, 9.0 ", ((8, 0), (9, 0))),
    ("none", ()),
    ("NONE", ()),
])
def test_fake_variable(value, expected):
    result = probe(Untouchable(), fake=value)
    assert result.capabilities == expected
    assert result.method == "fake"
    assert result.error is None


@pytest.mark.parametrize("value", ["9.x", "abc", "9.0,,10.0", "9", "9.0;10.0", "none,9.0"])
def test_malformed_fake_variable_is_an_error(value):
    assert_unknown(probe(Untouchable(), fake=value), "fake", FAKE_VARIABLE)


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_fake_variable_falls_through_to_nvml(value):
    result = probe(FakeNvml(GPUS), fake=value)
    assert result.method == "nvml"
    assert result.capabilities == ((8, 0), (9, 0), (10, 0))


def test_fake_variable_wins_over_nvml_and_method():
    result = probe(Untouchable(), fake="8.0", method="nvml", visible="5")
    assert result.capabilities == ((8, 0),)


# --- NVML --------------------------------------------------------------------

def test_nvml_all_devices():
    nvml = FakeNvml(GPUS)
    result = probe(nvml)
    assert result.capabilities == ((8, 0), (9, 0), (10, 0))
    assert result.method == "nvml" and result.error is None
    assert "3 device(s)" in result.detail and "all visible" in result.detail
    assert nvml.calls[0] == "nvmlInit" and nvml.calls[-1] == "nvmlShutdown"
    assert "nvmlDeviceGetMaxMigDeviceCount" not in nvml.calls  # only for MIG- names


def test_nvml_uuid_as_bytes():
    # Older nvidia-ml-py returned bytes.
    class BytesNvml(FakeNvml):
        def nvmlDeviceGetUUID(self, handle):
            return super().nvmlDeviceGetUUID(handle).encode()
    assert probe(BytesNvml(GPUS), visible=UUID1).capabilities == ((9, 0),)


@pytest.mark.parametrize("visible, expected", [
    ("1", ((9, 0),)),
    ("2,0", ((10, 0), (8, 0))),
    (" 1 , 2 ", ((9, 0), (10, 0))),
    (UUID1, ((9, 0),)),
    ("GPU-aaaa", ((8, 0),)),               # unique prefix
    ("GPU-bbbb3", ((10, 0),)),
    (f"{UUID2},0", ((10, 0), (8, 0))),
    ("", ()),                              # none visible
    ("-1", ()),                            # hides all
    ("0,-1,1", ((8, 0),)),                 # a negative index ends the list
    (MIG_UUID, ((9, 0),)),                 # MIG instance: its parent's capability
    ("MIG-cccc", ((9, 0),)),
])
def test_nvml_cuda_visible_devices(visible, expected):
    result = probe(FakeNvml(GPUS), method="nvml", visible=visible)
    assert result.capabilities == expected, result
    assert result.method == "nvml"
    assert f"CUDA_VISIBLE_DEVICES={visible} visible" in result.detail


def test_mig_functions_are_queried_only_for_mig_names():
    nvml = FakeNvml(GPUS)
    assert probe(nvml, visible=f"0,{MIG_UUID}").capabilities == ((8, 0), (9, 0))
    assert nvml.calls.count("nvmlDeviceGetMaxMigDeviceCount") == 3
    nvml = FakeNvml(GPUS)
    probe(nvml, visible="GPU-aaaa")
    assert "nvmlDeviceGetMaxMigDeviceCount" not in nvml.calls


def test_nvml_without_mig_functions_cannot_resolve_mig_names():
    nvml = FakeNvml(GPUS)
    nvml.nvmlDeviceGetMaxMigDeviceCount = None  # as if the binding predated MIG
    assert_unknown(probe(nvml, method="nvml", visible=MIG_UUID),
                   "nvml", "matches no")


@pytest.mark.parametrize("visible, fragments", [
    ("3", ["device 3", "3 GPU(s)"]),
    ("0,7", ["device 7"]),
    ("GPU-ffff", ["'GPU-ffff'", "matches no"]),
    ("MIG-ffff", ["'MIG-ffff'", "matches no"]),
    ("GPU-bbbb", ["'GPU-bbbb'", "more than one"]),   # ambiguous prefix
    ("0,,1", ["empty entry"]),
])
def test_nvml_cuda_visible_devices_errors(visible, fragments):
    nvml = FakeNvml(GPUS)
    result = probe(nvml, method="nvml", visible=visible)
    assert_unknown(result, "nvml", *fragments)
    assert nvml.calls[-1] == "nvmlShutdown"


def test_nvml_visible_devices_error_does_not_fall_back(smi):
    # nvidia-smi would read the same CUDA_VISIBLE_DEVICES: no point asking it.
    result = probe(FakeNvml(GPUS), smi=NO_SMI, visible="3")
    assert_unknown(result, "nvml", "device 3")
    assert "nvidia-smi" not in result.error


NO_LIBRARY = {"nvmlInit": pynvml.NVMLError_LibraryNotFound()}


def test_library_not_found_is_not_no_gpu_nvidia_smi_is_asked(smi):
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=smi("ok"))
    assert result.capabilities == ((8, 0), (9, 0))
    assert result.method == "nvidia-smi" and result.error is None


def test_library_and_nvidia_smi_missing_and_no_listing_is_no_gpu():
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=NO_SMI)
    assert result.capabilities == () and result.vendor is None and result.is_known
    assert result.method == "listing"
    assert "libnvidia-ml" in result.detail and "not installed" in result.detail


def test_devices_in_the_driver_listing_make_the_node_unknown_not_gpu_free(tmp_path):
    root = device_root(tmp_path, nvidia=["0000:18:00.0", "0000:2a:00.0"])
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=NO_SMI, root=root)
    assert_unknown(result, "listing", "2 NVIDIA device(s)", "0000:18:00.0",
                   "compute capability is unreadable", "libnvidia-ml")


def test_an_amd_node_is_named_as_such(tmp_path):
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=NO_SMI, root=device_root(tmp_path, amd=True))
    assert result.vendor == "amd" and result.capabilities == () and result.is_known
    assert "dev/kfd" in result.detail


@pytest.mark.parametrize("nodes, vendor, words", [
    # Ascend: one /dev/davinci<N> per NPU; the shared nodes are not devices.
    (["davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc"], "ascend",
     "2 device node(s)"),
    # Moore Threads: /dev/mtgpu.<N>, also spelled /dev/mtgpu<N>.
    (["mtgpu.0", "mtgpu.1", "dri"], "musa", "mtgpu.0, mtgpu.1"),
    (["mtgpu0"], "musa", "mtgpu0"),
])
def test_ascend_and_moore_threads_nodes_are_named_never_no_gpu(tmp_path, nodes, vendor, words):
    (tmp_path / "dev").mkdir()
    for name in nodes:
        (tmp_path / "dev" / name).write_text("")
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=NO_SMI, root=tmp_path)
    assert result.vendor == vendor and result.capabilities == () and result.is_known
    assert result.method == "listing" and words in result.detail
    assert result.labels() == [vendor]


def test_shared_ascend_nodes_alone_are_not_an_npu(tmp_path):
    # davinci_manager without any davinci<N>: no NPU is visible here.
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "davinci_manager").write_text("")
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=NO_SMI, root=tmp_path)
    assert result.vendor is None and result.capabilities == ()


def test_nvidia_devices_win_over_other_vendors_device_nodes(tmp_path):
    root = device_root(tmp_path, nvidia=["0000:18:00.0"])
    (root / "dev").mkdir()
    (root / "dev" / "davinci0").write_text("")
    assert_unknown(probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=NO_SMI, root=root), "listing",
                   "1 NVIDIA device(s)")


@pytest.mark.parametrize("value, vendor", [("npu", "ascend"), ("ascend", "ascend"),
                                           ("NPU", "ascend"), ("musa", "musa"),
                                           ("amd", "amd")])
def test_fake_vendor_values(value, vendor):
    result = probe(Untouchable(), fake=value)
    assert result.vendor == vendor and result.capabilities == () and result.method == "fake"


def test_a_failing_backend_with_no_listing_stays_unknown():
    # NVML loaded but failed: that is no evidence the node has no GPU.
    nvml = FakeNvml(GPUS, fail={"nvmlInit": pynvml.NVMLError_DriverNotLoaded()})
    assert_unknown(probe(nvml, smi=NO_SMI), "listing", "a probe failed", "nvmlInit failed")


def test_a_device_root_that_is_not_a_folder_names_the_variable(tmp_path):
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=NO_SMI, root=tmp_path / "nowhere")
    assert_unknown(result, "listing", ROOT_VARIABLE, "is not a folder")


def test_a_hung_nvml_gives_unknown_within_its_bound_and_is_not_waited_on_twice(smi):
    release = threading.Event()
    try:
        started = time.monotonic()
        first = probe(FakeNvml(GPUS, hang=release), smi=NO_SMI, nvml_timeout=0.5)
        assert time.monotonic() - started < 3
        assert_unknown(first, "listing", "NVML did not answer within 0.5 s")
        # The stuck call is not waited on again, and nvidia-smi still answers.
        started = time.monotonic()
        second = probe(FakeNvml(GPUS, hang=release), smi=smi("ok"), nvml_timeout=5)
        assert time.monotonic() - started < 3
        assert second.capabilities == ((8, 0), (9, 0))
    finally:
        release.set()


def test_nvml_init_error_falls_back_to_nvidia_smi(smi):
    nvml = FakeNvml(GPUS, fail={"nvmlInit": pynvml.NVMLError_DriverNotLoaded()})
    result = probe(nvml, smi=smi("ok"))
    assert result.capabilities == ((8, 0), (9, 0))
    assert result.method == "nvidia-smi" and result.error is None


def test_nvml_device_error_falls_back_to_nvidia_smi(smi):
    nvml = FakeNvml(GPUS, fail={"nvmlDeviceGetCudaComputeCapability": pynvml.NVMLError_GpuIsLost()})
    result = probe(nvml, smi=smi("ok"))
    assert result.capabilities == ((8, 0), (9, 0))
    assert result.method == "nvidia-smi"
    assert nvml.calls[-1] == "nvmlShutdown"


def test_both_backends_failing_reports_both_errors(smi):
    nvml = FakeNvml(GPUS, fail={"nvmlDeviceGetCudaComputeCapability": pynvml.NVMLError_GpuIsLost()})
    result = probe(nvml, smi=smi("failed"))
    assert_unknown(result, "listing", "nvml: NVML device query failed: GPU is lost",
                   "nvidia-smi: ", "exited with 9")


@pytest.mark.parametrize("failure", [
    {"nvmlInit": pynvml.NVMLError_DriverNotLoaded()},
    {"nvmlDeviceGetCount": pynvml.NVMLError_Unknown()},
    {"nvmlDeviceGetCudaComputeCapability": pynvml.NVMLError_GpuIsLost()},
])
def test_nvml_method_does_not_fall_back(smi, failure):
    # With fallback the working fake nvidia-smi would answer (8.0, 9.0).
    result = probe(FakeNvml(GPUS, fail=failure), smi=smi("ok"), method="nvml")
    assert_unknown(result, "nvml", str(next(iter(failure.values()))))


@pytest.mark.parametrize("failing", [
    "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
    "nvmlDeviceGetCudaComputeCapability",
])
def test_nvml_shutdown_after_a_failed_device_query(failing):
    nvml = FakeNvml(GPUS, fail={failing: pynvml.NVMLError_GpuIsLost()})
    assert_unknown(probe(nvml, method="nvml"), "nvml", "GPU is lost")
    assert nvml.calls.count("nvmlInit") == 1
    assert nvml.calls[-1] == "nvmlShutdown"
    assert nvml.calls.count("nvmlShutdown") == 1


def test_nvml_shutdown_error_does_not_spoil_the_result():
    nvml = FakeNvml(GPUS, fail={"nvmlShutdown": pynvml.NVMLError_Uninitialized()})
    assert probe(nvml).capabilities == ((8, 0), (9, 0), (10, 0))


@pytest.mark.parametrize("method", ["bogus", "NVML", "smi"])
def test_unknown_method_is_an_error(method):
    result = probe(Untouchable(), smi=NO_SMI, method=method)
    assert_unknown(result, "probe", METHOD_VARIABLE, repr(method))


@pytest.mark.parametrize("method", ["", "  ", "auto", " nvml "])
def test_blank_or_padded_method_uses_nvml(method):
    assert probe(FakeNvml(GPUS), method=method).method == "nvml"


# --- nvidia-smi --------------------------------------------------------------

@pytest.mark.parametrize("behaviour, visible, expected", [
    ("ok", None, ((8, 0), (9, 0))),
    ("ok", "GPU-22222222", ((9, 0),)),
    ("ok", "1,0", ((9, 0), (8, 0))),
    ("ok", "-1", ()),
    ("ok", "", ()),
    ("nodevices", None, ()),
])
def test_nvidia_smi(smi, behaviour, visible, expected):
    result = probe(Untouchable(), smi=smi(behaviour), method="nvidia-smi", visible=visible)
    assert result.capabilities == expected
    assert result.method == "nvidia-smi" and result.error is None


@pytest.mark.parametrize("behaviour, visible, fragments", [
    ("garbage", None, ["unexpected", "output line", "Failed to initialize NVML"]),
    ("failed", None, ["exited with 9", "could not communicate with the driver"]),
    ("ok", "2", ["device 2", "2 GPU(s)"]),
    ("ok", "GPU-33333333", ["matches no"]),
    ("ok", "GPU-", ["more than one"]),
])
def test_nvidia_smi_errors(smi, behaviour, visible, fragments):
    result = probe(Untouchable(), smi=smi(behaviour), method="nvidia-smi", visible=visible)
    assert_unknown(result, "nvidia-smi", *fragments)


def _live_processes_in_session(session: int) -> dict:
    """``{pid: argv}`` of the live (not zombie) processes in a session."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _ppid, _pgrp, sid = f.read().rsplit(")", 1)[1].split()[:4]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
        except (OSError, ValueError):
            continue
        if int(sid) == session and state != "Z":
            found[int(entry)] = argv
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_hung_nvidia_smi_is_killed_with_its_children(smi, monkeypatch):
    started = []  # the fake nvidia-smi leads its own session: pid == session id

    class RecordingPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self.pid)

    monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
    leftovers = {}
    try:
        start = time.monotonic()
        result = probe(Untouchable(), smi=smi("hang"), timeout=0.5, method="nvidia-smi")
        elapsed = time.monotonic() - start
        assert_unknown(result, "nvidia-smi", "did not answer within 0.5 s")
        assert 0.5 <= elapsed < 2.0
        assert len(started) == 1
        deadline = time.monotonic() + 1.0
        while True:
            leftovers = _live_processes_in_session(started[0])
            if not leftovers or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert ["sleep", "600"] not in leftovers.values(), "the hung child survived"
        assert not leftovers, f"still running from the probe: {leftovers}"
    finally:
        for pid in leftovers:  # don't leave a 600 s sleep behind a failed test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_nvidia_smi_not_found():
    result = probe(Untouchable(), smi=NO_SMI, method="nvidia-smi")
    assert_unknown(result, "nvidia-smi", f"{NO_SMI[0]} is not installed")


def test_nvidia_smi_not_executable(tmp_path):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    result = probe(Untouchable(), smi=[str(script)], method="nvidia-smi")
    assert_unknown(result, "nvidia-smi", "cannot run")


# --- never raises --------------------------------------------------------------

class CountIsNotANumber(FakeNvml):
    def nvmlDeviceGetCount(self):
        return None


@pytest.mark.parametrize("nvml, fragment", [
    (FakeNvml(GPUS, fail={"nvmlInit": RuntimeError("driver ate the GPU")}), "RuntimeError: driver ate the GPU"),
    (Exploding(), "RuntimeError"),
    (CountIsNotANumber(GPUS), "TypeError"),
])
def test_probe_never_raises(nvml, fragment):
    result = probe(nvml, smi=NO_SMI)
    assert_unknown(result, "probe", "unexpected", fragment)


def test_probe_never_raises_for_an_empty_smi_command():
    assert_unknown(probe(Untouchable(), smi=[], method="nvidia-smi"), "probe")


def test_shutdown_follows_an_unexpected_device_error():
    nvml = CountIsNotANumber(GPUS)
    probe(nvml)
    assert nvml.calls[-1] == "nvmlShutdown"


# --- ProbeCache ------------------------------------------------------------------

class CountingProbe:
    def __init__(self, *results: NodeGpus, delay: float = 0.0):
        self.results = list(results) or [NodeGpus.known([(9, 0)], "fake")]
        self.delay = delay
        self.threads: List[int] = []
        self._lock = threading.Lock()

    @property
    def calls(self) -> int:
        return len(self.threads)

    def __call__(self) -> NodeGpus:
        with self._lock:
            self.threads.append(threading.get_ident())
            result = self.results[min(len(self.threads), len(self.results)) - 1]
        time.sleep(self.delay)
        return result


def test_cache_probes_once():
    probe_ = CountingProbe()
    cache = ProbeCache(probe_)
    results = [cache.get() for _ in range(50)]
    assert probe_.calls == 1 and cache.runs == 1
    assert all(r is results[0] for r in results)
    assert results[0].capabilities == ((9, 0),)


def test_cache_probes_once_across_threads():
    probe_ = CountingProbe(delay=0.05)
    cache = ProbeCache(probe_)
    barrier = threading.Barrier(16)
    results = []

    def worker():
        barrier.wait()
        results.append(cache.get())

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(results) == 16
    assert probe_.calls == 1 and cache.runs == 1
    assert all(r is results[0] for r in results)


def test_cache_get_async_probes_once_off_the_event_loop():
    probe_ = CountingProbe(delay=0.3)
    cache = ProbeCache(probe_)

    async def main():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        results = await asyncio.gather(*(cache.get_async() for _ in range(20)))
        done.set()
        await ticking
        again = await cache.get_async()
        return results, again, ticks, threading.get_ident()

    results, again, ticks, loop_thread = asyncio.run(main())
    assert probe_.calls == 1 and cache.runs == 1
    assert probe_.threads[0] != loop_thread
    assert ticks >= 10, f"the event loop was blocked: {ticks} ticks in 0.3 s"
    assert all(r is results[0] for r in results) and again is results[0]
    assert results[0].capabilities == ((9, 0),)


def test_failed_result_is_retried_after_the_delay_and_success_is_kept():
    now = [1000.0]
    probe_ = CountingProbe(NodeGpus.unknown("nvml", "first"), NodeGpus.unknown("nvml", "second"),
                           NodeGpus.known([(8, 0)], "nvml"), NodeGpus.unknown("nvml", "never"))
    cache = ProbeCache(probe_, retry_failed_after_s=60.0, clock=lambda: now[0])

    assert cache.get().error == "first"
    now[0] += 59.9
    assert cache.get().error == "first" and probe_.calls == 1
    now[0] += 0.1
    assert cache.get().error == "second" and probe_.calls == 2
    now[0] += 30
    assert cache.get().error == "second" and probe_.calls == 2
    now[0] += 30
    assert cache.get().capabilities == ((8, 0),) and probe_.calls == 3
    now[0] += 1e9
    assert cache.get().capabilities == ((8, 0),) and probe_.calls == 3
    assert cache.runs == 3


def test_failed_result_is_retried_by_get_async_too():
    now = [0.0]
    probe_ = CountingProbe(NodeGpus.unknown("nvml", "first"), NodeGpus.known([(8, 0)], "nvml"))
    cache = ProbeCache(probe_, retry_failed_after_s=10.0, clock=lambda: now[0])

    async def main():
        first = await cache.get_async()
        now[0] = 9.0
        cached = await cache.get_async()
        now[0] = 10.0
        return first, cached, await cache.get_async()

    first, cached, retried = asyncio.run(main())
    assert first.error == "first" and cached is first
    assert retried.capabilities == ((8, 0),)
    assert probe_.calls == 2


@pytest.mark.parametrize("outcome", [NodeGpus.known([(9, 0)], "fake"),
                                     NodeGpus.unknown("nvml", "broken")])
def test_cached_result_carries_time_and_pid(outcome):
    assert outcome.probed_at is None and outcome.probe_pid is None
    cache = ProbeCache(CountingProbe(outcome))
    before = time.time()
    result = cache.get()
    after = time.time()
    assert before <= result.probed_at <= after
    assert result.probe_pid == os.getpid()
    assert (result.capabilities, result.method, result.error) == \
        (outcome.capabilities, outcome.method, outcome.error)
