"""The test harness itself: the leak check minds only this session's processes."""

import os
import subprocess
import sys
import time

from conftest import SESSION_VARIABLE, our_ray_processes


def _sleeper(env):
    """A process whose command line looks like Ray's ("raylet"), as the check
    sees it; returned once it runs (before exec it is still a copy of us)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "raylet"],
                            env=env)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            if b"raylet" in f.read():
                return proc
        time.sleep(0.05)
    raise AssertionError("the sleeper did not start")


def test_the_leak_check_counts_our_processes_and_not_another_jobs():
    token = os.environ[SESSION_VARIABLE]  # set for the session by conftest
    ours = _sleeper(dict(os.environ))
    other = _sleeper({k: v for k, v in os.environ.items() if k != SESSION_VARIABLE})
    try:
        found = our_ray_processes(token)
        assert ours.pid in found
        assert other.pid not in found
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
    assert ours.pid not in our_ray_processes(token)
