"""What the GPU probe's unit tests share (tests/unit/probe/): three fake
GPUs, NVML modules the probe must not use, and ``probe``, which calls
``probe_gpus`` with an explicit environment built from keywords.

NVML is a fake module (``nvml=``) that raises pynvml's real exception
classes; nvidia-smi is tests/fakes/nvidia-smi, whose behaviour comes from
FAKE_NVIDIA_SMI in the *process* environment (the ``smi`` fixture of
tests/unit/probe/conftest.py). The probe's own environment is always an
explicit dict, never os.environ.
"""

from __future__ import annotations

import tempfile

import pynvml
import pytest

from fake_nvml import Gpu
from paths import FAKES
from ray_megatron_env.node import NodeGpus
from ray_megatron_env.probe import FAKE_VARIABLE, METHOD_VARIABLE, ROOT_VARIABLE, probe_gpus

FAKE_SMI = [str(FAKES / "nvidia-smi")]
NO_SMI = ["/nonexistent/ray-megatron-env-tests/nvidia-smi"]

UUID0 = "GPU-aaaa1111-0000-0000-0000-000000000000"
UUID1 = "GPU-bbbb2222-0000-0000-0000-000000000001"
UUID2 = "GPU-bbbb3333-0000-0000-0000-000000000002"
MIG_UUID = "MIG-cccc4444-0000-0000-0000-000000000003"

GPUS = (Gpu(UUID0, (8, 0)), Gpu(UUID1, (9, 0), migs=[None, MIG_UUID]), Gpu(UUID2, (10, 0)))

NO_LIBRARY = {"nvmlInit": pynvml.NVMLError_LibraryNotFound()}


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


def assert_unknown(result: NodeGpus, method: str, *fragments: str) -> None:
    assert result.capabilities is None, result
    assert not result.is_known
    assert result.method == method
    for fragment in fragments:
        assert fragment in result.error, (fragment, result.error)
