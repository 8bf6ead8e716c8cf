"""A stand-in for a Ray process, for the harness tests."""

import subprocess
import sys
import time


def sleeper(env, looks_like="raylet"):
    """A process whose command line looks like Ray's ("raylet"), as the check
    sees it; returned once it runs (before exec it is still a copy of us)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", looks_like],
                            env=env)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            if looks_like.encode() in f.read():
                return proc
        time.sleep(0.05)
    raise AssertionError("the sleeper did not start")
