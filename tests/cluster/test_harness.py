"""The test harness itself: a simulated cluster stops what Ray's shutdown left of it
(the leak check: tests/house/test_harness.py)."""

import os
import signal

from processes import sleeper
from ray_megatron_env.simulation import SimulatedCluster, SimulatedNode


def test_a_cluster_shutdown_stops_a_process_ray_left_behind(no_cluster):
    # As a node's dashboard agent still starting when its cluster stops: it
    # carries the cluster's RAY_TMPDIR and outlives Ray's own shutdown.
    cluster = SimulatedCluster([SimulatedNode("solo", "9.0")]).start(connect=False)
    cluster.straggler_grace_s = 1.0  # the straggler never leaves by itself: no 5 s wait
    try:
        straggler = sleeper(dict(os.environ), "/site-packages/ray/dashboard/agent.py")
        elsewhere = sleeper({k: v for k, v in os.environ.items() if k != "RAY_TMPDIR"},
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

