"""probe/smi.py: the GPUs through nvidia-smi (tests/fakes/nvidia-smi, its
behaviour picked by the ``smi`` fixture): its capabilities, CUDA_VISIBLE_DEVICES
applied to them, and its failures named. Its fabric and IMEX readers:
tests/unit/probe/test_fabric.py; running it bounded: tests/unit/probe/test_common.py.
"""

import pytest

from gpu_probe import Untouchable, assert_unknown, probe


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
