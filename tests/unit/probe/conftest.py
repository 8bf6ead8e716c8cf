"""The probe tests' fixture: the fake nvidia-smi (tests/fakes/nvidia-smi)."""

import pytest

from gpu_probe import FAKE_SMI


@pytest.fixture
def smi(monkeypatch):
    """Pick the fake nvidia-smi's behaviour; returns its command."""
    def choose(behaviour: str):
        monkeypatch.setenv("FAKE_NVIDIA_SMI", behaviour)
        return FAKE_SMI
    return choose
