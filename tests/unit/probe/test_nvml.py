"""probe/nvml.py: the GPUs through NVML (every device, CUDA_VISIBLE_DEVICES
by index and UUID, MIG instances, shutdown after every failure, a hung call
bounded) and the peer-access facts (P2P status of every pair, the CUDA
driver). NVML is tests/helpers/fake_nvml.py, raising pynvml's real
exception classes; its fabric record: tests/unit/probe/test_fabric.py.
"""

import threading
import time

import pynvml
import pytest

from fake_nvml import FakeNvml
from gpu_probe import GPUS, MIG_UUID, UUID1, UUID2, NO_SMI, assert_unknown, probe
from ray_megatron_env.probe import probe_p2p


# --- the GPUs ----------------------------------------------------------------

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
        # The released call ends now; the next test must not find it running
        # ("an earlier NVML call has still not returned").
        for thread in threading.enumerate():
            if thread.name == "ray-megatron-env-nvml":
                thread.join(5)


# --- peer access and the CUDA driver -----------------------------------------

def test_nvml_pairs_without_peer_access_across_two_roots():
    roots = {(i, j) for i in (0, 1) for j in (2, 3)} | {(j, i) for i in (0, 1) for j in (2, 3)}
    nvml = FakeNvml(4, without=roots, driver=12080)
    p2p = probe_p2p({}, nvml=nvml)
    assert (p2p.method, p2p.count, p2p.without, p2p.cuda_driver, p2p.error) == \
        ("nvml", 4, ((0, 2), (0, 3), (1, 2), (1, 3)), (12, 8), None)
    assert nvml.shut
    assert p2p.describe() == ("4 NVIDIA GPU(s), no peer access between GPUs 0-2, 0-3, 1-2, 1-3, "
                              "CUDA driver 12.8")


def test_nvml_a_pair_is_without_peer_access_if_either_direction_is():
    p2p = probe_p2p({}, nvml=FakeNvml(2, without={(1, 0)}, driver=13000))
    assert (p2p.without, p2p.cuda_driver) == (((0, 1),), (13, 0))


def test_nvml_every_pair_with_peer_access_and_every_pair_asked():
    nvml = FakeNvml(3)
    p2p = probe_p2p({}, nvml=nvml)
    assert p2p.without == () and p2p.count == 3
    assert sorted(nvml.p2p_asked) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]


def test_nvml_driver_not_reported_is_none_not_a_failure():
    nvml = FakeNvml(2, fail={"nvmlSystemGetCudaDriverVersion": pynvml.NVMLError_NotSupported()})
    p2p = probe_p2p({}, nvml=nvml)
    assert (p2p.count, p2p.cuda_driver) == (2, None)


@pytest.mark.parametrize("fail,words", [
    ({"nvmlInit": pynvml.NVMLError_DriverNotLoaded()}, "nvmlInit failed"),
    ({"nvmlDeviceGetP2PStatus": pynvml.NVMLError_GpuIsLost()}, "NVML P2P query failed"),
])
def test_nvml_failures_are_unknown_never_raised(fail, words):
    nvml = FakeNvml(2, fail=fail)
    p2p = probe_p2p({}, nvml=nvml)
    assert p2p.count is None and not p2p.is_known and words in p2p.error


def test_rays_bundled_binding_has_both_calls():
    from ray._private.thirdparty import pynvml as bundled

    assert callable(bundled.nvmlDeviceGetP2PStatus)
    assert callable(bundled.nvmlSystemGetCudaDriverVersion)
    assert callable(bundled.nvmlSystemGetDriverVersion)
    assert bundled.NVML_P2P_STATUS_OK == 0
