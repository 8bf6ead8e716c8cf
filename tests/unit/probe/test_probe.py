"""probe/__init__: ``probe_gpus`` tries its sources in order (the fake GPU
list, NVML, nvidia-smi, the kernel's listings), falls back where another
source may still answer, and never raises. Each source's own tests:
tests/unit/probe/test_<source>.py; the helpers: tests/helpers/gpu_probe.py.
"""

from __future__ import annotations

import pynvml
import pytest

from fake_nvml import FakeNvml
from gpu_probe import (
    Exploding, GPUS, NO_LIBRARY, NO_SMI, Untouchable, assert_unknown, probe,
)
from ray_megatron_env.probe import METHOD_VARIABLE


# --- falling back, or not ----------------------------------------------------------------

def test_nvml_visible_devices_error_does_not_fall_back(smi):
    # nvidia-smi would read the same CUDA_VISIBLE_DEVICES: no point asking it.
    result = probe(FakeNvml(GPUS), smi=NO_SMI, visible="3")
    assert_unknown(result, "nvml", "device 3")
    assert "nvidia-smi" not in result.error


def test_library_not_found_is_not_no_gpu_nvidia_smi_is_asked(smi):
    result = probe(FakeNvml(GPUS, fail=NO_LIBRARY), smi=smi("ok"))
    assert result.capabilities == ((8, 0), (9, 0))
    assert result.method == "nvidia-smi" and result.error is None


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


@pytest.mark.parametrize("method", ["bogus", "NVML", "smi"])
def test_unknown_method_is_an_error(method):
    result = probe(Untouchable(), smi=NO_SMI, method=method)
    assert_unknown(result, "probe", METHOD_VARIABLE, repr(method))


@pytest.mark.parametrize("method", ["", "  ", "auto", " nvml "])
def test_blank_or_padded_method_uses_nvml(method):
    assert probe(FakeNvml(GPUS), method=method).method == "nvml"


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
