"""The test harness itself: the leak check minds only this session's
processes; a simulated cluster stops what Ray's shutdown left of it."""

import os
import signal
import subprocess
import sys
import time

from conftest import SESSION_VARIABLE, our_ray_processes
from ray_megatron_env.simulation import SimulatedCluster, SimulatedNode


def _sleeper(env, looks_like="raylet"):
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


def test_a_cluster_shutdown_stops_a_process_ray_left_behind(no_cluster):
    # As a node's dashboard agent still starting when its cluster stops: it
    # carries the cluster's RAY_TMPDIR and outlives Ray's own shutdown.
    cluster = SimulatedCluster([SimulatedNode("solo", "9.0")]).start(connect=False)
    cluster.straggler_grace_s = 1.0  # the straggler never leaves by itself: no 5 s wait
    try:
        straggler = _sleeper(dict(os.environ), "/site-packages/ray/dashboard/agent.py")
        elsewhere = _sleeper({k: v for k, v in os.environ.items() if k != "RAY_TMPDIR"},
                             "/site-packages/ray/dashboard/agent.py")
    finally:
        cluster.shutdown()
    try:
        assert straggler.wait(timeout=5) == -signal.SIGKILL
        assert elsewhere.poll() is None  # not this cluster's: left alone
    finally:
        for proc in (straggler, elsewhere):
            proc.kill()
            proc.wait()

