"""probe/common.py: what every source shares. CUDA_VISIBLE_DEVICES applied as
CUDA applies it (``select_visible``), the device root, and one bounded way to
run a tool (``run_command``): a hung one killed with its children, one that
is missing or cannot run named. Expected values from CUDA's documented
reading of CUDA_VISIBLE_DEVICES (indices, unique UUID prefixes, a negative
index ends the list) and from the messages in probe/common.py.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from gpu_probe import NO_SMI, Untouchable, assert_unknown, probe
from ray_megatron_env.probe.common import (
    Absent, ProbeError, VisibilityError, clip, root, run_command, select_visible, text_of,
    visible_detail,
)
from ray_megatron_env.probe import ROOT_VARIABLE

DEVICES = [("GPU-aa11", (8, 0)), ("GPU-ab22", (9, 0)), ("GPU-b333", (10, 0))]
MIGS = [("MIG-c444", (9, 0))]


# --- CUDA_VISIBLE_DEVICES ------------------------------------------------------------

@pytest.mark.parametrize("visible,chosen", [
    (None, [(8, 0), (9, 0), (10, 0)]),  # unset: every device, in index order
    ("2,0", [(10, 0), (8, 0)]),
    (" 1 ", [(9, 0)]),
    ("1,-1,0", [(9, 0)]),  # a negative index ends the list
    ("-1", []),
    ("", []),  # set and empty: no GPU visible
    ("GPU-b", [(10, 0)]),  # a unique prefix
    ("GPU-ab22,0", [(9, 0), (8, 0)]),
    ("MIG-c", [(9, 0)]),  # a MIG instance, by UUID only
])
def test_visible_devices_as_cuda_reads_them(visible, chosen):
    assert select_visible(visible, DEVICES, MIGS) == chosen


@pytest.mark.parametrize("visible,words", [
    ("0,,1", "CUDA_VISIBLE_DEVICES='0,,1' has an empty entry"),
    ("3", "CUDA_VISIBLE_DEVICES names device 3, but the node has 3 GPU(s)"),
    ("GPU-a", "CUDA_VISIBLE_DEVICES entry 'GPU-a' matches more than one GPU UUID on the node"),
    ("GPU-ff", "CUDA_VISIBLE_DEVICES entry 'GPU-ff' matches no GPU UUID on the node"),
])
def test_a_name_that_matches_no_device_is_an_error_not_a_shorter_list(visible, words):
    with pytest.raises(VisibilityError) as info:
        select_visible(visible, DEVICES, MIGS)
    assert words in str(info.value)
    assert isinstance(info.value, ProbeError)


def test_visible_detail_says_how_many_and_which():
    assert visible_detail(None, 8) == "8 device(s) on the node, all visible"
    assert visible_detail("0,1", 8) == "8 device(s) on the node, CUDA_VISIBLE_DEVICES=0,1 visible"


# --- the device root and text --------------------------------------------------------

@pytest.mark.parametrize("environ,top", [
    ({}, "/"), ({ROOT_VARIABLE: "  "}, "/"), ({ROOT_VARIABLE: " /host "}, "/host"),
])
def test_the_device_root_is_slash_unless_named(environ, top):
    assert root(environ) == top


def test_long_text_is_clipped_to_its_limit_and_bytes_are_decoded():
    assert clip("x" * 120) == "x" * 120
    assert clip("x" * 121) == "x" * 117 + "..."
    assert clip("abcdefgh", 6) == "abc..."
    assert text_of(b"GPU-\xff") == "GPU-\ufffd"
    assert text_of(3) == "3"


# --- running a tool, bounded ---------------------------------------------------------

def test_a_tool_that_answers_gives_its_output():
    assert run_command([sys.executable, "-c"], ["print('0, 9.0')"], 10.0) == "0, 9.0\n"


def test_no_devices_found_is_none_not_an_error():
    # nvidia-smi's words when the driver sees no GPU, with a non-zero exit
    script = "import sys; print('No devices were found'); sys.exit(6)"
    assert run_command([sys.executable, "-c"], [script], 10.0) is None


def test_a_failing_tool_is_named_with_its_exit_status_and_first_line():
    script = "import sys; sys.stderr.write('Failed to initialize NVML\\nmore\\n'); sys.exit(9)"
    with pytest.raises(ProbeError) as info:
        run_command([sys.executable, "-c"], [script], 10.0)
    assert str(info.value) == f"{sys.executable} exited with 9: Failed to initialize NVML"


def test_a_missing_tool_is_absent():
    with pytest.raises(Absent, match="is not installed"):
        run_command(NO_SMI, [], 1.0)


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
