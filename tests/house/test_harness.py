"""The test harness itself: the leak check minds only this session's
processes (a simulated cluster stopping what Ray left: tests/cluster/test_harness.py)."""

import os

from processes import sleeper
from conftest import SESSION_VARIABLE, our_ray_processes


def test_the_leak_check_counts_our_processes_and_not_another_jobs():
    token = os.environ[SESSION_VARIABLE]  # set for the session by conftest
    ours = sleeper(dict(os.environ))
    other = sleeper({k: v for k, v in os.environ.items() if k != SESSION_VARIABLE})
    try:
        found = our_ray_processes(token)
        assert ours.pid in found
        assert other.pid not in found
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
    assert ours.pid not in our_ray_processes(token)
