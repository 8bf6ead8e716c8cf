"""probe/listings.py: the kernel's own listings, the last word when NVML and
nvidia-smi cannot say: NVIDIA device folders under /proc (unknown, never "no
GPU"), AMD's /dev/kfd, Ascend's and Moore Threads' device nodes in /dev, and
a device root that is not a folder. The folder is a prepared tmp_path
(RAY_MEGATRON_ENV_DEVICE_ROOT); the IMEX channels: tests/unit/probe/test_fabric.py.
"""

import pynvml
import pytest

from fake_nvml import FakeNvml
from gpu_probe import GPUS, NO_LIBRARY, NO_SMI, assert_unknown, device_root, probe
from ray_megatron_env.probe import ROOT_VARIABLE


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


def test_a_device_root_that_is_not_a_folder_names_the_variable(tmp_path):
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=NO_SMI, root=tmp_path / "nowhere")
    assert_unknown(result, "listing", ROOT_VARIABLE, "is not a folder")


def test_a_failing_backend_with_no_listing_stays_unknown():
    # NVML loaded but failed: that is no evidence the node has no GPU.
    nvml = FakeNvml(GPUS, fail={"nvmlInit": pynvml.NVMLError_DriverNotLoaded()})
    assert_unknown(probe(nvml, smi=NO_SMI), "listing", "a probe failed", "nvmlInit failed")
